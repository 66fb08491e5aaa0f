// A retry consumer whose handler does what each message asks, for the demo and the tests:
//
//   demo_consumer --url URL --topology FILE --service NAME [--concurrency N] [--quiet]
//                 [--http 127.0.0.1:PORT]
//                 [--dependency http://HOST:PORT/PATH [--probe | --no-breaker]]
//
// Bodies:
//   {"id": ..., "fail_times": N}      retry while the attempt is <= N, then ack
//   "retry_after_ms": N with it       each retry asks to wait N ms (Outcome::retry_after; alone,
//                                     it fails once)
//   {"id": ..., "permanent": "why"}   permanent failure: parked at once
//   not a JSON object                 poison: parked at once
//   any other JSON object             ack
//   "sleep_ms": N in an object        the handler first sleeps N ms (a slow handler)
//
// With --dependency, the handler of a message that is neither poison nor permanent first calls
// GET URL?id=<message id> (2 s to connect, 2 s to answer): a 2xx answer lets the body decide as
// above; a refused connection, a timeout or a 5xx means the dependency is unavailable
// (Outcome::unavailable: the service's breaker counts it and the message is not charged), a 429
// that it is overloaded (Outcome::overloaded: not charged either; the breaker lowers the number
// of calls at once); any
// other answer is a retry. --probe gives the consumer a probe function, GET URL?probe=1, so that
// no message is risked while the breaker is open (docs/outage.md). --no-breaker turns an
// unavailable dependency into a retry, charged like any other, as before the breaker existed.
//
// Unless --quiet, one JSON line per handled delivery on stdout:
//   {"time": "12:00:01.250", "id": ..., "attempt": N,
//    "outcome": "ack|retry|permanent|poison|unavailable"}
// with "trace_id" when the message has a W3C traceparent.
// --http serves /metrics (Prometheus), /healthz and /readyz; port 0 picks a free port, and the
// log says which.
// SIGINT or SIGTERM stops it gracefully (exit 0); a second one stops it at once. A fatal error
// (topology drift, refused credentials) exits 3.

#include <uv.h>
#include <retryloop/consumer/consumer.hpp>
#include <retryloop/operations/http_endpoint.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <httplib.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

using namespace retryloop;
using consumer::Outcome;

namespace {

std::mutex output_mutex;

std::string clock_time() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[32];
  std::snprintf(text, sizeof text, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<int>(ms.count()));
  return text;
}

/// An HTTP dependency: `http://host:port/path`.
struct Dependency {
  std::string origin;
  std::string path;

  static Dependency parse(const std::string& url) {
    const std::string scheme = "http://";
    if (url.rfind(scheme, 0) != 0) {
      throw std::invalid_argument("--dependency must be an http:// URL, got " + url);
    }
    const size_t slash = url.find('/', scheme.size());
    Dependency dependency{url.substr(0, slash),
                          slash == std::string::npos ? "/" : url.substr(slash)};
    if (dependency.origin.size() == scheme.size()) {
      throw std::invalid_argument("--dependency has no host: " + url);
    }
    return dependency;
  }

  /// One call: nullopt when it answered 2xx, else the outcome its failure means.
  std::optional<Outcome> call(const std::string& query) const {
    httplib::Client client(origin);
    client.set_connection_timeout(std::chrono::seconds(2));
    client.set_read_timeout(std::chrono::seconds(2));
    const auto result = client.Get(path + "?" + query);
    if (!result) {
      return Outcome::unavailable("dependency " + origin + ": " +
                                  httplib::to_string(result.error()));
    }
    const int status = result->status;
    if (status >= 200 && status < 300) return std::nullopt;
    const std::string error = "dependency " + origin + " answered " + std::to_string(status);
    if (status == 429) return Outcome::overloaded(error);
    if (status >= 500) return Outcome::unavailable(error);
    return Outcome::retry(error);
  }
};

/// What the body asks for, after the dependency when there is one.
Outcome decide(const consumer::Message& message, const std::optional<Dependency>& dependency,
               nlohmann::json& id) {
  nlohmann::json body = nlohmann::json::parse(message.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return Outcome::poison("body is not a JSON object");
  id = body.value("id", nlohmann::json());
  if (auto sleep = body.find("sleep_ms"); sleep != body.end() && sleep->is_number_unsigned()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep->get<uint64_t>()));
  }
  if (auto why = body.find("permanent"); why != body.end()) {
    return Outcome::permanent(why->is_string() ? why->get<std::string>() : why->dump());
  }
  if (dependency) {
    if (auto failed = dependency->call(
            "id=" + httplib::detail::encode_query_param(std::string(message.message_id())))) {
      return *failed;
    }
  }
  auto after = body.find("retry_after_ms");
  const bool asks_delay = after != body.end() && after->is_number_unsigned();
  int64_t fail_times = asks_delay ? 1 : 0;
  if (auto fail = body.find("fail_times"); fail != body.end() && fail->is_number_integer()) {
    fail_times = fail->get<int64_t>();
  }
  if (message.attempt <= fail_times) {
    std::string error = "simulated failure " + std::to_string(message.attempt) + " of " +
                        std::to_string(fail_times);
    if (!asks_delay) return Outcome::retry(std::move(error));
    return Outcome::retry_after(std::chrono::milliseconds(after->get<uint64_t>()),
                                std::move(error));
  }
  return Outcome::ack();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A retry consumer that does what each message's body asks (see the source)."};
  std::string url;
  std::string topology_file;
  std::string service_name;
  uint32_t concurrency = 1;
  uint16_t prefetch = 200;
  bool quiet = false;
  bool verbose = false;
  std::string http;
  std::string dependency_url;
  bool probe = false;
  bool no_breaker = false;
  app.add_option("--url", url,
                 "broker URL, amqp://user:pass@host:port/vhost; several hosts: "
                 "amqp://user:pass@h1:5672,h2:5673/vhost")
      ->envname("RETRYLOOP_URL")
      ->required();
  app.add_option("--topology", topology_file, "topology file")->required();
  app.add_option("--service", service_name, "service in the topology file")->required();
  app.add_option("--concurrency", concurrency, "handlers at once")->check(CLI::Range(1u, 1000u));
  app.add_option("--prefetch", prefetch, "basic.qos prefetch")->check(CLI::Range(1, 65535));
  app.add_option("--http", http,
                 "serve /metrics, /healthz and /readyz on HOST:PORT (a bare PORT: on 127.0.0.1)");
  app.add_option("--dependency", dependency_url,
                 "call GET URL?id=<message id> for each message (http://HOST:PORT/PATH); refused, "
                 "timed out and 5xx are the dependency being unavailable, 429 overloaded");
  app.add_flag("--probe", probe, "with --dependency: probe it with GET URL?probe=1 while open");
  app.add_flag("--no-breaker", no_breaker,
               "with --dependency: a dependency that is down is a retry, charged as any other "
               "(what a consumer did before the breaker; for comparisons)");
  app.add_flag("--quiet", quiet, "print no line per delivery");
  app.add_flag("--verbose", verbose, "log every outcome, acks included");
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("demo_consumer");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");

  topology::ParseResult parsed = topology::load_topology(topology_file);
  if (!parsed.ok()) {
    for (const auto& line : parsed.messages())
      std::fprintf(stderr, "%s\n", line.c_str());
    return 2;
  }
  consumer::ConsumerOptions options;
  operations::HttpEndpointOptions http_options;
  std::optional<Dependency> dependency;
  try {
    if (!dependency_url.empty()) dependency = Dependency::parse(dependency_url);
    if (probe && !dependency) throw std::invalid_argument("--probe needs --dependency");
    options.service = topology::select_services(*parsed.topology, {service_name}).services.at(0);
    options.connection.uri = client::parse_uri(url);
    if (!http.empty()) http_options.listen = operations::parse_listen_address(http);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "demo_consumer: %s\n", e.what());
    return 1;
  }
  options.concurrency = concurrency;
  options.prefetch = prefetch;
  options.logger = logger;
  options.stop_on_signals = true;
  options.metrics_interval = std::chrono::seconds(verbose ? 5 : 0);

  if (dependency && probe) {
    options.probe = [dependency] {
      const std::optional<Outcome> failed = dependency->call("probe=1");
      return !failed || failed->kind != consumer::OutcomeKind::unavailable;  // it answered
    };
  }

  if (no_breaker) options.share_breaker = false;
  auto handler = [quiet, dependency, no_breaker](const consumer::Message& message) {
    nlohmann::json id;
    Outcome outcome = decide(message, dependency, id);
    if (no_breaker && outcome.kind == consumer::OutcomeKind::unavailable) {
      outcome = Outcome::retry(outcome.text);
    }
    if (!quiet) {
      nlohmann::ordered_json line = {{"time", clock_time()},
                                     {"id", id},
                                     {"attempt", message.attempt},
                                     {"outcome", consumer::to_string(outcome.kind)}};
      if (outcome.delay) line["retry_after_ms"] = outcome.delay->count();
      if (auto trace = message.trace_context()) line["trace_id"] = trace->trace_id;
      std::lock_guard<std::mutex> lock(output_mutex);
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
    return outcome;
  };

  uv_loop_t* loop = uv_default_loop();
  auto service_consumer = consumer::Consumer::create(loop, options, consumer::Handler(handler));
  std::shared_ptr<operations::HttpEndpoint> endpoint;
  if (!http.empty()) {
    http_options.logger = logger;
    endpoint = operations::HttpEndpoint::create(loop, http_options);
    endpoint->add(service_consumer);
    if (client::Error error = endpoint->start()) {
      std::fprintf(stderr, "demo_consumer: %s\n", error.message().c_str());
      return 1;
    }
  }
  int exit_code = 0;
  service_consumer->set_stopped_handler([&exit_code, &endpoint](const client::Error& error) {
    if (error) exit_code = 3;
    if (endpoint) endpoint->close();
  });
  if (client::Error error = service_consumer->start()) {
    std::fprintf(stderr, "demo_consumer: %s\n", error.message().c_str());
    if (endpoint) endpoint->close();
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 1;
  }
  service_consumer.reset();  // it keeps itself alive until it stops
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return exit_code;
}
