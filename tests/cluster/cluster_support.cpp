#include "cluster_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include "retryloop/client/uri.hpp"
#include "retryloop/management/management.hpp"
#include "support/process.hpp"

namespace retryloop::test {

using namespace std::chrono_literals;

std::vector<std::string> node_dirs() {
  const char* dirs = std::getenv("RETRYLOOP_TEST_NODE_DIRS");
  if (dirs == nullptr)
    FAIL("RETRYLOOP_TEST_NODE_DIRS is not set: run through scripts/with-broker --nodes 3");
  std::vector<std::string> out;
  std::istringstream in(dirs);
  for (std::string dir; in >> dir;)
    out.push_back(dir);
  return out;
}

namespace {

/// A variable of the node's broker.env.
std::string node_variable(const std::string& dir, const std::string& name) {
  ChildProcess read({"/bin/sh", "-c", ". '" + dir + "/broker.env' && echo \"$" + name + "\""});
  read.wait(10000);
  std::string value = read.out();
  while (!value.empty() && (value.back() == '\n' || value.back() == ' '))
    value.pop_back();
  return value;
}

}  // namespace

std::string node_on_port(uint16_t port) {
  for (const auto& dir : node_dirs()) {
    if (node_variable(dir, "RETRYLOOP_TEST_AMQP_PORT") == std::to_string(port)) return dir;
  }
  FAIL("no node listens on port " << port);
  return {};
}

uint16_t node_port(const std::string& dir) {
  const std::string port = node_variable(dir, "RETRYLOOP_TEST_AMQP_PORT");
  INFO("the AMQP port of the node in " << dir << ": '" << port << "'");
  REQUIRE(!port.empty());
  return static_cast<uint16_t>(std::stoi(port));
}

int broker_script(TestLoop& loop, const std::string& command, const std::string& dir) {
  ChildProcess script({std::string(RETRYLOOP_SOURCE_DIR) + "/scripts/broker", command, dir});
  REQUIRE(loop.run_until([&] { return !script.running(); }, 180s));
  INFO(script.out() << script.err());
  return script.wait(1000);
}

std::string management_url() {
  const char* url = std::getenv("RETRYLOOP_TEST_MANAGEMENT_URL");
  if (url == nullptr)
    FAIL("RETRYLOOP_TEST_MANAGEMENT_URL is not set: run through scripts/with-broker --nodes 3");
  return url;
}

std::string url_starting_at(size_t first, const std::string& query) {
  client::Uri uri = client::parse_uri(broker_url());
  std::vector<client::Endpoint> hosts = uri.hosts();
  std::rotate(hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(first), hosts.end());
  std::string text;
  for (const auto& host : hosts)
    text += (text.empty() ? "" : ",") + host.text();
  return "amqp://" + uri.user + ":" + uri.password + "@" + text + "/" +
         (query.empty() ? "" : "?" + query);
}

std::string queue_leader(const std::string& queue) {
  management::ManagementClient api(management::parse_api_url(management_url(), "", ""), 5s);
  management::ApiError error;
  auto members = api.queue("/", queue, error);
  INFO(error.message);
  REQUIRE(members);
  return members->leader;
}

}  // namespace retryloop::test
