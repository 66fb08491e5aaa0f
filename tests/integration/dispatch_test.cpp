// `retryloop dispatch` against a real broker and a small HTTP application (dispatch_app.py, whose
// answer each message's body chooses): every row of the outcome table, Retry-After, an
// application that is down, slow or overloaded, huge and endless answers, what a request
// carries, a dispatcher killed mid-stream, the Unix socket and TLS targets, and the metrics.

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "retryloop/dispatch/header_encoding.hpp"
#include "retryloop/topology/topology.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;

namespace {

/// A service of its own for one test: its topology file (direct input exchange `<name>.in`, key
/// `key`) and its objects on the broker, declared at the start and deleted at the end.
class DispatchService {
 public:
  /// `settings`: the service's members after name and input (`"retry": {...}` and more).
  DispatchService(retryloop::test::Broker& broker, const std::string& prefix,
                  const std::string& settings)
      : broker_(broker), name_(retryloop::test::unique_name(prefix)) {
    const std::string json = R"({"services": [{"name": ")" + name_ +
                             R"(", "input": {"exchange": ")" + name_ +
                             R"(.in", "type": "direct", "bindings": ["key"]}, )" + settings + "}]}";
    const retryloop::topology::ParseResult parsed = retryloop::topology::parse_topology(json);
    REQUIRE(parsed.ok());
    service_ = parsed.topology->services.at(0);
    broker_.apply(service_);
    file_ = (std::filesystem::temp_directory_path() / (name_ + ".json")).string();
    std::ofstream(file_) << json;
  }
  ~DispatchService() {
    std::filesystem::remove(file_);
    broker_.remove(service_);
  }
  DispatchService(const DispatchService&) = delete;
  DispatchService& operator=(const DispatchService&) = delete;

  const std::string& name() const { return name_; }
  const std::string& file() const { return file_; }

  void publish(const std::string& id, const std::string& body,
               retryloop::amqp::BasicProperties properties = {}) {
    broker_.publish(service_.input.exchange, "key", id, body, std::move(properties));
  }
  /// Publishes without a message-id, persistent.
  void publish_without_id(const std::string& body, retryloop::amqp::BasicProperties properties) {
    properties.delivery_mode = 2;
    retryloop::test::publish_confirmed(broker_.loop, *broker_.channel, service_.input.exchange,
                                       "key", properties, body);
  }
  uint32_t ready() { return broker_.depth(retryloop::topology::input_queue_name(service_)); }
  uint32_t parked() {
    return broker_.depth(retryloop::topology::parking_queue_name(service_.name));
  }
  uint32_t waiting(std::chrono::milliseconds delay) {
    return broker_.depth(retryloop::topology::wait_queue_name(service_.name, delay));
  }
  /// The parked messages by message-id, taken out of the parking queue.
  std::map<std::string, retryloop::client::GetResult> take_parked() {
    std::map<std::string, retryloop::client::GetResult> parked;
    for (auto& message : broker_.drain(retryloop::topology::parking_queue_name(service_.name)))
      parked[message.message.properties.message_id.value_or("")] = std::move(message);
    return parked;
  }

 private:
  retryloop::test::Broker& broker_;
  std::string name_;
  std::string file_;
  retryloop::topology::Service service_;
};

/// A string header of a parked message; empty when it has none.
std::string dispatch_parked_text(const retryloop::client::GetResult& message,
                                 const std::string& name) {
  const retryloop::amqp::FieldValue* value = retryloop::test::header(message, name);
  return value != nullptr && value->as_string() ? std::string(*value->as_string()) : "";
}

int64_t dispatch_parked_attempts(const retryloop::client::GetResult& message) {
  const retryloop::amqp::FieldValue* value = retryloop::test::header(message, "retryloop-attempts");
  return value != nullptr ? value->as_int64().value_or(-1) : -1;
}

/// tests/integration/dispatch_app.py, run for one test: it answers each request as the
/// message's body says, and logs one JSON line per request.
class DispatchApp {
 public:
  /// `args`: `--port N` (else a free port), `--unix PATH`, `--tls-cert F --tls-key F`.
  explicit DispatchApp(const std::vector<std::string>& args = {})
      : log_((std::filesystem::temp_directory_path() /
              (retryloop::test::unique_name("dispatch-app") + ".log"))
                 .string()) {
    std::vector<std::string> argv = {
        "/usr/bin/python3",
        std::string(RETRYLOOP_SOURCE_DIR) + "/tests/integration/dispatch_app.py", log_};
    argv.insert(argv.end(), args.begin(), args.end());
    process_ = std::make_unique<retryloop::test::ChildProcess>(argv);
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (process_->out().find('\n') == std::string::npos && process_->running() &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    const std::string out = process_->out();
    INFO(process_->err());
    REQUIRE(out.find('\n') != std::string::npos);
    listening_ = out.substr(0, out.find('\n'));
  }
  ~DispatchApp() {
    stop();
    std::filesystem::remove(log_);
  }
  DispatchApp(const DispatchApp&) = delete;
  DispatchApp& operator=(const DispatchApp&) = delete;

  int port() const { return std::stoi(listening_); }
  void stop() {
    process_->signal(SIGKILL);
    process_->wait();
  }

  /// Every request logged so far, in the order they arrived.
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_);
    for (std::string line; std::getline(in, line);) {
      auto request = nlohmann::json::parse(line, nullptr, false);
      if (request.is_object()) out.push_back(std::move(request));
    }
    return out;
  }
  /// The requests of message `id` (its ce-id).
  std::vector<nlohmann::json> requests_of(const std::string& id) const;
  /// The message ids it has answered with a 2xx status.
  std::set<std::string> answered_2xx() const;

 private:
  std::string log_;
  std::string listening_;
  std::unique_ptr<retryloop::test::ChildProcess> process_;
};

/// A header field of a logged request (names compared without case); empty when absent.
std::string dispatch_field(const nlohmann::json& request, const std::string& name) {
  for (const auto& [key, value] : request.at("headers").items()) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return value.get<std::string>();
    }
  }
  return "";
}

std::vector<nlohmann::json> DispatchApp::requests_of(const std::string& id) const {
  std::vector<nlohmann::json> out;
  for (auto& request : requests())
    if (dispatch_field(request, "ce-id") == id) out.push_back(std::move(request));
  return out;
}

std::set<std::string> DispatchApp::answered_2xx() const {
  std::set<std::string> ids;
  for (const auto& request : requests()) {
    const int status = request.at("status").get<int>();
    if (status >= 200 && status < 300) ids.insert(dispatch_field(request, "ce-id"));
  }
  return ids;
}

double dispatch_time(const nlohmann::json& request) {
  return request.at("time").get<double>();
}

/// `retryloop dispatch` of one test's service, with --shutdown 5s; killed at the end if the test
/// did not stop it.
class DispatchRun {
 public:
  DispatchRun(const DispatchService& service, const std::string& to,
              const std::vector<std::string>& options = {}) {
    std::vector<std::string> argv = {retryloop::test::built_program("retryloop"),
                                     "dispatch",
                                     "-t",
                                     service.file(),
                                     service.name(),
                                     "--to",
                                     to,
                                     "--url",
                                     retryloop::test::broker_url(),
                                     "--shutdown",
                                     "5s"};
    argv.insert(argv.end(), options.begin(), options.end());
    process_ = std::make_unique<retryloop::test::ChildProcess>(
        argv, std::vector<std::string>{"RETRYLOOP_URL=", "RETRYLOOP_TOPOLOGY="});
  }

  retryloop::test::ChildProcess& process() { return *process_; }
  std::string log() const { return process_->err(); }

  /// Stops it with SIGTERM; its exit code (-1 when it still runs after 30 s).
  int stop() {
    process_->signal(SIGTERM);
    return process_->wait(30000);
  }

  /// The port of its --http endpoint, once it has logged it; 0 if it never does.
  uint16_t http_port() {
    if (http_port_ != 0) return http_port_;
    const std::regex listening("operations endpoint on http://127\\.0\\.0\\.1:([0-9]+)/");
    const auto until = std::chrono::steady_clock::now() + 30s;
    for (std::smatch match; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(20ms)) {
      const std::string text = log();
      if (std::regex_search(text, match, listening)) {
        http_port_ = uint16_t(std::stoi(match.str(1)));
        break;
      }
      if (!process_->running()) break;
    }
    return http_port_;
  }

  /// Its /metrics; empty when it does not answer.
  std::string metrics() {
    httplib::Client client("127.0.0.1", http_port());
    client.set_read_timeout(10, 0);
    const auto answer = client.Get("/metrics");
    return answer && answer->status == 200 ? answer->body : "";
  }

  /// The value of the first sample of `metrics` whose line begins with `sample` (a name and the
  /// first labels: `retryloop_dispatch_answers_total{service="x",class="2xx"`); -1 when none.
  static double value(const std::string& metrics, const std::string& sample) {
    std::istringstream lines(metrics);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(sample, 0) == 0 && line.size() > sample.size() &&
          (line[sample.size()] == ' ' || line[sample.size()] == '}' ||
           line[sample.size()] == ',')) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return -1;
  }

 private:
  std::unique_ptr<retryloop::test::ChildProcess> process_;
  uint16_t http_port_ = 0;
};

/// Waits for `condition` (the timeout is a bound on a hang, not on speed); on a timeout the
/// failure shows what the dispatcher logged.
bool dispatch_eventually(retryloop::test::TestLoop& loop, DispatchRun& run,
                         const std::function<bool()>& condition,
                         std::chrono::milliseconds timeout = 60s) {
  if (retryloop::test::eventually(loop, condition, timeout)) return true;
  UNSCOPED_INFO("the dispatcher logged:\n" << run.log());
  return false;
}

std::string dispatch_url(const DispatchApp& app) {
  return "http://127.0.0.1:" + std::to_string(app.port()) + "/orders";
}

/// A loopback port that nothing listens on (as long as nothing takes it).
int dispatch_free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  const bool bound = bind(s, reinterpret_cast<sockaddr*>(&address), size) == 0 &&
                     getsockname(s, reinterpret_cast<sockaddr*>(&address), &size) == 0;
  close(s);
  REQUIRE(bound);
  return ntohs(address.sin_port);
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM); -1 when it cannot be read.
long dispatch_memory_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

std::string dispatch_http_date(std::chrono::system_clock::time_point at) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(at);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &utc);
  return text;
}

/// A throwaway CA and a server certificate it signed for localhost and 127.0.0.1.
struct DispatchCertificates {
  std::filesystem::path dir;
  DispatchCertificates()
      : dir(std::filesystem::temp_directory_path() / retryloop::test::unique_name("dispatch-tls")) {
    std::filesystem::create_directories(dir);
    const std::string command =
        "cd '" + dir.string() +
        "' && openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days 1 "
        "-subj '/CN=dispatch test CA' -keyout ca.key -out ca.pem 2>/dev/null && openssl req "
        "-x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days 1 -subj "
        "'/CN=localhost' -CA ca.pem -CAkey ca.key -addext "
        "'subjectAltName=DNS:localhost,IP:127.0.0.1' -keyout server.key -out server.pem "
        "2>/dev/null";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  ~DispatchCertificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  DispatchCertificates(const DispatchCertificates&) = delete;
  DispatchCertificates& operator=(const DispatchCertificates&) = delete;
  std::string file(const char* name) const { return (dir / name).string(); }
};

/// A message body that tells the application how to answer.
std::string dispatch_plan(const nlohmann::json& plan) {
  return plan.dump();
}

/// `table` with its entries in the order RabbitMQ gives them: 4.0 and later sort a message's
/// headers by name as it comes in, 3.10 when it dead-letters it (nested tables keep their order).
retryloop::amqp::FieldTable dispatch_broker_order(retryloop::amqp::FieldTable table) {
  std::stable_sort(table.begin(), table.end(),
                   [](const auto& a, const auto& b) { return a.name < b.name; });
  return table;
}

}  // namespace

TEST_CASE("dispatch: a 2xx answer acks the message, which the application sees once",
          "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-ok",
                          R"("retry": {"delays": ["300ms"], "max_attempts": 3})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  const std::vector<int> statuses = {200, 201, 202, 204};
  for (int status : statuses)
    service.publish("ok-" + std::to_string(status),
                    dispatch_plan({{"status", status}, {"body", "fine"}}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 4; }));
  CHECK(run.stop() == 0);
  // Acked: a delivery still unsettled at the stop would be back in the queue.
  CHECK(service.ready() == 0);
  CHECK(service.waiting(300ms) == 0);
  CHECK(service.parked() == 0);
  for (int status : statuses) {
    const auto requests = app.requests_of("ok-" + std::to_string(status));
    REQUIRE(requests.size() == 1);
    CHECK(requests[0].at("status") == status);
    CHECK(dispatch_field(requests[0], "Retryloop-Attempt") == "1");
  }
}

TEST_CASE(
    "dispatch: 500, 408 and 409 are retried after the service's delay, the next request with "
    "Retryloop-Attempt 2, and parked as exhausted after max_attempts",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-retry",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 2})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  const std::vector<int> statuses = {500, 408, 409};
  for (int status : statuses)
    service.publish("retry-" + std::to_string(status),
                    dispatch_plan({{"status", status}, {"body", "try later"}}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return service.parked() == 3; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  auto parked = service.take_parked();
  for (int status : statuses) {
    const std::string id = "retry-" + std::to_string(status);
    INFO(id);
    const auto requests = app.requests_of(id);
    REQUIRE(requests.size() == 2);
    CHECK(dispatch_field(requests[0], "Retryloop-Attempt") == "1");
    CHECK(dispatch_field(requests[1], "Retryloop-Attempt") == "2");
    CHECK(dispatch_field(requests[1], "Retryloop-Max-Attempts") == "2");
    // The broker counts its TTL in whole milliseconds: up to 1 ms short passes.
    CHECK(dispatch_time(requests[1]) - dispatch_time(requests[0]) > 0.300 - 0.001);
    REQUIRE(parked.count(id) == 1);
    CHECK(dispatch_parked_text(parked[id], "retryloop-reason") == "exhausted");
    CHECK(dispatch_parked_attempts(parked[id]) == 2);
    CHECK_THAT(
        dispatch_parked_text(parked[id], "retryloop-error"),
        Catch::Contains("answered " + std::to_string(status)) && Catch::Contains("try later"));
  }
}

TEST_CASE(
    "dispatch: 400, 404, 410, 413, 415 and 422 park the message at once as permanent, the "
    "status and the answer's body in retryloop-error",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-permanent",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 5})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  const std::vector<int> statuses = {400, 404, 410, 413, 415, 422};
  for (int status : statuses) {
    service.publish(
        "permanent-" + std::to_string(status),
        dispatch_plan({{"status", status},
                       {"body", R"({"error": "refused )" + std::to_string(status) + R"("})"}}));
  }

  REQUIRE(dispatch_eventually(loop, run, [&] { return service.parked() == 6; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.waiting(300ms) == 0);
  auto parked = service.take_parked();
  for (int status : statuses) {
    const std::string id = "permanent-" + std::to_string(status);
    INFO(id);
    CHECK(app.requests_of(id).size() == 1);
    REQUIRE(parked.count(id) == 1);
    CHECK(dispatch_parked_text(parked[id], "retryloop-reason") == "permanent");
    CHECK(dispatch_parked_attempts(parked[id]) == 1);
    CHECK_THAT(dispatch_parked_text(parked[id], "retryloop-error"),
               Catch::Contains("answered " + std::to_string(status)) &&
                   Catch::Contains(R"({"error": "refused )" + std::to_string(status) + R"("})"));
  }
}

TEST_CASE(
    "dispatch: a Retryloop-Outcome answer header decides instead of the status: poison and "
    "permanent park, drop leaves nothing, ack on a 500 acks",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-override",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 3})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  const auto saying = [](int status, const char* outcome) {
    return dispatch_plan({{"status", status}, {"headers", {{"Retryloop-Outcome", outcome}}}});
  };
  service.publish("poison", saying(200, "poison"));
  service.publish("permanent", saying(204, "Permanent"));
  service.publish("drop", saying(500, "drop"));
  service.publish("ack", saying(500, "ack"));

  REQUIRE(dispatch_eventually(loop, run, [&] {
    return service.parked() == 2 && app.requests_of("drop").size() == 1 &&
           app.requests_of("ack").size() == 1;
  }));
  CHECK(run.stop() == 0);
  // Neither dropped nor acked message waits for a retry, nor is back in the queue.
  CHECK(service.waiting(300ms) == 0);
  CHECK(service.ready() == 0);
  auto parked = service.take_parked();
  REQUIRE(parked.size() == 2);
  CHECK(dispatch_parked_text(parked["poison"], "retryloop-reason") == "poison");
  CHECK(dispatch_parked_text(parked["permanent"], "retryloop-reason") == "permanent");
  for (const char* id : {"poison", "permanent", "drop", "ack"}) {
    INFO(id);
    CHECK(app.requests_of(id).size() == 1);
  }
}

TEST_CASE(
    "dispatch: Retry-After on a retry, in seconds or as an HTTP-date, chooses the delay: the next "
    "attempt comes no sooner",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  // A plain retry waits 200 ms; a Retry-After of up to 3 s takes the 3 s tier.
  DispatchService service(
      broker, "dispatch-retry-after",
      R"("retry": {"mode": "republish", "delays": ["200ms", "3s"], "max_attempts": 3})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  // Whole seconds, so at most 3 s from now.
  const auto date = std::chrono::system_clock::now() + 3s;
  const double date_seconds = double(std::chrono::system_clock::to_time_t(date));
  service.publish(
      "seconds",
      dispatch_plan({{"status", 500}, {"times", 1}, {"headers", {{"Retry-After", "2"}}}}));
  service.publish("date",
                  dispatch_plan({{"status", 500},
                                 {"times", 1},
                                 {"headers", {{"Retry-After", dispatch_http_date(date)}}}}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 2; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.parked() == 0);
  const auto seconds = app.requests_of("seconds");
  REQUIRE(seconds.size() == 2);
  CHECK(dispatch_field(seconds[1], "Retryloop-Attempt") == "2");
  CHECK(dispatch_time(seconds[1]) - dispatch_time(seconds[0]) > 2.0 - 0.001);
  const auto dated = app.requests_of("date");
  REQUIRE(dated.size() == 2);
  CHECK(dispatch_field(dated[1], "Retryloop-Attempt") == "2");
  CHECK(dispatch_time(dated[1]) > date_seconds - 0.001);
}

TEST_CASE(
    "dispatch: a 429 with Retry-After holds the message uncharged, and no request reaches the "
    "application before Retry-After has passed",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  // One attempt: a charged message would be parked at once.
  DispatchService service(broker, "dispatch-overloaded",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 1})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app), {"--http", "127.0.0.1:0"});
  REQUIRE(run.http_port() != 0);
  service.publish(
      "busy",
      dispatch_plan({{"status", 429}, {"requests", 1}, {"headers", {{"Retry-After", "2"}}}}));
  REQUIRE(dispatch_eventually(loop, run, [&] { return !app.requests_of("busy").empty(); }));
  const double answered = dispatch_time(app.requests_of("busy").at(0));
  // The next message comes once the dispatcher has read the 429 (it counts it as it settles the
  // message): before that, on a loaded machine, it may rightly have sent one more.
  const std::string answers_4xx =
      R"(retryloop_dispatch_answers_total{service=")" + service.name() + R"(",class="4xx")";
  REQUIRE(dispatch_eventually(loop, run,
                              [&] { return DispatchRun::value(run.metrics(), answers_4xx) == 1; }));
  service.publish("after", dispatch_plan({}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 2; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.waiting(300ms) == 0);
  CHECK(service.parked() == 0);
  const auto busy = app.requests_of("busy");
  REQUIRE(busy.size() == 2);
  CHECK(busy[0].at("status") == 429);
  CHECK(dispatch_field(busy[1], "Retryloop-Attempt") == "1");
  // The quiet counts from the answer, which came after the request was logged; the loop's clock
  // is in whole milliseconds.
  const auto requests = app.requests();
  for (size_t i = 1; i < requests.size(); ++i) {
    INFO(requests[i].dump());
    CHECK(dispatch_time(requests[i]) - answered > 2.0 - 0.005);
  }
}

TEST_CASE(
    "dispatch: an application that is down costs nothing: no message is charged or parked, it "
    "gets one request per probe interval, and once it is up every message arrives at its first "
    "attempt",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-down",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 1},
                          "outage": {"consecutive_unavailable": 2, "probe_interval": "500ms"})");
  const int port = dispatch_free_port();
  DispatchRun run(service, "http://127.0.0.1:" + std::to_string(port) + "/orders",
                  {"--concurrency", "1", "--http", "127.0.0.1:0"});
  REQUIRE(run.http_port() != 0);
  for (int i = 0; i < 3; ++i)
    service.publish("down-" + std::to_string(i), dispatch_plan({}));

  REQUIRE(dispatch_eventually(
      loop, run, [&] { return run.log().find("breaker closed -> open") != std::string::npos; }));
  const std::string refused =
      R"(retryloop_dispatch_failures_total{service=")" + service.name() + R"(",failure="refused")";
  const auto from = std::chrono::steady_clock::now();
  const double at_open = DispatchRun::value(run.metrics(), refused);
  REQUIRE(at_open >= 2);
  // For at least 2 s, and until it has probed twice (a loaded machine's timers run late).
  double probes = 0;
  std::chrono::steady_clock::duration window{};
  REQUIRE(dispatch_eventually(loop, run, [&] {
    probes = DispatchRun::value(run.metrics(), refused) - at_open;
    window = std::chrono::steady_clock::now() - from;
    return probes >= 2 && window >= 2s;
  }));
  INFO(probes << " requests in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(window).count() << " ms");
  CHECK(probes <= double(window / 500ms) + 1);
  CHECK(service.parked() == 0);

  DispatchApp app({"--port", std::to_string(port)});
  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 3; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.parked() == 0);
  for (const auto& request : app.requests()) {
    CHECK(dispatch_field(request, "Retryloop-Attempt") == "1");
    CHECK(dispatch_field(request, "Retryloop-Redelivered") == "false");
  }
}

TEST_CASE(
    "dispatch: an application slower than --timeout costs nothing: the message is not charged or "
    "parked, it is asked once per probe interval, and acked at its first attempt once it answers "
    "in time",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-slow",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 1},
                          "outage": {"consecutive_unavailable": 2, "probe_interval": "500ms"})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app), {"--concurrency", "1", "--timeout", "500ms"});
  // Four requests time out: two trip the breaker, two are its probes; the fifth is answered.
  service.publish("slow", dispatch_plan({{"status", 200}, {"sleep_ms", 3000}, {"requests", 4}}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.requests_of("slow").size() == 5; }));
  REQUIRE(dispatch_eventually(loop, run, [&] { return service.ready() == 0; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.parked() == 0);
  const auto requests = app.requests_of("slow");
  CHECK(requests.at(4).at("status") == 204);
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i + 1);
    CHECK(dispatch_field(requests[i], "Retryloop-Attempt") == "1");
    // From the trip on, a probe starts a probe interval after the previous one failed.
    if (i >= 2) CHECK(dispatch_time(requests[i]) - dispatch_time(requests[i - 1]) > 0.5 - 0.005);
  }
  CHECK(run.log().find("breaker closed -> open") != std::string::npos);
}

TEST_CASE(
    "dispatch: huge and endless answers are cut at --max-answer: the status still decides, the "
    "error quotes at most 1 KiB, and the dispatcher's memory stays bounded",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-huge",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 3})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app),
                  {"--concurrency", "8", "--max-answer", "65536", "--http", "127.0.0.1:0"});
  REQUIRE(run.http_port() != 0);
  REQUIRE(dispatch_eventually(loop, run, [&] {
    return DispatchRun::value(run.metrics(),
                              R"(retryloop_consuming{service=")" + service.name() + "\"") == 1;
  }));
  const long before_kib = dispatch_memory_kib(run.process().pid(), "VmRSS");
  REQUIRE(before_kib > 0);

  service.publish("huge-422", dispatch_plan({{"status", 422}, {"huge", 5000000}}));
  for (int i = 0; i < 20; ++i)
    service.publish("huge-" + std::to_string(i),
                    dispatch_plan({{"status", 200}, {"huge", 5000000}}));
  for (int i = 0; i < 10; ++i)
    service.publish("endless-" + std::to_string(i),
                    dispatch_plan({{"status", 200}, {"endless", true}}));

  REQUIRE(dispatch_eventually(loop, run, [&] {
    return service.parked() == 1 && app.answered_2xx().size() == 30 && service.ready() == 0;
  }));
  const std::string cut =
      R"(retryloop_dispatch_bodies_cut_total{service=")" + service.name() + "\"";
  REQUIRE(
      dispatch_eventually(loop, run, [&] { return DispatchRun::value(run.metrics(), cut) == 31; }));
  // 31 answers of 5 MB or more went through it, at most 8 at once.
  const long peak_kib = dispatch_memory_kib(run.process().pid(), "VmHWM");
  INFO("VmRSS before: " << before_kib << " KiB, VmHWM after: " << peak_kib << " KiB");
  CHECK(peak_kib - before_kib < 64 * 1024);
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);

  auto parked = service.take_parked();
  REQUIRE(parked.count("huge-422") == 1);
  CHECK(dispatch_parked_text(parked["huge-422"], "retryloop-reason") == "permanent");
  const std::string error = dispatch_parked_text(parked["huge-422"], "retryloop-error");
  CHECK_THAT(error, Catch::Contains("answered 422") && Catch::Contains(std::string(1024, 'x')) &&
                        !Catch::Contains(std::string(1025, 'x')) &&
                        Catch::Contains("cut at 65536 bytes"));
  CHECK(error.size() < 1024 + 256);
}

TEST_CASE(
    "dispatch: the request carries the message as a CloudEvent, retryloop's fields, the trace "
    "context and the AMQP headers, the same on a retry",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(
      broker, "dispatch-request",
      R"("retry": {"mode": "republish", "delays": ["200ms"], "max_attempts": 4})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  retryloop::amqp::FieldTable headers;
  headers.set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  headers.set("tracestate", "congo=t61rcWkgMzE");
  headers.set("Region", "eu");
  headers.set("count", int64_t(42));
  headers.set("small", int32_t(3));
  headers.set("urgent", true);
  headers.set("price", retryloop::amqp::Decimal{2, 1999});
  headers.set("raw", retryloop::amqp::ByteArray{std::string("\x01\x02", 2)});
  headers.set("when", retryloop::amqp::Timestamp{1700000000});
  headers.set("list", retryloop::amqp::FieldArray{"a", int64_t(2)});
  headers.set("nested", retryloop::amqp::FieldTable{{"inner", "value"}});
  retryloop::amqp::BasicProperties properties;
  properties.content_type = "application/json";
  properties.timestamp = 1700000000;
  properties.headers = headers;
  const std::string body = dispatch_plan({{"status", 500}, {"times", 1}});
  service.publish("order-7", body, properties);

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 1; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  const auto requests = app.requests_of("order-7");
  REQUIRE(requests.size() == 2);
  for (size_t i = 0; i < requests.size(); ++i) {
    const nlohmann::json& request = requests[i];
    INFO(request.dump());
    CHECK(request.at("path") == "/orders");
    CHECK(request.at("body_length") == body.size());
    CHECK(dispatch_field(request, "ce-specversion") == "1.0");
    CHECK(dispatch_field(request, "ce-id") == "order-7");
    CHECK(dispatch_field(request, "ce-source") == service.name());
    // The routing key it was published with, also after its trip through the wait queue.
    CHECK(dispatch_field(request, "ce-type") == "key");
    CHECK(dispatch_field(request, "ce-time") == "2023-11-14T22:13:20Z");
    CHECK(dispatch_field(request, "Content-Type") == "application/json");
    CHECK(dispatch_field(request, "traceparent") ==
          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    CHECK(dispatch_field(request, "tracestate") == "congo=t61rcWkgMzE");
    CHECK(dispatch_field(request, "Retryloop-Attempt") == std::to_string(i + 1));
    CHECK(dispatch_field(request, "Retryloop-Max-Attempts") == "4");
    CHECK(dispatch_field(request, "Retryloop-Redelivered") == "false");
    std::string error;
    const auto carried =
        retryloop::dispatch::decode_headers(dispatch_field(request, "Retryloop-Headers"), &error);
    INFO(error);
    REQUIRE(carried);
    CHECK(*carried == dispatch_broker_order(headers));
  }
}

// RabbitMQ 3.10 delivers a message's headers in the order they were published, and sorts them by
// name when it dead-letters the message: the ce-id of a message without a message-id must not
// depend on that order.
TEST_CASE(
    "dispatch: a message without a message-id keeps its ce-id on its retry, whatever the order of "
    "its headers",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(
      broker, "dispatch-anonymous",
      R"("retry": {"mode": "republish", "delays": ["200ms"], "max_attempts": 3})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app));
  retryloop::amqp::BasicProperties properties;
  properties.headers = retryloop::amqp::FieldTable{{"zone", "eu"}, {"Account", int64_t(7)}};
  service.publish_without_id(dispatch_plan({{"status", 500}, {"times", 1}}), properties);

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 1; }));
  CHECK(run.stop() == 0);
  const auto requests = app.requests();
  REQUIRE(requests.size() == 2);
  CHECK_THAT(dispatch_field(requests[0], "ce-id"), Catch::StartsWith("sha256:"));
  CHECK(dispatch_field(requests[1], "ce-id") == dispatch_field(requests[0], "ce-id"));
}

TEST_CASE(
    "dispatch: a dispatcher killed with SIGKILL while requests are in flight loses nothing: "
    "started again, every message is answered and acked, none parked",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-killed",
                          R"("queue_type": "quorum",
                          "retry": {"mode": "republish", "delays": ["1s"], "max_attempts": 3})");
  DispatchApp app;
  const int messages = 200;
  std::set<std::string> published;
  for (int i = 0; i < messages; ++i) {
    const std::string id = "killed-" + std::to_string(i);
    service.publish(id, dispatch_plan({{"sleep_ms", 100}}));
    published.insert(id);
  }
  {
    DispatchRun first(service, dispatch_url(app), {"--concurrency", "16"});
    REQUIRE(dispatch_eventually(loop, first, [&] { return app.requests().size() >= 40; }));
    first.process().signal(SIGKILL);
    CHECK(first.process().wait() == 128 + SIGKILL);
  }
  // Each request takes 100 ms: those of the last 100 ms were still in flight at the kill.
  DispatchRun second(service, dispatch_url(app), {"--concurrency", "16", "--http", "127.0.0.1:0"});
  REQUIRE(second.http_port() != 0);
  const std::string in_flight = R"(retryloop_in_flight_messages{service=")" + service.name() + "\"";
  REQUIRE(dispatch_eventually(loop, second, [&] {
    return app.answered_2xx() == published &&
           DispatchRun::value(second.metrics(), in_flight) == 0 && service.ready() == 0;
  }));
  CHECK(second.stop() == 0);
  // Acked: whatever it still held at the stop would be back in the queue.
  CHECK(service.ready() == 0);
  CHECK(service.waiting(1s) == 0);
  CHECK(service.parked() == 0);
  CHECK(app.answered_2xx() == published);
  // What the killed one had in flight came again, at the same attempt.
  bool redelivered = false;
  for (const auto& request : app.requests()) {
    CHECK(dispatch_field(request, "Retryloop-Attempt") == "1");
    redelivered = redelivered || dispatch_field(request, "Retryloop-Redelivered") == "true";
  }
  CHECK(redelivered);
}

TEST_CASE("dispatch: a Unix socket target gets the request on its path",
          "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-unix",
                          R"("retry": {"delays": ["300ms"], "max_attempts": 3})");
  const std::string socket =
      (std::filesystem::temp_directory_path() / ("dispatch-" + std::to_string(getpid()) + ".sock"))
          .string();
  DispatchApp app({"--unix", socket});
  DispatchRun run(service, "unix:" + socket + ":/orders");
  service.publish("over-unix", dispatch_plan({}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 1; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  const auto requests = app.requests_of("over-unix");
  REQUIRE(requests.size() == 1);
  CHECK(requests[0].at("path") == "/orders");
  app.stop();
  std::filesystem::remove(socket);
}

TEST_CASE("dispatch: an https target is verified with --ca-file and gets the request",
          "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-tls",
                          R"("retry": {"delays": ["300ms"], "max_attempts": 3})");
  DispatchCertificates certificates;
  DispatchApp app({"--tls-cert", certificates.file("server.pem"), "--tls-key",
                   certificates.file("server.key")});
  DispatchRun run(service, "https://localhost:" + std::to_string(app.port()) + "/orders",
                  {"--ca-file", certificates.file("ca.pem")});
  service.publish("over-tls", dispatch_plan({}));

  REQUIRE(dispatch_eventually(loop, run, [&] { return app.answered_2xx().size() == 1; }));
  CHECK(run.stop() == 0);
  CHECK(service.ready() == 0);
  CHECK(service.parked() == 0);
  CHECK(app.requests_of("over-tls").size() == 1);
}

TEST_CASE(
    "dispatch: /metrics counts the answers by class, the outcomes, the requests' latency "
    "and the pool",
    "[dispatch][integration]") {
  retryloop::test::TestLoop loop;
  retryloop::test::Broker broker(loop);
  DispatchService service(broker, "dispatch-metrics",
                          R"("retry": {"mode": "reject", "delays": ["300ms"], "max_attempts": 1})");
  DispatchApp app;
  DispatchRun run(service, dispatch_url(app), {"--pool", "4", "--http", "127.0.0.1:0"});
  REQUIRE(run.http_port() != 0);
  service.publish("fine", dispatch_plan({}));
  service.publish("invalid", dispatch_plan({{"status", 422}}));
  service.publish("failed", dispatch_plan({{"status", 500}}));

  const std::string labels = R"({service=")" + service.name() + "\"";
  std::string metrics;
  REQUIRE(dispatch_eventually(loop, run, [&] {
    metrics = run.metrics();
    // The ack of the message answered 2xx is counted once the broker has it, after its answer.
    return DispatchRun::value(metrics,
                              "retryloop_dispatch_request_duration_seconds_count" + labels) == 3 &&
           DispatchRun::value(metrics, "retryloop_acked_messages_total" + labels) == 1 &&
           service.parked() == 2;
  }));
  INFO(metrics);
  const auto value = [&](const std::string& name, const std::string& label = "") {
    return DispatchRun::value(metrics, name + labels + label);
  };
  CHECK(value("retryloop_dispatch_answers_total", R"(,class="2xx")") == 1);
  CHECK(value("retryloop_dispatch_answers_total", R"(,class="4xx")") == 1);
  CHECK(value("retryloop_dispatch_answers_total", R"(,class="5xx")") == 1);
  CHECK(value("retryloop_dispatch_failures_total", R"(,failure="refused")") == 0);
  CHECK(value("retryloop_dispatch_outcomes_total", R"(,outcome="ack")") == 1);
  CHECK(value("retryloop_dispatch_outcomes_total", R"(,outcome="permanent")") == 1);
  CHECK(value("retryloop_dispatch_outcomes_total", R"(,outcome="retry")") == 1);
  CHECK(value("retryloop_dispatch_pool_size") == 4);
  CHECK(value("retryloop_dispatch_connections_opened_total") >= 1);
  CHECK(value("retryloop_dispatch_connections_open") <= 4);
  CHECK(value("retryloop_dispatch_bodies_cut_total") == 0);
  CHECK(value("retryloop_acked_messages_total") == 1);
  CHECK(run.stop() == 0);
}
