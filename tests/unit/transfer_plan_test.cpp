#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/transfer/plan.hpp"

using namespace std::chrono_literals;
using retryloop::amqp::BasicProperties;
using retryloop::amqp::FieldArray;
using retryloop::amqp::FieldTable;
using retryloop::amqp::FieldValue;
using retryloop::amqp::Timestamp;
using retryloop::topology::QueueType;
using retryloop::topology::RetryMode;
using retryloop::topology::Service;
using retryloop::transfer::Placement;
using retryloop::transfer::Source;

namespace {

Service orders_service(RetryMode mode, std::vector<std::chrono::milliseconds> delays) {
  Service s;
  s.name = "orders";
  s.queue = "orders";
  s.retry.mode = mode;
  s.retry.delays = std::move(delays);
  s.retry.max_attempts = 5;
  return s;
}

/// Properties as RabbitMQ leaves a message it dead-lettered from `queue` (rejected, `count`
/// times, first at `time`) and, after the first, expired from the wait queue.
BasicProperties rejected(const std::string& queue, int64_t count, uint64_t time) {
  FieldTable entry;
  entry.append("count", FieldValue(count));
  entry.append("reason", FieldValue("rejected"));
  entry.append("queue", FieldValue(queue));
  entry.append("time", FieldValue(Timestamp{time}));
  entry.append("exchange", FieldValue("orders.in"));
  entry.append("routing-keys", FieldValue(FieldArray{FieldValue("new")}));
  FieldArray deaths;
  deaths.push_back(FieldValue(std::move(entry)));
  FieldTable headers;
  headers.append("x-death", FieldValue(std::move(deaths)));
  headers.append("x-first-death-queue", FieldValue(queue));
  BasicProperties properties;
  properties.headers = std::move(headers);
  properties.message_id = "m1";
  return properties;
}

/// orders in republish mode, its retries waiting in `levels` delay levels of base 1 s.
Service levelled_orders(int levels) {
  Service s = orders_service(RetryMode::republish, {5s});
  s.retry.delay_levels = retryloop::topology::DelayLevels{1s, levels, std::nullopt};
  return s;
}

/// A file's schedule of `levels` levels of base 1 s, delivering to `queues`.
retryloop::topology::Schedule one_second_schedule(int levels, std::vector<std::string> queues) {
  retryloop::topology::Schedule schedule;
  schedule.levels = retryloop::topology::DelayLevels{1s, levels, std::nullopt};
  schedule.queues = std::move(queues);
  return schedule;
}

const FieldValue* find_header(const BasicProperties& properties, std::string_view name) {
  return properties.headers ? properties.headers->find(name) : nullptr;
}

}  // namespace

TEST_CASE("A transfer reads the service queue, the wait queues shortest first, then parking",
          "[transfer]") {
  auto sources =
      retryloop::transfer::transfer_sources(orders_service(RetryMode::republish, {30s, 1s, 30s}));
  REQUIRE(sources.size() == 4);
  CHECK(sources[0].kind == Source::Kind::service_queue);
  CHECK(sources[0].queue == "orders");
  CHECK(sources[1].kind == Source::Kind::wait_queue);
  CHECK(sources[1].queue == "orders.wait.1s");
  CHECK(sources[1].delay == 1s);
  CHECK(sources[2].queue == "orders.wait.30s");
  CHECK(sources[2].delay == 30s);
  CHECK(sources[3].kind == Source::Kind::parking);
  CHECK(sources[3].queue == "orders.parking");

  auto in_queue =
      retryloop::transfer::transfer_sources(orders_service(RetryMode::in_queue, {1s, 30s}));
  REQUIRE(in_queue.size() == 2);
  CHECK(in_queue[1].kind == Source::Kind::parking);
}

TEST_CASE("Moved retries wait in levels of the transfer's precision that reach the longest delay",
          "[transfer]") {
  Service s = orders_service(RetryMode::reject, {37s});
  s.queue_type = QueueType::quorum;
  auto schedule = retryloop::transfer::transfer_schedule(s, 100ms);
  REQUIRE(schedule);
  CHECK(schedule->levels.base == 100ms);
  CHECK(schedule->levels.levels == 9);  // 100 ms * (2^9 - 1) = 51.1 s >= 37 s; 2^8 - 1 = 25.5 s
  CHECK(schedule->queue_type == QueueType::quorum);
  REQUIRE(schedule->queues.size() == 1);
  CHECK(schedule->queues[0] == "orders");

  Service ladder = retryloop::transfer::ladder_service(s, 100ms);
  auto route = retryloop::topology::delay_route(ladder, 36'950ms);
  CHECK(route.delay == 37s);  // rounded up to the precision, never down
  CHECK_FALSE(route.capped);
  CHECK(route.routing_key.substr(route.routing_key.size() - 7) == ".orders");

  // A service with levels of its own uses them.
  Service levelled = orders_service(RetryMode::republish, {5s});
  levelled.retry.delay_levels = retryloop::topology::DelayLevels{1s, 6, std::nullopt};
  CHECK_FALSE(retryloop::transfer::transfer_schedule(levelled, 100ms));
  CHECK(retryloop::topology::delay_set_name(retryloop::transfer::ladder_service(levelled, 100ms)) ==
        retryloop::topology::delay_set_name(levelled));
}

TEST_CASE("A retry's due time comes from retryloop-retry-due, or a first rejection's x-death time",
          "[transfer]") {
  const Source wait{Source::Kind::wait_queue, "orders.wait.30s", 30s, 0, {}};

  BasicProperties republished;
  FieldTable headers;
  headers.append(std::string(retryloop::retry::header::retry_due),
                 FieldValue(int64_t(1'700'000'012'345)));
  republished.headers = headers;
  CHECK(retryloop::transfer::due_time(republished, wait, "orders") == 1'700'000'012'345);

  // Rejected once at second 1,700,000,000: in the wait queue from then to a second later, so due
  // no earlier than 1,700,000,031 s.
  CHECK(retryloop::transfer::due_time(rejected("orders", 1, 1'700'000'000), wait, "orders") ==
        1'700'000'031'000);
  // Rejected a third time: the entry keeps the first rejection's time, which says nothing of now.
  CHECK_FALSE(retryloop::transfer::due_time(rejected("orders", 3, 1'700'000'000), wait, "orders"));
  // Another queue's rejection, and no history at all.
  CHECK_FALSE(retryloop::transfer::due_time(rejected("other", 1, 1'700'000'000), wait, "orders"));
  CHECK_FALSE(retryloop::transfer::due_time(BasicProperties{}, wait, "orders"));
  // x-death says nothing of a message in the service queue.
  const Source queue{Source::Kind::service_queue, "orders", 0ms, 0, {}};
  CHECK_FALSE(retryloop::transfer::due_time(rejected("orders", 1, 1'700'000'000), queue, "orders"));
}

TEST_CASE("A waiting retry goes through the levels for what is left of its delay, never less",
          "[transfer]") {
  const Source wait{Source::Kind::wait_queue, "orders.wait.30s", 30s, 0, {}};
  const int64_t now = 1'700'000'000'000;

  Placement later = retryloop::transfer::place(now + 12'345, wait.delay, now, false);
  CHECK(later.kind == Placement::Kind::levels);
  CHECK(later.delay == 12'345ms);
  CHECK(later.due_known);

  Placement due = retryloop::transfer::place(now - 5, wait.delay, now, false);
  CHECK(due.kind == Placement::Kind::service_queue);
  CHECK(retryloop::transfer::place(now, wait.delay, now, false).kind ==
        Placement::Kind::service_queue);

  // Not known: its whole delay again (never early), or left to come due where it is.
  Placement unknown = retryloop::transfer::place(std::nullopt, wait.delay, now, false);
  CHECK(unknown.kind == Placement::Kind::levels);
  CHECK(unknown.delay == 30s);
  CHECK_FALSE(unknown.due_known);
  CHECK(retryloop::transfer::place(std::nullopt, wait.delay, now, true).kind ==
        Placement::Kind::leave);
}

TEST_CASE("A moved retry keeps its attempts in retryloop-retries, without the broker's x-death",
          "[transfer]") {
  const Source wait{Source::Kind::wait_queue, "orders.wait.30s", 30s, 0, {}};
  // Rejected three times: its next delivery is attempt 4, on the new broker too.
  BasicProperties copy =
      retryloop::transfer::transfer_copy(rejected("orders", 3, 1'700'000'000), wait, "orders", "",
                                         "orders.wait.30s", 1'700'000'100, 1'700'000'130'000);
  CHECK(find_header(copy, "x-death") == nullptr);
  CHECK(find_header(copy, "x-first-death-queue") == nullptr);
  REQUIRE(find_header(copy, retryloop::retry::header::retries) != nullptr);
  CHECK(find_header(copy, retryloop::retry::header::retries)->as_int64() == 3);
  CHECK(find_header(copy, retryloop::retry::header::retry_due)->as_int64() == 1'700'000'130'000);
  CHECK(find_header(copy, retryloop::retry::header::original_exchange)->as_string() ==
        std::string_view("orders.in"));
  CHECK(copy.message_id == "m1");
  auto info = retryloop::retry::read_attempt_info(copy, "orders", "", "orders");
  CHECK(info.attempt == 4);

  // Parked: as it is, x-death and all.
  const Source parking{Source::Kind::parking, "orders.parking", 0ms, 0, {}};
  BasicProperties parked = rejected("orders", 5, 1'700'000'000);
  CHECK(retryloop::transfer::transfer_copy(parked, parking, "orders", "orders.parking", "", 0, 0) ==
        parked);
  // In the service queue and never retried: as it is.
  const Source queue{Source::Kind::service_queue, "orders", 0ms, 0, {}};
  BasicProperties fresh;
  fresh.message_id = "m2";
  CHECK(retryloop::transfer::transfer_copy(fresh, queue, "orders", "orders.in", "new", 0, 0) ==
        fresh);
  // Back in the service queue after two rejections: attempt 3 next, wherever it is delivered.
  BasicProperties back = retryloop::transfer::transfer_copy(
      rejected("orders", 2, 1'700'000'000), queue, "orders", "", "orders", 1'700'000'100, 0);
  CHECK(find_header(back, "x-death") == nullptr);
  CHECK(find_header(back, retryloop::retry::header::retry_due) == nullptr);
  CHECK(retryloop::retry::read_attempt_info(back, "orders", "", "orders").attempt == 3);
}

TEST_CASE(
    "A transfer reads the shared delay levels that hold the service's retries and the messages "
    "scheduled for it, longest level first, each set once",
    "[transfer]") {
  const Service levelled = levelled_orders(3);
  auto schedule = one_second_schedule(5, {"mail", "orders"});

  // The service's own set (3 levels) and the schedule's, the same set, 5 levels deep: one read of
  // each of the 5, then of the set's unrouted queue, between the wait queue and parking.
  auto ladders = retryloop::transfer::level_ladders(levelled, schedule);
  REQUIRE(ladders.size() == 2);
  auto sources = retryloop::transfer::transfer_sources(levelled, ladders);
  REQUIRE(sources.size() == 9);
  CHECK(sources[1].kind == Source::Kind::wait_queue);
  for (int i = 0; i < 5; ++i) {
    INFO(i);
    CHECK(sources[2 + i].kind == Source::Kind::delay_level);
    CHECK(sources[2 + i].level == 4 - i);
    CHECK(sources[2 + i].ladders == std::vector<size_t>{0, 1});  // both ladders use the set
    CHECK(sources[2 + i].queue == "retryloop.delay.1s.0" + std::to_string(4 - i));
    CHECK(sources[2 + i].delay == std::chrono::seconds(1 << (4 - i)));
  }
  CHECK(sources[7].kind == Source::Kind::unrouted);
  CHECK(sources[7].queue == "retryloop.delay.1s.unrouted");
  CHECK(sources[7].ladders == std::vector<size_t>{0, 1});
  CHECK(sources[8].kind == Source::Kind::parking);

  // A quorum schedule is another set: read after the service's own.
  schedule.queue_type = QueueType::quorum;
  sources = retryloop::transfer::transfer_sources(
      levelled, retryloop::transfer::level_ladders(levelled, schedule));
  REQUIRE(sources.size() == 13);
  CHECK(sources[2].queue == "retryloop.delay.1s.02");
  CHECK(sources[5].queue == "retryloop.delay.1s.unrouted");
  CHECK(sources[6].queue == "retryloop.delay.1s.quorum.04");
  CHECK(sources[10].queue == "retryloop.delay.1s.quorum.00");
  CHECK(sources[11].queue == "retryloop.delay.1s.quorum.unrouted");
  CHECK(sources[2].ladders == std::vector<size_t>{0});
  CHECK(sources[10].ladders == std::vector<size_t>{1});
  CHECK(sources[11].ladders == std::vector<size_t>{1});

  // The schedule's part for a service: only its own queue.
  auto own = retryloop::transfer::service_schedule(levelled, schedule);
  REQUIRE(own);
  CHECK(own->queues == std::vector<std::string>{"orders"});
  // A schedule that does not name the service's queue, and a service without levels: none.
  schedule.queues = {"mail"};
  CHECK_FALSE(retryloop::transfer::service_schedule(levelled, schedule));
  CHECK(retryloop::transfer::level_ladders(orders_service(RetryMode::reject, {5s}), schedule)
            .empty());
  CHECK(retryloop::transfer::transfer_sources(orders_service(RetryMode::reject, {5s}), {}).size() ==
        3);
}

TEST_CASE(
    "A message in a shared level is the service's only when routed for its queue, and waits at "
    "most the rest of its route when it says nothing of its due time",
    "[transfer]") {
  const Service levelled = levelled_orders(4);
  const auto schedule = one_second_schedule(6, {"orders"});
  auto ladders = retryloop::transfer::level_ladders(levelled, schedule);
  auto sources = retryloop::transfer::transfer_sources(levelled, ladders);
  const Source& level2 = sources[2 + 3];  // levels 5, 4, 3, then 2
  REQUIRE(level2.level == 2);

  // A retry of the service (4 words), one scheduled for its queue (6 words), and others.
  const Service* retry = retryloop::transfer::ladder_of(ladders, level2, "1.0.1.1.orders");
  REQUIRE(retry != nullptr);
  CHECK(retry->retry.delay_levels->levels == 4);
  const Service* scheduled = retryloop::transfer::ladder_of(ladders, level2, "0.1.1.0.0.1.orders");
  REQUIRE(scheduled != nullptr);
  CHECK(scheduled->retry.delay_levels->levels == 6);
  CHECK(retryloop::transfer::ladder_of(ladders, level2, "1.0.1.1.mail") == nullptr);
  CHECK(retryloop::transfer::ladder_of(ladders, level2, "1.0.1.orders") == nullptr);
  CHECK(retryloop::transfer::ladder_of(ladders, level2, "1.0.1.1.x.orders") == nullptr);
  // The same route read from a level of a set that only the schedule uses.
  Source other_set = level2;
  other_set.ladders = {1};
  CHECK(retryloop::transfer::ladder_of(ladders, other_set, "1.0.1.1.orders") == nullptr);
  CHECK(retryloop::transfer::ladder_of(ladders, other_set, "0.1.1.0.0.1.orders") == &ladders[1]);

  // In level 2 (4 s), with bits 0 and 1 of the route: at most 4 + 1 + 2 s left; bit 1 only: 6 s.
  CHECK(retryloop::transfer::level_wait_bound(*retry, level2, "1.1.1.0.orders") == 7s);
  CHECK(retryloop::transfer::level_wait_bound(*retry, level2, "0.1.1.1.orders") == 6s);
  const Source& level0 = sources[2 + 5];
  REQUIRE(level0.level == 0);
  CHECK(retryloop::transfer::level_wait_bound(*retry, level0, "1.0.0.0.orders") == 1s);

  // Its due time: a retry's retryloop-retry-due, a scheduled message's retryloop-due-at.
  BasicProperties due_at;
  due_at.headers = FieldTable{};
  due_at.headers->append("retryloop-due-at", FieldValue(int64_t(1'700'000'009'000)));
  CHECK(retryloop::transfer::due_time(due_at, level2, "orders") == 1'700'000'009'000);
  // retryloop-due-at says nothing in a wait queue, which only a retry reaches.
  const Source wait{Source::Kind::wait_queue, "orders.wait.5s", 5s, 0, {}};
  CHECK_FALSE(retryloop::transfer::due_time(due_at, wait, "orders"));
  CHECK_FALSE(retryloop::transfer::due_time(BasicProperties{}, level2, "orders"));

  // The copy keeps its due time and headers, without what the old broker's levels wrote.
  BasicProperties waited = due_at;
  waited.headers->append("x-death", FieldValue(FieldArray{}));
  waited.headers->append("x-last-death-queue", FieldValue("retryloop.delay.1s.03"));
  waited.headers->append("x-delivery-count", FieldValue(int64_t(1)));
  waited.headers->append("retryloop-scheduled-at", FieldValue(int64_t(1'700'000'000'000)));
  BasicProperties copy =
      retryloop::transfer::transfer_copy(waited, level2, "orders", "retryloop.delay.1s.03",
                                         "0.1.1.0.0.1.orders", 0, 1'700'000'009'000);
  CHECK(find_header(copy, "x-death") == nullptr);
  CHECK(find_header(copy, "x-last-death-queue") == nullptr);
  CHECK(find_header(copy, "x-delivery-count") == nullptr);
  CHECK(find_header(copy, "retryloop-due-at")->as_int64() == 1'700'000'009'000);
  CHECK(find_header(copy, "retryloop-scheduled-at")->as_int64() == 1'700'000'000'000);
  CHECK(find_header(copy, retryloop::retry::header::retries) == nullptr);

  // The set's unrouted queue: the same routes are the service's, and its copies lose the same
  // headers (the broker's, and the levels' last dead-lettering).
  const Source& unrouted = sources[2 + 6];
  REQUIRE(unrouted.kind == Source::Kind::unrouted);
  CHECK(retryloop::transfer::ladder_of(ladders, unrouted, "1.0.1.1.orders") == retry);
  CHECK(retryloop::transfer::ladder_of(ladders, unrouted, "0.1.1.0.0.1.orders") == scheduled);
  CHECK(retryloop::transfer::ladder_of(ladders, unrouted, "1.0.1.1.mail") == nullptr);
  copy = retryloop::transfer::transfer_copy(
      waited, unrouted, "orders", "retryloop.delay.1s.deliver", "0.1.1.0.0.1.orders", 0, 0);
  CHECK(find_header(copy, "x-death") == nullptr);
  CHECK(find_header(copy, "x-delivery-count") == nullptr);
  CHECK(find_header(copy, "retryloop-due-at")->as_int64() == 1'700'000'009'000);
}

TEST_CASE(
    "A scheduled queue no service declares is transferred on its own: its messages as they are, "
    "then what its schedule's levels hold for it",
    "[transfer]") {
  retryloop::topology::Topology file;
  file.services = {levelled_orders(3)};
  file.schedule = one_second_schedule(5, {"mail", "orders", "sms", "mail"});
  // orders is the service's queue; mail and sms are someone else's, each named once.
  CHECK(retryloop::transfer::unowned_scheduled_queues(file) ==
        std::vector<std::string>{"mail", "sms"});
  file.schedule.reset();
  CHECK(retryloop::transfer::unowned_scheduled_queues(file).empty());
  file.schedule = one_second_schedule(5, {"mail", "orders", "sms"});

  const auto ladders = retryloop::transfer::queue_level_ladders("mail", file.schedule);
  REQUIRE(ladders.size() == 1);
  CHECK(retryloop::topology::input_queue_name(ladders[0]) == "mail");
  CHECK(ladders[0].retry.delay_levels->levels == 5);
  CHECK(retryloop::transfer::queue_level_ladders("billing", file.schedule).empty());

  // The queue, its 5 levels longest first, the set's unrouted queue: no wait queue, no parking.
  const auto sources = retryloop::transfer::scheduled_queue_sources("mail", ladders);
  REQUIRE(sources.size() == 7);
  CHECK(sources[0].kind == Source::Kind::scheduled_queue);
  CHECK(sources[0].queue == "mail");
  CHECK(sources[1].queue == "retryloop.delay.1s.04");
  CHECK(sources[5].queue == "retryloop.delay.1s.00");
  CHECK(sources[6].kind == Source::Kind::unrouted);
  // Only mail's routes are its own, not the service's that shares the set.
  CHECK(retryloop::transfer::ladder_of(ladders, sources[3], "1.0.1.1.0.mail") == &ladders[0]);
  CHECK(retryloop::transfer::ladder_of(ladders, sources[3], "1.0.1.1.0.orders") == nullptr);
  CHECK(retryloop::transfer::ladder_of(ladders, sources[6], "1.0.1.1.0.mail") == &ladders[0]);

  // A message of the queue keeps everything, its x-death too: the queue is its owner's.
  const BasicProperties own = rejected("mail", 2, 1'700'000'000);
  const BasicProperties copy =
      retryloop::transfer::transfer_copy(own, sources[0], "mail", "", "mail", 1'700'000'100, 0);
  CHECK(copy == own);
}
