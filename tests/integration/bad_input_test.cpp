// Bad input from the other side: a server that sends garbage or cut frames, a broker that refuses
// a body, and command lines that are wrong. Each gives a clear error, once, and nothing hangs.

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "support/fake_server.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"
#include "unit/codec_support.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::ClientError;
using client::Error;
using test::TestLoop;

namespace {

struct Attempt {
  int calls = 0;
  Error error;
};

/// Connects to a fake server that answers the protocol header with `script`.
Attempt connect_to(const std::string& script, bool close_after,
                   std::chrono::milliseconds timeout = 5s) {
  TestLoop loop;
  Attempt attempt;
  {
    test::FakeServer server(loop.get(), script, close_after);
    client::ConnectionOptions options;
    options.uri =
        client::parse_uri("amqp://guest:guest@127.0.0.1:" + std::to_string(server.port()) + "/");
    options.connect_timeout = timeout;
    auto connection = client::Connection::create(loop.get(), options);
    REQUIRE_FALSE(connection->connect([&](const Error& error) {
      ++attempt.calls;
      attempt.error = error;
    }));
    REQUIRE(loop.run_until([&] { return attempt.calls > 0; }, 10s));
    loop.run_for(100ms);
    CHECK(server.received().substr(0, 8) == std::string("AMQP\0\0\x09\x01", 8));
  }
  CHECK(attempt.calls == 1);
  return attempt;
}

std::string golden_start() {
  return amqp::test::from_hex(amqp::test::kConnectionStart310);
}

bool is(const Error& error, ClientError code) {
  return error.code == make_error_code(code);
}

}  // namespace

TEST_CASE("A server that answers with garbage ends the connection with a protocol error",
          "[client][integration]") {
  Attempt http = connect_to("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", false);
  INFO(http.error.message());
  CHECK(is(http.error, ClientError::protocol_error));

  std::string start = golden_start();
  start.back() = '\x00';  // the frame-end octet must be 0xCE
  Attempt bad_end = connect_to(start, false);
  INFO(bad_end.error.message());
  CHECK(is(bad_end.error, ClientError::protocol_error));
  CHECK_THAT(bad_end.error.message(), Catch::Contains("frame end"));

  // A frame header announcing 4 GiB: refused from the header alone, nothing allocated.
  Attempt huge =
      connect_to(std::string("\x01\x00\x00\xff\xff\xff\xff", 7) + std::string(64, 'x'), false);
  INFO(huge.error.message());
  CHECK(is(huge.error, ClientError::protocol_error));

  Attempt refusal = connect_to(std::string("AMQP\x00\x00\x09\x00", 8), true);
  INFO(refusal.error.message());
  CHECK(is(refusal.error, ClientError::protocol_error));
}

TEST_CASE("A server that cuts a frame short or goes silent ends the attempt once, without a hang",
          "[client][integration]") {
  Attempt cut = connect_to(golden_start().substr(0, 40), true);
  INFO(cut.error.message());
  CHECK(is(cut.error, ClientError::connection_lost));
  CHECK_THAT(cut.error.message(), Catch::Contains("handshake"));

  // Long enough that the client has sent its protocol header (checked) before it gives up, also
  // when a loaded machine holds the loop back.
  Attempt silent = connect_to("", false, 2s);
  INFO(silent.error.message());
  CHECK(is(silent.error, ClientError::connect_timeout));

  // A valid connection.start followed by a method frame that is not one: the payload is cut.
  std::string garbage_method = golden_start() + amqp::test::from_hex("01 0000 00000002 000a ce");
  Attempt method = connect_to(garbage_method, false);
  INFO(method.error.message());
  CHECK(method.calls == 1);
  CHECK(method.error);
}

TEST_CASE("A body larger than the broker allows fails its publish with the broker's reason",
          "[client][integration]") {
  TestLoop loop;
  auto connection = test::connect(loop, test::broker_url());
  auto channel = test::open_channel(loop, *connection);
  REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  const std::string queue = test::unique_name("huge");
  test::declare_queue(loop, *channel, queue);
  // RabbitMQ's default max_message_size is 128 MiB.
  const std::string body(129u << 20, 'x');
  bool done = false;
  client::PublishOutcome result;
  REQUIRE_FALSE(channel->publish("", queue, {}, body, client::Mandatory::yes,
                                 [&](const client::PublishOutcome& outcome) {
                                   result = outcome;
                                   done = true;
                                 }));
  REQUIRE(loop.run_until([&] { return done; }, 60s));
  INFO(result.error.message());
  CHECK(result.status == client::PublishStatus::failed);
  CHECK(result.error.reply_code == 406);
  CHECK_THAT(result.error.message(), Catch::Contains("max size"));
  // The connection survives; only the channel was closed.
  auto again = test::open_channel(loop, *connection);
  CHECK(test::queue_depth(loop, *connection, queue) == 0);
  test::close(loop, connection);
}

TEST_CASE("Wrong parking command lines give a clear message and their documented exit code",
          "[cli][integration]") {
  const std::string name = test::unique_name("badcli");
  const auto file = std::filesystem::temp_directory_path() / (name + ".json");
  std::ofstream(file) << R"({"services": [{"name": ")" << name
                      << R"(", "input": {"exchange": "x.in", "type": "direct", "bindings": ["k"]},)"
                      << R"( "retry": {"delays": ["1s"], "max_attempts": 3}}]})";
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {test::built_program("retryloop"), "parking"};
    argv.insert(argv.end(), args.begin(), args.end());
    test::ChildProcess child(argv, {"RETRYLOOP_URL="});
    int code = child.wait();
    return std::make_pair(code, child.err() + child.out());
  };
  const std::string url = test::broker_url();
  const std::string wrong_password =
      "amqp://guest:not-the-password@" + url.substr(url.find('@') + 1);

  auto [unknown_flag, unknown_flag_text] = run({"list", "--bogus", "-t", file.string(), name});
  CHECK(unknown_flag == 1);
  CHECK_THAT(unknown_flag_text, Catch::Contains("--bogus"));

  auto [bad_url, bad_url_text] =
      run({"list", "-t", file.string(), name, "--url", "amqp://h:notaport/"});
  CHECK(bad_url == 1);
  CHECK_THAT(bad_url_text, Catch::Contains("URL"));

  auto [missing, missing_text] =
      run({"stats", "-t", "/nonexistent/topology.json", name, "--url", url});
  CHECK(missing == 2);
  CHECK_THAT(missing_text, Catch::Contains("/nonexistent/topology.json"));

  auto [unknown, unknown_text] =
      run({"stats", "-t", file.string(), "no-such-service", "--url", url});
  CHECK(unknown == 1);
  CHECK_THAT(unknown_text, Catch::Contains("no-such-service"));

  auto [password, password_text] =
      run({"list", "-t", file.string(), name, "--url", wrong_password});
  CHECK(password == 4);
  CHECK_THAT(password_text, Catch::Contains("user name or password"));
  CHECK_THAT(password_text, !Catch::Contains("not-the-password"));

  auto [no_queue, no_queue_text] = run({"list", "-t", file.string(), name, "--url", url});
  CHECK(no_queue == 3);
  CHECK_THAT(no_queue_text, Catch::Contains(name + ".parking does not exist"));
  std::filesystem::remove(file);
}
