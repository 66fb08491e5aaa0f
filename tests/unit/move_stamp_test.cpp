// move::stable_stamp: the stamp a rerun of a killed move gives the same message again;
// move::StampSet: the stamps a move has copied.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "retryloop/move/stamp.hpp"

using namespace retryloop;

namespace {

constexpr std::string_view kStampHeader = "retryloop-migration";

amqp::BasicProperties order(const std::string& id) {
  amqp::BasicProperties properties;
  properties.message_id = id;
  properties.content_type = "application/json";
  properties.headers = amqp::FieldTable{{"tenant", amqp::FieldValue(std::string("acme"))}};
  return properties;
}

}  // namespace

TEST_CASE(
    "A message with an id keeps its stable stamp when a quorum queue redelivers it and when it "
    "carries a stamp already",
    "[move]") {
  const std::string first = move::stable_stamp(order("m-1"), "{}", kStampHeader);
  REQUIRE(first.size() == 35);
  CHECK(first.rfind("id-", 0) == 0);
  CHECK(first.find_first_not_of("0123456789abcdef", 3) == std::string::npos);

  amqp::BasicProperties returned = order("m-1");
  returned.headers->set("x-delivery-count", amqp::FieldValue(int64_t{1}));
  returned.headers->set("x-acquired-count", amqp::FieldValue(int64_t{2}));
  returned.headers->set(std::string(kStampHeader), amqp::FieldValue(std::string("m/orders:7")));
  CHECK(move::stable_stamp(returned, "{}", kStampHeader) == first);
}

TEST_CASE("Messages that differ in their id, properties, headers or body have other stamps",
          "[move]") {
  const std::string first = move::stable_stamp(order("m-1"), "{}", kStampHeader);
  CHECK(move::stable_stamp(order("m-2"), "{}", kStampHeader) != first);
  CHECK(move::stable_stamp(order("m-1"), "{ }", kStampHeader) != first);
  amqp::BasicProperties typed = order("m-1");
  typed.content_type = "text/plain";
  CHECK(move::stable_stamp(typed, "{}", kStampHeader) != first);
  amqp::BasicProperties retried = order("m-1");
  retried.headers->set("retryloop-retries", amqp::FieldValue(int64_t{1}));
  CHECK(move::stable_stamp(retried, "{}", kStampHeader) != first);
  // The body's length is part of what is hashed: the parts cannot run into each other.
  amqp::BasicProperties empty_type = order("m-1");
  empty_type.content_type = "";
  CHECK(move::stable_stamp(empty_type, "", kStampHeader) !=
        move::stable_stamp(order("m-1"), "", kStampHeader));
}

TEST_CASE("A message without an id has no stable stamp: its bytes may be another message's",
          "[move]") {
  amqp::BasicProperties none = order("m-1");
  none.message_id.reset();
  CHECK(move::stable_stamp(none, "{}", kStampHeader).empty());
  CHECK(move::stable_stamp(order(""), "{}", kStampHeader).empty());
}

TEST_CASE(
    "A stamp set takes each stamp once, takes no stamp for another, and keeps each in at most 43 "
    "bytes",
    "[move]") {
  move::StampSet stamps;
  CHECK(stamps.insert("run-1:1"));
  CHECK_FALSE(stamps.insert("run-1:1"));
  CHECK(stamps.size() == 1);
  CHECK(stamps.insert(""));  // an empty stamp is a stamp like another
  CHECK_FALSE(stamps.insert(""));

  // Through several doublings of the table: every stamp new the first time (none taken for one
  // before it) and known the second.
  constexpr size_t count = 300000;
  const std::string prefix = "rl-migration-0123456789/orders:id-";
  size_t added = 0, again = 0;
  for (size_t i = 0; i < count; ++i)
    added += stamps.insert(prefix + std::to_string(i));
  for (size_t i = 0; i < count; ++i)
    again += stamps.insert(prefix + std::to_string(i));
  CHECK(added == count);
  CHECK(again == 0);
  CHECK(stamps.size() == count + 2);
  CHECK(stamps.memory_bytes() <= 43 * stamps.size());
}
