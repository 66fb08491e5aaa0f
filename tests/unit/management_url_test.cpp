#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "retryloop/management/management.hpp"

using retryloop::management::ApiUrl;
using retryloop::management::MembersCheck;
using retryloop::management::parse_api_url;
using retryloop::management::QueueMembers;

TEST_CASE("A management URL gives its scheme, host, port, credentials and path prefix",
          "[topology]") {
  ApiUrl url = parse_api_url("http://admin:s%40cret@rabbit-1:15673/mgmt/", "guest", "guest");
  CHECK_FALSE(url.tls);
  REQUIRE(url.hosts.size() == 1);
  CHECK(url.hosts[0].host == "rabbit-1");
  CHECK(url.hosts[0].port == 15673);
  CHECK(url.user == "admin");
  CHECK(url.password == "s@cret");
  CHECK(url.path_prefix == "/mgmt");
  CHECK(url.redacted() == "http://admin:***@rabbit-1:15673/mgmt/");

  ApiUrl defaults = parse_api_url("https://[::1]", "svc", "pw");
  CHECK(defaults.tls);
  CHECK(defaults.hosts.at(0).host == "::1");
  CHECK(defaults.hosts.at(0).port == 15671);
  CHECK(defaults.user == "svc");  // the AMQP URI's user when the URL names none
  CHECK(defaults.password == "pw");
  CHECK(defaults.path_prefix.empty());
  CHECK(parse_api_url("http://localhost/", "guest", "guest").hosts.at(0).port == 15672);

  ApiUrl cluster = parse_api_url("http://u:p@n1:15672,n2:15673,n3/", "guest", "guest");
  REQUIRE(cluster.hosts.size() == 3);
  CHECK(cluster.hosts[1].host == "n2");
  CHECK(cluster.hosts[1].port == 15673);
  CHECK(cluster.hosts[2].port == 15672);
  CHECK(cluster.redacted() == "http://u:***@n1:15672,n2:15673,n3:15672/");
}

TEST_CASE("A malformed management URL is refused with what is wrong", "[topology]") {
  auto refused = [](const char* url) {
    try {
      parse_api_url(url, "guest", "guest");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("amqp://localhost:15672/"), Catch::Contains("http:// or https://"));
  CHECK_THAT(refused("http://localhost:0/"), Catch::Contains("from 1 to 65535"));
  CHECK_THAT(refused("http://localhost:99999/"), Catch::Contains("from 1 to 65535"));
  CHECK_THAT(refused("http://localhost:port/"), Catch::Contains("from 1 to 65535"));
  CHECK_THAT(refused("http:///api"), Catch::Contains("names no host"));
  CHECK_THAT(refused("http://localhost/?x=1"), Catch::Contains("no query"));
  CHECK_THAT(refused("http://a%zz@localhost/"), Catch::Contains("percent-encoding"));
  CHECK_THAT(refused("http://[::1/"), Catch::Contains("closing ']'"));
  CHECK_THAT(refused("http://n1:15672,/"), Catch::Contains("names no host"));
}

TEST_CASE("A quorum queue is short of members when fewer are online than the file asks for",
          "[topology]") {
  MembersCheck check;
  check.queue = "orders";
  check.found = QueueMembers{"quorum",
                             "rl-1@localhost",
                             {"rl-1@localhost", "rl-2@localhost", "rl-3@localhost"},
                             {"rl-1@localhost", "rl-3@localhost"}};
  CHECK(check.required() == 3);  // no "replicas": every member it has
  CHECK_FALSE(check.ok());
  CHECK(check.offline() == std::vector<std::string>{"rl-2@localhost"});

  check.wanted = 2;
  CHECK(check.required() == 2);
  CHECK(check.ok());

  check.wanted = 5;  // asks for more than the queue has
  CHECK_FALSE(check.ok());

  MembersCheck unanswered;
  unanswered.error = {0, "no answer"};
  CHECK_FALSE(unanswered.ok());
}
