// The command line given values it must refuse, or a broker that refuses: each is refused before
// anything is sent, with a message that names the mistake and the documented exit code.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

test::CommandRun run_with_all_output_in_err(const std::vector<std::string>& args) {
  test::CommandRun run = test::run_retryloop(args, 120000, {"RETRYLOOP_CONSOLE_TOKEN="});
  run.err += run.out;
  return run;
}

/// A topology file with one service, and delay levels that schedule for its queue unless
/// `scheduled` is false.
struct File {
  std::string name = test::unique_name("hostile");
  std::string path = (fs::temp_directory_path() / (name + ".json")).string();
  explicit File(bool scheduled = true) {
    std::ofstream(path) << "{"
                        << (scheduled
                                ? R"("delay_levels": {"base": "1s", "max": "1h", "queues": [")" +
                                      name + R"("]}, )"
                                : std::string())
                        << R"("services": [{"name": ")" << name << R"(", "input": {"exchange": ")"
                        << name << R"(.in", "type": "direct", "bindings": ["k"]},)"
                        << R"( "retry": {"delays": ["1s"], "max_attempts": 3}}]})";
  }
  ~File() { fs::remove(path); }
  std::vector<std::string> send(std::vector<std::string> args) const {
    std::vector<std::string> out{"send", "-t", path, "--queue", name};
    out.insert(out.end(), args.begin(), args.end());
    return out;
  }
};

}  // namespace

TEST_CASE("send refuses a time zone offset that does not exist instead of sending at once",
          "[cli][integration]") {
  File file;
  for (const char* offset : {"+99:99", "+24:00", "+23:60", "-24:00"}) {
    const std::string at = std::string("2026-11-28T09:00:00") + offset;
    test::CommandRun run = run_with_all_output_in_err(file.send({"--at", at, "body"}));
    INFO(at << ": " << run.err);
    CHECK(run.exit_code == 1);
    CHECK_THAT(run.err, Catch::Contains("--at '" + at + "' is not a time"));
  }
}

TEST_CASE("send refuses a window that is not from 1 to 65535 instead of wrapping it around",
          "[cli][integration]") {
  File file;
  for (const char* window : {"-5", "99999999999", "0", "ten"}) {
    test::CommandRun run =
        run_with_all_output_in_err(file.send({"--delay", "1s", "--window", window, "body"}));
    INFO(window << ": " << run.err);
    CHECK(run.exit_code == 1);
    CHECK_THAT(run.err, Catch::Contains("must be a whole number from 1 to 65535"));
  }
}

TEST_CASE("send names a delay too long for the levels as given, not wrapped around",
          "[cli][integration]") {
  File file;
  test::CommandRun run =
      run_with_all_output_in_err(file.send({"--delay", "9223372036854775001ms", "body"}));
  INFO(run.err);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("a delay of 9223372036854775001ms is longer than"));
  CHECK(run.err.find("-92") == std::string::npos);
}

TEST_CASE("send refuses a header name or message id over 255 bytes as a usage error",
          "[cli][integration]") {
  File file;
  const std::string long_text(256, 'h');
  test::CommandRun header =
      run_with_all_output_in_err(file.send({"--delay", "1s", "b", "--header", long_text + "=v"}));
  INFO(header.err);
  CHECK(header.exit_code == 1);
  CHECK_THAT(header.err, Catch::Contains("--header name"));
  CHECK_THAT(header.err, Catch::Contains("256 bytes long; AMQP allows at most 255"));
  test::CommandRun id =
      run_with_all_output_in_err(file.send({"--delay", "1s", "--message-id", long_text, "b"}));
  INFO(id.err);
  CHECK(id.exit_code == 1);
  CHECK_THAT(id.err, Catch::Contains("--message-id"));
  CHECK_THAT(id.err, Catch::Contains("256 bytes long"));
}

TEST_CASE("send refuses a body over 128 MiB before reading it whole", "[cli][integration]") {
  File file;
  const std::string body = file.path + ".body";
  { std::ofstream out(body, std::ios::binary); }
  fs::resize_file(body, 200u << 20);  // sparse: nothing is written
  test::CommandRun run = run_with_all_output_in_err(file.send({"--delay", "1s", "--file", body}));
  fs::remove(body);
  INFO(run.err);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("is 209715200 bytes; send publishes at most 134217728"));
}

TEST_CASE("send reports a body the broker refuses as refused, with exit 3",
          "[cli][integration][broker-wide]") {
  File file;
  // The broker's limit, lowered for this test; a channel reads it when it opens. It is lowered for
  // every client (the console test parks a 1.5 MiB message), so the test runs alone.
  std::string before;
  REQUIRE(test::broker_ctl("eval 'application:get_env(rabbit, max_message_size).'", &before) == 0);
  REQUIRE(test::broker_ctl("eval 'application:set_env(rabbit, max_message_size, 1048576).'") == 0);
  struct Restore {
    ~Restore() {
      test::broker_ctl("eval 'application:set_env(rabbit, max_message_size, 134217728).'");
    }
  } restore;
  // RabbitMQ 4 keeps the limit it started with (16 MiB by default), and routes before it checks
  // the size: the queue exists, and the body is over the limit either way.
  test::TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  test::declare_queue(loop, *channel, file.name);
  test::close(loop, connection);
  const std::string body = file.path + ".body";
  std::ofstream(body, std::ios::binary)
      << std::string(test::broker_is_4x() ? 17u << 20 : 2u << 20, 'x');
  // Due now: straight to the queue through the default exchange.
  test::CommandRun run = run_with_all_output_in_err(file.send({"--delay", "0ms", "--file", body}));
  fs::remove(body);
  INFO(run.err);
  CHECK(run.exit_code == 3);
  CHECK_THAT(run.err, Catch::Contains("refused by the broker"));
  CHECK_THAT(run.err, Catch::Contains("max size"));
  CHECK(run.err.find("may or may not") == std::string::npos);
}

TEST_CASE("parking stats --fail-above -1 says briefly what it takes", "[cli][integration]") {
  File file;
  test::CommandRun run = run_with_all_output_in_err(
      {"parking", "stats", "-t", file.path, file.name, "--fail-above", "-1"});
  INFO(run.err);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("--fail-above: must be a whole number 0 or more, not '-1'"));
  CHECK(run.err.size() < 400);
}

TEST_CASE("A URL with a bad IPv6 host is named as such, with only its password hidden",
          "[cli][integration]") {
  File file;
  test::CommandRun run = run_with_all_output_in_err(
      {"parking", "list", "-t", file.path, file.name, "--url", "amqp://u:secret@[::1/bad"});
  INFO(run.err);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("lacks ']'"));
  CHECK(run.err.find("secret") == std::string::npos);
}

TEST_CASE("parking serve --tokens given a directory says it is one", "[cli][integration]") {
  File file;
  test::CommandRun run =
      run_with_all_output_in_err({"parking", "serve", "-t", file.path, file.name, "--tokens",
                                  fs::temp_directory_path().string()});
  INFO(run.err);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.err, Catch::Contains("is a directory"));
  CHECK(run.err.find("names nobody") == std::string::npos);
}

TEST_CASE("The console says a request body is not valid JSON, not that it is no JSON object",
          "[console][cli][integration]") {
  File file(false);
  REQUIRE(run_with_all_output_in_err({"topology", "apply", file.path}).exit_code == 0);
  const std::string token = "hostile-token-0123456789";
  test::ChildProcess console(
      {test::built_program("retryloop"), "parking", "serve", "-t", file.path, file.name, "--url",
       test::broker_url(), "--listen", "127.0.0.1:0", "--token", token},
      {"RETRYLOOP_CONSOLE_TOKEN="});
  int port = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (port == 0 && console.running() && std::chrono::steady_clock::now() < deadline) {
    const std::string out = console.out();
    const size_t at = out.find("open  http://127.0.0.1:");
    if (at != std::string::npos) port = std::stoi(out.substr(at + 23));
    std::this_thread::sleep_for(20ms);
  }
  INFO(console.out() + console.err());
  REQUIRE(port != 0);
  httplib::Client http("127.0.0.1", port);
  const httplib::Headers headers{{"X-Retryloop-Token", token}};
  auto overflow =
      http.Post("/api/scan", headers, R"({"where": [], "n": 1e309})", "application/json");
  REQUIRE(overflow);
  CHECK(overflow->status == 400);
  CHECK_THAT(overflow->body, Catch::Contains("is not valid JSON: number overflow"));
  auto surrogate = http.Post("/api/scan", headers, R"({"q": "\ud800"})", "application/json");
  REQUIRE(surrogate);
  CHECK(surrogate->status == 400);
  CHECK_THAT(surrogate->body, Catch::Contains("is not valid JSON"));
  CHECK_THAT(surrogate->body, Catch::Contains("surrogate"));
  auto array = http.Post("/api/scan", headers, "[1]", "application/json");
  REQUIRE(array);
  CHECK_THAT(array->body, Catch::Contains("must be a JSON object"));
  console.signal(SIGTERM);
  CHECK(console.wait() == 0);
  CHECK(
      run_with_all_output_in_err({"topology", "delete", file.path, "--yes", "--force"}).exit_code ==
      0);
}
