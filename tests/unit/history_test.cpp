#include <catch2/catch.hpp>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/retry/history.hpp"

#include <nlohmann/json.hpp>

using namespace retryloop;
using retry::History;
using retry::HistoryEntry;

namespace {

HistoryEntry retry_entry(int64_t attempt, std::string error = "timeout") {
  HistoryEntry entry;
  entry.attempt = attempt;
  entry.at = 1'700'000'000 + uint64_t(attempt);
  entry.outcome = "retry";
  entry.error = std::move(error);
  entry.delay_ms = 1000;
  entry.via = "republish";
  entry.consumer = "host:1";
  return entry;
}

History history_of(const amqp::BasicProperties& properties) {
  return retry::read_history(properties.headers ? &*properties.headers : nullptr);
}

std::vector<int64_t> attempts_of(const History& history) {
  std::vector<int64_t> attempts;
  for (const auto& entry : history.entries)
    attempts.push_back(entry.attempt);
  return attempts;
}

}  // namespace

TEST_CASE("A history entry survives the wire, field by field", "[history]") {
  amqp::BasicProperties properties;
  HistoryEntry entry = retry_entry(1, "customer 7 does not exist\nat line 3");
  retry::record_history(properties, entry);
  amqp::BasicProperties parked = properties;
  HistoryEntry park;
  park.attempt = 2;
  park.at = 1'700'000'100;
  park.outcome = "parked";
  park.error = "no";
  park.via = "republish";
  park.reason = "exhausted";
  park.consumer = "host:2";
  retry::record_history(parked, park);

  // Encode and decode the properties as the broker would pass them on.
  std::string encoded;
  amqp::Writer writer(encoded);
  parked.encode(writer);
  REQUIRE_FALSE(writer.error());
  amqp::BasicProperties decoded;
  amqp::Reader reader(encoded);
  decoded.decode(reader);
  REQUIRE(reader.ok());
  const History history = history_of(decoded);
  REQUIRE(history.malformed.empty());
  REQUIRE(history.entries.size() == 2);
  entry.error = "customer 7 does not exist";  // the first line only
  CHECK(history.entries[0] == entry);
  CHECK(history.entries[1] == park);
  CHECK(history.older == 0);
  CHECK(decoded.headers->find(retry::header::history)->type_letter() == 'A');
  const auto& first = decoded.headers->find(retry::header::history)
                          ->get_if<amqp::FieldArray>()
                          ->front()
                          .get_if<amqp::FieldTable>();
  CHECK(first->find("at")->type_letter() == 'T');
}

TEST_CASE("The history keeps the last 20 entries and counts the older ones", "[history]") {
  amqp::BasicProperties properties;
  for (int64_t attempt = 1; attempt <= 27; ++attempt)
    retry::record_history(properties, retry_entry(attempt));
  const History history = history_of(properties);
  REQUIRE(history.entries.size() == retry::max_history_entries);
  CHECK(history.entries.front().attempt == 8);
  CHECK(history.entries.back().attempt == 27);
  CHECK(history.older == 7);
}

TEST_CASE("An error in the history is its first line, cut to 256 bytes at a character boundary",
          "[history]") {
  amqp::BasicProperties properties;
  std::string error;
  for (int i = 0; i < 200; ++i)
    error += "\xc3\xa9";  // é, two bytes
  retry::record_history(properties, retry_entry(1, error + "\r\nsecond line"));
  const std::string kept = history_of(properties).entries.at(0).error;
  CHECK(kept.size() == 256);
  CHECK(kept == error.substr(0, 256));
  retry::record_history(properties, retry_entry(2, std::string(255, 'a') + "\xc3\xa9"));
  CHECK(history_of(properties).entries.at(1).error == std::string(255, 'a'));
}

TEST_CASE("Attempts that the broker moved are filled in when the next copy is made", "[history]") {
  SECTION("reject mode: attempts 1 and 2 rejected, attempt 3 parked") {
    amqp::BasicProperties properties;
    HistoryEntry park;
    park.attempt = 3;
    park.outcome = "parked";
    retry::record_history(properties, park, "reject", 5000, 1'700'000'000);
    const History history = history_of(properties);
    REQUIRE(attempts_of(history) == std::vector<int64_t>{1, 2, 3});
    CHECK(history.entries[0].via == "reject");
    CHECK(history.entries[0].outcome == "retry");
    CHECK(history.entries[0].at == std::optional<uint64_t>(1'700'000'000));
    CHECK(history.entries[1].at == std::nullopt);  // the broker's x-death keeps only the first
    CHECK(history.entries[1].delay_ms == std::optional<int64_t>(5000));
    CHECK(history.entries[0].error.empty());
  }
  SECTION("recorded attempts are not added twice") {
    amqp::BasicProperties properties;
    retry::record_history(properties, retry_entry(1), "reject");
    retry::record_history(properties, retry_entry(2), "reject");
    CHECK(attempts_of(history_of(properties)) == std::vector<int64_t>{1, 2});
  }
  SECTION("a replay starts the count again") {
    amqp::BasicProperties properties;
    retry::record_history(properties, retry_entry(1), "reject");
    retry::record_history(properties, retry_entry(2), "reject");
    properties = parking::make_replay_copy(properties, {"", "cli", "ops@host", 1'700'000'500});
    HistoryEntry park;
    park.attempt = 2;
    park.outcome = "parked";
    retry::record_history(properties, park, "reject");
    const History history = history_of(properties);
    REQUIRE(attempts_of(history) == std::vector<int64_t>{1, 2, 0, 1, 2});
    CHECK(history.entries[2].outcome == "replayed");
    CHECK(history.entries[2].by == "ops@host");
    CHECK(history.entries[2].via == "cli");
    CHECK(history.entries[2].at == std::optional<uint64_t>(1'700'000'500));
    CHECK(history.entries[3].via == "reject");
  }
  SECTION("a forged attempt count adds at most 20 entries") {
    amqp::BasicProperties properties;
    HistoryEntry park;
    park.attempt = 1'000'000'000;
    park.outcome = "parked";
    retry::record_history(properties, park, "reject");
    const History history = history_of(properties);
    CHECK(history.entries.size() == retry::max_history_entries);
    CHECK(history.entries.back().attempt == 1'000'000'000);
    CHECK(history.older == 1'000'000'000 - int64_t(retry::max_history_entries));
  }
}

TEST_CASE("A replay keeps the history and records the attempts it ends", "[history]") {
  amqp::BasicProperties parked;
  retry::record_history(parked, retry_entry(1));
  parked.headers->set(std::string(retry::header::attempts), int64_t(2));
  parked.headers->set(std::string(retry::header::reason), "exhausted");
  const amqp::BasicProperties copy =
      parking::make_replay_copy(parked, {"", "console", "alice at 127.0.0.1", 0});
  const History history = history_of(copy);
  REQUIRE(history.entries.size() == 2);
  CHECK(history.entries[1].outcome == "replayed");
  CHECK(history.entries[1].attempt == 2);
  CHECK(history.entries[1].via == "console");
  CHECK(history.entries[1].at.has_value());
  CHECK(copy.headers->find(retry::header::reason) == nullptr);
}

TEST_CASE("A copy that must shrink gives up its oldest history entries first", "[history]") {
  amqp::BasicProperties properties;
  for (int64_t attempt = 1; attempt <= 9; ++attempt)
    retry::record_history(properties, retry_entry(attempt));
  REQUIRE(retry::shorten_history(properties));
  History history = history_of(properties);
  CHECK(attempts_of(history) == std::vector<int64_t>{5, 6, 7, 8, 9});
  CHECK(history.older == 4);
  while (retry::shorten_history(properties)) {
  }
  history = history_of(properties);
  CHECK(history.entries.empty());
  CHECK(history.older == 9);
  CHECK_FALSE(retry::shorten_history(properties));
  amqp::BasicProperties none;
  CHECK_FALSE(retry::shorten_history(none));
}

TEST_CASE("A history header that is not retryloop's is reported, not trusted", "[history]") {
  amqp::FieldTable headers;
  headers.set(std::string(retry::header::history), "not an array");
  CHECK_THAT(retry::read_history(&headers).malformed, Catch::Contains("not an array"));
  amqp::FieldArray entries{amqp::FieldValue(int64_t(3)), amqp::FieldValue(amqp::FieldTable{})};
  headers.set(std::string(retry::header::history), entries);
  headers.set(std::string(retry::header::history_older), "x");
  const History history = retry::read_history(&headers);
  CHECK(history.entries.size() == 1);
  CHECK_THAT(history.malformed, Catch::Contains("[0] is not a table"));
  CHECK_THAT(history.malformed, Catch::Contains("retryloop-history-older"));
  const nlohmann::json json = parking::history_json(&headers);
  CHECK(json["entries"].size() == 1);
  CHECK(json.contains("malformed"));
}

TEST_CASE("parking list --json shows the history with ISO times", "[history]") {
  client::Message message;
  retry::record_history(message.properties, retry_entry(1));
  const nlohmann::json json =
      parking::message_json(parking::read_parked(message, 0), 1'700'000'100);
  REQUIRE(json["history"]["entries"].size() == 1);
  CHECK(json["history"]["entries"][0]["at"] == "2023-11-14T22:13:21Z");
  CHECK(json["history"]["entries"][0]["outcome"] == "retry");
  CHECK(json["history"]["entries"][0]["delay_ms"] == 1000);
  CHECK(json["history"]["older"] == 0);
}
