// move::move_queue against a real broker: a queue's messages moved to another queue, classic or
// quorum, in order, with their bodies and every property and header byte as they were read (the
// broker's x-death headers included), each copy stamped; duplicates of a stamp dropped; a copy
// that comes back leaving its original in place.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/field_table.hpp"
#include "retryloop/amqp/properties.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/message.hpp"
#include "retryloop/client/timer.hpp"
#include "retryloop/move/error.hpp"
#include "retryloop/move/queue_mover.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using client::Error;
using test::TestLoop;

namespace {

constexpr const char* kStamp = "retryloop-move-stamp";

/// A message as a queue holds it: its properties in wire form, as the broker sent them.
struct Held {
  std::string raw_properties;
  std::string body;
};

std::string encoded(const amqp::BasicProperties& properties) {
  std::string out;
  amqp::Writer writer(out);
  properties.encode(writer);
  return out;
}

amqp::BasicProperties decoded(const std::string& raw) {
  amqp::BasicProperties properties;
  REQUIRE_FALSE(client::decode_properties(raw, properties));
  return properties;
}

/// Whether `a` and `b` hold the same properties and the same headers, each of the same type and
/// value, in any order.
bool same_entries(amqp::BasicProperties a, amqp::BasicProperties b) {
  if (a.headers.has_value() != b.headers.has_value()) return false;
  if (a.headers) {
    if (a.headers->size() != b.headers->size()) return false;
    for (const auto& entry : *a.headers) {
      const amqp::FieldValue* other = b.headers->find(entry.name);
      if (other == nullptr || *other != entry.value) return false;
    }
  }
  a.headers.reset();
  b.headers.reset();
  return a == b;
}

/// What differs between two messages' properties, for a failure's message.
std::string difference(const amqp::BasicProperties& expected, const amqp::BasicProperties& got) {
  std::string out;
  auto field = [&](const char* name, const auto& a, const auto& b) {
    if (a != b) out += std::string(" ") + name;
  };
  field("content_type", expected.content_type, got.content_type);
  field("content_encoding", expected.content_encoding, got.content_encoding);
  field("delivery_mode", expected.delivery_mode, got.delivery_mode);
  field("priority", expected.priority, got.priority);
  field("correlation_id", expected.correlation_id, got.correlation_id);
  field("reply_to", expected.reply_to, got.reply_to);
  field("expiration", expected.expiration, got.expiration);
  field("message_id", expected.message_id, got.message_id);
  field("timestamp", expected.timestamp, got.timestamp);
  field("type", expected.type, got.type);
  field("user_id", expected.user_id, got.user_id);
  field("app_id", expected.app_id, got.app_id);
  field("cluster_id", expected.cluster_id, got.cluster_id);
  if (expected.headers.has_value() != got.headers.has_value()) {
    out += " headers (present in one only)";
  } else if (expected.headers) {
    for (const auto& entry : *expected.headers) {
      const amqp::FieldValue* other = got.headers->find(entry.name);
      if (other == nullptr) {
        out += " -" + entry.name;  // missing
      } else if (*other != entry.value) {
        out += " ~" + entry.name;  // another type or value
      }
    }
    for (const auto& entry : *got.headers) {
      if (expected.headers->find(entry.name) == nullptr) out += " +" + entry.name;  // added
    }
    if (out.empty() && expected.headers->size() != got.headers->size()) out += " headers (twice)";
  }
  return out;
}

/// The test's connection and its confirm-mode channel, with helpers over them.
struct BrokerSession {
  TestLoop& loop;
  std::shared_ptr<client::Connection> connection;
  std::shared_ptr<client::Channel> channel;

  explicit BrokerSession(TestLoop& l)
      : loop(l),
        connection(test::connect(loop, test::broker_url())),
        channel(test::open_channel(loop, *connection)) {
    REQUIRE_FALSE(test::wait(loop, [&](auto done) { return channel->confirm_select(done); }));
  }
  ~BrokerSession() {
    if (connection->is_open()) test::close(loop, connection);
  }

  std::string queue(const std::string& prefix, const std::string& type = "classic",
                    amqp::FieldTable arguments = {}) {
    const std::string name = test::unique_name(prefix);
    client::QueueOptions options;
    options.arguments = std::move(arguments);
    if (type == "quorum") options.arguments.set("x-queue-type", "quorum");
    test::declare_queue(loop, *channel, name, options);
    return name;
  }

  uint32_t depth(const std::string& queue) { return test::queue_depth(loop, *connection, queue); }

  /// Whether `queue` is seen empty within a few seconds. A move's acks have no reply, and a quorum
  /// queue counts a message until the log entry of its ack is applied: a look-up right after the
  /// move may still count some (112 of 1,000 on a loaded machine).
  bool emptied(const std::string& queue) {
    return test::eventually(
        loop, [&] { return depth(queue) == 0; }, 30s);
  }

  /// Publishes, pipelined, with confirms; every one must be routed.
  void publish(const std::string& queue,
               const std::vector<std::pair<amqp::BasicProperties, std::string>>& messages) {
    size_t confirmed = 0;
    size_t failed = 0;
    for (const auto& [properties, body] : messages) {
      REQUIRE_FALSE(channel->publish("", queue, properties, body, client::Mandatory::yes,
                                     [&](const client::PublishOutcome& outcome) {
                                       ++confirmed;
                                       if (!outcome.ok()) ++failed;
                                     }));
      if (channel->unconfirmed_count() >= 500) {
        REQUIRE(loop.run_until([&] { return channel->unconfirmed_count() < 250; }, 60s));
      }
    }
    REQUIRE(loop.run_until([&] { return confirmed == messages.size(); }, 60s));
    REQUIRE(failed == 0);
  }

  /// The `count` messages of `queue`, in order, properties as they arrived. `take`: acked, so the
  /// queue is left empty; otherwise they are given back (the channel closes) and the queue is
  /// waited for until it counts them again.
  std::vector<Held> read(const std::string& queue, size_t count, bool take) {
    auto reader = test::open_channel(loop, *connection);
    std::vector<Held> out;
    client::ConsumeOptions options;
    options.raw_properties = true;
    options.no_ack = take;
    bool started = false;
    REQUIRE_FALSE(reader->consume(
        queue, std::move(options),
        [&](client::Delivery&& delivery) {
          out.push_back(
              {std::move(delivery.message.raw_properties), std::move(delivery.message.body)});
        },
        [&](const Error& error, const std::string&) {
          INFO(error.message());
          CHECK_FALSE(error);
          started = true;
        }));
    REQUIRE(loop.run_until([&] { return started && out.size() >= count; }, 60s));
    loop.run_for(200ms);  // nothing more comes
    CHECK(out.size() == count);
    REQUIRE_FALSE(test::wait(loop, [&](auto done) { return reader->close(done); }));
    if (!take) CHECK(test::eventually(loop, [&] { return depth(queue) == count; }));
    return out;
  }

  struct Moved {
    Error error;
    move::Progress progress;
    bool interrupted = false;
    uint64_t progress_calls = 0;
  };

  Moved move_queue(move::MoveOptions options) {
    Moved moved;
    bool done = false;
    options.on_progress = [&](const move::Progress&) { ++moved.progress_calls; };
    REQUIRE_FALSE(
        move::move_queue(connection, std::move(options),
                         [&](const Error& error, const move::Progress& progress, bool interrupted) {
                           CHECK_FALSE(done);  // once
                           moved.error = error;
                           moved.progress = progress;
                           moved.interrupted = interrupted;
                           done = true;
                         }));
    REQUIRE(loop.run_until([&] { return done; }, 120s));
    INFO(moved.error.message());
    return moved;
  }
};

move::MoveOptions to_queue(const std::string& from, const std::string& to,
                           const std::string& prefix) {
  move::MoveOptions options;
  options.from = from;
  options.routing_key = to;
  options.stamp_header = kStamp;
  options.stamp_prefix = prefix;
  return options;
}

/// Message `i` of the test: each property set, headers of every type, some without headers, and
/// bodies of every byte value, a few over the frame size.
std::pair<amqp::BasicProperties, std::string> message(size_t i) {
  amqp::BasicProperties properties;
  properties.message_id = "m-" + std::to_string(i);
  if (i % 7 != 3) {
    properties.content_type = "application/octet-stream";
    properties.content_encoding = "identity";
    properties.delivery_mode = uint8_t(1 + i % 2);
    // One priority, the default, for every message: a quorum queue delivers a message of a
    // higher priority first (RabbitMQ 4.3 one of 4 before one of 0 to 3).
    properties.priority = 4;
    properties.correlation_id = "c-" + std::to_string(i);
    properties.reply_to = "reply-" + std::to_string(i);
    properties.expiration = "86400000";
    properties.timestamp = 1700000000 + i;
    properties.type = "kind-" + std::to_string(i % 4);
    properties.app_id = "move-test";
  }
  if (i % 11 == 5) {
    properties.headers.emplace();  // an empty table
  } else if (i % 7 != 3) {         // no table at all for these
    amqp::FieldTable headers;
    headers.append("bool", i % 2 == 0);
    headers.append("int8", int8_t(-int(i % 100)));
    headers.append("uint8", uint8_t(i % 256));
    headers.append("int16", int16_t(-int(i)));
    headers.append("uint16", uint16_t(i));
    headers.append("int32", int32_t(-int32_t(i) * 1000));
    headers.append("uint32", uint32_t(i) * 1000);
    headers.append("int64", int64_t(i) << 40);
    headers.append("float", float(i) / 4);
    headers.append("double", double(i) / 3);
    headers.append("decimal", amqp::Decimal{2, uint32_t(i)});
    headers.append("text", "héllo " + std::to_string(i));
    headers.append("bytes", amqp::ByteArray{std::string("\0\x01\xff", 3) + std::to_string(i)});
    headers.append("array", amqp::FieldArray{amqp::FieldValue(int32_t(i)), amqp::FieldValue("a"),
                                             amqp::FieldValue(amqp::Timestamp{i})});
    headers.append("at", amqp::Timestamp{1700000000 + i});
    amqp::FieldTable nested;
    nested.append("deep", amqp::FieldTable{{"n", amqp::FieldValue(int64_t(i))}});
    headers.append("table", amqp::FieldValue(std::move(nested)));
    headers.append_void("nothing");
    if (i % 50 == 7) headers.append(kStamp, "earlier:" + std::to_string(i));
    properties.headers = std::move(headers);
  }
  std::string body;
  const size_t size = i % 97 == 0 ? 200000 : 1 + i % 300;
  body.reserve(size);
  for (size_t b = 0; b < size; ++b)
    body.push_back(char((b * 31 + i) % 256));
  return {std::move(properties), std::move(body)};
}

}  // namespace

TEST_CASE(
    "move_queue keeps the order, bodies and property bytes of 1,000 messages, x-death included, "
    "from classic to quorum, back to classic and on, each copy stamped once",
    "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string first = broker.queue("move-first");
  // 100 messages dead-lettered into `first`, which gives them the broker's x-death headers.
  const std::string rejecting =
      broker.queue("move-rejecting", "classic",
                   amqp::FieldTable{{"x-dead-letter-exchange", amqp::FieldValue("")},
                                    {"x-dead-letter-routing-key", amqp::FieldValue(first)}});
  std::vector<std::pair<amqp::BasicProperties, std::string>> messages;
  for (size_t i = 0; i < 1000; ++i)
    messages.push_back(message(i));
  broker.publish(rejecting, {messages.begin(), messages.begin() + 100});
  {
    auto consumer = test::open_channel(loop, *broker.connection);
    size_t rejected = 0;
    REQUIRE_FALSE(consumer->consume(
        rejecting, {},
        [&](client::Delivery&& delivery) {
          CHECK_FALSE(consumer->reject(delivery.delivery_tag, false));
          ++rejected;
        },
        [](const Error& error, const std::string&) { CHECK_FALSE(error); }));
    REQUIRE(loop.run_until([&] { return rejected == 100; }, 60s));
    REQUIRE(test::eventually(
        loop, [&] { return broker.depth(first) == 100; }, 60s));
    REQUIRE_FALSE(test::wait(loop, [&](auto done) { return consumer->close(done); }));
  }
  broker.publish(first, {messages.begin() + 100, messages.end()});

  // The messages as `first` holds them (a classic queue adds nothing when it gives them back).
  const std::vector<Held> before = broker.read(first, 1000, false);
  REQUIRE(before.size() == 1000);
  size_t with_death = 0;
  size_t stamped_before = 0;
  for (const Held& held : before) {
    const amqp::BasicProperties properties = decoded(held.raw_properties);
    REQUIRE(encoded(properties) == held.raw_properties);  // the comparison below is sound
    if (properties.headers && properties.headers->find("x-death") != nullptr) ++with_death;
    if (properties.headers && properties.headers->find(kStamp) != nullptr) ++stamped_before;
  }
  CHECK(with_death == 100);
  size_t stamped_sent = 0;
  for (const auto& sent : messages)
    if (sent.first.headers && sent.first.headers->find(kStamp) != nullptr) ++stamped_sent;
  CHECK(stamped_sent > 0);
  CHECK(stamped_before == stamped_sent);

  const std::string quorum = broker.queue("move-quorum", "quorum");
  const std::string second = broker.queue("move-second");
  const std::string third = broker.queue("move-third");
  move::MoveOptions options = to_queue(first, quorum, "first");
  options.window = 100;
  auto moved = broker.move_queue(options);
  CHECK_FALSE(moved.error);
  CHECK_FALSE(moved.interrupted);
  CHECK(moved.progress.total == 1000);
  CHECK(moved.progress.scanned == 1000);
  CHECK(moved.progress.moved == 1000);
  CHECK(moved.progress.failed == 0);
  CHECK(moved.progress.uncertain == 0);
  CHECK(moved.progress.duplicates == 0);
  CHECK(moved.progress_calls >= 1000);
  CHECK(broker.emptied(first));
  CHECK(broker.depth(quorum) == 1000);

  // Moved on, each keeps the stamp of its first move.
  for (const auto& [from, to] : {std::pair{quorum, second}, std::pair{second, third}}) {
    moved = broker.move_queue(to_queue(from, to, "later"));
    CHECK_FALSE(moved.error);
    CHECK(moved.progress.moved == 1000);
    CHECK(moved.progress.failed == 0);
    CHECK(broker.emptied(from));
  }

  const std::vector<Held> after = broker.read(third, 1000, true);
  REQUIRE(after.size() == 1000);
  CHECK(broker.depth(third) == 0);

  // What each should be: as `first` held it, with the stamp of the first move (n counts that
  // move's copies, the ones that kept a stamp of their own too)...
  std::vector<std::pair<amqp::BasicProperties, std::string>> expected;
  for (size_t i = 0; i < 1000; ++i) {
    amqp::BasicProperties properties = decoded(before[i].raw_properties);
    amqp::FieldTable& headers =
        properties.headers ? *properties.headers : properties.headers.emplace();
    if (headers.find(kStamp) == nullptr) headers.set(kStamp, "first:" + std::to_string(i + 1));
    expected.emplace_back(std::move(properties), before[i].body);
  }
  // ...and in the bytes the broker holds such a message in when a client publishes it: RabbitMQ
  // 4.x keeps a message's header table sorted by name, where 3.10 keeps the order it was sent in,
  // so there the stamp goes where the broker puts it.
  const std::string control = broker.queue("move-control");
  broker.publish(control, expected);
  const std::vector<Held> published = broker.read(control, 1000, true);
  REQUIRE(published.size() == 1000);

  size_t mismatched = 0;
  std::string mismatches;
  for (size_t i = 0; i < 1000; ++i) {
    const amqp::BasicProperties got = decoded(after[i].raw_properties);
    std::string wrong;
    if (after[i].raw_properties != published[i].raw_properties) wrong += " bytes";
    if (!test::broker_is_4x() && after[i].raw_properties != encoded(expected[i].first)) {
      wrong += " bytes-as-sent";
    }
    if (!same_entries(expected[i].first, got)) wrong += difference(expected[i].first, got);
    if (after[i].body != before[i].body) wrong += " body";
    if (wrong.empty()) continue;
    if (++mismatched <= 5) {
      mismatches += "\n  message " + std::to_string(i) + " (" +
                    expected[i].first.message_id.value_or("?") + ", came as " +
                    got.message_id.value_or("?") + "):" + wrong;
    }
  }
  INFO(mismatched << " messages differ; the first:" << mismatches);
  CHECK(mismatched == 0);
}

TEST_CASE("move_queue with deduplicate copies one message of each stamp and acks the others",
          "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string from = broker.queue("move-dup-from");
  const std::string to = broker.queue("move-dup-to", "quorum");
  std::vector<std::pair<amqp::BasicProperties, std::string>> messages;
  for (const char* stamp : {"s:1", "s:2", "s:1", "s:3", "s:2", ""}) {
    amqp::BasicProperties properties;
    properties.message_id = std::string("of ") + stamp;
    if (*stamp != '\0') properties.headers.emplace().append(kStamp, stamp);
    messages.emplace_back(std::move(properties), std::string("body of ") + stamp);
  }
  broker.publish(from, messages);
  move::MoveOptions options = to_queue(from, to, "d");
  options.deduplicate = true;
  const auto moved = broker.move_queue(options);
  CHECK_FALSE(moved.error);
  CHECK(moved.progress.total == 6);
  CHECK(moved.progress.moved == 4);
  CHECK(moved.progress.duplicates == 2);
  CHECK(moved.progress.failed == 0);
  CHECK(broker.emptied(from));
  const std::vector<Held> after = broker.read(to, 4, true);
  REQUIRE(after.size() == 4);
  std::vector<std::string> stamps;
  for (const Held& held : after) {
    const amqp::BasicProperties properties = decoded(held.raw_properties);
    REQUIRE(properties.headers);
    const amqp::FieldValue* stamp = properties.headers->find(kStamp);
    REQUIRE(stamp != nullptr);
    stamps.emplace_back(stamp->as_string().value_or("?"));
    CHECK(held.body == "body of " + properties.message_id.value_or("?").substr(3));
  }
  // The unstamped message is the fourth copy.
  CHECK(stamps == std::vector<std::string>{"s:1", "s:2", "s:3", "d:4"});
}

TEST_CASE(
    "move_queue records the stamps it copies before it acks their originals, and drops what an "
    "earlier run recorded",
    "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string from = broker.queue("move-record-from", "quorum");
  const std::string to = broker.queue("move-record-to");
  std::vector<std::pair<amqp::BasicProperties, std::string>> messages;
  for (int i = 1; i <= 50; ++i) {
    amqp::BasicProperties properties;
    properties.headers.emplace().append(kStamp, "s:" + std::to_string(i));
    messages.emplace_back(std::move(properties), "body " + std::to_string(i));
  }
  broker.publish(from, messages);
  move::MoveOptions options = to_queue(from, to, "d");
  options.window = 8;
  options.deduplicate = true;
  options.copied_before = {"s:2", "s:40"};
  std::vector<std::string> recorded;
  size_t calls = 0;
  bool open = false;
  // Each record takes 50 ms to answer: the move ends only after the last one, its originals acked.
  options.copied = [&](std::vector<std::string> stamps, std::function<void(const Error&)> done) {
    CHECK_FALSE(open);  // one call at a time
    open = true;
    ++calls;
    recorded.insert(recorded.end(), stamps.begin(), stamps.end());
    client::run_after(loop.get(), 50ms, [&open, done] {
      open = false;
      done({});
    });
  };
  const auto moved = broker.move_queue(options);
  CHECK_FALSE(open);
  CHECK_FALSE(moved.error);
  CHECK(moved.progress.moved == 48);
  CHECK(moved.progress.duplicates == 2);
  CHECK(calls > 1);
  std::vector<std::string> expected;
  for (int i = 1; i <= 50; ++i) {
    if (i != 2 && i != 40) expected.push_back("s:" + std::to_string(i));
  }
  std::sort(recorded.begin(), recorded.end());
  std::sort(expected.begin(), expected.end());
  CHECK(recorded == expected);
  CHECK(broker.emptied(from));
  CHECK(broker.depth(to) == 48);
}

TEST_CASE("move_queue acks no original whose copy its record of what it moved refused",
          "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string from = broker.queue("move-unrecorded-from");
  const std::string to = broker.queue("move-unrecorded-to");
  std::vector<std::pair<amqp::BasicProperties, std::string>> messages;
  for (size_t i = 0; i < 20; ++i)
    messages.push_back(message(i));
  broker.publish(from, messages);
  move::MoveOptions options = to_queue(from, to, "d");
  options.deduplicate = true;
  options.copied = [](std::vector<std::string>, std::function<void(const Error&)> done) {
    done(Error(client::ClientError::invalid_argument, "the record was refused"));
  };
  const auto moved = broker.move_queue(options);
  CHECK(moved.error.message().find("the record was refused") != std::string::npos);
  // No original was acked: each is back, and what may have been copied is counted uncertain.
  CHECK(test::eventually(loop, [&] { return broker.depth(from) == 20; }));
  CHECK(moved.progress.moved == 0);
  CHECK(moved.progress.uncertain >= 1);
  CHECK(broker.depth(to) <= moved.progress.uncertain);
}

TEST_CASE("move_queue to a queue that does not exist leaves every original in place, as failed",
          "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string from = broker.queue("move-nowhere-from");
  std::vector<std::pair<amqp::BasicProperties, std::string>> messages;
  for (size_t i = 0; i < 20; ++i)
    messages.push_back(message(i));
  broker.publish(from, messages);
  const std::vector<Held> before = broker.read(from, 20, false);
  const auto moved = broker.move_queue(to_queue(from, test::unique_name("move-nowhere"), "x"));
  CHECK_FALSE(moved.error);
  CHECK(moved.progress.total == 20);
  CHECK(moved.progress.moved == 0);
  CHECK(moved.progress.failed == 20);
  CHECK(moved.progress.uncertain == 0);
  // Back in place, in order, unchanged (the stamps went only on the copies).
  CHECK(broker.depth(from) == 20);
  const std::vector<Held> after = broker.read(from, 20, true);
  REQUIRE(after.size() == 20);
  for (size_t i = 0; i < 20; ++i) {
    CHECK(after[i].raw_properties == before[i].raw_properties);
    CHECK(after[i].body == before[i].body);
  }
}

TEST_CASE("move_queue from a queue that does not exist ends with queue_missing",
          "[move][integration]") {
  TestLoop loop;
  BrokerSession broker(loop);
  const std::string missing = test::unique_name("move-missing");
  const auto moved = broker.move_queue(to_queue(missing, broker.queue("move-missing-to"), "x"));
  CHECK(moved.error.code == move::make_error_code(move::MoveError::queue_missing));
  CHECK(moved.error.reply_text == "queue " + missing + " does not exist");
  CHECK(moved.progress.moved == 0);
}
