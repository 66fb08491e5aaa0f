// Several hosts in one URL against a real broker: a connection moves past hosts that refuse, that
// end the handshake or that do not answer, stops at once on wrong credentials, and names every
// host it tried; a consumer whose host goes away carries on on another.

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "retryloop/client/connection.hpp"
#include "support/consumer_fixture.hpp"
#include "support/fake_server.hpp"
#include "support/harness.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::ClientError;
using client::Error;
using test::TestLoop;

namespace {

// A loopback port nothing listens on: a proxy's, once it has closed.
uint16_t refusing_port(TestLoop& loop) {
  test::TcpProxy proxy(loop.get(), test::broker_port());
  const uint16_t port = proxy.port();
  proxy.close();
  return port;
}

// The test broker's URL with `hosts` ("127.0.0.1:1234,...") in place of its host.
client::Uri uri_with_hosts(const std::string& hosts, const std::string& password = "") {
  client::Uri broker = client::parse_uri(test::broker_url());
  return client::parse_uri("amqp://" + broker.user + ":" +
                           (password.empty() ? broker.password : password) + "@" + hosts + "/");
}

std::string local(uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

struct ConnectResult {
  bool done = false;
  Error error;
};

ConnectResult connect_and_wait(TestLoop& loop, client::Connection& connection) {
  ConnectResult outcome;
  REQUIRE_FALSE(connection.connect([&](const Error& error) {
    outcome.done = true;
    outcome.error = error;
  }));
  REQUIRE(loop.run_until([&] { return outcome.done; }, 30s));
  return outcome;
}

}  // namespace

TEST_CASE(
    "A connection moves past a refusing host and one that ends the handshake, opens on the "
    "broker, and tells which host it is on",
    "[client][failover][integration]") {
  TestLoop loop;
  const uint16_t refused = refusing_port(loop);
  test::FakeServer hangs_up(loop.get(), "", true);  // closes right after the protocol header
  client::ConnectionOptions options;
  options.uri = uri_with_hosts(local(refused) + "," + local(hangs_up.port()) + "," +
                               local(test::broker_port()));
  auto connection = client::Connection::create(loop.get(), options);
  ConnectResult outcome = connect_and_wait(loop, *connection);
  INFO(outcome.error.message());
  REQUIRE_FALSE(outcome.error);
  CHECK(connection->is_open());
  CHECK(connection->uri().port == test::broker_port());
  CHECK(connection->uri().other_hosts.empty());
  CHECK(hangs_up.received().substr(0, 4) == "AMQP");  // it was tried, and said nothing
  auto channel = test::open_channel(loop, *connection);
  CHECK(channel != nullptr);
  test::close(loop, connection);
}

TEST_CASE("Wrong credentials stop at the first host: no other host is tried",
          "[client][failover][integration]") {
  TestLoop loop;
  test::TcpProxy second(loop.get(), test::broker_port());
  client::ConnectionOptions options;
  options.uri = uri_with_hosts(local(test::broker_port()) + "," + local(second.port()), "wrong");
  auto connection = client::Connection::create(loop.get(), options);
  ConnectResult outcome = connect_and_wait(loop, *connection);
  CHECK(outcome.error.code == make_error_code(ClientError::authentication_failed));
  loop.run_for(200ms);
  CHECK(second.accepted() == 0);
}

TEST_CASE("When every host fails, the error names each of them and why",
          "[client][failover][integration]") {
  TestLoop loop;
  const uint16_t first = refusing_port(loop);
  test::FakeServer hangs_up(loop.get(), "", true);
  client::ConnectionOptions options;
  options.uri = uri_with_hosts(local(first) + "," + local(hangs_up.port()));
  auto connection = client::Connection::create(loop.get(), options);
  ConnectResult outcome = connect_and_wait(loop, *connection);
  const std::string message = outcome.error.message();
  INFO(message);
  CHECK(outcome.error.code == make_error_code(ClientError::connection_lost));
  CHECK_THAT(message, Catch::Contains(local(first)) && Catch::Contains("connection refused"));
  CHECK_THAT(message, Catch::Contains("during the handshake"));
}

TEST_CASE("A host that does not answer costs one connect timeout, then the next host is tried",
          "[client][failover][integration]") {
  TestLoop loop;
  test::FakeServer silent(loop.get(), "", false);  // accepts, reads, never answers
  client::ConnectionOptions options;
  options.uri = uri_with_hosts(local(silent.port()) + "," + local(test::broker_port()));
  options.connect_timeout = 500ms;
  auto connection = client::Connection::create(loop.get(), options);
  // Work on the loop's thread before the connect leaves the loop's clock behind: the timeout
  // must still be the whole 500 ms, not what is left of it counted from the loop's last turn.
  std::this_thread::sleep_for(300ms);
  const auto started = std::chrono::steady_clock::now();
  ConnectResult outcome = connect_and_wait(loop, *connection);
  INFO(outcome.error.message());
  REQUIRE_FALSE(outcome.error);
  CHECK(std::chrono::steady_clock::now() - started >= 500ms);
  CHECK(connection->uri().port == test::broker_port());
  test::close(loop, connection);
}

TEST_CASE("Shuffled hosts spread connections over every host", "[client][failover][integration]") {
  TestLoop loop;
  test::TcpProxy a(loop.get(), test::broker_port()), b(loop.get(), test::broker_port());
  client::ConnectionOptions options;
  options.uri = uri_with_hosts(local(a.port()) + "," + local(b.port()));
  options.uri.host_order = client::HostOrder::shuffled;
  // Twenty connections land on both hosts (all on one: a chance of 2 in a million).
  for (int i = 0; i < 20; ++i) {
    auto connection = client::Connection::create(loop.get(), options);
    REQUIRE_FALSE(connect_and_wait(loop, *connection).error);
    connection->close();
  }
  CHECK(a.accepted() > 0);
  CHECK(b.accepted() > 0);
  CHECK(a.accepted() + b.accepted() == 20);
}

TEST_CASE("A consumer whose host goes away reconnects to the next host and consumes on",
          "[retry][failover][integration]") {
  TestLoop loop;
  test::Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("fo"), R"("delays": ["200ms"], "max_attempts": 3)");
  broker.apply(service);
  auto first = std::make_unique<test::TcpProxy>(loop.get(), test::broker_port());
  test::TcpProxy second(loop.get(), test::broker_port());
  auto options = test::options_for(service);
  options.connection.uri = uri_with_hosts(local(first->port()) + "," + local(second.port()));
  test::Recorder recorder;
  auto consumer = test::start(loop, options, [&](const consumer::Message& message) {
    recorder.add(message);
    return consumer::Outcome::ack();
  });
  CHECK(second.accepted() == 0);  // in order: the first host took both connections
  REQUIRE(consumer->consuming_from());
  CHECK(consumer->consuming_from()->port == first->port());
  broker.publish(service.input.exchange, "key", "before");
  REQUIRE(loop.run_until([&] { return recorder.of("before").size() == 1; }));

  first.reset();  // the host goes away: its connections end, and it refuses new ones
  REQUIRE(loop.run_until([&] { return consumer->metrics().reconnects == 1; }, 30s));
  CHECK(second.accepted() == 2);  // the consume and the publish connection
  REQUIRE(loop.run_until([&] { return consumer->consuming_from().has_value(); }));
  CHECK(consumer->consuming_from()->port == second.port());
  broker.publish(service.input.exchange, "key", "after");
  REQUIRE(loop.run_until([&] { return recorder.of("after").size() == 1; }));
  test::stop(loop, consumer);
}
