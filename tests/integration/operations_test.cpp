// The operations endpoint against a real consumer and broker: /metrics read by Prometheus' own
// parser after known traffic, /healthz, and /readyz while consuming, reconnecting, blocked by a
// memory alarm and stopped; demo_consumer --http.

#include <poll.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "retryloop/operations/http_endpoint.hpp"
#include "retryloop/operations/prometheus.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/http_clients.hpp"
#include "support/process.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using test::Broker;
using test::TestLoop;

namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
};

/// GET http://127.0.0.1:PORT/PATH from another thread, running the loop meanwhile (the endpoint
/// asks the loop for every answer).
Reply http_get(TestLoop& loop, uint16_t port, const std::string& path) {
  auto reply = std::async(std::launch::async, [port, path] {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    Reply out;
    if (auto result = client.Get(path.c_str())) {
      out.status = result->status;
      out.body = result->body;
      out.content_type = result->get_header_value("Content-Type");
    }
    return out;
  });
  REQUIRE(loop.run_until([&] { return reply.wait_for(0s) == std::future_status::ready; }, 20s));
  return reply.get();
}

/// A sample as Prometheus' Python parser read it.
struct Sample {
  std::string family;
  std::string type;
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// Parses `exposition` with prometheus_client (tests/interop/prometheus_parse.py); fails the test
/// when it does not parse.
std::vector<Sample> parse_with_prometheus_client(const std::string& exposition) {
  const auto file =
      std::filesystem::temp_directory_path() / (test::unique_name("metrics") + ".txt");
  std::ofstream(file) << exposition;
  test::ChildProcess parser(
      {"/usr/bin/python3", std::string(RETRYLOOP_SOURCE_DIR) + "/tests/interop/prometheus_parse.py",
       file.string()});
  const int code = parser.wait();
  std::filesystem::remove(file);
  INFO(parser.err());
  INFO(exposition);
  REQUIRE(code == 0);
  std::vector<Sample> samples;
  std::istringstream lines(parser.out());
  for (std::string line; std::getline(lines, line);) {
    const auto json = nlohmann::json::parse(line);
    samples.push_back(Sample{json.at("family"), json.at("type"), json.at("name"),
                             json.at("labels").get<std::map<std::string, std::string>>(),
                             json.at("value").get<double>()});
  }
  return samples;
}

/// The value of the sample `name` whose labels include `labels`; fails the test unless exactly
/// one matches.
double value_of(const std::vector<Sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  std::vector<double> found;
  for (const auto& sample : samples) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto it = sample.labels.find(key);
      match = match && it != sample.labels.end() && it->second == value;
    }
    if (match) found.push_back(sample.value);
  }
  INFO(name);
  REQUIRE(found.size() == 1);
  return found[0];
}

std::shared_ptr<operations::HttpEndpoint> serve(TestLoop& loop,
                                                const std::shared_ptr<consumer::Consumer>& c) {
  operations::HttpEndpointOptions options;
  options.listen.port = 0;
  auto endpoint = operations::HttpEndpoint::create(loop.get(), options);
  endpoint->add(c);
  REQUIRE_FALSE(endpoint->start());
  REQUIRE(endpoint->port() != 0);
  return endpoint;
}

void close_endpoint(TestLoop& loop, const std::shared_ptr<operations::HttpEndpoint>& endpoint) {
  bool closed = false;
  endpoint->close([&closed] { closed = true; });
  REQUIRE(loop.run_until([&] { return closed; }, 10s));
}

/// Waits, without running the loop, until something wakes it (a LoopBridge task posted from
/// another thread), or `timeout` passes; returns whether it was woken.
bool wait_until_woken(TestLoop& loop, std::chrono::milliseconds timeout) {
  pollfd backend{uv_backend_fd(loop.get()), POLLIN, 0};
  return ::poll(&backend, 1, static_cast<int>(timeout.count())) == 1;
}

/// Polls /readyz until it answers `status` (or 10 s pass); returns the last reply.
Reply readyz_until(TestLoop& loop, uint16_t port, int status) {
  Reply reply;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until;) {
    reply = http_get(loop, port, "/readyz");
    if (reply.status == status) break;
    loop.run_for(50ms);
  }
  return reply;
}

/// Sends `request` as bytes to 127.0.0.1:PORT from another thread, running the loop meanwhile;
/// returns the raw answer.
std::string exchange(TestLoop& loop, uint16_t port, const std::string& request) {
  auto answer = std::async(std::launch::async,
                           [port, request] { return test::http_exchange(port, request); });
  REQUIRE(loop.run_until([&] { return answer.wait_for(0s) == std::future_status::ready; }, 90s));
  return answer.get();
}

}  // namespace

TEST_CASE(
    "/metrics after 3 acks, 2 retries and a park is what Prometheus' parser reads, with those "
    "counts",
    "[operations][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("metrics"),
                         R"("mode": "republish", "delays": ["100ms"], "max_attempts": 5)");
  auto c = test::start(loop, test::options_for(service), [](const consumer::Message& m) {
    if (m.message_id() == "gone") return Outcome::permanent("no such customer");
    if (m.message_id() == "flaky" && m.attempt <= 2) return Outcome::retry("timeout");
    return Outcome::ack();
  });
  auto endpoint = serve(loop, c);
  for (const char* id : {"a", "b", "flaky", "gone"})
    broker.publish(service.input.exchange, "key", id);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 3 && c->metrics().parked() == 1; }));

  const Reply metrics = http_get(loop, endpoint->port(), "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.content_type == "text/plain; version=0.0.4; charset=utf-8");
  const auto samples = parse_with_prometheus_client(metrics.body);
  const std::string queue = topology::input_queue_name(service);
  const std::map<std::string, std::string> own = {{"service", service.name}, {"queue", queue}};
  const std::map<std::string, std::string> messaging = {{"messaging_system", "rabbitmq"},
                                                        {"messaging_destination_name", queue},
                                                        {"service", service.name}};
  // 4 messages, "flaky" delivered three times.
  CHECK(value_of(samples, "messaging_client_consumed_messages_total", messaging) == 6);
  CHECK(value_of(samples, "retryloop_acked_messages_total", own) == 3);
  auto retries = own;
  retries["delay"] = "100ms";
  CHECK(value_of(samples, "retryloop_retries_total", retries) == 2);
  auto parked = own;
  parked["reason"] = "permanent";
  CHECK(value_of(samples, "retryloop_parked_messages_total", parked) == 1);
  parked["reason"] = "exhausted";
  CHECK(value_of(samples, "retryloop_parked_messages_total", parked) == 0);
  CHECK(value_of(samples, "retryloop_copy_publish_failures_total", own) == 0);
  CHECK(value_of(samples, "retryloop_reconnects_total", own) == 0);
  CHECK(value_of(samples, "retryloop_in_flight_messages", own) == 0);
  CHECK(value_of(samples, "retryloop_consuming", own) == 1);
  CHECK(value_of(samples, "retryloop_publishing_blocked", own) == 0);
  CHECK(value_of(samples, "messaging_process_duration_seconds_count", messaging) == 6);
  auto infinity = messaging;
  infinity["le"] = "+Inf";
  CHECK(value_of(samples, "messaging_process_duration_seconds_bucket", infinity) == 6);
  CHECK(value_of(samples, "messaging_process_duration_seconds_sum", messaging) >= 0);
  for (const auto& sample : samples) {
    INFO(sample.name);
    CHECK(sample.labels.count("message_id") == 0);
    if (sample.type == "counter") CHECK(sample.name.size() > 6);
  }

  const Reply health = http_get(loop, endpoint->port(), "/healthz");
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  const Reply ready = http_get(loop, endpoint->port(), "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body == "ready\nservice " + service.name + " (queue " + queue + "): consuming\n");
  CHECK(http_get(loop, endpoint->port(), "/nothing").status == 404);

  test::stop(loop, c);
  const Reply stopped = http_get(loop, endpoint->port(), "/readyz");
  CHECK(stopped.status == 503);
  CHECK(stopped.body == "not ready\nservice " + service.name + " (queue " + queue + "): stopped\n");
  CHECK(http_get(loop, endpoint->port(), "/healthz").status == 200);  // the process is still alive
  close_endpoint(loop, endpoint);
}

TEST_CASE("/readyz answers 503 while the consumer reconnects and 200 once it consumes again",
          "[operations][integration]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), client::parse_uri(test::broker_url()).port);
  const auto service = test::make_service(
      test::unique_name("ready"), R"("mode": "reject", "delays": ["1s"], "max_attempts": 3)");
  auto options = test::options_for(service);
  options.connection.uri.port = proxy.port();
  options.recovery = consumer::Backoff{1500ms, 1500ms, 1.0, 0.0};
  auto c = test::start(loop, options, [](const consumer::Message&) { return Outcome::ack(); });
  auto endpoint = serve(loop, c);
  CHECK(http_get(loop, endpoint->port(), "/readyz").status == 200);

  proxy.cut();
  const Reply lost = readyz_until(loop, endpoint->port(), 503);
  CHECK(lost.status == 503);
  CHECK(lost.body.find("): reconnecting\n") != std::string::npos);
  const Reply back = readyz_until(loop, endpoint->port(), 200);
  CHECK(back.status == 200);
  CHECK(c->metrics().reconnects == 1);
  test::stop(loop, c);
  close_endpoint(loop, endpoint);
}

TEST_CASE("/readyz answers 503 while a memory alarm blocks the consumer's copies, and 200 after it",
          "[operations][integration][broker-wide]") {
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("blocked"),
                         R"("mode": "republish", "delays": ["100ms"], "max_attempts": 3)");
  broker.apply(service);
  broker.publish("", topology::input_queue_name(service), "fails-once");
  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0") == 0);
  struct Restore {
    ~Restore() { test::broker_ctl("set_vm_memory_high_watermark 0.4"); }
  } restore;
  auto c = test::start(loop, test::options_for(service), [](const consumer::Message& m) {
    return m.attempt == 1 ? Outcome::retry("once") : Outcome::ack();
  });
  auto endpoint = serve(loop, c);
  const Reply blocked = readyz_until(loop, endpoint->port(), 503);
  CHECK(blocked.status == 503);
  CHECK(blocked.body.find("consuming, publishing blocked by the broker") != std::string::npos);
  const auto samples =
      parse_with_prometheus_client(http_get(loop, endpoint->port(), "/metrics").body);
  CHECK(value_of(samples, "retryloop_publishing_blocked", {{"service", service.name}}) == 1);
  CHECK(value_of(samples, "retryloop_in_flight_messages", {{"service", service.name}}) == 1);

  REQUIRE(test::broker_ctl("set_vm_memory_high_watermark 0.4") == 0);
  CHECK(readyz_until(loop, endpoint->port(), 200).status == 200);
  REQUIRE(loop.run_until([&] { return c->metrics().acked == 1; }, 20s));
  test::stop(loop, c);
  close_endpoint(loop, endpoint);
}

TEST_CASE(
    "A request the loop thread does not answer in time gets 503, and closing answers a waiting "
    "request at once",
    "[operations][integration]") {
  TestLoop loop;
  operations::HttpEndpointOptions options;
  options.listen.port = 0;
  options.loop_timeout = 300ms;
  auto endpoint = operations::HttpEndpoint::create(loop.get(), options);
  REQUIRE_FALSE(endpoint->start());
  const uint16_t port = endpoint->port();
  auto request = [port](const char* path) {
    return std::async(std::launch::async, [port, path] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(10);
      auto result = client.Get(path);
      return result ? result->status : 0;
    });
  };
  // The loop is not run: the request waits 300 ms for it, then gets 503.
  auto stuck = request("/healthz");
  REQUIRE(stuck.wait_for(30s) == std::future_status::ready);
  CHECK(stuck.get() == 503);
  const Reply none = http_get(loop, port, "/readyz");  // the loop runs: it answers
  CHECK(none.status == 503);
  CHECK(none.body == "not ready\nno consumers\n");
  CHECK(http_get(loop, port, "/healthz").status == 200);

  // Only the close can answer within the client's read timeout: the loop would take an hour.
  options.loop_timeout = 1h;
  auto patient = operations::HttpEndpoint::create(loop.get(), options);
  REQUIRE_FALSE(patient->start());
  auto waiting = std::async(std::launch::async, [port = patient->port()] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60);
    auto result = client.Get("/metrics");
    return result ? result->status : 0;
  });
  REQUIRE(wait_until_woken(loop, 30s));  // the request has asked the loop, which does not run
  bool closed = false;
  patient->close([&closed] { closed = true; });
  REQUIRE(waiting.wait_for(90s) == std::future_status::ready);
  CHECK(waiting.get() == 503);
  REQUIRE(loop.run_until([&] { return closed; }, 10s));
  close_endpoint(loop, endpoint);
}

TEST_CASE("demo_consumer --http serves the endpoint and closes it when it stops",
          "[operations][integration]") {
  TestLoop loop;
  Broker broker(loop);
  const std::string name = test::unique_name("demohttp");
  const std::string json = R"({"services": [{"name": ")" + name + R"(", "input": {"exchange": ")" +
                           name + R"(.in", "type": "direct", "bindings": ["key"]}, "retry": )" +
                           R"({"mode": "reject", "delays": ["100ms"], "max_attempts": 3}}]})";
  const auto file = std::filesystem::temp_directory_path() / (name + ".json");
  std::ofstream(file) << json;
  const auto service = topology::parse_topology(json).topology->services.at(0);
  test::ChildProcess demo({test::built_program("examples/demo_consumer"), "--url",
                           test::broker_url(), "--topology", file.string(), "--service", name,
                           "--http", "127.0.0.1:0"});
  const std::regex listening("operations endpoint on http://127\\.0\\.0\\.1:([0-9]+)/");
  std::string log;
  std::smatch match;
  for (auto until = std::chrono::steady_clock::now() + 20s;
       !std::regex_search(log, match, listening) && std::chrono::steady_clock::now() < until;) {
    loop.run_for(50ms);
    log = demo.err();
  }
  std::filesystem::remove(file);
  INFO(log);
  REQUIRE_FALSE(match.empty());
  const auto port = static_cast<uint16_t>(std::stoi(match.str(1)));
  CHECK(readyz_until(loop, port, 200).status == 200);
  broker.publish(service.input.exchange, "key", "m-1", R"({"id": 1})");
  REQUIRE(test::eventually(loop, [&] {
    const Reply metrics = http_get(loop, port, "/metrics");
    return metrics.body.find("retryloop_acked_messages_total{service=\"" + name + "\",queue=\"" +
                             name + "\"} 1") != std::string::npos;
  }));
  demo.signal(SIGTERM);
  CHECK(demo.wait() == 0);
}

TEST_CASE(
    "The operations endpoint answers /healthz while 300 idle and 12 slow clients are connected, "
    "and closes each of them once its request time is up",
    "[operations][integration][http]") {
  TestLoop loop;
  operations::HttpEndpointOptions options;
  options.listen.port = 0;
  auto endpoint = operations::HttpEndpoint::create(loop.get(), options);
  REQUIRE_FALSE(endpoint->start());
  const uint16_t port = endpoint->port();
  {
    test::IdleClients idle(port, 300);
    test::SlowClients slow(port, 12, 1s);
    REQUIRE(loop.run_until([&] { return slow.bytes_sent() >= 12; }, 60s));  // each has begun
    const std::string healthz = exchange(loop, port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(test::http_status(healthz) == 200);
    // Answered before the endpoint's own deadline closed any of them: it waited for none.
    CHECK(idle.still_open() == 300);
    CHECK(slow.closed_by_server() == 0);
    // Then the deadline closes them: a request begun gets 408, an idle connection nothing.
    CHECK(loop.run_until([&] { return slow.closed_by_server() == 12; }, 60s));
    CHECK(slow.first_answer() == "HTTP/1.1 408 Request Timeout");
    CHECK(loop.run_until([&] { return idle.still_open() == 0; }, 60s));
  }
  close_endpoint(loop, endpoint);
}

TEST_CASE(
    "The operations endpoint refuses a body however it is framed, and a second endpoint on its "
    "port does not start",
    "[operations][integration][http]") {
  TestLoop loop;
  operations::HttpEndpointOptions options;
  options.listen.port = 0;
  auto endpoint = operations::HttpEndpoint::create(loop.get(), options);
  REQUIRE_FALSE(endpoint->start());
  const uint16_t port = endpoint->port();
  const std::string big(4 << 20, 'x');
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  const std::string sized = exchange(
      loop, port, head + "Content-Length: " + std::to_string(big.size()) + "\r\n\r\n" + big);
  CHECK(test::http_status(sized) == 413);
  std::string chunks;
  for (size_t at = 0; at < big.size(); at += 65536)
    chunks += "10000\r\n" + big.substr(at, 65536) + "\r\n";
  const std::string chunked =
      exchange(loop, port, head + "Transfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n");
  CHECK(test::http_status(chunked) == 413);
  CHECK(test::http_body(chunked) == "the request has a body, and none is taken here\n");

  operations::HttpEndpointOptions same_port;
  same_port.listen.port = port;
  auto second = operations::HttpEndpoint::create(loop.get(), same_port);
  const client::Error error = second->start();
  CHECK(error.code == std::errc::address_in_use);
  CHECK_THAT(error.message(),
             Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(port)));
  close_endpoint(loop, second);
  close_endpoint(loop, endpoint);
}
