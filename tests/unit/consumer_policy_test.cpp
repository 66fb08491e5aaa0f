// The consumer's pure parts: the attempt rule read from headers, the retry and parking copies,
// the retry policy, backoff and the latency histogram.

#include <catch2/catch.hpp>

#include <set>

#include "codec_support.hpp"
#include "retryloop/retry/backoff.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/metrics.hpp"
#include "retryloop/retry/outcome.hpp"
#include "retryloop/retry/retry_policy.hpp"
#include "retryloop/topology/topology.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using amqp::FieldArray;
using amqp::FieldTable;
using amqp::FieldValue;
using retry::Action;
using retry::AttemptInfo;
using retry::Backoff;
using retry::decide;
using retry::Decision;
using retry::DecisionContext;
using retry::ExceptionPolicy;
using retry::in_queue_attempt;
using retry::is_death_header;
using retry::LatencyHistogram;
using retry::make_parking_copy;
using retry::make_retry_copy;
using retry::max_error_bytes;
using retry::Metrics;
using retry::Outcome;
using retry::OutcomeKind;
using retry::ParkingNote;
using retry::ParkReason;
using retry::PermanentError;
using retry::read_attempt_info;
using retry::retry_delay_label;
using retry::RetryAfterError;
using retry::truncate_utf8;
using retry::UnavailableError;

namespace {

FieldTable death_entry(std::string queue, std::string reason, FieldValue count,
                       std::string exchange = "orders.in",
                       std::string routing_key = "order.created") {
  FieldTable entry;
  entry.append("count", std::move(count));
  entry.append("reason", std::move(reason));
  entry.append("queue", std::move(queue));
  entry.append("time", amqp::Timestamp{1700000000});
  entry.append("exchange", std::move(exchange));
  entry.append("routing-keys", FieldArray{FieldValue(std::move(routing_key))});
  return entry;
}

amqp::BasicProperties with_headers(FieldTable headers) {
  amqp::BasicProperties properties;
  properties.message_id = "m-1";
  properties.content_type = "application/json";
  properties.headers = std::move(headers);
  return properties;
}

topology::Service service(topology::RetryMode mode, std::vector<std::chrono::milliseconds> delays,
                          int max_attempts) {
  topology::Service s;
  s.name = "orders";
  s.queue = "orders";
  s.input.exchange = "orders.in";
  s.input.bindings.push_back(topology::Binding{"order.created", {}, {}});
  s.retry.mode = mode;
  s.retry.delays = std::move(delays);
  s.retry.max_attempts = max_attempts;
  return s;
}

std::string encoded_header_frame(const amqp::BasicProperties& properties) {
  std::string out;
  REQUIRE_FALSE(amqp::append_header_frame(out, 1, 0, properties));
  return out;
}

}  // namespace

TEST_CASE("A first delivery is attempt 1 and remembers where it was published", "[retry]") {
  AttemptInfo info = read_attempt_info(amqp::BasicProperties{}, "orders", "orders.in", "order.x");
  CHECK(info.attempt == 1);
  CHECK(info.rejected == 0);
  CHECK(info.retries == 0);
  CHECK(info.original_exchange == "orders.in");
  CHECK(info.original_routing_key == "order.x");
  CHECK_FALSE(info.first_failure);
  CHECK(info.malformed.empty());
}

TEST_CASE("The attempt counts the x-death entry of this queue and reason rejected, not entry 0",
          "[retry]") {
  FieldTable headers;
  headers.append("x-death", FieldArray{FieldValue(death_entry("orders.wait.30s", "expired",
                                                              int64_t(7), "orders.wait", "30s")),
                                       FieldValue(death_entry("other", "rejected", int64_t(5))),
                                       FieldValue(death_entry("orders", "expired", int64_t(4))),
                                       FieldValue(death_entry("orders", "rejected", int64_t(2)))});
  AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "", "orders");
  CHECK(info.rejected == 2);
  CHECK(info.attempt == 3);
  // In reject mode the delivery comes from the default exchange; the entry knows the original.
  CHECK(info.original_exchange == "orders.in");
  CHECK(info.original_routing_key == "order.created");
  CHECK(info.first_failure == 1700000000u);
  CHECK(info.malformed.empty());
}

TEST_CASE(
    "The attempt counts the rejections in the queue's holding queue too, which stood in for it "
    "during a migration",
    "[retry]") {
  // The mover put it in the holding queue through the default exchange; it was rejected there
  // after the rejections in the service queue, whose entry is the older one.
  FieldTable holding =
      death_entry("orders.migrating", "rejected", int64_t(2), "", "orders.migrating");
  holding.set("time", amqp::Timestamp{1700000500});
  FieldTable headers;
  headers.append(
      "x-death",
      FieldArray{FieldValue(std::move(holding)),
                 FieldValue(death_entry("orders.migrating.other", "rejected", int64_t(9))),
                 FieldValue(death_entry("orders", "rejected", int64_t(3)))});
  AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "", "orders");
  CHECK(info.rejected == 5);
  CHECK(info.attempt == 6);
  // Where it was published, and its first failure, come from the service queue's entry: a parked
  // copy replays to orders.in, and the retry budget counts from the first failure.
  CHECK(info.original_exchange == "orders.in");
  CHECK(info.original_routing_key == "order.created");
  CHECK(info.first_failure == 1700000000u);
  CHECK(info.malformed.empty());
  CHECK(read_attempt_info(with_headers(headers), "orders.migrating", "", "q").attempt == 3);

  // Rejected in the holding queue only: its entry is all there is.
  FieldTable only_holding;
  only_holding.append(
      "x-death", FieldArray{FieldValue(death_entry("orders.migrating", "rejected", int64_t(1), "",
                                                   "orders.migrating"))});
  AttemptInfo moved = read_attempt_info(with_headers(only_holding), "orders", "", "orders");
  CHECK(moved.attempt == 2);
  CHECK(moved.original_routing_key == "orders.migrating");
}

TEST_CASE("An x-death header as RabbitMQ 3.10 wrote it after two loops gives attempt 3",
          "[retry]") {
  amqp::ContentHeader header;
  REQUIRE_FALSE(amqp::decode_header_frame(
      amqp::test::payload_of(amqp::test::from_hex(amqp::test::kXDeathHeaderCount2)), header));
  AttemptInfo info = read_attempt_info(header.properties, "rl.work", "", "rl.work");
  CHECK(info.rejected == 2);
  CHECK(info.attempt == 3);
  CHECK(read_attempt_info(header.properties, "another.queue", "", "q").attempt == 1);
}

TEST_CASE("retryloop-retries adds to the attempt, and the original-* headers win", "[retry]") {
  FieldTable headers;
  headers.append("retryloop-retries", int64_t(3));
  headers.append("retryloop-original-exchange", "shop.events");
  headers.append("retryloop-original-routing-key", "order.paid");
  headers.append("retryloop-first-failure", amqp::Timestamp{1600000000});
  headers.append("x-death", FieldArray{FieldValue(death_entry("orders", "rejected", int64_t(1)))});
  AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "", "orders");
  CHECK(info.attempt == 5);
  CHECK(info.original_exchange == "shop.events");
  CHECK(info.original_routing_key == "order.paid");
  CHECK(info.first_failure == 1600000000u);
}

TEST_CASE("Forged x-death headers never crash and are reported as malformed", "[retry]") {
  SECTION("x-death is a string") {
    FieldTable headers;
    headers.append("x-death", "lots");
    AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "e", "k");
    CHECK(info.attempt == 1);
    CHECK(info.malformed == "x-death is not an array (type 'S')");
  }
  SECTION("the count of this queue's entry is a string") {
    FieldTable headers;
    headers.append("x-death", FieldArray{FieldValue(death_entry("orders", "rejected", "9"))});
    AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "e", "k");
    CHECK(info.attempt == 1);
    CHECK(info.malformed == "x-death[0].count is not a non-negative integer");
  }
  SECTION("an entry is not a table, and the count is negative") {
    FieldTable headers;
    headers.append("x-death",
                   FieldArray{FieldValue(int64_t(1)),
                              FieldValue(death_entry("orders", "rejected", int64_t(-4)))});
    AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "e", "k");
    CHECK(info.attempt == 1);
    CHECK(info.malformed ==
          "x-death[0] is not a table; x-death[1].count is not a non-negative integer");
  }
  SECTION("retryloop-retries is a string") {
    FieldTable headers;
    headers.append("retryloop-retries", "2");
    CHECK(read_attempt_info(with_headers(headers), "orders", "e", "k").malformed ==
          "retryloop-retries is not a non-negative integer");
  }
  SECTION("huge counts saturate instead of overflowing") {
    FieldTable headers;
    headers.append("retryloop-retries", std::numeric_limits<int64_t>::max());
    headers.append("x-death", FieldArray{FieldValue(death_entry(
                                  "orders", "rejected", std::numeric_limits<int64_t>::max()))});
    AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "e", "k");
    CHECK(info.attempt == std::numeric_limits<int64_t>::max());
    CHECK(info.malformed.empty());
  }
}

TEST_CASE("A retry copy strips the death headers, counts the retry and keeps the rest", "[retry]") {
  FieldTable headers;
  headers.append("app", "kept");
  headers.append("x-death",
                 FieldArray{FieldValue(death_entry("orders.wait.1s", "expired", int64_t(1)))});
  headers.append("x-first-death-exchange", "orders.wait");
  headers.append("x-first-death-queue", "orders.wait.1s");
  headers.append("x-first-death-reason", "expired");
  headers.append("x-last-death-queue", "orders.wait.1s");
  headers.append("retryloop-retries", int64_t(1));
  headers.append("tail", int64_t(42));
  amqp::BasicProperties original = with_headers(headers);
  original.correlation_id = "c-9";
  original.delivery_mode = 2;
  AttemptInfo info = read_attempt_info(original, "orders", "", "orders");

  amqp::BasicProperties copy = make_retry_copy(original, info, 1700000500);
  FieldTable expected;
  expected.append("app", "kept");
  expected.append("retryloop-retries", int64_t(2));
  expected.append("tail", int64_t(42));
  expected.append("retryloop-original-exchange", "");
  expected.append("retryloop-original-routing-key", "orders");
  expected.append("retryloop-first-failure", amqp::Timestamp{1700000500});
  CHECK(*copy.headers == expected);

  // Everything but the headers is byte-identical.
  amqp::BasicProperties without_headers = copy;
  without_headers.headers = original.headers;
  CHECK(encoded_header_frame(without_headers) == encoded_header_frame(original));
}

TEST_CASE("A first retry copy records the original exchange and routing key", "[retry]") {
  amqp::BasicProperties original;
  original.message_id = "m-2";
  AttemptInfo info = read_attempt_info(original, "orders", "orders.in", "order.created");
  amqp::BasicProperties copy = make_retry_copy(original, info, 1700000000);
  REQUIRE(copy.headers);
  CHECK(*copy.headers->find("retryloop-retries")->as_int64() == 1);
  CHECK(*copy.headers->find("retryloop-original-exchange")->as_string() == "orders.in");
  CHECK(*copy.headers->find("retryloop-original-routing-key")->as_string() == "order.created");
  CHECK(copy.message_id == "m-2");
  // The next delivery of the copy reads as attempt 2, from the original exchange.
  AttemptInfo next = read_attempt_info(copy, "orders", "", "orders");
  CHECK(next.attempt == 2);
  CHECK(next.original_exchange == "orders.in");
}

TEST_CASE(
    "A retry copy carries every attempt so far, broker rejections included, so the count never "
    "goes down",
    "[retry]") {
  // Rejected twice in reject mode, then the service switched to republish mode.
  FieldTable headers;
  headers.append("x-death", FieldArray{FieldValue(death_entry("orders", "rejected", int64_t(2)))});
  AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "", "orders");
  REQUIRE(info.attempt == 3);
  amqp::BasicProperties copy = make_retry_copy(with_headers(headers), info, 1700000000);
  CHECK(copy.headers->find("x-death") == nullptr);
  CHECK(*copy.headers->find("retryloop-retries")->as_int64() == 3);
  // The copy comes back through a wait queue (an `expired` entry, not a rejection): attempt 4.
  FieldTable back = *copy.headers;
  back.append("x-death",
              FieldArray{FieldValue(death_entry("orders.wait.1s", "expired", int64_t(1)))});
  AttemptInfo next = read_attempt_info(with_headers(back), "orders", "", "orders");
  CHECK(next.attempt == 4);

  // Both counters at once: 1 + 2 rejected + 1 retry = attempt 4; the copy says 4 attempts done.
  headers.append("retryloop-retries", int64_t(1));
  info = read_attempt_info(with_headers(headers), "orders", "", "orders");
  REQUIRE(info.attempt == 4);
  copy = make_retry_copy(with_headers(headers), info, 1700000000);
  CHECK(*copy.headers->find("retryloop-retries")->as_int64() == 4);
  CHECK(read_attempt_info(copy, "orders", "", "orders").attempt == 5);
}

TEST_CASE(
    "Retry and parking copies carry no expiration and keep it in "
    "retryloop-original-expiration",
    "[retry]") {
  amqp::BasicProperties original;
  original.message_id = "m-ttl";
  original.expiration = "6000";
  AttemptInfo info = read_attempt_info(original, "orders", "orders.in", "order.created");
  CHECK(info.original_expiration == std::optional<std::string>("6000"));

  amqp::BasicProperties retry = make_retry_copy(original, info, 1700000000);
  CHECK_FALSE(retry.expiration);
  CHECK(*retry.headers->find("retryloop-original-expiration")->as_string() == "6000");

  ParkingNote note;
  note.reason = ParkReason::permanent;
  note.queue = "orders";
  amqp::BasicProperties parked = make_parking_copy(original, info, note);
  CHECK_FALSE(parked.expiration);
  CHECK(*parked.headers->find("retryloop-original-expiration")->as_string() == "6000");
  // Everything else is as it was.
  amqp::BasicProperties restored = parked;
  restored.expiration = "6000";
  restored.headers.reset();
  amqp::BasicProperties expected = original;
  expected.headers.reset();
  CHECK(encoded_header_frame(restored) == encoded_header_frame(expected));

  // A later copy keeps the first value, even if the message got another expiration meanwhile.
  amqp::BasicProperties again = retry;
  again.expiration = "10";
  AttemptInfo later = read_attempt_info(again, "orders", "", "orders");
  CHECK(later.original_expiration == std::optional<std::string>("6000"));
  CHECK(*make_parking_copy(again, later, note)
             .headers->find("retryloop-original-expiration")
             ->as_string() == "6000");

  // In reject mode the broker has already moved it into the x-death entry.
  FieldTable entry = death_entry("orders", "rejected", int64_t(1));
  entry.append("original-expiration", "6000");
  FieldTable headers;
  headers.append("x-death", FieldArray{FieldValue(entry)});
  AttemptInfo rejected = read_attempt_info(with_headers(headers), "orders", "", "orders");
  amqp::BasicProperties from_death = make_parking_copy(with_headers(headers), rejected, note);
  CHECK_FALSE(from_death.expiration);
  CHECK(*from_death.headers->find("retryloop-original-expiration")->as_string() == "6000");
  // The property, when the message has one again, comes before the x-death entry.
  amqp::BasicProperties both = with_headers(headers);
  both.expiration = "500";
  CHECK(read_attempt_info(both, "orders", "", "orders").original_expiration ==
        std::optional<std::string>("500"));

  // No expiration, no header.
  amqp::BasicProperties plain = make_parking_copy(amqp::BasicProperties{}, AttemptInfo{}, note);
  CHECK(plain.headers->find("retryloop-original-expiration") == nullptr);
}

TEST_CASE("A parking copy carries the diagnostic headers and keeps x-death as evidence",
          "[retry]") {
  FieldTable headers;
  headers.append("x-death", FieldArray{FieldValue(death_entry("orders", "rejected", int64_t(2)))});
  amqp::BasicProperties original = with_headers(headers);
  AttemptInfo info = read_attempt_info(original, "orders", "", "orders");
  ParkingNote note;
  note.reason = ParkReason::exhausted;
  note.error = std::string(5000, 'e');
  note.queue = "orders";
  note.consumer = "host-1:42";
  note.now_seconds = 1700000900;
  amqp::BasicProperties copy = make_parking_copy(original, info, note);
  const FieldTable& h = *copy.headers;
  CHECK(h.find("x-death") != nullptr);
  CHECK(*h.find("retryloop-attempts")->as_int64() == 3);
  CHECK(*h.find("retryloop-reason")->as_string() == "exhausted");
  CHECK(h.find("retryloop-error")->as_string()->size() == max_error_bytes);
  CHECK(*h.find("retryloop-queue")->as_string() == "orders");
  CHECK(*h.find("retryloop-original-exchange")->as_string() == "orders.in");
  CHECK(*h.find("retryloop-original-routing-key")->as_string() == "order.created");
  CHECK(h.find("retryloop-first-failure")->get_if<amqp::Timestamp>()->seconds == 1700000000);
  CHECK(h.find("retryloop-parked-at")->get_if<amqp::Timestamp>()->seconds == 1700000900);
  CHECK(*h.find("retryloop-consumer")->as_string() == "host-1:42");
  CHECK(copy.message_id == "m-1");
}

TEST_CASE("Error texts are cut at a character boundary", "[retry]") {
  CHECK(truncate_utf8("short", 10) == "short");
  CHECK(truncate_utf8("abc\xC3\xA9", 4) == "abc");  // é is two bytes: not split
  CHECK(truncate_utf8("abc\xC3\xA9", 5) == "abc\xC3\xA9");
  CHECK(truncate_utf8("\xE2\x82\xAC\xE2\x82\xAC", 4) == "\xE2\x82\xAC");
}

TEST_CASE("is_death_header matches exactly the broker's death headers", "[retry]") {
  CHECK(is_death_header("x-death"));
  CHECK(is_death_header("x-first-death-queue"));
  CHECK(is_death_header("x-last-death-reason"));
  CHECK_FALSE(is_death_header("x-deaths"));
  CHECK_FALSE(is_death_header("x-delivery-count"));
  CHECK_FALSE(is_death_header("retryloop-retries"));
}

TEST_CASE("The retry policy maps each outcome to its effect on the message", "[retry]") {
  const auto reject = service(topology::RetryMode::reject, {30s}, 3);
  const auto republish = service(topology::RetryMode::republish, {100ms, 300ms, 1s}, 6);
  AttemptInfo first;

  CHECK(decide(reject, first, Outcome::ack()).action == Action::ack);
  Decision dropped = decide(reject, first, Outcome::drop("duplicate"));
  CHECK(dropped.action == Action::drop);
  CHECK(dropped.error == "duplicate");

  Decision permanent = decide(reject, first, Outcome::permanent("no such customer"));
  CHECK(permanent.action == Action::park);
  CHECK(permanent.reason == ParkReason::permanent);
  CHECK(permanent.error == "no such customer");
  Decision poison = decide(republish, first, Outcome::poison("not JSON"));
  CHECK(poison.action == Action::park);
  CHECK(poison.reason == ParkReason::poison);

  CHECK(decide(reject, first, Outcome::retry("timeout")).action == Action::reject_to_wait);

  SECTION("reject mode parks as exhausted on attempt max_attempts") {
    AttemptInfo info;
    info.attempt = 2;
    CHECK(decide(reject, info, Outcome::retry("x")).action == Action::reject_to_wait);
    info.attempt = 3;
    Decision last = decide(reject, info, Outcome::retry("still down"));
    CHECK(last.action == Action::park);
    CHECK(last.reason == ParkReason::exhausted);
    CHECK(last.error == "still down");
    info.attempt = 99;
    CHECK(decide(reject, info, Outcome::retry("x")).action == Action::park);
  }
  SECTION("republish mode walks the delays and repeats the last") {
    std::vector<std::string> keys;
    for (int attempt = 1; attempt <= 5; ++attempt) {
      AttemptInfo info;
      info.attempt = attempt;
      Decision d = decide(republish, info, Outcome::retry("x"));
      REQUIRE(d.action == Action::publish_to_wait);
      keys.push_back(d.wait_routing_key);
    }
    CHECK(keys == std::vector<std::string>{"100ms", "300ms", "1s", "1s", "1s"});
    AttemptInfo info;
    info.attempt = 6;
    CHECK(decide(republish, info, Outcome::retry("x")).reason == ParkReason::exhausted);
  }
  SECTION("a retry with malformed death headers parks as poison, naming the problem") {
    AttemptInfo info;
    info.malformed = "x-death is not an array (type 'S')";
    Decision d = decide(reject, info, Outcome::retry("timeout"));
    CHECK(d.action == Action::park);
    CHECK(d.reason == ParkReason::poison);
    CHECK(d.error ==
          "cannot count attempts: x-death is not an array (type 'S'); last error: timeout");
    CHECK(decide(reject, info, Outcome::ack()).action == Action::ack);
  }
  SECTION("max_attempts 1 parks the first failure") {
    const auto once = service(topology::RetryMode::reject, {1s}, 1);
    CHECK(decide(once, first, Outcome::retry("x")).reason == ParkReason::exhausted);
  }
}

TEST_CASE("Backoff grows exponentially to its cap and jitters within its spread", "[retry]") {
  Backoff backoff{100ms, 1000ms, 2.0, 0.25};
  CHECK(backoff.delay(0, 0.5) == 100ms);
  CHECK(backoff.delay(1, 0.5) == 200ms);
  CHECK(backoff.delay(3, 0.5) == 800ms);
  CHECK(backoff.delay(4, 0.5) == 1000ms);
  CHECK(backoff.delay(60000, 0.5) == 1000ms);
  CHECK(backoff.delay(0, 0.0) == 75ms);
  CHECK(backoff.delay(0, 1.0) == 125ms);
  Backoff exact{50ms, 50ms, 2.0, 0.0};
  CHECK(exact.delay(10, 0.9) == 50ms);
}

TEST_CASE("Backoff draws its own jitter within the spread, and not the same each time", "[retry]") {
  Backoff backoff{1000ms, 1000ms, 2.0, 0.25};
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) {
    const auto delay = backoff.delay(0);
    REQUIRE(delay >= 750ms);
    REQUIRE(delay <= 1250ms);
    seen.insert(delay.count());
  }
  CHECK(seen.size() > 20);
  // It runs in event-loop callbacks, where an exception ends the process: a failed random source
  // falls back to the clock instead of throwing.
  STATIC_REQUIRE(noexcept(backoff.delay(0)));
}

TEST_CASE("The latency histogram reports bucket bounds for quantiles", "[retry]") {
  LatencyHistogram histogram;
  CHECK(histogram.quantile(0.5) == 0us);
  for (int i = 0; i < 90; ++i)
    histogram.record(std::chrono::microseconds(800));
  for (int i = 0; i < 10; ++i)
    histogram.record(std::chrono::milliseconds(40));
  CHECK(histogram.count() == 100);
  CHECK(histogram.quantile(0.5) == 1000us);
  CHECK(histogram.quantile(0.9) == 1000us);
  CHECK(histogram.quantile(0.95) == 40000us);  // the bucket bound (50 ms) capped at the max seen
  CHECK(histogram.max() == 40000us);
  CHECK(histogram.mean() == 4720us);
}

namespace {

topology::Service with_levels(std::vector<std::chrono::milliseconds> delays, int max_attempts) {
  topology::Service s = service(topology::RetryMode::republish, std::move(delays), max_attempts);
  s.retry.delay_levels = topology::DelayLevels{100ms, 16, std::nullopt};
  return s;
}

AttemptInfo attempt(int64_t number, std::optional<uint64_t> first_failure = std::nullopt) {
  AttemptInfo info;
  info.attempt = number;
  info.retries = number - 1;
  info.first_failure = first_failure;
  return info;
}

}  // namespace

TEST_CASE("retry_after waits in the delay levels, rounded up to the base and capped", "[policy]") {
  const auto s = with_levels({1s}, 5);
  DecisionContext now{1700000000, 0.5};
  Decision d = decide(s, attempt(1), Outcome::retry_after(17s, "429"), now);
  CHECK(d.action == Action::publish_to_wait);
  CHECK(d.wait_exchange == "retryloop.delay.100ms.07");
  CHECK(d.wait_routing_key == "0.1.0.1.0.1.0.1.0.0.0.0.0.0.0.0.orders");
  CHECK(d.delay == 17s);
  CHECK(d.requested_delay == 17s);
  CHECK_FALSE(d.capped);
  CHECK(d.hops == 4);

  // Rounded up to the base: never back before it asked.
  d = decide(s, attempt(1), Outcome::retry_after(1234ms, "x"), now);
  CHECK(d.delay == 1300ms);
  d = decide(s, attempt(1), Outcome::retry_after(30ms, "x"), now);
  CHECK(d.delay == 100ms);

  // 16 levels of 100 ms reach 6553.5 s; a day is cut to that, and said so.
  d = decide(s, attempt(1), Outcome::retry_after(24h, "maintenance"), now);
  CHECK(d.capped);
  CHECK(d.delay == 6553500ms);

  // A plain retry still uses the tiers.
  d = decide(s, attempt(1), Outcome::retry("x"), now);
  CHECK(d.wait_exchange.empty());
  CHECK(d.wait_routing_key == "1s");
  CHECK_FALSE(d.requested_delay);

  // The attempt cap applies to retry_after as to retry.
  d = decide(s, attempt(5), Outcome::retry_after(1s, "x"), now);
  CHECK(d.action == Action::park);
  CHECK(d.reason == ParkReason::exhausted);
}

TEST_CASE("retry_after without delay levels takes the shortest tier long enough", "[policy]") {
  DecisionContext now{1700000000, 0.5};
  const auto tiers = service(topology::RetryMode::republish, {1s, 30s, 5min}, 9);
  Decision d = decide(tiers, attempt(1), Outcome::retry_after(17s, "x"), now);
  CHECK(d.wait_routing_key == "30s");
  CHECK_FALSE(d.capped);
  d = decide(tiers, attempt(1), Outcome::retry_after(1h, "x"), now);
  CHECK(d.wait_routing_key == "5m");
  CHECK(d.capped);
  const auto reject = service(topology::RetryMode::reject, {30s}, 9);
  d = decide(reject, attempt(1), Outcome::retry_after(17s, "x"), now);
  CHECK(d.action == Action::reject_to_wait);
  CHECK(d.delay == 30s);
  CHECK(d.capped);
}

TEST_CASE("A retry is counted under its tier's delay, or a power-of-two step of the delay levels",
          "[policy]") {
  DecisionContext now{1700000000, 0.5};
  const auto tiers = service(topology::RetryMode::republish, {1s, 30s, 5min}, 9);
  CHECK(retry_delay_label(tiers, decide(tiers, attempt(2), Outcome::retry("x"), now)) == "30s");
  const auto reject = service(topology::RetryMode::reject, {250ms}, 9);
  CHECK(retry_delay_label(reject, decide(reject, attempt(1), Outcome::retry("x"), now)) == "250ms");
  // 16 levels of 100 ms: 17 s is 170 units, counted under 256; any delay gets one of 18 labels
  // (zero, and 1 to 65536 units in powers of two).
  const auto levels = with_levels({1s}, 9);
  auto label = [&](std::chrono::milliseconds delay) {
    return retry_delay_label(levels,
                             decide(levels, attempt(1), Outcome::retry_after(delay, "x"), now));
  };
  CHECK(label(17s) == "25600ms");
  CHECK(label(100ms) == "100ms");
  CHECK(label(300ms) == "400ms");
  CHECK(label(400ms) == "400ms");
  CHECK(label(0ms) == "0ms");
  CHECK(label(1s) == "1600ms");
  std::set<std::string> labels;
  for (int64_t ms = 0; ms < 7000000; ms += 9973)
    labels.insert(label(std::chrono::milliseconds(ms)));
  CHECK(labels.size() <= 18);
  // A plain retry of the same service still goes to a tier.
  CHECK(retry_delay_label(levels, decide(levels, attempt(1), Outcome::retry("x"), now)) == "1s");
}

TEST_CASE("Metrics of two consumers add up, latencies and retries by delay included", "[retry]") {
  Metrics a;
  Metrics b;
  a.acked = 3;
  a.retried = 2;
  a.retried_by_delay["1s"] = 2;
  b.retried = 3;
  b.retried_by_delay["1s"] = 1;
  b.retried_by_delay["30s"] = 2;
  a.handler_latency.record(800us);
  b.handler_latency.record(40ms);
  b.parked_poison = 1;
  a.add(b);
  CHECK(a.acked == 3);
  CHECK(a.retried == 5);
  CHECK(a.retried_by_delay == std::map<std::string, uint64_t>{{"1s", 3}, {"30s", 2}});
  CHECK(a.parked() == 1);
  CHECK(a.handler_latency.count() == 2);
  CHECK(a.handler_latency.sum() == 40800us);
  CHECK(a.handler_latency.max() == 40000us);
}

TEST_CASE("A backoff over the delay levels grows, jitters within its bounds and is capped",
          "[policy]") {
  auto s = with_levels({}, 20);
  s.retry.backoff = topology::RetryBackoff{1s, 60s, 2.0, 0.2};
  std::vector<std::chrono::milliseconds> middle;
  for (int k = 1; k <= 10; ++k) {
    Decision low = decide(s, attempt(k), Outcome::retry("x"), {1700000000, 0.0});
    Decision mid = decide(s, attempt(k), Outcome::retry("x"), {1700000000, 0.5});
    Decision high = decide(s, attempt(k), Outcome::retry("x"), {1700000000, 0.999999});
    CHECK(mid.action == Action::publish_to_wait);
    CHECK_FALSE(mid.wait_exchange.empty());
    const auto expected = std::min<std::chrono::milliseconds>(1000ms * (1 << (k - 1)), 60s);
    CHECK(mid.delay == expected);
    CHECK(low.delay >= expected * 8 / 10 - 50ms);
    CHECK(high.delay <= expected * 12 / 10 + 50ms);
    CHECK(low.delay < high.delay);
  }
}

TEST_CASE("max_retry_duration parks a message whose first failure is too long ago", "[policy]") {
  auto s = service(topology::RetryMode::republish, {1s}, 100);
  s.retry.max_retry_duration = 1h;
  const uint64_t now = 1700000000;
  Decision d = decide(s, attempt(3, now - 3599), Outcome::retry("timeout"), {now, 0.5});
  CHECK(d.action == Action::publish_to_wait);
  d = decide(s, attempt(3, now - 3600), Outcome::retry("timeout"), {now, 0.5});
  CHECK(d.action == Action::park);
  CHECK(d.reason == ParkReason::exhausted);
  // The first line stays the handler's error, so parked messages still group by it.
  CHECK(d.error.rfind("timeout\n", 0) == 0);
  CHECK_THAT(d.error, Catch::Contains("max_retry_duration 1h"));
  // A first failure is now: no budget is used up.
  d = decide(s, attempt(1), Outcome::retry("timeout"), {now, 0.5});
  CHECK(d.action == Action::publish_to_wait);
  // A permanent outcome parks at once, budget or not.
  d = decide(s, attempt(1), Outcome::permanent("bad"), {now, 0.5});
  CHECK(d.reason == ParkReason::permanent);
}

namespace {
struct RateLimited : std::runtime_error {
  RateLimited() : std::runtime_error("HTTP 429") {}
};
struct TooBusy : RateLimited {};
}  // namespace

TEST_CASE("The exception policy maps the application's exceptions to outcomes", "[policy]") {
  ExceptionPolicy policy;
  policy.on<RateLimited>([](const RateLimited& e) { return Outcome::retry_after(17s, e.what()); });
  policy.on<std::invalid_argument>([](const auto& e) { return Outcome::poison(e.what()); });
  policy.on<std::out_of_range>(
      [](const std::out_of_range&) -> Outcome { throw std::runtime_error("rule failed"); });
  auto classify = [&](auto exception) {
    return policy.classify(std::make_exception_ptr(exception));
  };
  Outcome o = classify(TooBusy{});  // derived from a mapped type
  CHECK(o.kind == OutcomeKind::retry);
  CHECK(o.delay == 17s);
  CHECK(o.text == "HTTP 429");
  CHECK(classify(std::invalid_argument("no JSON")).kind == OutcomeKind::poison);
  CHECK(classify(PermanentError("gone")).kind == OutcomeKind::permanent);
  CHECK(classify(RetryAfterError(3s, "busy")).delay == 3s);
  o = classify(std::runtime_error("timeout"));
  CHECK(o.kind == OutcomeKind::retry);
  CHECK_FALSE(o.delay);
  CHECK(classify(42).text == "unknown exception escaped the handler");
  o = classify(std::out_of_range("x"));
  CHECK(o.kind == OutcomeKind::retry);
  CHECK_THAT(o.text, Catch::Contains("rule failed"));
}

TEST_CASE(
    "An unavailable outcome, or an UnavailableError, is handled as a retry until the "
    "consumer consults the breaker",
    "[retry][outage]") {
  ExceptionPolicy policy;
  Outcome thrown = policy.classify(std::make_exception_ptr(UnavailableError("payments down")));
  CHECK(thrown.kind == OutcomeKind::unavailable);
  CHECK(thrown.text == "payments down");
  CHECK(std::string(to_string(OutcomeKind::unavailable)) == "unavailable");

  const auto reject = service(topology::RetryMode::reject, {30s}, 3);
  const auto republish = service(topology::RetryMode::republish, {100ms, 300ms, 1s}, 6);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    AttemptInfo info;
    info.attempt = attempt;
    for (const auto* s : {&reject, &republish}) {
      const Decision unavailable = decide(*s, info, Outcome::unavailable("payments down"));
      const Decision retried = decide(*s, info, Outcome::retry("payments down"));
      CHECK(unavailable.action == retried.action);
      CHECK(unavailable.delay == retried.delay);
      CHECK(unavailable.wait_routing_key == retried.wait_routing_key);
      CHECK(unavailable.error == "payments down");
    }
  }
}

TEST_CASE(
    "In in_queue mode a retry is a requeueing reject that the queue holds for the step times the "
    "failures, capped",
    "[retry]") {
  auto s = service(topology::RetryMode::in_queue, {300ms, 1s}, 5);
  s.queue_type = topology::QueueType::quorum;
  const std::vector<std::chrono::milliseconds> expected = {300ms, 600ms, 900ms, 1000ms};
  for (int attempt = 1; attempt <= 4; ++attempt) {
    INFO("attempt " << attempt);
    AttemptInfo info;
    info.attempt = attempt;
    const Decision d = decide(s, info, Outcome::retry("down"));
    CHECK(d.action == Action::requeue_delayed);
    CHECK(d.delay == expected[static_cast<size_t>(attempt - 1)]);
    CHECK(d.error == "down");
  }
  AttemptInfo last;
  last.attempt = 5;
  const Decision parked = decide(s, last, Outcome::retry("down"));
  CHECK(parked.action == Action::park);
  CHECK(parked.reason == ParkReason::exhausted);
  // One delay: a fixed wait.
  const auto fixed = service(topology::RetryMode::in_queue, {2s}, 5);
  AttemptInfo third;
  third.attempt = 3;
  CHECK(decide(fixed, third, Outcome::retry("down")).delay == 2s);
  CHECK(std::string(to_string(Action::requeue_delayed)) == "requeue_delayed");
}

TEST_CASE(
    "In in_queue mode the failed deliveries add to the attempt, saturating, so that a forged "
    "retryloop-retries near the largest count still parks the message",
    "[retry]") {
  FieldTable headers;
  headers.append("retryloop-retries", std::numeric_limits<int64_t>::max() - 1);
  headers.append("x-delivery-count", int64_t(5));
  const AttemptInfo info = read_attempt_info(with_headers(headers), "orders", "e", "k");
  REQUIRE(info.malformed.empty());
  REQUIRE(info.delivery_count == 5);
  CHECK(in_queue_attempt(info) == std::numeric_limits<int64_t>::max());

  AttemptInfo counted = info;
  counted.attempt = in_queue_attempt(info);
  auto s = service(topology::RetryMode::in_queue, {300ms, 1s}, 5);
  s.queue_type = topology::QueueType::quorum;
  const Decision d = decide(s, counted, Outcome::retry("down"));
  CHECK(d.action == Action::park);
  CHECK(d.reason == ParkReason::exhausted);

  AttemptInfo second;
  second.attempt = 2;
  second.delivery_count = 1;
  CHECK(in_queue_attempt(second) == 3);
}
