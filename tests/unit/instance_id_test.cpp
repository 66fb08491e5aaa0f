// A consumer's id among its service's instances: unique even where host names and pids repeat.

#include <unistd.h>
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "retryloop/consumer/detail/instance_id.hpp"

using retryloop::consumer::detail::instance_id;

TEST_CASE(
    "Instance ids carry a random part, so that two processes with one host name and one pid (two "
    "containers on the host's network, each its PID 1) are told apart",
    "[consumer]") {
  const std::string first = instance_id();
  const std::string second = instance_id();
  const std::regex shape(R"(.+:[0-9]+#[0-9]+\.[0-9a-f]{8})");
  CHECK(std::regex_match(first, shape));
  CHECK(std::regex_match(second, shape));
  CHECK(first.find(":" + std::to_string(getpid()) + "#") != std::string::npos);
  // The count tells consumers of one process apart; the random part tells processes apart.
  const auto random = [](const std::string& id) { return id.substr(id.rfind('.') + 1); };
  CHECK(random(first) != random(second));
}
