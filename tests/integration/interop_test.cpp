// Interoperability with pika, the Python client: tests/interop/pika_headers.py publishes one
// message with every basic property and a header of every type pika can encode, and describes
// it in JSON; the message is then fetched with this client and compared field by field, and
// re-encoded and compared byte by byte with what pika wrote.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/methods.hpp"
#include "retryloop/client/connection.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace retryloop::client;
using retryloop::test::TestLoop;
// Keeps the key order of the script's output, which is the wire order of the headers.
using Json = nlohmann::ordered_json;

namespace {

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string from_hex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>((nibble(hex[i]) << 4) | nibble(hex[i + 1])));
  }
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

/// Runs `command` through the shell and returns its stdout; fails the test unless it exits 0.
/// Its stderr goes to the test's stderr.
std::string run_capturing(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0)
    out.append(buffer, n);
  int status = ::pclose(pipe);
  INFO(command);
  INFO("stdout: " << out);
  REQUIRE(status != -1);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return out;
}

void check_table(const Json& expected, const amqp::FieldTable& actual, const std::string& path);

/// Checks one decoded value against the script's {"type": letter, "value": ...}.
void check_value(const Json& expected, const amqp::FieldValue& actual, const std::string& path) {
  INFO("header " << path);
  const std::string letter = expected.at("type").get<std::string>();
  const Json& value = expected.at("value");
  REQUIRE(letter.size() == 1);
  CHECK(std::string(1, actual.type_letter()) == letter);
  if (std::string(1, actual.type_letter()) != letter) return;

  switch (letter[0]) {
    case 't':
      CHECK(*actual.get_if<bool>() == value.get<bool>());
      break;
    case 'b':
    case 'B':
    case 's':
    case 'u':
    case 'I':
    case 'i':
    case 'l':
      // The letter pins the alternative; the value must fit it exactly.
      REQUIRE(actual.as_int64().has_value());
      CHECK(*actual.as_int64() == value.get<int64_t>());
      break;
    case 'D': {
      const amqp::Decimal& d = *actual.get_if<amqp::Decimal>();
      CHECK(int{d.scale} == value.at("scale").get<int>());
      CHECK(int64_t{d.value} == value.at("value").get<int64_t>());
      break;
    }
    case 'S':
      CHECK(*actual.get_if<std::string>() == value.get<std::string>());
      break;
    case 'x':
      CHECK(to_hex(actual.get_if<amqp::ByteArray>()->bytes) == value.get<std::string>());
      break;
    case 'T':
      CHECK(actual.get_if<amqp::Timestamp>()->seconds == value.get<uint64_t>());
      break;
    case 'V':
      CHECK(value.is_null());
      break;
    case 'F':
      check_table(value, *actual.get_if<amqp::FieldTable>(), path);
      break;
    case 'A': {
      const amqp::FieldArray& array = *actual.get_if<amqp::FieldArray>();
      REQUIRE(value.is_array());
      CHECK(array.size() == value.size());
      for (size_t i = 0; i < array.size() && i < value.size(); ++i) {
        check_value(value[i], array[i], path + "[" + std::to_string(i) + "]");
      }
      break;
    }
    default:
      FAIL_CHECK("the script reports a type letter this test does not know: " << letter);
  }
}

/// Whether the broker delivers the top-level headers table sorted by name: RabbitMQ 4.x keeps a
/// message's headers in a form of its own (nested tables keep their order); 3.x delivers the
/// bytes it was given.
bool broker_sorts_headers() {
  return test::broker_is_4x();
}

/// The table with its entries sorted by name, byte by byte, as RabbitMQ 4.x delivers headers.
amqp::FieldTable sorted_by_name(const amqp::FieldTable& table) {
  std::vector<const amqp::FieldEntry*> entries;
  for (const amqp::FieldEntry& entry : table)
    entries.push_back(&entry);
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto* a, const auto* b) { return a->name < b->name; });
  amqp::FieldTable sorted;
  for (const amqp::FieldEntry* entry : entries)
    sorted.append(entry->name, entry->value);
  return sorted;
}

/// Checks names (in order; for the top-level table, in the broker's order) and values of a
/// table against the script's object of {"type", "value"}.
void check_table(const Json& expected, const amqp::FieldTable& actual, const std::string& path) {
  INFO("table " << (path.empty() ? "headers" : path));
  REQUIRE(expected.is_object());
  std::vector<std::string> expected_names;
  for (const auto& item : expected.items())
    expected_names.push_back(item.key());
  if (path.empty() && broker_sorts_headers()) {
    std::sort(expected_names.begin(), expected_names.end());
  }
  std::vector<std::string> actual_names;
  for (const amqp::FieldEntry& entry : actual)
    actual_names.push_back(entry.name);
  CHECK(actual_names == expected_names);

  for (const auto& item : expected.items()) {
    if (const amqp::FieldValue* value = actual.find(item.key())) {
      check_value(item.value(), *value, path.empty() ? item.key() : path + "." + item.key());
    }
  }
}

void check_property(const char* name, const std::optional<std::string>& actual,
                    const Json& expected) {
  INFO("property " << name);
  REQUIRE(actual.has_value());
  CHECK(*actual == expected.get<std::string>());
}

template <class Int>
void check_property(const char* name, const std::optional<Int>& actual, const Json& expected) {
  INFO("property " << name);
  REQUIRE(actual.has_value());
  CHECK(uint64_t{*actual} == expected.get<uint64_t>());
}

/// Checks every property the script reports; a property this test does not know fails.
void check_properties(const Json& expected, const amqp::BasicProperties& actual) {
  REQUIRE(expected.is_object());
  for (const auto& item : expected.items()) {
    const std::string& name = item.key();
    const Json& value = item.value();
    if (name == "content_type") {
      check_property("content_type", actual.content_type, value);
    } else if (name == "content_encoding") {
      check_property("content_encoding", actual.content_encoding, value);
    } else if (name == "delivery_mode") {
      check_property("delivery_mode", actual.delivery_mode, value);
    } else if (name == "priority") {
      check_property("priority", actual.priority, value);
    } else if (name == "correlation_id") {
      check_property("correlation_id", actual.correlation_id, value);
    } else if (name == "reply_to") {
      check_property("reply_to", actual.reply_to, value);
    } else if (name == "expiration") {
      check_property("expiration", actual.expiration, value);
    } else if (name == "message_id") {
      check_property("message_id", actual.message_id, value);
    } else if (name == "timestamp") {
      check_property("timestamp", actual.timestamp, value);
    } else if (name == "type") {
      check_property("type", actual.type, value);
    } else if (name == "user_id") {
      check_property("user_id", actual.user_id, value);
    } else if (name == "app_id") {
      check_property("app_id", actual.app_id, value);
    } else if (name == "cluster_id") {
      check_property("cluster_id", actual.cluster_id, value);
    } else {
      FAIL_CHECK("the script reports a property this test does not know: " << name);
    }
  }
}

}  // namespace

TEST_CASE(
    "In interop with pika, every header type and value, every property and the body decode "
    "exactly, and re-encode to pika's bytes",
    "[client][integration]") {
  const std::string url = test::broker_url();
  const std::string queue = test::unique_name("interop.pika");
  const std::string script = std::string(RETRYLOOP_SOURCE_DIR) + "/tests/interop/pika_headers.py";
  const std::string output = run_capturing("/usr/bin/python3 " + shell_quote(script) + " " +
                                           shell_quote(url) + " " + shell_quote(queue));
  Json expected;
  REQUIRE_NOTHROW(expected = Json::parse(output));
  INFO("pika " << expected.value("pika_version", std::string("?")));
  REQUIRE(expected.at("queue").get<std::string>() == queue);

  TestLoop loop;
  auto connection = test::connect(loop, url);
  auto channel = test::open_channel(loop, *connection);

  bool fetched = false;
  Error get_error;
  std::optional<GetResult> result;
  REQUIRE_FALSE(channel->get(queue, false, [&](const Error& e, std::optional<GetResult>&& r) {
    get_error = e;
    result = std::move(r);
    fetched = true;
  }));
  REQUIRE(loop.run_until([&] { return fetched; }));
  INFO(get_error.message());
  REQUIRE_FALSE(get_error);
  REQUIRE(result.has_value());
  CHECK(result->message_count == 0);
  CHECK_FALSE(channel->ack(result->delivery_tag));
  const amqp::BasicProperties& properties = result->message.properties;

  CHECK(to_hex(result->message.body) == expected.at("body_hex").get<std::string>());

  // Every header: type letter, value and order, recursively.
  REQUIRE(properties.headers.has_value());
  check_table(expected.at("headers"), *properties.headers, "");

  // Every basic property.
  check_properties(expected.at("properties"), properties);

  // The headers table re-encodes to pika's bytes, and pika's bytes decode to the same table.
  // From RabbitMQ 4.x, which sorts the top level, "pika's bytes" are those of pika's table
  // sorted so: decoded, sorted and encoded again.
  const std::string golden_table = from_hex(expected.at("headers_table_hex").get<std::string>());
  amqp::FieldTable pika_table;
  {
    amqp::Reader reader(golden_table);
    reader.table(pika_table);
    CHECK(reader.ok());
    CHECK(reader.at_end());
  }
  std::string pika_properties_bytes = from_hex(expected.at("properties_hex").get<std::string>());
  if (broker_sorts_headers()) {
    pika_table = sorted_by_name(pika_table);
    amqp::BasicProperties sorted;
    amqp::Reader reader(pika_properties_bytes);
    sorted.decode(reader);
    REQUIRE(reader.ok());
    sorted.headers = pika_table;
    pika_properties_bytes.clear();
    amqp::Writer writer(pika_properties_bytes);
    sorted.encode(writer);
    REQUIRE_FALSE(writer.error());
  }
  {
    std::string encoded;
    amqp::Writer writer(encoded);
    writer.table(*properties.headers);
    REQUIRE_FALSE(writer.error());
    if (!broker_sorts_headers()) CHECK(to_hex(encoded) == to_hex(golden_table));
    CHECK(pika_table == *properties.headers);
  }

  // The property flags and list re-encode to pika's bytes.
  {
    std::string encoded;
    amqp::Writer writer(encoded);
    properties.encode(writer);
    REQUIRE_FALSE(writer.error());
    CHECK(to_hex(encoded) == to_hex(pika_properties_bytes));
  }

  uint32_t left = 99;
  bool deleted = false;
  REQUIRE_FALSE(channel->queue_delete(queue, false, false, [&](const Error& e, uint32_t count) {
    CHECK_FALSE(e);
    left = count;
    deleted = true;
  }));
  REQUIRE(loop.run_until([&] { return deleted; }));
  CHECK(left == 0);
  REQUIRE_FALSE(test::wait(loop, [&](CompletionCallback cb) { return channel->close(cb); }));
  test::close(loop, connection);
  CHECK(loop.drain());
}
