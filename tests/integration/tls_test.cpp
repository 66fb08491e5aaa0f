#include <unistd.h>

#include <catch2/catch.hpp>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "retryloop/client/connection.hpp"
#include "support/harness.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace retryloop::client;
using retryloop::test::contains;
using retryloop::test::TestLoop;

namespace {

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run the broker tests through scripts/with-broker");
  }
  return value;
}

std::string amqps_port() {
  return required_env("RETRYLOOP_TEST_AMQPS_PORT");
}
/// The throwaway CA that signed the test broker's certificate (for localhost and 127.0.0.1).
std::string test_ca_file() {
  return required_env("RETRYLOOP_TEST_CA_FILE");
}

/// Percent-encodes a URI query value.
std::string percent_encoded(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// The client certificate and key the test broker's CA signed: the broker requires one.
std::string client_cert_file() {
  return required_env("RETRYLOOP_TEST_CLIENT_CERT");
}
std::string client_key_file() {
  return required_env("RETRYLOOP_TEST_CLIENT_KEY");
}

/// `amqps://guest:guest@HOST:PORT/` plus `query`, for the test broker's TLS port, without a
/// client certificate.
ConnectionOptions amqps_without_client_certificate(const std::string& host,
                                                   const std::string& query = "") {
  ConnectionOptions options;
  options.uri = parse_uri("amqps://guest:guest@" + host + ":" + amqps_port() + "/" +
                          (query.empty() ? "" : "?" + query));
  options.connect_timeout = std::chrono::seconds(20);
  return options;
}

/// The same with the client certificate the broker requires, given as options.
ConnectionOptions amqps(const std::string& host, const std::string& query = "") {
  ConnectionOptions options = amqps_without_client_certificate(host, query);
  options.tls.cert_file = client_cert_file();
  options.tls.key_file = client_key_file();
  return options;
}

/// amqps to localhost, verified with the test CA given in the URI.
ConnectionOptions verified_amqps(const std::string& extra_query = "") {
  return amqps("localhost", "cacertfile=" + percent_encoded(test_ca_file()) +
                                (extra_query.empty() ? "" : "&" + extra_query));
}

/// A CA that signed nothing the broker has, made with the openssl command, and a client
/// certificate it signed.
class OtherCa {
 public:
  OtherCa() {
    dir_ = std::filesystem::path(required_env("RETRYLOOP_TEST_BROKER_DIR")) /
           ("tls-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    std::string command =
        "openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days 1 "
        "-subj '/CN=some other CA' -keyout '" +
        (dir_ / "ca.key").string() + "' -out '" + file() +
        "' 2>/dev/null && openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
        "-noenc -days 1 -subj '/CN=a stranger' -CA '" +
        file() + "' -CAkey '" + (dir_ / "ca.key").string() +
        "' -addext 'extendedKeyUsage=clientAuth' -keyout '" + client_key() + "' -out '" +
        client_cert() + "' 2>/dev/null";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  std::string client_cert() const { return (dir_ / "client.pem").string(); }
  std::string client_key() const { return (dir_ / "client.key").string(); }
  ~OtherCa() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  OtherCa(const OtherCa&) = delete;
  OtherCa& operator=(const OtherCa&) = delete;

  std::string file() const { return (dir_ / "ca.pem").string(); }

 private:
  std::filesystem::path dir_;
};

Error connect_error(TestLoop& loop, ConnectionOptions options) {
  std::shared_ptr<Connection> connection;
  Error error = test::try_connect(loop, std::move(options), connection);
  if (!error) test::close(loop, connection);
  return error;
}

/// Connects, declares a queue, publishes one message with a confirm and gets it back.
void round_trip(TestLoop& loop, ConnectionOptions options, const std::string& body = "hello") {
  auto connection = test::connect(loop, std::move(options));
  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("tls");
  QueueOptions queue_options;
  queue_options.durable = false;
  queue_options.auto_delete = true;
  test::declare_queue(loop, *channel, queue, queue_options);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  test::publish_confirmed(loop, *channel, "", queue, {}, body);
  auto messages = test::drain_queue(loop, *connection, queue);
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].message.body == body);
  test::close(loop, connection);
}

}  // namespace

TEST_CASE("A verified amqps connection declares, publishes with a confirm and consumes",
          "[client][integration][tls]") {
  TestLoop loop;
  ConnectionOptions options = verified_amqps();
  std::string name = test::unique_name("tls-connection");
  options.connection_name = name;
  auto connection = test::connect(loop, options);
  CHECK(connection->is_open());
  CHECK(connection->tuning().frame_max == 131072);

  auto channel = test::open_channel(loop, *connection);
  std::string queue = test::unique_name("tls-q");
  test::declare_queue(loop, *channel, queue);
  REQUIRE_FALSE(
      test::wait(loop, [&](CompletionCallback cb) { return channel->confirm_select(cb); }));
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  properties.message_id = "tls-1";
  properties.headers = amqp::FieldTable{{"attempt", int32_t{1}}};
  test::publish_confirmed(loop, *channel, "", queue, properties, "over TLS");

  std::vector<Delivery> deliveries;
  REQUIRE_FALSE(channel->consume(
      queue, ConsumeOptions{},
      [&](Delivery&& delivery) {
        CHECK_FALSE(channel->ack(delivery.delivery_tag));
        deliveries.push_back(std::move(delivery));
      },
      [](const Error& error, const std::string&) { REQUIRE_FALSE(error); }));
  REQUIRE(loop.run_until([&] { return deliveries.size() == 1; }));
  CHECK(deliveries[0].message.body == "over TLS");
  CHECK(deliveries[0].message.properties == properties);

  // The broker sees a TLS connection.
  std::string listing;
  REQUIRE(test::broker_ctl("list_connections -q ssl ssl_protocol client_properties", &listing) ==
          0);
  INFO(listing);
  bool found = false;
  for (size_t start = 0; start < listing.size();) {
    size_t end = listing.find('\n', start);
    std::string line = listing.substr(start, end - start);
    if (contains(line, name)) {
      found = true;
      CHECK(line.rfind("true\ttlsv1.", 0) == 0);
    }
    start = end == std::string::npos ? listing.size() : end + 1;
  }
  CHECK(found);

  REQUIRE_FALSE(channel->queue_delete(queue, false, false, [](const Error&, uint32_t) {}));
  test::close(loop, connection);
  CHECK_FALSE(connection->is_open());
  CHECK(loop.drain());
}

TEST_CASE("The TLS options of ConnectionOptions work like the URI's and take precedence",
          "[client][integration][tls]") {
  TestLoop loop;
  SECTION("a CA file given as an option") {
    ConnectionOptions options = amqps("localhost");
    options.tls.ca_file = test_ca_file();
    round_trip(loop, options);
  }
  SECTION("an IP address is checked against the certificate's IP entry") {
    ConnectionOptions options = amqps("127.0.0.1");
    options.tls.ca_file = test_ca_file();
    round_trip(loop, options);
  }
  SECTION("a server name, for SNI and the check, when connecting by address") {
    ConnectionOptions options = amqps("127.0.0.1", "cacertfile=" + percent_encoded(test_ca_file()));
    options.tls.server_name = "localhost";
    round_trip(loop, options);
  }
  SECTION("the option's CA file replaces the URI's") {
    OtherCa other;
    ConnectionOptions options = amqps("localhost", "cacertfile=" + percent_encoded(other.file()));
    options.tls.ca_file = test_ca_file();
    round_trip(loop, options);
  }
  CHECK(loop.drain());
}

TEST_CASE("A broker certificate from a CA that is not trusted is refused with tls_failed",
          "[client][integration][tls]") {
  TestLoop loop;
  ConnectionOptions options;
  std::string hint;
  SECTION("a CA file of another CA") {
    OtherCa other;
    options = amqps("localhost", "cacertfile=" + percent_encoded(other.file()));
    Error error = connect_error(loop, options);
    INFO(error.message());
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    CHECK(contains(error.message(), "self-signed certificate in certificate chain"));
    CHECK(contains(error.message(), "'CN=retryloop throwaway test CA'"));
    CHECK(contains(error.message(), "its CA is not in '" + other.file() + "'"));
  }
  SECTION("no CA file, so the system's trust store") {
    options = amqps("localhost");
    Error error = connect_error(loop, options);
    INFO(error.message());
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    CHECK(contains(error.message(), "self-signed certificate in certificate chain"));
    CHECK(contains(error.message(), "broker localhost:" + amqps_port()));
    CHECK(contains(error.message(), "give it with cacertfile=PATH"));
  }
  CHECK(loop.drain());
}

TEST_CASE("Peer verification is off only when asked for explicitly", "[client][integration][tls]") {
  TestLoop loop;
  auto refused = [&](ConnectionOptions options) {
    Error error = connect_error(loop, std::move(options));
    INFO(error.message());
    return error.code == make_error_code(ClientError::tls_failed);
  };
  SECTION("by default, with verify_peer, and when the option overrides verify_none") {
    // The broker's CA is in no trust store that the client reads unless told.
    CHECK(refused(amqps("localhost")));
    CHECK(refused(amqps("localhost", "verify=verify_peer")));
    ConnectionOptions options = amqps("localhost", "verify=verify_none");
    options.tls.verify_peer = true;
    CHECK(refused(options));
  }
  SECTION("verify=verify_none in the URI") {
    round_trip(loop, amqps("localhost", "verify=verify_none"));
  }
  SECTION("verify_peer = false in the options, with a name the certificate lacks") {
    ConnectionOptions options = amqps("localhost");
    options.tls.verify_peer = false;
    options.tls.server_name = "not-the-broker.example";
    round_trip(loop, options);
  }
  CHECK(loop.drain());
}

TEST_CASE("A certificate that does not name the server is refused with a hostname mismatch",
          "[client][integration][tls]") {
  TestLoop loop;
  SECTION("server_name_indication in the URI") {
    Error error =
        connect_error(loop, verified_amqps("server_name_indication=not-the-broker.example"));
    INFO(error.message());
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    CHECK(contains(error.message(), "hostname mismatch"));
    CHECK(contains(error.message(), "not valid for 'not-the-broker.example'"));
    CHECK(contains(error.message(), "it names DNS:localhost, IP:127.0.0.1"));
  }
  SECTION("server_name in the options, connecting by address") {
    ConnectionOptions options = amqps("127.0.0.1");
    options.tls.ca_file = test_ca_file();
    options.tls.server_name = "broker.example";
    Error error = connect_error(loop, options);
    INFO(error.message());
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    CHECK(contains(error.message(), "hostname mismatch"));
  }
  SECTION("an IP address the certificate does not carry") {
    ConnectionOptions options = amqps("127.0.0.1");
    options.tls.ca_file = test_ca_file();
    options.tls.server_name = "127.0.0.2";
    Error error = connect_error(loop, options);
    INFO(error.message());
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    CHECK(contains(error.message(), "IP address mismatch"));
  }
  CHECK(loop.drain());
}

TEST_CASE("A 1 MB message crosses TLS intact, whatever the frame size",
          "[client][integration][tls]") {
  TestLoop loop;
  std::string body(1024 * 1024, '\0');
  uint32_t state = 12345;
  for (char& c : body) {
    state = state * 1103515245u + 12345u;
    c = static_cast<char>(state >> 24);
  }
  SECTION("negotiated frame_max") {
    round_trip(loop, verified_amqps(), body);
  }
  SECTION("frame_max 8192, the smallest every lane accepts: 129 body frames") {
    round_trip(loop, verified_amqps("frame_max=8192"), body);
  }
  CHECK(loop.drain());
}

TEST_CASE("Over TLS, heartbeats keep an idle connection open and catch a silent broker",
          "[client][integration][tls]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), static_cast<uint16_t>(std::stoi(amqps_port())));
  ConnectionOptions options = amqps("127.0.0.1");
  options.uri.port = proxy.port();
  options.tls.ca_file = test_ca_file();
  options.heartbeat_seconds = 1;
  auto connection = test::connect(loop, options);
  REQUIRE(connection->tuning().heartbeat_seconds == 1);
  Error lost;
  bool is_lost = false;
  connection->set_lost_handler([&](const Error& error) {
    lost = error;
    is_lost = true;
  });
  loop.run_for(std::chrono::milliseconds(3500));
  CHECK_FALSE(is_lost);
  REQUIRE(connection->is_open());
  auto channel = test::open_channel(loop, *connection);
  CHECK(channel->is_open());

  proxy.freeze();
  auto frozen_at = uv_now(loop.get());
  REQUIRE(loop.run_until([&] { return is_lost; }, std::chrono::seconds(30)));
  auto detected_after = uv_now(loop.get()) - frozen_at;
  INFO("declared dead after " << detected_after << " ms");
  CHECK(lost.code == make_error_code(ClientError::heartbeat_timeout));
  CHECK(detected_after >= 1000);  // not before a whole interval of silence
  // Two intervals are 2 to 2.5 s; the rest is room for a loaded machine.
  CHECK(detected_after <= 10000);
  proxy.close();
  CHECK(loop.drain());
}

TEST_CASE("The connect timeout covers a TLS handshake that gets no answer",
          "[client][integration][tls]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), static_cast<uint16_t>(std::stoi(amqps_port())));
  proxy.freeze();
  ConnectionOptions options = amqps("127.0.0.1");
  options.uri.port = proxy.port();
  options.tls.ca_file = test_ca_file();
  options.connect_timeout = std::chrono::milliseconds(1000);
  auto started = uv_now(loop.get());
  Error error = connect_error(loop, options);
  auto took = uv_now(loop.get()) - started;
  INFO(error.message());
  CHECK(error.code == make_error_code(ClientError::connect_timeout));
  CHECK(contains(error.message(), "the TLS handshake did not finish"));
  CHECK(took >= 900);
  CHECK(took <= 5000);
  proxy.close();
  CHECK(loop.drain());
}

TEST_CASE("A TLS connection cut by the network is connection_lost, not tls_failed",
          "[client][integration][tls]") {
  TestLoop loop;
  test::TcpProxy proxy(loop.get(), static_cast<uint16_t>(std::stoi(amqps_port())));
  ConnectionOptions options = amqps("127.0.0.1");
  options.uri.port = proxy.port();
  options.tls.ca_file = test_ca_file();
  auto connection = test::connect(loop, options);
  Error lost;
  bool is_lost = false;
  connection->set_lost_handler([&](const Error& error) {
    lost = error;
    is_lost = true;
  });
  proxy.cut();
  REQUIRE(loop.run_until([&] { return is_lost; }, std::chrono::seconds(10)));
  INFO(lost.message());
  // The consumer reconnects after connection_lost; it gives up on tls_failed.
  CHECK(lost.code == make_error_code(ClientError::connection_lost));
  proxy.close();
  CHECK(loop.drain());
}

TEST_CASE("amqps:// to a plain AMQP port gives tls_failed saying it is not a TLS port",
          "[client][integration][tls]") {
  TestLoop loop;
  ConnectionOptions options;
  options.uri =
      parse_uri("amqps://guest:guest@127.0.0.1:" + required_env("RETRYLOOP_TEST_AMQP_PORT") + "/");
  options.tls.ca_file = test_ca_file();
  Error error = connect_error(loop, options);
  INFO(error.message());
  CHECK(error.code == make_error_code(ClientError::tls_failed));
  CHECK(contains(error.message(), "is not a TLS port"));
  CHECK(loop.drain());
}

TEST_CASE("A CA file that cannot be read fails connect at once, naming the file",
          "[client][integration][tls]") {
  TestLoop loop;
  ConnectionOptions options = amqps("localhost");
  options.tls.ca_file = "/nonexistent/retryloop-ca.pem";
  auto connection = Connection::create(loop.get(), options);
  bool called = false;
  Error error = connection->connect([&](const Error&) { called = true; });
  INFO(error.message());
  CHECK(error.code == make_error_code(ClientError::tls_failed));
  CHECK(contains(error.message(), "cannot load the CA file '/nonexistent/retryloop-ca.pem'"));
  CHECK(loop.drain());
  CHECK_FALSE(called);
}

TEST_CASE(
    "A broker that requires a client certificate takes one its CA signed, from the URI or the "
    "options, and refuses a client without one or with another CA's",
    "[client][integration][tls]") {
  TestLoop loop;
  SECTION("certfile and keyfile in the URI") {
    round_trip(loop, amqps_without_client_certificate(
                         "localhost", "cacertfile=" + percent_encoded(test_ca_file()) +
                                          "&certfile=" + percent_encoded(client_cert_file()) +
                                          "&keyfile=" + percent_encoded(client_key_file())));
  }
  SECTION("no client certificate") {
    Error error =
        connect_error(loop, amqps_without_client_certificate(
                                "localhost", "cacertfile=" + percent_encoded(test_ca_file())));
    INFO(error.message());
    CHECK(error);
    CHECK_FALSE(error.code == make_error_code(ClientError::connect_failed));
    // The broker's alert ("TLS: tlsv13 alert certificate required", "... unknown ca"), or, when
    // the broker closed the socket before the alert was read, a reset.
    CHECK((error.code == make_error_code(ClientError::connection_lost) ||
           error.code == make_error_code(ClientError::tls_failed)));
  }
  SECTION("a certificate of another CA") {
    OtherCa other;
    ConnectionOptions options = amqps_without_client_certificate(
        "localhost", "cacertfile=" + percent_encoded(test_ca_file()));
    options.tls.cert_file = other.client_cert();
    options.tls.key_file = other.client_key();
    Error error = connect_error(loop, options);
    INFO(error.message());
    CHECK(error);
    // The broker's alert ("TLS: tlsv13 alert certificate required", "... unknown ca"), or, when
    // the broker closed the socket before the alert was read, a reset.
    CHECK((error.code == make_error_code(ClientError::connection_lost) ||
           error.code == make_error_code(ClientError::tls_failed)));
  }
  CHECK(loop.drain());
}

TEST_CASE("A client certificate that cannot be used fails connect at once, naming the file and why",
          "[client][integration][tls]") {
  TestLoop loop;
  OtherCa other;
  auto immediate = [&](ConnectionOptions options) {
    auto connection = Connection::create(loop.get(), options);
    bool called = false;
    Error error = connection->connect([&](const Error&) { called = true; });
    CHECK(loop.drain());
    CHECK_FALSE(called);
    CHECK(error.code == make_error_code(ClientError::tls_failed));
    return error.message();
  };
  ConnectionOptions options = verified_amqps();
  options.tls.key_file.reset();
  CHECK(contains(immediate(options), "needs both certfile and keyfile; only certfile is given"));
  options = verified_amqps();
  options.tls.cert_file = "/nonexistent/client.pem";
  CHECK(
      contains(immediate(options), "cannot load the client certificate '/nonexistent/client.pem'"));
  options = verified_amqps();
  options.tls.key_file = other.client_key();  // another certificate's key
  const std::string mismatch = immediate(options);
  INFO(mismatch);
  CHECK(contains(mismatch, "cannot load the client key '" + other.client_key() + "'"));
  CHECK(contains(mismatch, "key values mismatch"));
}
