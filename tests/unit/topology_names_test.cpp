#include <catch2/catch.hpp>

#include <chrono>

#include "retryloop/topology/topology.hpp"

using namespace std::chrono_literals;
using namespace retryloop::topology;

namespace {

Service service(RetryMode mode, std::vector<std::chrono::milliseconds> delays) {
  Service s;
  s.name = "orders";
  s.retry.mode = mode;
  s.retry.delays = std::move(delays);
  return s;
}

}  // namespace

TEST_CASE("Every other name of a service is derived from its name", "[topology]") {
  CHECK(wait_exchange_name("orders") == "orders.wait");
  CHECK(wait_queue_name("orders", 30s) == "orders.wait.30s");
  CHECK(wait_queue_name("orders", 250ms) == "orders.wait.250ms");
  CHECK(wait_queue_name("orders", std::chrono::hours(24 * 14)) == "orders.wait.14d");
  CHECK(parking_exchange_name("orders") == "orders.parking");
  CHECK(parking_queue_name("orders") == "orders.parking");
}

TEST_CASE("The input queue is the service name unless the file names another", "[topology]") {
  Service s;
  s.name = "orders";
  CHECK(input_queue_name(s) == "orders");
  s.queue = "orders.v2";
  CHECK(input_queue_name(s) == "orders.v2");
}

TEST_CASE("In reject mode every retry waits the single delay", "[topology]") {
  Service s = service(RetryMode::reject, {30s});
  for (int attempt : {0, 1, 2, 5, 100}) {
    CHECK(delay_after_attempt(s, attempt) == 30s);
    CHECK(wait_routing_key(s, attempt) == "30s");
  }
}

TEST_CASE("In republish mode retry k waits delays[k-1], and the last delay repeats", "[topology]") {
  Service s = service(RetryMode::republish, {1s, 10s, 1min});
  CHECK(wait_routing_key(s, 1) == "1s");
  CHECK(wait_routing_key(s, 2) == "10s");
  CHECK(wait_routing_key(s, 3) == "1m");
  CHECK(wait_routing_key(s, 4) == "1m");
  CHECK(wait_routing_key(s, 50) == "1m");
  CHECK(wait_routing_key(s, 0) == "1s");
  CHECK(delay_after_attempt(s, 2) == 10s);
}

TEST_CASE("A delay used twice gets one wait queue", "[topology]") {
  Service s = service(RetryMode::republish, {1s, 5s, 1000ms, 5s, 1min});
  CHECK(wait_delays(s) == std::vector<std::chrono::milliseconds>{1s, 5s, 1min});
}
