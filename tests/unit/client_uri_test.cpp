#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/uri.hpp"

using retryloop::client::Endpoint;
using retryloop::client::HostOrder;
using retryloop::client::parse_uri;
using retryloop::client::Uri;

namespace {

// What parse_uri says of `text`, or "no error".
std::string message_of(const char* text) {
  try {
    parse_uri(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("A full AMQP URI is parsed into its parts", "[client]") {
  Uri uri = parse_uri("amqp://alice:s3cret@broker.example:5673/orders?heartbeat=10&frame_max=8192");
  CHECK_FALSE(uri.tls);
  CHECK(uri.user == "alice");
  CHECK(uri.password == "s3cret");
  CHECK(uri.host == "broker.example");
  CHECK(uri.port == 5673);
  CHECK(uri.vhost == "orders");
  CHECK(uri.heartbeat_seconds == 10);
  CHECK(uri.frame_max == 8192u);
}

TEST_CASE("Missing URI parts take RabbitMQ's defaults", "[client]") {
  Uri uri = parse_uri("amqp://");
  CHECK(uri.user == "guest");
  CHECK(uri.password == "guest");
  CHECK(uri.host == "localhost");
  CHECK(uri.port == 5672);
  CHECK(uri.vhost == "/");
  CHECK(parse_uri("amqps://h").port == 5671);
  CHECK(parse_uri("amqps://h").tls);
  CHECK(parse_uri("amqp://h/").vhost == "/");
  CHECK(parse_uri("amqp://h/orders").vhost == "orders");
}

TEST_CASE("URI parts are percent-decoded", "[client]") {
  Uri uri = parse_uri("amqp://us%40er:p%3Ass%2Fw@h/%2F");
  CHECK(uri.user == "us@er");
  CHECK(uri.password == "p:ss/w");
  CHECK(uri.vhost == "/");
  CHECK(parse_uri("amqp://u@[::1]:5999/v").host == "::1");
  CHECK(parse_uri("amqp://u@[::1]:5999/v").port == 5999);
}

TEST_CASE("A bad URI is refused with a message naming the part at fault", "[client]") {
  CHECK(message_of("http://h").find("scheme") != std::string::npos);
  CHECK(message_of("localhost:5672").find("amqp://") != std::string::npos);
  CHECK(message_of("amqp://h:99999").find("port") != std::string::npos);
  CHECK(message_of("amqp://h:").find("port") != std::string::npos);
  CHECK(message_of("amqp://h/a/b").find("%2F") != std::string::npos);
  CHECK(message_of("amqp://h/%zz").find("vhost") != std::string::npos);
  CHECK(message_of("amqp://h?heartbeat=x").find("heartbeat") != std::string::npos);
  CHECK(message_of("amqp://h?bogus=1").find("bogus") != std::string::npos);
  CHECK(message_of("amqp://u:topsecret@h:x").find("topsecret") == std::string::npos);
}

TEST_CASE("A redacted URI never shows the password", "[client]") {
  Uri uri = parse_uri("amqp://alice:s3cret@h:5672/%2F");
  CHECK(uri.redacted() == "amqp://alice:***@h:5672/%2F");
}

TEST_CASE("A URI names several hosts, each with its port or the scheme's", "[client]") {
  Uri uri = parse_uri("amqp://u:p@h1:5672,h2:5673,h3,[::1]:5999/v?host_order=shuffled");
  CHECK(uri.host == "h1");
  CHECK(uri.port == 5672);
  REQUIRE(uri.other_hosts.size() == 3);
  CHECK(uri.other_hosts[0] == Endpoint{"h2", 5673});
  CHECK(uri.other_hosts[1] == Endpoint{"h3", 5672});
  CHECK(uri.other_hosts[2] == Endpoint{"::1", 5999});
  CHECK(uri.host_order == HostOrder::shuffled);
  CHECK(uri.vhost == "v");
  CHECK(uri.redacted() == "amqp://u:***@h1:5672,h2:5673,h3:5672,[::1]:5999/v");
  CHECK(parse_uri("amqps://a,b").other_hosts.at(0).port == 5671);
  CHECK(parse_uri("amqp://h").host_order == HostOrder::in_order);

  CHECK(message_of("amqp://h1,,h3") == "URI host list has an empty host (host 2)");
  CHECK(message_of("amqp://h1,h2:x").find("port") != std::string::npos);
  CHECK(message_of("amqp://h1,h2:").find("(host 2)") != std::string::npos);
  CHECK(message_of("amqp://h?host_order=random").find("in_order or shuffled") != std::string::npos);
}

TEST_CASE("After losing a host, the URI for reconnecting tries it last", "[client]") {
  Uri uri = parse_uri("amqp://h1:1,h2:2,h3:3");
  Uri next = uri.with_last(Endpoint{"h1", 1});
  CHECK(next.hosts() == std::vector<Endpoint>{{"h2", 2}, {"h3", 3}, {"h1", 1}});
  CHECK(next.with_last(Endpoint{"h3", 3}).hosts() ==
        std::vector<Endpoint>{{"h2", 2}, {"h1", 1}, {"h3", 3}});
  CHECK(uri.with_last(Endpoint{"elsewhere", 1}).hosts() == uri.hosts());
  Uri one = uri.with_only(Endpoint{"h2", 2});
  CHECK(one.hosts() == std::vector<Endpoint>{{"h2", 2}});
}

TEST_CASE("The broker's version is read from its server properties, and sets the least frame_max",
          "[client]") {
  using retryloop::client::broker_min_frame_max;
  using retryloop::client::broker_version;
  auto properties = [](const std::string& version) {
    retryloop::amqp::FieldTable table;
    table.append("product", std::string("RabbitMQ"));
    table.append("version", version);
    return table;
  };
  const auto v436 = broker_version(properties("4.3.6"));
  REQUIRE(v436);
  CHECK(v436->major == 4);
  CHECK(v436->minor == 3);
  CHECK(v436->patch == 6);
  CHECK(v436->text() == "4.3.6");
  CHECK(v436->at_least(4, 1));
  CHECK(v436->at_least(4, 3));
  CHECK_FALSE(v436->at_least(4, 4));
  CHECK_FALSE(v436->at_least(5, 0));
  CHECK(broker_version(properties("3.10.8"))->at_least(3, 9));
  CHECK_FALSE(broker_version(properties("3.10.8"))->at_least(4, 0));
  CHECK(broker_version(properties("4.1"))->text() == "4.1.0");
  CHECK(broker_version(properties("4.2.0-rc.1"))->text() == "4.2.0");
  CHECK_FALSE(broker_version(properties("")));
  CHECK_FALSE(broker_version(properties("4")));
  CHECK_FALSE(broker_version(properties("main")));
  CHECK_FALSE(broker_version(retryloop::amqp::FieldTable{}));

  CHECK(broker_min_frame_max(properties("3.10.8")) == 4096);
  CHECK(broker_min_frame_max(properties("4.0.5")) == 4096);
  CHECK(broker_min_frame_max(properties("4.1.0")) == 8192);
  CHECK(broker_min_frame_max(properties("4.3.6")) == 8192);
  CHECK(broker_min_frame_max(retryloop::amqp::FieldTable{}) == 4096);
}

TEST_CASE("The TLS query options are read, the client certificate's among them", "[client]") {
  auto uri = parse_uri(
      "amqps://u:p@rabbit.example.com/?cacertfile=%2Fetc%2Fca.pem&certfile=%2Fetc%2Fclient.pem"
      "&keyfile=%2Fetc%2Fclient.key&verify=verify_peer&server_name_indication=rabbit");
  CHECK(uri.ca_file == "/etc/ca.pem");
  CHECK(uri.cert_file == "/etc/client.pem");
  CHECK(uri.key_file == "/etc/client.key");
  CHECK(uri.verify_peer == true);
  CHECK(uri.server_name == "rabbit");
  CHECK_FALSE(parse_uri("amqps://h/").cert_file);
}
