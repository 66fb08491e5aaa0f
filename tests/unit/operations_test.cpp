// The operations endpoint's pure parts: the Prometheus text exposition of the consumers' metrics
// (a real parser reads it from a real consumer in tests/integration/operations_test.cpp),
// readiness, and the listen address.

#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "retryloop/operations/http_endpoint.hpp"
#include "retryloop/operations/prometheus.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using operations::ConsumerStatus;

namespace {

ConsumerStatus orders_status() {
  ConsumerStatus status;
  status.service = "orders";
  status.queue = "orders.q";
  status.state = consumer::ConsumerState::consuming;
  status.in_flight = 4;
  consumer::Metrics& m = status.metrics;
  m.delivered = 7;
  m.acked = 3;
  m.retried = 2;
  m.retried_by_delay["30s"] = 2;
  m.parked_exhausted = 1;
  m.publish_failures = 5;
  m.reconnects = 1;
  m.handler_latency.record(800us);
  m.handler_latency.record(40ms);
  return status;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines_of(text)) {
    if (l == line) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("The exposition has counters, gauges and the handler latency histogram in seconds",
          "[operations]") {
  const std::string text = operations::prometheus_text({orders_status()});
  INFO(text);
  CHECK(text.back() == '\n');
  CHECK(has_line(text, "# TYPE messaging_client_consumed_messages_total counter"));
  CHECK(has_line(text,
                 "messaging_client_consumed_messages_total{messaging_system=\"rabbitmq\","
                 "messaging_operation_name=\"receive\",messaging_destination_name=\"orders.q\","
                 "service=\"orders\"} 7"));
  CHECK(has_line(text, "retryloop_acked_messages_total{service=\"orders\",queue=\"orders.q\"} 3"));
  CHECK(has_line(text,
                 "retryloop_retries_total{service=\"orders\",queue=\"orders.q\",delay=\"30s\"} 2"));
  for (const char* reason : {"exhausted", "permanent", "poison", "delivery_limit"}) {
    CHECK(has_line(text, std::string("retryloop_parked_messages_total{service=\"orders\",queue="
                                     "\"orders.q\",reason=\"") +
                             reason + "\"} " + (std::string(reason) == "exhausted" ? "1" : "0")));
  }
  CHECK(has_line(text,
                 "retryloop_copy_publish_failures_total{service=\"orders\",queue=\"orders.q\"} 5"));
  CHECK(has_line(text, "retryloop_reconnects_total{service=\"orders\",queue=\"orders.q\"} 1"));
  CHECK(has_line(text, "# TYPE retryloop_in_flight_messages gauge"));
  CHECK(has_line(text, "retryloop_in_flight_messages{service=\"orders\",queue=\"orders.q\"} 4"));
  CHECK(has_line(text, "retryloop_consuming{service=\"orders\",queue=\"orders.q\"} 1"));
  CHECK(has_line(text, "retryloop_publishing_blocked{service=\"orders\",queue=\"orders.q\"} 0"));

  const std::string labels =
      "messaging_system=\"rabbitmq\",messaging_operation_name=\"process\","
      "messaging_destination_name=\"orders.q\",service=\"orders\"";
  CHECK(has_line(text, "# TYPE messaging_process_duration_seconds histogram"));
  CHECK(
      has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"0.0001\"} 0"));
  CHECK(has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"0.001\"} 1"));
  CHECK(has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"0.025\"} 1"));
  CHECK(has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"0.05\"} 2"));
  CHECK(has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"60\"} 2"));
  CHECK(has_line(text, "messaging_process_duration_seconds_bucket{" + labels + ",le=\"+Inf\"} 2"));
  CHECK(has_line(text, "messaging_process_duration_seconds_sum{" + labels + "} 0.0408"));
  CHECK(has_line(text, "messaging_process_duration_seconds_count{" + labels + "} 2"));
}

TEST_CASE("Every sample follows its family's HELP and TYPE, and no series appears twice",
          "[operations]") {
  ConsumerStatus second = orders_status();
  second.service = "audit";
  second.queue = "audit";
  const std::string text = operations::prometheus_text({orders_status(), second});
  std::string family;
  std::set<std::string> families;
  std::set<std::string> series;
  bool help = false;
  for (const auto& line : lines_of(text)) {
    INFO(line);
    if (line.rfind("# HELP ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      CHECK(families.insert(family).second);
      help = true;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      CHECK(help);
      CHECK(line.substr(7, family.size() + 1) == family + " ");
      continue;
    }
    const std::string name = line.substr(0, line.find_first_of("{ "));
    const bool in_family = name == family || name == family + "_bucket" ||
                           name == family + "_sum" || name == family + "_count";
    CHECK(in_family);
    CHECK(series.insert(line.substr(0, line.rfind(' '))).second);
  }
  for (const auto& f : families) {
    const bool counter_named = f.size() > 6 && f.compare(f.size() - 6, 6, "_total") == 0;
    const bool is_counter = has_line(text, "# TYPE " + f + " counter");
    CHECK(counter_named == is_counter);
  }
}

TEST_CASE("Label values are escaped: backslash, double quote and newline", "[operations]") {
  ConsumerStatus status = orders_status();
  status.service = "we\"ird\\name\nx";
  status.queue = "q";
  const std::string text = operations::prometheus_text({status});
  CHECK(has_line(text,
                 "retryloop_acked_messages_total{service=\"we\\\"ird\\\\name\\nx\","
                 "queue=\"q\"} 3"));
  CHECK(text.find("we\"ird") == std::string::npos);
}

TEST_CASE("Consumers of the same service and queue are added into one series", "[operations]") {
  ConsumerStatus first = orders_status();
  ConsumerStatus second = orders_status();
  second.state = consumer::ConsumerState::reconnecting;
  second.metrics.retried_by_delay["1m"] = 1;
  const std::string text = operations::prometheus_text({first, second});
  INFO(text);
  CHECK(has_line(text, "retryloop_acked_messages_total{service=\"orders\",queue=\"orders.q\"} 6"));
  CHECK(has_line(text,
                 "retryloop_retries_total{service=\"orders\",queue=\"orders.q\",delay=\"30s\"} 4"));
  CHECK(has_line(text,
                 "retryloop_retries_total{service=\"orders\",queue=\"orders.q\",delay=\"1m\"} 1"));
  CHECK(has_line(text, "retryloop_in_flight_messages{service=\"orders\",queue=\"orders.q\"} 8"));
  CHECK(has_line(text, "retryloop_consuming{service=\"orders\",queue=\"orders.q\"} 1"));
}

TEST_CASE("Ready means consuming and not blocked by the broker", "[operations]") {
  ConsumerStatus status = orders_status();
  CHECK(operations::is_ready(status));
  status.blocked = true;
  CHECK_FALSE(operations::is_ready(status));
  status.blocked = false;
  for (auto state : {consumer::ConsumerState::not_started, consumer::ConsumerState::connecting,
                     consumer::ConsumerState::reconnecting, consumer::ConsumerState::stopping,
                     consumer::ConsumerState::stopped}) {
    status.state = state;
    CHECK_FALSE(operations::is_ready(status));
  }
}

TEST_CASE("A listen address is HOST:PORT, [IPV6]:PORT, or a bare port on loopback",
          "[operations]") {
  auto address = operations::parse_listen_address("127.0.0.1:9464");
  CHECK(address.host == "127.0.0.1");
  CHECK(address.port == 9464);
  address = operations::parse_listen_address("[::1]:0");
  CHECK(address.host == "::1");
  CHECK(address.port == 0);
  CHECK(address.text() == "[::1]:0");
  address = operations::parse_listen_address("8080");
  CHECK(address.host == "127.0.0.1");
  CHECK(address.text() == "127.0.0.1:8080");
  CHECK(operations::parse_listen_address("0.0.0.0:80").host == "0.0.0.0");
  for (const char* bad : {"", ":80", "host:", "host:http", "host:65536", "[::1]80", "[::1"}) {
    INFO(bad);
    CHECK_THROWS_AS(operations::parse_listen_address(bad), std::invalid_argument);
  }
}

TEST_CASE(
    "The breaker's state, limit, pace, trips, probes, time open and held deliveries are exposed, "
    "and two consumers of a service show its most stopped state",
    "[operations][outage]") {
  ConsumerStatus open = orders_status();
  open.breaker = outage::State::open;
  open.breaker_stats.trips = 2;
  open.breaker_stats.probes = 5;
  open.breaker_stats.time_open = 12500ms;
  open.held = 40;
  ConsumerStatus closed = orders_status();
  closed.breaker_limit = 8;
  closed.breaker_stats.trips = 1;
  closed.breaker_stats.pace = 284.6;
  closed.parking_alert_threshold = 50;
  const std::string text = operations::prometheus_text({open, closed});
  INFO(text);
  const std::string own = "service=\"orders\",queue=\"orders.q\"";
  CHECK(has_line(text, "# TYPE retryloop_breaker_state gauge"));
  CHECK(has_line(text, "retryloop_breaker_state{" + own + ",state=\"open\"} 1"));
  CHECK(has_line(text, "retryloop_breaker_state{" + own + ",state=\"closed\"} 0"));
  CHECK(has_line(text, "retryloop_breaker_state{" + own + ",state=\"paused\"} 0"));
  CHECK(has_line(text, "retryloop_breaker_trips_total{" + own + "} 3"));
  CHECK(has_line(text, "retryloop_breaker_probes_total{" + own + "} 5"));
  CHECK(has_line(text, "retryloop_breaker_open_seconds_total{" + own + "} 12.5"));
  CHECK(has_line(text, "retryloop_breaker_limit{" + own + "} 8"));
  CHECK(has_line(text, "retryloop_breaker_pace{" + own + "} 285"));
  CHECK(has_line(text, "retryloop_parking_alert_threshold{" + own + "} 50"));
  CHECK(has_line(text, "retryloop_held_messages{" + own + "} 40"));
}
