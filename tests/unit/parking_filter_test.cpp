// The parking tools' pure parts: decoding parked messages, filters and the replay copy.

#include <catch2/catch.hpp>

#include <limits>

#include "retryloop/parking/parked_message.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/retry/headers.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
namespace header = retry::header;

namespace {

client::Message parked_message(amqp::FieldTable headers) {
  client::Message message;
  message.properties.message_id = "m-1";
  message.properties.headers = std::move(headers);
  return message;
}

int64_t replays_of(const amqp::BasicProperties& properties) {
  REQUIRE(properties.headers);
  const amqp::FieldValue* value = properties.headers->find(header::replays);
  REQUIRE(value != nullptr);
  return value->as_int64().value();
}

}  // namespace

TEST_CASE("read_parked decodes the parking headers and tolerates wrong types", "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::parked_at), amqp::Timestamp{1700000000});
  headers.set(std::string(header::reason), std::string("exhausted"));
  headers.set(std::string(header::attempts), int64_t(5));
  headers.set(std::string(header::queue), int64_t(7));
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 3);
  CHECK(parked.position == 3);
  CHECK(parked.message_id == "m-1");
  CHECK(parked.parked_at == uint64_t(1700000000));
  CHECK(parked.reason == "exhausted");
  CHECK(parked.attempts == int64_t(5));
  CHECK(parked.queue.empty());
}

TEST_CASE("older_than compares the age in whole milliseconds, without overflow", "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::parked_at), amqp::Timestamp{1000});
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 0);

  parking::Filter filter;
  filter.older_than = 1500ms;
  CHECK_FALSE(filter.matches(parked, 1001));
  CHECK(filter.matches(parked, 1002));
  CHECK_FALSE(filter.matches(parked, 999));

  filter.older_than = std::chrono::milliseconds(std::numeric_limits<int64_t>::max());
  const uint64_t longest_seconds = uint64_t(std::numeric_limits<int64_t>::max()) / 1000;
  CHECK_FALSE(filter.matches(parked, 1000 + longest_seconds));
  CHECK(filter.matches(parked, 1000 + longest_seconds + 1));

  amqp::FieldTable far_past;
  far_past.set(std::string(header::parked_at), amqp::Timestamp{0});
  filter.older_than = 24h;
  CHECK(filter.matches(parking::read_parked(parked_message(far_past), 0),
                       std::numeric_limits<uint64_t>::max()));
}

TEST_CASE("where filters match the header's text and parse_where names what is wrong",
          "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::reason), std::string("poison"));
  headers.set(std::string(header::attempts), int64_t(2));
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 0);

  parking::Filter filter;
  filter.where.push_back(parking::parse_where("retryloop-reason=poison"));
  filter.where.push_back(parking::parse_where("retryloop-attempts=2"));
  CHECK(filter.matches(parked, 0));
  filter.where.push_back(parking::parse_where("tenant="));
  CHECK_FALSE(filter.matches(parked, 0));

  CHECK(parking::parse_where("a=b=c") == std::make_pair(std::string("a"), std::string("b=c")));
  CHECK_THROWS_WITH(parking::parse_where("reason"), Catch::Contains("HEADER=VALUE"));
  CHECK_THROWS_WITH(parking::parse_where("=x"), Catch::Contains("header name is empty"));
}

TEST_CASE("A replay copy starts fresh and counts replays up to the largest number", "[parking]") {
  amqp::FieldTable headers;
  headers.set("x-death", amqp::FieldArray{});
  headers.set(std::string(header::reason), std::string("exhausted"));
  headers.set(std::string(header::original_exchange), std::string("orders.in"));
  headers.set("tenant", std::string("acme"));
  amqp::BasicProperties properties;
  properties.headers = headers;

  const amqp::BasicProperties first = parking::make_replay_copy(properties);
  CHECK(replays_of(first) == 1);
  CHECK(first.headers->find("x-death") == nullptr);
  CHECK(first.headers->find(header::reason) == nullptr);
  CHECK(first.headers->find(header::original_exchange) != nullptr);
  CHECK(first.headers->find("tenant") != nullptr);
  CHECK(replays_of(parking::make_replay_copy(first)) == 2);

  properties.headers->set(std::string(header::replays), std::numeric_limits<int64_t>::max());
  CHECK(replays_of(parking::make_replay_copy(properties)) == std::numeric_limits<int64_t>::max());
  properties.headers->set(std::string(header::replays), int64_t(-4));
  CHECK(replays_of(parking::make_replay_copy(properties)) == 1);
}

TEST_CASE(
    "A replay copy carries no expiration and keeps the first one in "
    "retryloop-original-expiration",
    "[parking]") {
  amqp::BasicProperties properties;
  properties.message_id = "m-1";
  properties.expiration = "3000";  // parked by an older version, or published there by hand
  const amqp::BasicProperties copy = parking::make_replay_copy(properties);
  CHECK_FALSE(copy.expiration);
  CHECK(*copy.headers->find(header::original_expiration)->as_string() == "3000");
  CHECK(copy.message_id == "m-1");

  // A value recorded by the consumer wins, and survives the replay.
  amqp::FieldTable headers;
  headers.set(std::string(header::original_expiration), std::string("6000"));
  properties.headers = headers;
  const amqp::BasicProperties recorded = parking::make_replay_copy(properties);
  CHECK_FALSE(recorded.expiration);
  CHECK(*recorded.headers->find(header::original_expiration)->as_string() == "6000");
  properties.expiration.reset();
  CHECK(*parking::make_replay_copy(properties)
             .headers->find(header::original_expiration)
             ->as_string() == "6000");
}

TEST_CASE("A time range takes the messages parked within it, bounds included", "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::parked_at), amqp::Timestamp{1000});
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 0);

  parking::Filter filter;
  filter.parked_from = 1000;
  CHECK(filter.matches(parked, 0));
  filter.parked_from = 1001;
  CHECK_FALSE(filter.matches(parked, 0));
  filter.parked_from.reset();
  filter.parked_until = 1000;
  CHECK(filter.matches(parked, 0));
  filter.parked_until = 999;
  CHECK_FALSE(filter.matches(parked, 0));
  filter.parked_from = 900;
  filter.parked_until = 1100;
  CHECK(filter.matches(parked, 0));
  CHECK_FALSE(filter.empty());

  // Without retryloop-parked-at a message is outside every range.
  const parking::ParkedMessage undated = parking::read_parked(parked_message({}), 0);
  CHECK_FALSE(filter.matches(undated, 0));
  filter.parked_from.reset();
  CHECK_FALSE(filter.matches(undated, 0));
}

TEST_CASE("error_contains ignores ASCII case and error_first_line matches the whole first line",
          "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::error), std::string("Timeout talking to DB\n  at db.cpp:12"));
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 0);
  const parking::ParkedMessage no_error = parking::read_parked(parked_message({}), 0);

  parking::Filter contains;
  contains.error_contains = "talking to db";
  CHECK(contains.matches(parked, 0));
  CHECK_FALSE(contains.matches(no_error, 0));
  contains.error_contains = "DB.CPP:12";  // past the first line
  CHECK(contains.matches(parked, 0));
  contains.error_contains = "refused";
  CHECK_FALSE(contains.matches(parked, 0));
  CHECK_FALSE(contains.empty());

  parking::Filter first;
  first.error_first_line = "Timeout talking to DB";
  CHECK(first.matches(parked, 0));
  first.error_first_line = "Timeout";  // a prefix is not the line
  CHECK_FALSE(first.matches(parked, 0));
  first.error_first_line = "";  // the messages without an error
  CHECK_FALSE(first.matches(parked, 0));
  CHECK(first.matches(no_error, 0));

  CHECK(parking::first_line("one\ntwo") == "one");
  CHECK(parking::first_line("only") == "only");
  CHECK(parking::first_line("") == "");
}

TEST_CASE("message_ids takes any of the ids, original_routing_key the exact key", "[parking]") {
  amqp::FieldTable headers;
  headers.set(std::string(header::original_routing_key), std::string("order.created"));
  const parking::ParkedMessage parked = parking::read_parked(parked_message(headers), 0);

  parking::Filter ids;
  ids.message_ids = {"m-0", "m-1"};
  CHECK(ids.matches(parked, 0));
  ids.message_ids = {"m-2"};
  CHECK_FALSE(ids.matches(parked, 0));
  CHECK_FALSE(ids.empty());

  parking::Filter key;
  key.original_routing_key = "order.created";
  CHECK(key.matches(parked, 0));
  key.original_routing_key = "order.*";  // no patterns: the key as it was published
  CHECK_FALSE(key.matches(parked, 0));
  key.original_routing_key = "";
  CHECK_FALSE(key.matches(parked, 0));
  CHECK(key.matches(parking::read_parked(parked_message({}), 0), 0));

  // Every condition must hold.
  key.original_routing_key = "order.created";
  key.message_ids = {"m-1"};
  key.error_contains = "x";
  CHECK_FALSE(key.matches(parked, 0));
  CHECK(parking::Filter{}.empty());
}

TEST_CASE("Error fingerprints mask what varies from message to message", "[parking]") {
  using parking::error_fingerprint;
  CHECK(error_fingerprint("customer 1 does not exist") == "customer <n> does not exist");
  CHECK(error_fingerprint("customer 4 does not exist") == "customer <n> does not exist");
  CHECK(error_fingerprint("Timeout talking to payments after 5000 ms") ==
        "Timeout talking to payments after <n> ms");
  CHECK(error_fingerprint("order 7f3c9a2e-1b4d-4e8f-9a0b-c1d2e3f4a5b6 not found") ==
        "order <uuid> not found");
  CHECK(error_fingerprint("lock held since 2026-11-27T10:15:00.250Z by worker-3") ==
        "lock held since <time> by worker-<n>");
  CHECK(error_fingerprint("lock held since 2026-11-27 10:15:00+01:00") == "lock held since <time>");
  CHECK(error_fingerprint("bad checksum 0x1F2e, expected deadbeef42") ==
        "bad checksum <hex>, expected <hex>");
  CHECK(error_fingerprint("user \"ana\" has no role 'admin'") ==
        "user \"<value>\" has no role '<value>'");
  CHECK(error_fingerprint("don't retry ord_8F3k2 at 12.5%") == "don't retry <id> at <n>%");
  CHECK(error_fingerprint("HTTP 503 Service Unavailable") == "HTTP <n> Service Unavailable");
  CHECK(error_fingerprint("connection refused") == "connection refused");
  CHECK(error_fingerprint("") == "");
  CHECK(error_fingerprint("unclosed \"quote 12") == "unclosed \"quote <n>");
}

TEST_CASE("Error lines group by cause, with an example and the count of distinct lines",
          "[parking]") {
  // 12 parked messages, 6 distinct lines, 3 causes.
  const std::vector<std::pair<std::string, uint64_t>> by_error = {
      {"customer 1 does not exist", 4}, {"Timeout after 5000 ms", 3},
      {"customer 4 does not exist", 2}, {"card 4111-1111 declined", 1},
      {"card 5500-0000 declined", 1},   {"customer 9 does not exist", 1}};
  auto causes = parking::causes_of(by_error);
  REQUIRE(causes.size() == 3);
  CHECK(causes[0].fingerprint == "customer <n> does not exist");
  CHECK(causes[0].count == 7);
  CHECK(causes[0].distinct == 3);
  CHECK(causes[0].example == "customer 1 does not exist");
  CHECK(causes[1].fingerprint == "Timeout after <n> ms");
  CHECK(causes[1].count == 3);
  CHECK(causes[1].distinct == 1);
  CHECK(causes[2].fingerprint == "card <n>-<n> declined");
  CHECK(causes[2].count == 2);
  // Kept as they are: no error, and the lines past the limit.
  auto kept = parking::causes_of({{"(none)", 2}, {parking::other_errors_group, 5}});
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].fingerprint == parking::other_errors_group);
  CHECK(kept[1].fingerprint == "(none)");
}

TEST_CASE("A filter by cause takes the messages whose first line has that fingerprint",
          "[parking]") {
  parking::Filter filter;
  filter.error_fingerprint = "customer <n> does not exist";
  parking::ParkedMessage parked;
  parked.error = "customer 12 does not exist\n  at billing.cpp:40";
  CHECK(filter.matches(parked, 0));
  parked.error = "customer twelve does not exist";
  CHECK_FALSE(filter.matches(parked, 0));
  filter.error_fingerprint = "";
  parked.error.clear();
  CHECK(filter.matches(parked, 0));
}
