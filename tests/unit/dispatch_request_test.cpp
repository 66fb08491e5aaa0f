// The HTTP request a message becomes (the CloudEvents HTTP binding, binary mode), and the
// reversible encoding of its AMQP headers.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "retryloop/dispatch/header_encoding.hpp"
#include "retryloop/dispatch/request.hpp"
#include "retryloop/retry/headers.hpp"

using namespace retryloop;
using amqp::FieldArray;
using amqp::FieldTable;
using amqp::FieldValue;
using dispatch::decode_headers;
using dispatch::encode_headers;
using dispatch::make_request;
using dispatch::RequestSettings;

namespace {

const char* const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

consumer::Message order_message() {
  consumer::Message message;
  message.body = R"({"order":1})";
  message.properties.content_type = "application/json";
  message.properties.message_id = "order-1";
  message.properties.timestamp = 1700000000;
  message.properties.headers = FieldTable{{"tenant", "acme"}};
  message.exchange = "orders.in";
  message.routing_key = "order.created";
  message.queue = "orders";
  message.attempt = 1;
  return message;
}

const RequestSettings settings{"orders", 5};

FieldTable death(std::string queue, std::string reason, int64_t count) {
  FieldTable entry;
  entry.append("count", count);
  entry.append("reason", std::move(reason));
  entry.append("queue", std::move(queue));
  entry.append("time", amqp::Timestamp{1700000000});
  entry.append("exchange", "orders.in");
  entry.append("routing-keys", FieldArray{FieldValue("order.created")});
  return entry;
}

// The message as the broker hands it back after a rejection and a wait (reject mode).
consumer::Message after_reject(consumer::Message message) {
  FieldTable& headers = *message.properties.headers;
  headers.append("x-death", FieldArray{FieldValue(death("orders", "rejected", 1)),
                                       FieldValue(death("orders.wait.30s", "expired", 1))});
  headers.append("x-first-death-queue", "orders");
  headers.append("x-first-death-reason", "rejected");
  headers.append("x-first-death-exchange", "orders.in");
  message.exchange = "orders.wait";
  message.routing_key = "orders";
  message.attempt = 2;
  return message;
}

// The copy a republish-mode retry makes, as delivered again from its wait queue.
consumer::Message after_republish(consumer::Message message) {
  const retry::AttemptInfo info = retry::read_attempt_info(message.properties, message.queue,
                                                           message.exchange, message.routing_key);
  message.properties = retry::make_retry_copy(message.properties, info, 1700000100, 1700000130000);
  message.exchange = "orders.wait";
  message.routing_key = "orders";
  message.attempt = 2;
  return message;
}

// Visible ASCII with inner spaces: what HTTP/1.1 and HTTP/2 take as a field value.
bool is_legal_value(const std::string& value) {
  if (value.empty() || value.front() == ' ' || value.back() == ' ') return false;
  for (char c : value) {
    if (c < 0x20 || c > 0x7E) return false;
  }
  return true;
}

bool is_token(const std::string& name) {
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return !name.empty();
}

void check_legal(const dispatch::Request& request) {
  for (const auto& [name, value] : request.headers) {
    CAPTURE(name, value);
    CHECK(is_token(name));
    CHECK(is_legal_value(value));
  }
}

FieldTable every_type() {
  FieldTable nested;
  nested.append("Key", "upper");
  nested.append("key", "lower");
  nested.append("\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87", "\xF0\x9F\x98\x80");
  nested.append("deeper", FieldTable{{"list", FieldArray{FieldValue(int32_t(1)),
                                                         FieldValue(FieldTable{{"x", true}})}}});

  FieldTable table;
  table.append("bool true", true);
  table.append("bool false", false);
  table.append("int8 min", int8_t(-128));
  table.append("int8 max", int8_t(127));
  table.append("uint8", uint8_t(255));
  table.append("int16 min", int16_t(-32768));
  table.append("int16 max", int16_t(32767));
  table.append("uint16", uint16_t(65535));
  table.append("int32 min", std::numeric_limits<int32_t>::min());
  table.append("int32 max", std::numeric_limits<int32_t>::max());
  table.append("uint32", std::numeric_limits<uint32_t>::max());
  table.append("int64 min", std::numeric_limits<int64_t>::min());
  table.append("int64 max", std::numeric_limits<int64_t>::max());
  table.append("int64 zero", int64_t(0));
  table.append("float", 1.5f);
  table.append("float tenth", 0.1f);
  table.append("float max", std::numeric_limits<float>::max());
  table.append("float tiny", std::numeric_limits<float>::denorm_min());
  table.append("float integral", 16777216.0f);
  table.append("float infinity", std::numeric_limits<float>::infinity());
  table.append("double", 0.1);
  table.append("double big", 1e300);
  table.append("double tiny", std::numeric_limits<double>::denorm_min());
  table.append("double integral", 3.0);
  table.append("double minus infinity", -std::numeric_limits<double>::infinity());
  table.append("decimal", amqp::Decimal{2, 12345});
  table.append("decimal small", amqp::Decimal{3, 5});
  table.append("decimal zero", amqp::Decimal{0, 0});
  table.append("decimal widest", amqp::Decimal{255, 4294967295u});
  table.append("string", "plain");
  table.append("string empty", "");
  table.append("string escapes",
               std::string("quote\" back\\ nl\n cr\r tab\t nul\0 ctl\x01 del\x7f", 40));
  table.append("string unicode", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xE2\x80\xA8");
  table.append("string not utf-8", "\xFF\xFE ok \xC0\xAF");
  table.append("bytes", amqp::ByteArray{std::string("\0\x01\xFF text", 8)});
  table.append("bytes empty", amqp::ByteArray{});
  table.append("timestamp", amqp::Timestamp{1700000000});
  table.append("timestamp max", amqp::Timestamp{std::numeric_limits<uint64_t>::max()});
  table.append("void", amqp::Void{});
  table.append("array empty", FieldArray{});
  table.append("array mixed",
               FieldArray{FieldValue("a"), FieldValue(int64_t(1)), FieldValue(uint8_t(2)),
                          FieldValue(amqp::Void{}), FieldValue(FieldArray{FieldValue(2.5)}),
                          FieldValue(amqp::ByteArray{"b"})});
  table.append("table", std::move(nested));
  table.append("table empty", FieldTable{});
  table.append("", "empty name");
  table.append("Tenant", "upper case name");
  table.append("tenant", "lower case name");
  return table;
}

/// `table`'s entries sorted by name, as a request carries them.
FieldTable sorted_by_name(const FieldTable& table) {
  std::vector<const amqp::FieldEntry*> entries;
  for (const auto& entry : table)
    entries.push_back(&entry);
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto* a, const auto* b) { return a->name < b->name; });
  FieldTable sorted;
  for (const auto* entry : entries)
    sorted.append(entry->name, entry->value);
  return sorted;
}

}  // namespace

TEST_CASE("A message becomes a CloudEvents request in binary mode", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.content_encoding = "gzip";
  message.properties.headers->append("traceparent", traceparent);
  message.properties.headers->append("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  message.attempt = 3;
  message.redelivered = true;
  const dispatch::Request request = make_request(message, settings);

  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ce-specversion", "1.0"},
      {"ce-id", "order-1"},
      {"ce-source", "orders"},
      {"ce-type", "order.created"},
      {"ce-time", "2023-11-14T22:13:20Z"},
      {"Content-Type", "application/json"},
      {"Content-Encoding", "gzip"},
      {"traceparent", traceparent},
      {"tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
      {"Retryloop-Attempt", "3"},
      {"Retryloop-Max-Attempts", "5"},
      {"Retryloop-Redelivered", "true"},
      {"Retryloop-Headers",
       R"({"tenant":"acme","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",)"
       R"("tracestate":"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"})"},
  };
  CHECK(request.headers == expected);
  CHECK(request.header("CE-ID") == "order-1");
  CHECK(request.header("retryloop-attempt") == "3");
  CHECK(request.header("missing").empty());
  check_legal(request);
}

TEST_CASE("A message with few properties gets the defaults", "[dispatch]") {
  consumer::Message message;
  message.body = "raw";
  message.exchange = "orders.in";
  message.routing_key = "order.created";
  message.queue = "orders";
  const dispatch::Request request = make_request(message, settings);
  CHECK(request.header("ce-specversion") == "1.0");
  CHECK(request.header("ce-id").substr(0, 7) == "sha256:");
  CHECK(request.header("ce-id").size() == 7 + 32);
  CHECK(request.header("ce-source") == "orders");
  CHECK(request.header("ce-type") == "order.created");
  CHECK(request.header("ce-time").empty());
  CHECK(request.header("Content-Type") == "application/octet-stream");
  CHECK(request.header("Content-Encoding").empty());
  CHECK(request.header("traceparent").empty());
  CHECK(request.header("tracestate").empty());
  CHECK(request.header("Retryloop-Attempt") == "1");
  CHECK(request.header("Retryloop-Max-Attempts") == "5");
  CHECK(request.header("Retryloop-Redelivered") == "false");
  CHECK(request.header("Retryloop-Headers").empty());
  CHECK(request.header("Retryloop-Headers-Omitted").empty());
  CHECK(request.headers.size() == 8);
  check_legal(request);

  // An empty message-id is none.
  message.properties.message_id = "";
  CHECK(make_request(message, settings).header("ce-id").substr(0, 7) == "sha256:");
}

TEST_CASE("ce-type is the routing key the message was first published with", "[dispatch]") {
  const consumer::Message message = order_message();
  CHECK(make_request(after_reject(message), settings).header("ce-type") == "order.created");
  CHECK(make_request(after_republish(message), settings).header("ce-type") == "order.created");
  CHECK(make_request(after_republish(after_republish(message)), settings).header("ce-type") ==
        "order.created");

  // Published to a fanout exchange with no routing key: the exchange, else the queue.
  consumer::Message fanout = order_message();
  fanout.routing_key = "";
  CHECK(make_request(fanout, settings).header("ce-type") == "orders.in");
  fanout.exchange = "";
  CHECK(make_request(fanout, settings).header("ce-type") == "orders");
}

TEST_CASE("Without a message-id, every attempt of a message has the same ce-id", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.message_id.reset();
  message.properties.headers->append("region", "eu");  // after "tenant": not sorted
  const std::string id = std::string(make_request(message, settings).header("ce-id"));
  CHECK(id.substr(0, 7) == "sha256:");

  CHECK(make_request(after_reject(message), settings).header("ce-id") == id);
  CHECK(make_request(after_republish(message), settings).header("ce-id") == id);
  CHECK(make_request(after_republish(after_republish(message)), settings).header("ce-id") == id);
  consumer::Message redelivered = message;
  redelivered.redelivered = true;
  CHECK(make_request(redelivered, settings).header("ce-id") == id);
  consumer::Message in_queue = message;
  in_queue.properties.headers->append("x-delivery-count", int64_t(3));
  in_queue.properties.headers->append("x-acquired-count", int64_t(4));
  in_queue.attempt = 4;
  CHECK(make_request(in_queue, settings).header("ce-id") == id);
  // RabbitMQ 3.10 sorts the headers by name when it dead-letters a message.
  consumer::Message dead_lettered = message;
  dead_lettered.properties.headers = sorted_by_name(*message.properties.headers);
  REQUIRE_FALSE(*dead_lettered.properties.headers == *message.properties.headers);
  CHECK(make_request(dead_lettered, settings).header("ce-id") == id);

  // Another message has another id.
  consumer::Message other = message;
  other.body = R"({"order":2})";
  CHECK(make_request(other, settings).header("ce-id") != id);
  other = message;
  other.properties.timestamp = 1700000001;
  CHECK(make_request(other, settings).header("ce-id") != id);
  other = message;
  other.properties.headers->set("tenant", "globex");
  CHECK(make_request(other, settings).header("ce-id") != id);
  other = message;
  other.routing_key = "order.cancelled";
  CHECK(make_request(other, settings).header("ce-id") != id);
  other = message;
  other.properties.correlation_id = "";
  CHECK(make_request(other, settings).header("ce-id") != id);
}

TEST_CASE("ce-time is the timestamp property in RFC 3339, absent without one", "[dispatch]") {
  consumer::Message message = order_message();
  auto time_of = [&](std::optional<uint64_t> timestamp) {
    message.properties.timestamp = timestamp;
    return std::string(make_request(message, settings).header("ce-time"));
  };
  CHECK(time_of(1700000000) == "2023-11-14T22:13:20Z");
  CHECK(time_of(0) == "1970-01-01T00:00:00Z");
  CHECK(time_of(951782400) == "2000-02-29T00:00:00Z");
  CHECK(time_of(4107542399) == "2100-02-28T23:59:59Z");
  CHECK(time_of(253402300799) == "9999-12-31T23:59:59Z");
  CHECK(time_of(253402300800).empty());
  CHECK(time_of(std::numeric_limits<uint64_t>::max()).empty());
  CHECK(time_of(std::nullopt).empty());
}

TEST_CASE("Content-Type and Content-Encoding come from the properties", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.content_type = "text/plain; charset=utf-8";
  CHECK(make_request(message, settings).header("Content-Type") == "text/plain; charset=utf-8");
  message.properties.content_type = "";
  CHECK(make_request(message, settings).header("Content-Type") == "application/octet-stream");
  message.properties.content_type.reset();
  CHECK(make_request(message, settings).header("Content-Type") == "application/octet-stream");
  message.properties.content_encoding = "br";
  CHECK(make_request(message, settings).header("Content-Encoding") == "br");
}

TEST_CASE("traceparent and tracestate go as they are when the traceparent is valid", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.headers->append("traceparent", amqp::ByteArray{traceparent});
  message.properties.headers->append("tracestate", "a=1");
  dispatch::Request request = make_request(message, settings);
  CHECK(request.header("traceparent") == traceparent);
  CHECK(request.header("tracestate") == "a=1");

  message.properties.headers->set("traceparent",
                                  "00-00000000000000000000000000000000-00f067aa0ba902b7-01");
  request = make_request(message, settings);
  CHECK(request.header("traceparent").empty());
  CHECK(request.header("tracestate").empty());

  // A later version may carry more fields: they go as they are, unless they are not legal.
  const std::string later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
  message.properties.headers->set("traceparent", later);
  CHECK(make_request(message, settings).header("traceparent") == later);
  message.properties.headers->set("traceparent", later + "\r\nInjected: yes");
  CHECK(make_request(message, settings).header("traceparent") ==
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

TEST_CASE("The attempt, the maximum and redelivered are the request's own fields", "[dispatch]") {
  consumer::Message message = order_message();
  message.attempt = 7;
  message.redelivered = true;
  dispatch::Request request = make_request(message, RequestSettings{"orders", 10});
  CHECK(request.header("Retryloop-Attempt") == "7");
  CHECK(request.header("Retryloop-Max-Attempts") == "10");
  CHECK(request.header("Retryloop-Redelivered") == "true");
  message.redelivered = false;
  CHECK(make_request(message, settings).header("Retryloop-Redelivered") == "false");
}

TEST_CASE("Nothing in a message can add a header field or break the request", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.message_id = "x\r\nInjected: yes";
  message.routing_key = std::string("order\r\n\0created", 15);
  message.properties.content_type = "text/plain\r\nX-Evil: 1";
  message.properties.content_encoding = "gzip\n";
  message.properties.headers->append("traceparent", traceparent);
  message.properties.headers->append("tracestate", "a=1\r\nX-Evil: 1");
  message.properties.headers->append("x-\r\nname\0", std::string("v\r\n\0\x7f", 5));
  message.properties.headers->append(std::string("\xFF\r\n", 3), "name not UTF-8");
  const dispatch::Request request = make_request(message, RequestSettings{"orders service\r\n", 5});
  check_legal(request);
  CHECK(request.header("ce-id") == "x%0D%0AInjected:%20yes");
  CHECK(request.header("ce-type") == "order%0D%0A%00created");
  CHECK(request.header("ce-source") == "orders%20service%0D%0A");
  CHECK(request.header("Content-Type") == "application/octet-stream");
  CHECK(request.header("Content-Encoding").empty());
  CHECK(request.header("traceparent") == traceparent);
  CHECK(request.header("tracestate").empty());
  CHECK(request.header("X-Evil").empty());
  CHECK(request.header("Injected").empty());

  auto headers = decode_headers(request.header("Retryloop-Headers"));
  REQUIRE(headers);
  CHECK(*headers->find("x-\r\nname") == FieldValue(std::string("v\r\n\0\x7f", 5)));
  CHECK(headers->find(std::string("\xFF\r\n", 3)) == nullptr);
}

TEST_CASE("ce- values are percent-encoded as the CloudEvents HTTP binding asks", "[dispatch]") {
  consumer::Message message = order_message();
  auto id_of = [&](std::string id) {
    message.properties.message_id = std::move(id);
    return std::string(make_request(message, settings).header("ce-id"));
  };
  CHECK(id_of("Euro \xE2\x82\xAC \xF0\x9F\x98\x80") == "Euro%20%E2%82%AC%20%F0%9F%98%80");
  CHECK(id_of("50% \"off\"") == "50%25%20%22off%22");
  CHECK(id_of("a!~'()*+,/:;=?@[]{}|^`<>&$#") == "a!~'()*+,/:;=?@[]{}|^`<>&$#");
  CHECK(id_of("tab\there\x7f") == "tab%09here%7F");
  // Bytes that are not UTF-8 count as U+FFFD, which a CloudEvents reader accepts.
  CHECK(id_of("bad\xFF\xC0\xAF") == "bad%EF%BF%BD%EF%BF%BD%EF%BF%BD");
}

TEST_CASE("Retryloop-Headers carries the application's headers, not the broker's or retryloop's",
          "[dispatch]") {
  consumer::Message message = after_republish(after_reject(order_message()));
  message.properties.headers->append("x-tenant", "acme");
  message.properties.headers->append("Tenant", "upper");
  message.properties.headers->append("x-delivery-count", int64_t(2));
  message.properties.headers->append("x-acquired-count", int64_t(3));
  message.properties.headers->append("x-last-death-queue", "orders");
  message.properties.headers->append("retryloop-history", FieldArray{});
  message.properties.headers->append("x-received-from", FieldArray{});

  auto headers = decode_headers(make_request(message, settings).header("Retryloop-Headers"));
  REQUIRE(headers);
  FieldTable expected;
  expected.append("Tenant", "upper");  // sorted by name, byte by byte
  expected.append("tenant", "acme");
  expected.append("x-received-from", FieldArray{});
  expected.append("x-tenant", "acme");
  CHECK(*headers == expected);

  for (const char* name : {"x-death", "x-first-death-queue", "x-last-death-exchange",
                           "x-delivery-count", "x-acquired-count", "retryloop-retries",
                           "retryloop-history", "retryloop-original-routing-key"}) {
    CAPTURE(name);
    CHECK_FALSE(dispatch::is_carried_header(name));
  }
  for (const char* name : {"tenant", "x-tenant", "Retryloop-Own", "traceparent", "x-deathly"}) {
    CAPTURE(name);
    CHECK(dispatch::is_carried_header(name));
  }
}

TEST_CASE("Headers longer than the bound are left out, and the request says so", "[dispatch]") {
  consumer::Message message = order_message();
  message.properties.headers->append("big", std::string(200, 'x'));
  message.properties.headers->append("tracestate", "a=" + std::string(200, 'y'));
  message.properties.headers->append("traceparent", traceparent);
  RequestSettings small = settings;
  small.max_headers_bytes = 100;
  const std::string whole = encode_headers(sorted_by_name(*message.properties.headers));

  dispatch::Request request = make_request(message, small);
  CHECK(request.header("Retryloop-Headers").empty());
  CHECK(request.header("Retryloop-Headers-Omitted") == std::to_string(whole.size()));
  CHECK(request.header("tracestate").empty());
  CHECK(request.header("traceparent") == traceparent);

  small.max_headers_bytes = whole.size();
  request = make_request(message, small);
  CHECK(request.header("Retryloop-Headers") == whole);
  CHECK(request.header("Retryloop-Headers-Omitted").empty());
  CHECK(request.header("tracestate") == "a=" + std::string(200, 'y'));
}

TEST_CASE("The header encoding gives back every field type exactly", "[dispatch]") {
  const FieldTable table = every_type();
  const std::string encoded = encode_headers(table);
  CAPTURE(encoded);
  CHECK(is_legal_value(encoded));
  std::string error;
  auto decoded = decode_headers(encoded, &error);
  CHECK(error.empty());
  REQUIRE(decoded);
  CHECK(*decoded == table);
  // Type letters and order, entry by entry (operator== compares them too; this says where).
  REQUIRE(decoded->size() == table.size());
  auto a = decoded->begin();
  for (auto b = table.begin(); b != table.end(); ++a, ++b) {
    CAPTURE(b->name);
    CHECK(a->name == b->name);
    CHECK(a->value.type_letter() == b->value.type_letter());
  }
  // Signs of zero and NaN, which == does not tell apart.
  FieldTable zeros{{"f", -0.0f}, {"d", -0.0}, {"fn", std::nanf("")}, {"dn", std::nan("")}};
  decoded = decode_headers(encode_headers(zeros));
  REQUIRE(decoded);
  CHECK(std::signbit(*decoded->find("f")->get_if<float>()));
  CHECK(std::signbit(*decoded->find("d")->get_if<double>()));
  CHECK(std::isnan(*decoded->find("fn")->get_if<float>()));
  CHECK(std::isnan(*decoded->find("dn")->get_if<double>()));
  // Encoding again gives the same text.
  CHECK(encode_headers(*decode_headers(encoded)) == encoded);
}

TEST_CASE("The header encoding is plain JSON where JSON says enough, and tagged elsewhere",
          "[dispatch]") {
  FieldTable table;
  table.append("s", "caf\xC3\xA9\n\"\x7f");
  table.append("l", int64_t(-5));
  table.append("t", true);
  table.append("v", amqp::Void{});
  table.append("a", FieldArray{FieldValue(int64_t(1)), FieldValue("x")});
  table.append("I", int32_t(42));
  table.append("b", int8_t(-1));
  table.append("d", 1.5);
  table.append("f", 2.0f);
  table.append("inf", std::numeric_limits<double>::infinity());
  table.append("D", amqp::Decimal{2, 12345});
  table.append("D0", amqp::Decimal{3, 5});
  table.append("T", amqp::Timestamp{1700000000});
  table.append("x", amqp::ByteArray{"hi!"});
  table.append("S", "\xFF");
  table.append("F", FieldTable{{"k", "v"}});
  table.append("\xF0\x9F\x98\x80", "emoji name");
  CHECK(encode_headers(table) ==
        R"({"s":"caf\u00e9\n\"\u007f","l":-5,"t":true,"v":null,"a":[1,"x"],"I":{"I":42},)"
        R"("b":{"b":-1},"d":{"d":1.5},"f":{"f":2.0},"inf":{"d":"Infinity"},"D":{"D":"123.45"},)"
        R"("D0":{"D":"0.005"},"T":{"T":1700000000},"x":{"x":"aGkh"},"S":{"S":"/w=="},)"
        R"("F":{"F":{"k":"v"}},"\ud83d\ude00":"emoji name"})");
  CHECK(encode_headers(FieldTable{}) == "{}");
}

TEST_CASE("The header encoding keeps the first of two entries with one name", "[dispatch]") {
  FieldTable table;
  table.append("a", "first");
  table.append("b", "other");
  table.append("a", "second");
  CHECK(encode_headers(table) == R"({"a":"first","b":"other"})");
}

TEST_CASE("The header decoding reads what other programs write by the same rules", "[dispatch]") {
  auto decoded = decode_headers(
      " {\n \"caf\xC3\xA9\" : \"\\u00e9t\xC3\xA9\" , \"n\": {\"l\": 7}, \"d\": {\"d\": 2},"
      " \"f\": {\"f\": 0.1}, \"x\": {\"x\": \"aGk\"}, \"S\": {\"S\": \"aGk=\"}, \"bare\": 2.5,"
      " \"big\": {\"T\": 18446744073709551615}, \"e\": {\"d\": 1E2}, \"t\": {\"t\": false},"
      " \"V\": {\"V\": null}, \"A\": {\"A\": [{\"u\": 7}]} } ");
  REQUIRE(decoded);
  FieldTable expected;
  expected.append("caf\xC3\xA9", "\xC3\xA9t\xC3\xA9");
  expected.append("n", int64_t(7));
  expected.append("d", 2.0);
  expected.append("f", 0.1f);
  expected.append("x", amqp::ByteArray{"hi"});
  expected.append("S", "hi");
  expected.append("bare", 2.5);
  expected.append("big", amqp::Timestamp{std::numeric_limits<uint64_t>::max()});
  expected.append("e", 100.0);
  expected.append("t", false);
  expected.append("V", amqp::Void{});
  expected.append("A", FieldArray{FieldValue(uint16_t(7))});
  CHECK(*decoded == expected);
}

TEST_CASE("The header decoding refuses what is not the encoding, and says why", "[dispatch]") {
  const char* const invalid[] = {
      "",
      "   ",
      "null",
      "42",
      "\"text\"",
      "[]",
      "{",
      "{} trailing",
      "{\"a\":}",
      "{\"a\":{}}",
      "{\"a\":{\"Q\":1}}",
      "{\"a\":{\"II\":1}}",
      "{\"a\":{\"I\":1,\"b\":2}}",
      "{\"a\":{\"b\":128}}",
      "{\"a\":{\"b\":-129}}",
      "{\"a\":{\"B\":-1}}",
      "{\"a\":{\"B\":256}}",
      "{\"a\":{\"s\":32768}}",
      "{\"a\":{\"u\":65536}}",
      "{\"a\":{\"I\":2147483648}}",
      "{\"a\":{\"i\":4294967296}}",
      "{\"a\":{\"l\":9223372036854775808}}",
      "{\"a\":9223372036854775808}",
      "{\"a\":-9223372036854775809}",
      "{\"a\":{\"I\":1.5}}",
      "{\"a\":{\"I\":\"1\"}}",
      "{\"a\":{\"T\":-1}}",
      "{\"a\":{\"T\":1.0}}",
      "{\"a\":{\"t\":1}}",
      "{\"a\":{\"V\":0}}",
      "{\"a\":{\"d\":\"one\"}}",
      "{\"a\":{\"d\":1e999}}",
      "{\"a\":{\"f\":1e39}}",
      "{\"a\":{\"D\":\"1.2.3\"}}",
      "{\"a\":{\"D\":\"-1\"}}",
      "{\"a\":{\"D\":\"1.\"}}",
      "{\"a\":{\"D\":\".5\"}}",
      "{\"a\":{\"D\":\"4294967296\"}}",
      "{\"a\":{\"D\":1}}",
      "{\"a\":{\"x\":\"!!!!\"}}",
      "{\"a\":{\"x\":\"a\"}}",
      "{\"a\":{\"x\":5}}",
      "{\"a\":{\"S\":\"a=b=\"}}",
      "{\"a\":{\"F\":[]}}",
      "{\"a\":{\"F\":1}}",
      "{\"a\":{\"A\":{}}}",
      "{\"a\":{\"A\":1}}",
      "{\"a\":1,\"a\":2}",
      "{\"a\":{\"F\":{\"b\":1,\"b\":1}}}",
      "{\"a\":\"\xFF\"}",
      "{\"a\":\"\\ud800\"}",
      "{\"a\":1} {}",
      "{\"a\":1,}",
      "{'a':1}",
      "{\"a\":NaN}",
      "{\"a\":[1,]}",
  };
  for (const char* text : invalid) {
    CAPTURE(text);
    std::string error;
    CHECK_FALSE(decode_headers(text, &error));
    CHECK_FALSE(error.empty());
  }
  std::string error;
  CHECK_FALSE(decode_headers(R"({"a":{"Q":1}})", &error));
  CHECK(error == "\"Q\" is not a type letter (one of tbBsuIilfdDSxATFV)");
  CHECK_FALSE(decode_headers(R"({"a":{"b":300}})", &error));
  CHECK(error == "type \"b\" cannot hold 300");
  CHECK_FALSE(decode_headers(R"({"a":1,"a":2})", &error));
  CHECK(error == "\"a\" is named twice");
  CHECK_FALSE(decode_headers("[1]", &error));
  CHECK(error == "the headers are not a JSON object");
  CHECK_FALSE(decode_headers("{", &error));
  CHECK(error.substr(0, 9) == "not JSON:");
}

TEST_CASE("The header decoding refuses nesting deeper than AMQP allows, at any depth",
          "[dispatch]") {
  // The table is level 1; 63 arrays in it make 64 levels, as the AMQP codec allows.
  auto nested = [](size_t arrays) {
    return "{\"a\":" + std::string(arrays, '[') + std::string(arrays, ']') + "}";
  };
  CHECK(decode_headers(nested(63)));
  std::string error;
  CHECK_FALSE(decode_headers(nested(64), &error));
  CHECK(error == "tables and arrays nest deeper than 64 levels");
  CHECK_FALSE(decode_headers(nested(100000)));
  CHECK_FALSE(decode_headers(std::string(100000, '{')));

  // Tables in tags count a level each, as in AMQP.
  std::string tables = "{}";
  for (int i = 0; i < 63; ++i)
    tables = "{\"t\":{\"F\":" + tables + "}}";
  CHECK(decode_headers(tables));
  CHECK_FALSE(decode_headers("{\"t\":{\"F\":" + tables + "}}"));
}

TEST_CASE("The request's headers decode to the carried headers, sorted by name", "[dispatch]") {
  consumer::Message message = order_message();
  FieldTable table = every_type();
  table.append("x-death", FieldArray{FieldValue(death("orders", "rejected", 1))});
  table.append("retryloop-retries", int64_t(1));
  message.properties.headers = table;
  const dispatch::Request request = make_request(message, RequestSettings{"orders", 5, 1 << 20});
  check_legal(request);
  auto decoded = decode_headers(request.header("Retryloop-Headers"));
  REQUIRE(decoded);
  CHECK(*decoded == sorted_by_name(every_type()));
  CHECK_FALSE(*decoded == every_type());  // the test's table is not sorted to begin with
}
