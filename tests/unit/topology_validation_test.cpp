#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "retryloop/topology/topology.hpp"
#include "retryloop/topology/topology_json.hpp"

using namespace retryloop::topology;
namespace fs = std::filesystem;

namespace {

fs::path data_dir() {
  return fs::path(__FILE__).parent_path().parent_path() / "data" / "topology";
}

struct Expected {
  const char* file;
  /// The field path of the error; empty for the file as a whole (malformed JSON).
  const char* path;
  /// Part of the message (for malformed JSON: "line:column: ...").
  const char* fragment;
};

// One file per kind of mistake in tests/data/topology/invalid; every file there must be listed.
const std::vector<Expected> invalid_files = {
    {"malformed_json.json", "", R"~(3:23: malformed JSON)~"},
    {"empty_file.json", "", R"~(1:1: malformed JSON)~"},
    {"trailing_garbage.json", "", R"~(malformed JSON)~"},
    {"comment.json", "", R"~(1:1: malformed JSON)~"},
    {"invalid_utf8.json", "", R"~(malformed JSON)~"},
    {"number_overflow.json", "", R"~(malformed JSON: number overflow parsing '1e999')~"},
    {"deep_nesting.json", "", R"~(nested more than 64 levels)~"},
    {"not_an_object.json", "", R"~(must be an object)~"},
    {"missing_services.json", "services", R"~(is missing)~"},
    {"services_not_array.json", "services", R"~(must be an array)~"},
    {"no_services.json", "services", R"~(lists no services)~"},
    {"unknown_top_level_key.json", "version", R"~(unknown key "version")~"},
    {"duplicate_key.json", "services[0].retry.delays", R"~(duplicate key "delays")~"},
    {"service_not_object.json", "services[0]", R"~(must be an object)~"},
    {"unknown_service_key.json", "services[0].queue_typ", R"~(did you mean "queue_type")~"},
    {"missing_name.json", "services[0].name", R"~(is missing)~"},
    {"in_queue_classic.json", "services[0].retry.mode",
     R"~(in_queue needs "queue_type": "quorum")~"},
    {"in_queue_three_delays.json", "services[0].retry.delays",
     R"~(in_queue mode takes one delay, or two)~"},
    {"in_queue_cap_below_step.json", "services[0].retry.delays[1]",
     R"~(the most an in_queue retry waits, 1s, is shorter than its step 5s)~"},
    {"in_queue_retry_duration.json", "services[0].retry.max_retry_duration",
     R"~(is not available in in_queue mode)~"},
    {"delivery_limit_classic.json", "services[0].delivery_limit",
     R"~(applies to quorum queues only)~"},
    {"delivery_limit_zero.json", "services[0].delivery_limit", R"~(must be at least 1, not 0)~"},
    {"delivery_limit_string.json", "services[0].delivery_limit", R"~(must be a whole number)~"},
    {"replicas_classic.json", "services[0].replicas", R"~(applies to quorum queues only)~"},
    {"replicas_zero.json", "services[0].replicas", R"~(must be from 1 to 99, not 0)~"},
    {"replicas_string.json", "services[0].replicas", R"~(must be a whole number)~"},
    {"empty_name.json", "services[0].name", R"~(must not be empty)~"},
    {"name_not_string.json", "services[0].name", R"~(must be a string)~"},
    {"name_too_long.json", "services[0].name", R"~(256 bytes long; RabbitMQ allows at most 255)~"},
    {"derived_name_too_long.json", "services[0].name", R"~(the derived name)~"},
    {"name_control_character.json", "services[0].name", R"~(control character)~"},
    {"name_reserved_prefix.json", "services[0].name", R"~(reserves)~"},
    {"queue_reserved_prefix.json", "services[0].queue", R"~(reserves)~"},
    {"queue_empty.json", "services[0].queue", R"~(must not be empty)~"},
    {"queue_too_long.json", "services[0].queue", R"~(300 bytes long)~"},
    {"queue_not_string.json", "services[0].queue", R"~(must be a string)~"},
    {"unknown_queue_type.json", "services[0].queue_type",
     R"~("stream" is not one of "classic", "quorum")~"},
    {"duplicate_service_name.json", "services[1].name", R"~(duplicate service name)~"},
    {"duplicate_queue_name.json", "services[1].queue",
     R"~(is also the input queue of service "orders")~"},
    {"queue_collides_with_wait_queue.json", "services[1].queue",
     R"~(is also the wait queue of service "orders")~"},
    {"queue_collides_with_parking_queue.json", "services[1].queue",
     R"~(is also the parking queue of service "orders")~"},
    {"queue_named_like_delay.json", "services[0].queue",
     R"~(is also the routing key of the delay "30s" in the wait exchange "orders.wait")~"},
    {"queue_is_own_parking_queue.json", "services[0].queue",
     R"~(is also the parking queue of service "orders")~"},
    {"input_exchange_is_wait_exchange.json", "services[1].input.exchange",
     R"~(is the wait exchange of service "orders")~"},
    {"input_exchange_is_parking_exchange.json", "services[1].input.exchange",
     R"~(is the parking exchange of service "orders")~"},
    {"shared_exchange_type_mismatch.json", "services[1].input.type", R"~(must agree on its type)~"},
    {"missing_input.json", "services[0].input", R"~(is missing)~"},
    {"input_not_object.json", "services[0].input", R"~(must be an object)~"},
    {"unknown_input_key.json", "services[0].input.binding", R"~(did you mean "bindings")~"},
    {"missing_exchange.json", "services[0].input.exchange", R"~(is missing)~"},
    {"empty_exchange.json", "services[0].input.exchange",
     R"~(the default exchange cannot be bound)~"},
    {"exchange_reserved_prefix.json", "services[0].input.exchange", R"~(reserves)~"},
    {"exchange_too_long.json", "services[0].input.exchange", R"~(256 bytes long)~"},
    {"missing_exchange_type.json", "services[0].input.type", R"~(is missing)~"},
    {"unknown_exchange_type.json", "services[0].input.type",
     R"~(is not one of "direct", "topic", "fanout", "headers")~"},
    {"declare_not_bool.json", "services[0].input.declare", R"~(must be true or false)~"},
    {"bindings_not_array.json", "services[0].input.bindings", R"~(must be an array)~"},
    {"direct_without_bindings.json", "services[0].input.bindings",
     R"~(needs at least one binding)~"},
    {"topic_empty_bindings.json", "services[0].input.bindings", R"~(needs at least one binding)~"},
    {"fanout_with_bindings.json", "services[0].input.bindings",
     R"~(a fanout exchange ignores routing keys)~"},
    {"duplicate_binding.json", "services[0].input.bindings[2]",
     R"~(duplicate binding "orders" (same as bindings[0]))~"},
    {"binding_not_string.json", "services[0].input.bindings[0]",
     R"~(must be a routing key string)~"},
    {"routing_key_too_long.json", "services[0].input.bindings[0]", R"~(256 bytes long)~"},
    {"headers_binding_string.json", "services[0].input.bindings[0]",
     R"~(a headers exchange binding is an object)~"},
    {"headers_missing_headers.json", "services[0].input.bindings[0].headers", R"~(is missing)~"},
    {"headers_empty_headers.json", "services[0].input.bindings[0].headers",
     R"~(at least one header)~"},
    {"headers_x_header.json", "services[0].input.bindings[0].headers.x-kind",
     R"~(ignored by the headers exchange)~"},
    {"headers_value_float.json", "services[0].input.bindings[0].headers.version",
     R"~(a header value must be a string, a whole number or true/false)~"},
    {"headers_value_null.json", "services[0].input.bindings[0].headers.version",
     R"~(a header value must be)~"},
    {"headers_unknown_match.json", "services[0].input.bindings[0].match",
     R"~("some" is not one of "all", "any")~"},
    {"headers_routing_key.json", "services[0].input.bindings[0].routing_key", R"~(unknown key)~"},
    {"headers_duplicate_binding.json", "services[0].input.bindings[1]",
     R"~(duplicate binding (same as bindings[0]))~"},
    {"missing_retry.json", "services[0].retry", R"~(is missing)~"},
    {"retry_not_object.json", "services[0].retry", R"~(must be an object)~"},
    {"unknown_retry_key.json", "services[0].retry.delay", R"~(did you mean "delays")~"},
    {"unknown_mode.json", "services[0].retry.mode",
     R"~("requeue" is not one of "reject", "republish")~"},
    {"missing_delays.json", "services[0].retry.delays", R"~(is missing)~"},
    {"empty_delays.json", "services[0].retry.delays", R"~(at least one delay)~"},
    {"delays_not_array.json", "services[0].retry.delays", R"~(must be an array of durations)~"},
    {"delay_not_duration.json", "services[0].retry.delays[0]", R"~("3x" is not a duration)~"},
    {"delay_number.json", "services[0].retry.delays[0]", R"~(a bare number has no unit)~"},
    {"delay_no_unit.json", "services[0].retry.delays[0]", R"~(has no unit)~"},
    {"delay_empty_string.json", "services[0].retry.delays[0]", R"~(is empty)~"},
    {"delay_zero.json", "services[0].retry.delays[0]", R"~(must be longer than zero)~"},
    {"delay_negative.json", "services[0].retry.delays[0]", R"~(is negative)~"},
    {"delay_fraction.json", "services[0].retry.delays[0]", R"~(is not a duration)~"},
    {"delay_with_space.json", "services[0].retry.delays[0]", R"~(is not a duration)~"},
    {"delay_unknown_unit.json", "services[0].retry.delays[0]", R"~(is not a duration)~"},
    {"delay_too_long.json", "services[0].retry.delays[0]",
     R"~(longer than the largest TTL RabbitMQ accepts)~"},
    {"delay_overflow.json", "services[0].retry.delays[0]", R"~(too long to represent)~"},
    {"reject_with_two_delays.json", "services[0].retry.delays",
     R"~(reject mode takes exactly one delay)~"},
    {"republish_bad_second_delay.json", "services[0].retry.delays[1]",
     R"~("10x" is not a duration)~"},
    {"missing_max_attempts.json", "services[0].retry.max_attempts", R"~(is missing)~"},
    {"max_attempts_zero.json", "services[0].retry.max_attempts", R"~(must be at least 1)~"},
    {"max_attempts_negative.json", "services[0].retry.max_attempts", R"~(must be at least 1)~"},
    {"max_attempts_fraction.json", "services[0].retry.max_attempts", R"~(must be a whole number)~"},
    {"max_attempts_string.json", "services[0].retry.max_attempts", R"~(must be a whole number)~"},
    {"max_attempts_too_large.json", "services[0].retry.max_attempts",
     R"~(must be at most 2147483647)~"},
    {"parking_not_object.json", "services[0].parking", R"~(must be an object)~"},
    {"unknown_parking_key.json", "services[0].parking.max_len", R"~(did you mean "max_length")~"},
    {"parking_max_length_zero.json", "services[0].parking.max_length", R"~(must be at least 1)~"},
    {"parking_max_length_negative.json", "services[0].parking.max_length",
     R"~(must be at least 1)~"},
    {"parking_max_length_string.json", "services[0].parking.max_length",
     R"~(must be a whole number)~"},
    {"parking_max_length_too_large.json", "services[0].parking.max_length",
     R"~(must be at most 9223372036854775807)~"},
    {"parking_max_length_beyond_64_bits.json", "services[0].parking.max_length",
     R"~(must be at most 9223372036854775807)~"},
    {"nul_byte.json", "", R"~(4:1: a NUL byte)~"},
    {"queue_is_audit_stream.json", "services[0].queue",
     R"~(queue "retryloop.audit" is also the audit stream of the top-level "audit")~"},
    {"parking_ttl_not_duration.json", "services[0].parking.ttl",
     R"~("forever" is not a duration)~"},
    {"parking_ttl_zero.json", "services[0].parking.ttl", R"~(must be longer than zero)~"},
    {"parking_ttl_too_long.json", "services[0].parking.ttl", R"~(longer than the largest TTL)~"},
    {"outage_not_object.json", "services[0].outage", R"~(must be an object)~"},
    {"outage_unknown_key.json", "services[0].outage.probe_intervall",
     R"~(did you mean "probe_interval")~"},
    {"outage_consecutive_zero.json", "services[0].outage.consecutive_unavailable",
     R"~(must be from 1 to 1000000, not 0)~"},
    {"outage_consecutive_string.json", "services[0].outage.consecutive_unavailable",
     R"~(must be a whole number)~"},
    {"outage_probe_interval_short.json", "services[0].outage.probe_interval",
     R"~(must be from 100ms to 1h)~"},
    {"outage_probe_interval_number.json", "services[0].outage.probe_interval",
     R"~(a bare number has no unit)~"},
    {"outage_threshold_above_one.json", "services[0].outage.failure_rate.threshold",
     R"~(must be above 0 and at most 1)~"},
    {"outage_window_too_long.json", "services[0].outage.failure_rate.window",
     R"~(must be from 100ms to 1h)~"},
    {"outage_minimum_calls_zero.json", "services[0].outage.failure_rate.minimum_calls",
     R"~(must be from 1 to 1000000, not 0)~"},
    {"outage_failure_rate_not_object.json", "services[0].outage.failure_rate",
     R"~(must be an object)~"},
    {"outage_ramp_interval_zero.json", "services[0].outage.ramp.interval",
     R"~(must be from 100ms to 1h)~"},
    {"several_errors.json", "services[0].retry.delays[0]", R"~("3x" is not a duration)~"},
};

/// The "name" of services[index] in the file at `path`, when the file is JSON and has one.
std::string service_name_in(const fs::path& path, size_t index) {
  std::ifstream in(path, std::ios::binary);
  nlohmann::json root = nlohmann::json::parse(in, nullptr, false);
  if (!root.is_object() || !root.contains("services") || !root["services"].is_array()) return "";
  const auto& services = root["services"];
  if (index >= services.size() || !services[index].is_object()) return "";
  auto name = services[index].find("name");
  return name != services[index].end() && name->is_string() ? name->get<std::string>() : "";
}

std::string all_messages(const ParseResult& result) {
  std::string text;
  for (const auto& line : result.messages())
    text += line + "\n";
  return text;
}

const char* minimal = R"({"services": [{"name": "orders",
  "input": {"exchange": "orders.in", "type": "direct", "bindings": ["orders"]},
  "retry": {"delays": ["30s"], "max_attempts": 5}}]})";

}  // namespace

TEST_CASE(
    "Every invalid topology file is refused with exactly one error: its mistake, at its field "
    "path, naming its service",
    "[topology]") {
  for (const auto& expected : invalid_files) {
    fs::path path = data_dir() / "invalid" / expected.file;
    ParseResult result = load_topology(path.string());
    INFO(expected.file << "\n" << all_messages(result));
    REQUIRE_FALSE(result.ok());
    REQUIRE_FALSE(result.errors.empty());
    // One mistake, one error: no follow-on noise. (several_errors.json has its own test.)
    if (std::string(expected.file) != "several_errors.json") CHECK(result.errors.size() == 1);
    const TopologyError& error = result.errors.front();
    CHECK(error.path == expected.path);
    std::string located = error.line > 0 ? std::to_string(error.line) + ":" +
                                               std::to_string(error.column) + ": " + error.message
                                         : error.message;
    CHECK_THAT(located, Catch::Contains(expected.fragment));
    // Within a service, the error names it whenever the file gives it a name.
    if (error.path.rfind("services[", 0) == 0) {
      size_t index = std::stoul(error.path.substr(9));
      CHECK(error.service == service_name_in(path, index));
    } else {
      CHECK(error.service.empty());
    }
  }
}

TEST_CASE("Every file in the invalid set has an expectation", "[topology]") {
  std::set<std::string> listed;
  for (const auto& expected : invalid_files)
    listed.insert(expected.file);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(data_dir() / "invalid")) {
    ++files;
    INFO(entry.path().filename().string());
    CHECK(listed.count(entry.path().filename().string()) == 1);
  }
  CHECK(files == invalid_files.size());
}

TEST_CASE("Every valid topology file parses without errors", "[topology]") {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(data_dir() / "valid")) {
    ++files;
    ParseResult result = load_topology(entry.path().string());
    INFO(entry.path().filename().string() << "\n" << all_messages(result));
    CHECK(result.ok());
  }
  CHECK(files >= 4);
  for (const char* example :
       {"example.json", "quorum.json", "demo.json", "delays.json", "scheduled.json"}) {
    auto path = data_dir().parent_path().parent_path().parent_path() / "topology" / example;
    ParseResult result = load_topology(path.string());
    INFO(example << "\n" << all_messages(result));
    CHECK(result.ok());
  }
}

TEST_CASE("Every error in a file is reported, each with its service and path", "[topology]") {
  ParseResult result = load_topology((data_dir() / "invalid" / "several_errors.json").string());
  REQUIRE_FALSE(result.ok());
  INFO(all_messages(result));
  REQUIRE(result.errors.size() == 4);
  CHECK(result.errors[0].path == "services[0].retry.delays[0]");
  CHECK(result.errors[0].service == "orders");
  CHECK(result.errors[1].path == "services[1].colour");
  CHECK(result.errors[1].service == "billing");
  CHECK(result.errors[2].path == "services[1].retry.max_attempts");
  CHECK(result.errors[3].path == "services[2].name");
  CHECK(result.errors[3].message.find("duplicate service name") != std::string::npos);
}

TEST_CASE("An error message names the file, the path and the service", "[topology]") {
  ParseResult result = parse_topology(R"({"services": [{"name": "audit",
    "input": {"exchange": "a.in", "type": "direct", "bindings": ["a"]},
    "retry": {"mode": "republish", "delays": ["1s", "3x"], "max_attempts": 5}}]})",
                                      "topology/audit.json");
  REQUIRE(result.messages().size() == 1);
  CHECK(result.messages()[0] ==
        "topology/audit.json: services[0].retry.delays[1] (service \"audit\"): \"3x\" is not a "
        "duration; write a whole number followed by ms, s, m, h or d, such as 250ms, 30s, 5m, 1h "
        "or 14d");
}

TEST_CASE("Malformed JSON is reported with its line and column", "[topology]") {
  ParseResult result = parse_topology("{\n  \"services\": [\n    {\"name\": }\n  ]\n}\n", "f.json");
  REQUIRE(result.errors.size() == 1);
  CHECK(result.errors[0].line == 3);
  CHECK(result.errors[0].column == 14);
  CHECK(result.messages()[0].rfind("f.json:3:14: malformed JSON: ", 0) == 0);
}

TEST_CASE("A malformed-JSON message quotes only the last line it read", "[topology]") {
  ParseResult result = parse_topology("{\"services\": [\n  1\n]}\ngarbage", "f.json");
  REQUIRE(result.errors.size() == 1);
  CHECK(result.errors[0].line == 4);
  CHECK(result.messages()[0] ==
        "f.json:4:1: malformed JSON: syntax error while parsing value - invalid literal; last "
        "read: 'g'; expected end of input");
  ParseResult multi = load_topology((data_dir() / "invalid" / "trailing_garbage.json").string());
  REQUIRE(multi.errors.size() == 1);
  CHECK_THAT(multi.errors[0].message, !Catch::Contains("<U+000A>"));
  CHECK_THAT(multi.errors[0].message, Catch::Contains("last read: 'x'"));
}

TEST_CASE("Fields left out take their defaults", "[topology]") {
  ParseResult result = parse_topology(minimal);
  REQUIRE(result.ok());
  const Service& s = result.topology->services.at(0);
  CHECK(s.name == "orders");
  CHECK(s.queue == "orders");
  CHECK(s.queue_type == QueueType::classic);
  CHECK(s.input.declare);
  CHECK(s.input.type == ExchangeType::direct);
  CHECK(s.retry.mode == RetryMode::reject);
  CHECK(s.retry.delays == std::vector<std::chrono::milliseconds>{std::chrono::seconds(30)});
  CHECK(s.retry.max_attempts == 5);
  CHECK_FALSE(s.parking.max_length);
  CHECK_FALSE(s.parking.ttl);
  CHECK_FALSE(s.delivery_limit);
}

TEST_CASE("Every field of the format is read into the model", "[topology]") {
  ParseResult result = load_topology((data_dir() / "valid" / "all_features.json").string());
  REQUIRE(result.ok());
  const auto& services = result.topology->services;
  REQUIRE(services.size() == 5);
  CHECK(services[0].queue == "orders.q");
  CHECK(services[0].input.type == ExchangeType::topic);
  CHECK(services[0].input.bindings.size() == 2);
  CHECK(services[0].input.bindings[1].routing_key == "order.#.urgent");
  CHECK(services[0].retry.delays[0] == std::chrono::milliseconds(250));
  CHECK(services[0].parking.max_length == 1000);
  CHECK(services[0].parking.ttl == std::chrono::hours(14 * 24));

  const Service& payments = services[1];
  CHECK(payments.queue_type == QueueType::quorum);
  CHECK(payments.delivery_limit == 10);
  CHECK(payments.input.type == ExchangeType::headers);
  REQUIRE(payments.input.bindings.size() == 2);
  CHECK(payments.input.bindings[0].match == HeadersMatch::all);
  CHECK(payments.input.bindings[1].match == HeadersMatch::any);
  const auto& headers = payments.input.bindings[0].headers;
  REQUIRE(headers.size() == 2);
  CHECK(headers[0].first == "kind");
  CHECK(std::get<std::string>(headers[0].second) == "charge");
  CHECK(headers[1].first == "version");
  CHECK(std::get<int64_t>(headers[1].second) == 2);
  CHECK(std::get<bool>(payments.input.bindings[1].headers.at(1).second) == true);
  CHECK(payments.retry.mode == RetryMode::republish);
  CHECK(payments.retry.delays.size() == 5);
  CHECK(payments.retry.max_attempts == 10);

  CHECK(services[2].input.type == ExchangeType::fanout);
  CHECK(services[2].input.bindings.empty());
  CHECK(services[2].parking.ttl == std::chrono::hours(7 * 24));
  CHECK_FALSE(services[3].input.declare);
  CHECK(services[3].input.exchange == "amq.topic");
}

TEST_CASE("A model built in code is validated by the same rules", "[topology]") {
  Topology t;
  Service s;
  s.name = "orders";
  s.input.exchange = "orders.in";
  s.input.type = ExchangeType::direct;
  s.input.bindings.push_back({"orders", HeadersMatch::all, {{"kind", std::string("x")}}});
  s.retry.delays = {std::chrono::seconds(-1)};
  s.retry.max_attempts = 0;
  s.parking.max_length = 0;
  t.services.push_back(s);
  auto errors = validate(t);
  std::vector<std::string> paths;
  for (const auto& e : errors)
    paths.push_back(e.path);
  CHECK(paths == std::vector<std::string>{
                     "services[0].input.bindings[0]", "services[0].retry.delays[0]",
                     "services[0].retry.max_attempts", "services[0].parking.max_length"});
  for (const auto& e : errors)
    CHECK(e.service == "orders");

  t.services[0].input.bindings[0].headers.clear();
  t.services[0].retry.delays = {std::chrono::seconds(1)};
  t.services[0].retry.max_attempts = 1;
  t.services[0].parking.max_length = 1;
  CHECK(validate(t).empty());
  CHECK_FALSE(validate(Topology{}).empty());
}

TEST_CASE("A model built in code with names RabbitMQ refuses gets an error at each name's path",
          "[topology]") {
  // JSON cannot carry invalid UTF-8 (the parser refuses it), but a model built in code can.
  Topology t;
  Service s;
  s.name = "bad\xC3\x28";
  s.queue = "queue\xFF";
  s.input.exchange = "in\x01";
  s.input.type = ExchangeType::headers;
  s.input.bindings.push_back({"", HeadersMatch::all, {{"kind", std::string("\xE2\x82")}}});
  s.retry.delays = {std::chrono::seconds(1)};
  t.services.push_back(s);
  Service d;
  d.name = "direct";
  d.input = {"direct.in", ExchangeType::direct, true, {{"key\xF0", HeadersMatch::all, {}}}};
  d.retry.delays = {std::chrono::seconds(1)};
  t.services.push_back(d);
  auto errors = validate(t);
  std::vector<std::string> located;
  for (const auto& e : errors)
    located.push_back(e.path + ": " + e.message);
  INFO(Catch::Detail::stringify(located));
  REQUIRE(errors.size() == 5);
  CHECK(errors[0].path == "services[0].name");
  CHECK(errors[0].message == "\"bad\\xC3(\" is not valid UTF-8, which RabbitMQ refuses");
  CHECK(errors[1].path == "services[0].queue");
  CHECK_THAT(errors[1].message, Catch::Contains("is not valid UTF-8"));
  CHECK(errors[2].path == "services[0].input.exchange");
  CHECK_THAT(errors[2].message, Catch::Contains("control character"));
  CHECK(errors[3].path == "services[0].input.bindings[0].headers.kind");
  CHECK_THAT(errors[3].message, Catch::Contains("not valid UTF-8"));
  CHECK(errors[4].path == "services[1].input.bindings[0]");
  CHECK_THAT(errors[4].message, Catch::Contains("routing key is not valid UTF-8"));
  CHECK(errors[4].service == "direct");
}

TEST_CASE("A reserved amq. exchange may be used when it is not declared", "[topology]") {
  Topology t;
  Service s;
  s.name = "ledger";
  s.input = {"amq.topic", ExchangeType::topic, false, {{"ledger.#", HeadersMatch::all, {}}}};
  s.retry.delays = {std::chrono::seconds(1)};
  t.services.push_back(s);
  CHECK(validate(t).empty());
  t.services[0].input.declare = true;
  auto errors = validate(t);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].path == "services[0].input.exchange");
}

TEST_CASE("Services can be selected by name", "[topology]") {
  ParseResult result = load_topology((data_dir() / "valid" / "all_features.json").string());
  REQUIRE(result.ok());
  Topology two = select_services(*result.topology, {"mailer", "orders"});
  REQUIRE(two.services.size() == 2);
  CHECK(two.services[0].name == "orders");
  CHECK(two.services[1].name == "mailer");
  CHECK(select_services(*result.topology, {}).services.size() == 5);
  CHECK_THROWS_WITH(select_services(*result.topology, {"nope"}),
                    Catch::Contains("no service named \"nope\""));
}

TEST_CASE("A file that cannot be read is one error naming why", "[topology]") {
  ParseResult missing = load_topology((data_dir() / "no-such-file.json").string());
  REQUIRE(missing.errors.size() == 1);
  CHECK(missing.errors[0].message.find("cannot read the file") == 0);
  ParseResult directory = load_topology(data_dir().string());
  REQUIRE(directory.errors.size() == 1);
  CHECK(directory.errors[0].message.find("directory") != std::string::npos);
}

TEST_CASE("No input makes the parser throw or crash", "[topology]") {
  for (const char* text : {"", "null", "0", "\"x\"", "{\"services\": null}",
                           "{\"services\": [null, 1, \"x\", [], {}]}",
                           "{\"services\": [{\"name\": {}, \"queue\": 1, \"input\": [], "
                           "\"retry\": {\"delays\": [null, {}, []], \"max_attempts\": null}, "
                           "\"parking\": {\"max_length\": [], \"ttl\": {}}}]}",
                           "{\"services\": [{\"input\": {\"type\": \"headers\", \"bindings\": "
                           "[1, {\"headers\": []}, {\"headers\": {\"\": 1}}]}}]}"}) {
    INFO(text);
    ParseResult result;
    REQUIRE_NOTHROW(result = parse_topology(text));
    CHECK_FALSE(result.ok());
    CHECK_FALSE(result.errors.empty());
  }
}

TEST_CASE(
    "A service without an outage object gets the breaker's defaults, which trip within 2 s "
    "at 100 messages a second",
    "[topology][outage]") {
  ParseResult result = parse_topology(minimal);
  REQUIRE(result.ok());
  const retryloop::outage::Settings& outage = result.topology->services[0].outage;
  CHECK(outage.consecutive_unavailable == 5);
  CHECK_FALSE(outage.failure_rate);
  CHECK(outage.probe_interval == std::chrono::seconds(5));
  CHECK(outage.ramp.interval == std::chrono::seconds(2));
  // At 100 messages a second, the run of unavailable outcomes that trips takes 50 ms.
  CHECK(outage.consecutive_unavailable * 10 <= 2000);
}

TEST_CASE("An outage object sets each value it names and keeps the defaults of the rest",
          "[topology][outage]") {
  ParseResult result = parse_topology(R"({"services": [{"name": "orders",
    "outage": {"failure_rate": {"window": "30s"}, "ramp": {"interval": "1s"}},
    "input": {"exchange": "orders.in", "type": "direct", "bindings": ["orders"]},
    "retry": {"delays": ["30s"], "max_attempts": 5}}]})");
  INFO(all_messages(result));
  REQUIRE(result.ok());
  const retryloop::outage::Settings& outage = result.topology->services[0].outage;
  CHECK(outage.consecutive_unavailable == 5);
  REQUIRE(outage.failure_rate);
  CHECK(outage.failure_rate->threshold == 0.5);
  CHECK(outage.failure_rate->window == std::chrono::seconds(30));
  CHECK(outage.failure_rate->minimum_calls == 20);
  CHECK(outage.probe_interval == std::chrono::seconds(5));
  CHECK(outage.ramp.interval == std::chrono::seconds(1));
}
