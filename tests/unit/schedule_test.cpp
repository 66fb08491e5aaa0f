// Scheduled delivery without a broker: the copy a scheduled message is published as (its route,
// its due time, the headers it keeps, gains and loses), the requests it refuses, and what
// `retryloop send` reports of each publish's outcome.

#include <catch2/catch.hpp>

#include <random>
#include <stdexcept>
#include <string>

#include "cli/schedule_command.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "support/topology.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

topology::Schedule one_second_levels() {
  auto t = parse_valid_topology(
      R"({"delay_levels": {"base": "1s", "max": "1h", "queues": ["mail", "orders"]}})");
  return *t.schedule;
}

}  // namespace

TEST_CASE("A scheduled message is due no earlier than asked, to a whole number of the base",
          "[schedule]") {
  const auto schedule = one_second_levels();
  const int64_t now = 1'800'000'000'000;
  std::mt19937 random(5);
  std::vector<std::chrono::milliseconds> asks = {1ms, 300ms,  499ms,  500ms, 999ms,
                                                 1s,  1001ms, 4200ms, 90s,   1h};
  for (int k = 0; k < 300; ++k)
    asks.push_back(std::chrono::milliseconds(1 + random() % 3'600'000));
  for (auto ask : asks) {
    INFO("asks " << ask.count() << " ms");
    auto copy = schedule::make_scheduled_copy(schedule, "mail", {}, ask, now);
    CHECK(copy.delay >= ask);
    CHECK(copy.delay - ask < 1s);
    CHECK(copy.delay.count() % 1000 == 0);
    CHECK(copy.due_at_ms == now + copy.delay.count());
    CHECK(copy.scheduled_at_ms == now);
    CHECK(topology::is_delay_level_object(copy.exchange));
    CHECK(
        topology::is_delay_route_of(topology::schedule_target(schedule, "mail"), copy.routing_key));
  }
  // Below half the base, between levels: up, never to the nearest.
  CHECK(schedule::make_scheduled_copy(schedule, "mail", {}, 300ms, now).delay == 1s);
  CHECK(schedule::make_scheduled_copy(schedule, "mail", {}, 4200ms, now).delay == 5s);
  // Nothing to wait: straight to the queue through the default exchange, where a missing queue
  // is returned.
  for (std::chrono::milliseconds ask : {0ms, -5000ms}) {
    auto now_copy = schedule::make_scheduled_copy(schedule, "orders", {}, ask, now);
    CHECK(now_copy.exchange.empty());
    CHECK(now_copy.routing_key == "orders");
    CHECK(now_copy.due_at_ms == now);
  }
}

TEST_CASE("A scheduled message keeps its properties, gains two headers and loses the broker's",
          "[schedule]") {
  const auto schedule = one_second_levels();
  amqp::BasicProperties properties;
  properties.content_type = "application/json";
  properties.message_id = "m-1";
  properties.correlation_id = "c-1";
  properties.expiration = "500";
  properties.headers.emplace();
  properties.headers->set("tenant", "acme");
  properties.headers->set("x-death", amqp::FieldValue(amqp::FieldArray{}));
  properties.headers->set("x-first-death-queue", "old");
  properties.headers->set("x-last-death-reason", "expired");
  auto copy = schedule::make_scheduled_copy(schedule, "mail", properties, 90s, 1000);
  const auto& headers = *copy.properties.headers;
  CHECK(copy.properties.content_type == properties.content_type);
  CHECK(copy.properties.message_id == properties.message_id);
  CHECK(copy.properties.correlation_id == properties.correlation_id);
  CHECK(copy.properties.delivery_mode == 2);  // persistent unless the caller chose otherwise
  // A per-message TTL would cut the wait short: it is kept in a header instead.
  CHECK_FALSE(copy.properties.expiration);
  REQUIRE(headers.find(retry::header::original_expiration));
  CHECK(*headers.find(retry::header::original_expiration)->as_string() == "500");
  CHECK(*headers.find("tenant")->as_string() == "acme");
  CHECK(headers.find("x-death") == nullptr);
  CHECK(headers.find("x-first-death-queue") == nullptr);
  CHECK(headers.find("x-last-death-reason") == nullptr);
  CHECK(headers.find(schedule::header::scheduled_at)->as_int64() == 1000);
  CHECK(headers.find(schedule::header::due_at)->as_int64() == 91000);

  properties.delivery_mode = 1;
  CHECK(
      schedule::make_scheduled_copy(schedule, "mail", properties, 1s, 0).properties.delivery_mode ==
      1);
}

TEST_CASE("Scheduling refuses a queue the file does not name and a delay the levels cannot wait",
          "[schedule]") {
  const auto schedule = one_second_levels();
  CHECK_THROWS_WITH(schedule::make_scheduled_copy(schedule, "payments", {}, 1s, 0),
                    "queue \"payments\" does not receive scheduled messages; the topology file's "
                    "delay_levels.queues names mail, orders");
  CHECK(schedule::longest_schedule_delay(schedule) == 1h);
  CHECK_NOTHROW(schedule::make_scheduled_copy(schedule, "mail", {}, 1h, 0));
  // Longer than the levels: cut short it would arrive early, so it is refused.
  CHECK_THROWS_WITH(schedule::make_scheduled_copy(schedule, "mail", {}, 1h + 1ms, 0),
                    "a delay of 3601s is longer than the delay levels' 1h, so the message would "
                    "arrive early; raise delay_levels.max in the topology file");
}

namespace {

client::PublishOutcome failed(client::Error error) {
  client::PublishOutcome outcome;
  outcome.status = client::PublishStatus::failed;
  outcome.error = std::move(error);
  return outcome;
}

client::Error channel_closed(uint16_t reply_code, const std::string& text) {
  client::Error error(client::ClientError::channel_closed, text);
  error.reply_code = reply_code;
  error.class_id = 60;  // basic.publish
  error.method_id = 40;
  return error;
}

}  // namespace

TEST_CASE(
    "send reports a message the broker returned or nacked as refused, and one whose channel "
    "ended before its confirm as unknown, unless it was the only one awaiting a refusal",
    "[schedule][cli]") {
  using cli::SendOutcome;
  client::PublishOutcome outcome;
  outcome.status = client::PublishStatus::acked;
  CHECK(cli::send_outcome(outcome, 0) == SendOutcome::scheduled);
  outcome.status = client::PublishStatus::returned;
  CHECK(cli::send_outcome(outcome, 0) == SendOutcome::refused);
  outcome.status = client::PublishStatus::nacked;
  CHECK(cli::send_outcome(outcome, 0) == SendOutcome::refused);

  // The broker closed the channel for one publish: a body over its max_message_size (406), a
  // level exchange that is not there (404). Alone, that publish is the one refused.
  const auto too_large = failed(channel_closed(406,
                                               "PRECONDITION_FAILED - message size 2097152 "
                                               "is larger than configured max size 1048576"));
  const auto no_exchange = failed(channel_closed(404, "NOT_FOUND - no exchange"));
  CHECK(cli::send_outcome(too_large, 1) == SendOutcome::refused);
  CHECK(cli::send_outcome(no_exchange, 1) == SendOutcome::refused);
  CHECK(cli::send_outcome(failed(channel_closed(403, "ACCESS_REFUSED")), 1) ==
        SendOutcome::refused);
  // With others awaiting, the one it was for is not known: those before it were most likely
  // enqueued, those after it dropped. Each may or may not be held.
  for (size_t awaiting : {2, 20, 1000}) {
    INFO(awaiting << " awaiting");
    CHECK(cli::send_outcome(too_large, awaiting) == SendOutcome::unknown);
    CHECK(cli::send_outcome(no_exchange, awaiting) == SendOutcome::unknown);
  }

  // The connection ended, or the channel closed for something other than a publish: unknown,
  // however many awaited.
  for (size_t awaiting : {1, 2, 1000}) {
    INFO(awaiting << " awaiting");
    CHECK(cli::send_outcome(failed(client::Error(client::ClientError::connection_lost)),
                            awaiting) == SendOutcome::unknown);
    CHECK(cli::send_outcome(failed(client::Error(client::ClientError::heartbeat_timeout)),
                            awaiting) == SendOutcome::unknown);
    client::Error forced(client::ClientError::connection_closed, "CONNECTION_FORCED");
    forced.reply_code = 320;
    CHECK(cli::send_outcome(failed(forced), awaiting) == SendOutcome::unknown);
    CHECK(cli::send_outcome(failed(channel_closed(541, "INTERNAL_ERROR")), awaiting) ==
          SendOutcome::unknown);
  }
}
