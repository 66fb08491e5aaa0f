// A live migration's plan and state machine, with no broker: what a survey of the broker turns
// into, what is refused, the record a rerun resumes from, and when a drain looks again.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "retryloop/migrate/copied_log.hpp"
#include "retryloop/migrate/migration.hpp"
#include "retryloop/migrate/plan.hpp"
#include "support/topology.hpp"

using namespace retryloop;
using namespace retryloop::migrate;
using namespace std::chrono_literals;

namespace {

topology::Service orders(const std::string& extra = R"("queue_type": "quorum")") {
  return parse_valid_topology(R"({"services": [{"name": "orders", )" + extra +
                              R"(, "input": {"exchange": "orders.in", "type": "topic",
                                  "bindings": ["order.*", "refund.*"]},
                              "retry": {"mode": "republish", "delays": ["5s", "30s"],
                                        "max_attempts": 4}}]})")
      .services.front();
}

ObjectFound found(const std::string& name, Found state, uint64_t messages = 0,
                  const std::string& argument = {}) {
  ObjectFound object;
  object.name = name;
  object.found = state;
  object.messages = messages;
  object.argument = argument;
  return object;
}

/// Everything as the file wants it.
Survey matching() {
  Survey survey;
  survey.exchanges = {found("orders.in", Found::matches), found("orders.wait", Found::matches),
                      found("orders.parking", Found::matches)};
  survey.service_queue = found("orders", Found::matches, 300);
  survey.wait_queues = {found("orders.wait.5s", Found::matches),
                        found("orders.wait.30s", Found::matches)};
  survey.parking_queue = found("orders.parking", Found::matches, 12);
  return survey;
}

std::vector<std::string> described(const MigrationPlan& plan) {
  std::vector<std::string> out;
  for (const Step& step : plan.steps)
    out.push_back(describe(step));
  return out;
}

}  // namespace

TEST_CASE("A broker that has what the file wants needs no migration", "[migrate]") {
  const MigrationPlan plan = make_migration_plan(orders(), matching());
  CHECK(plan.empty());
  CHECK(plan.refused.empty());
  CHECK(plan.messages_to_move == 0);
}

TEST_CASE(
    "A classic service queue made quorum goes through a holding queue that takes its bindings and "
    "its consumers while it is moved, deleted and declared again, then gives them back",
    "[migrate]") {
  Survey survey = matching();
  survey.service_queue = found("orders", Found::differs, 300, "x-queue-type");
  const MigrationPlan plan = make_migration_plan(orders(), survey);
  REQUIRE(plan.refused.empty());
  CHECK(described(plan) == std::vector<std::string>{
                               "queue orders.migrating",
                               "move binding orders.in -> orders (order.*) to orders.migrating",
                               "move binding orders.in -> orders (refund.*) to orders.migrating",
                               "move binding orders.wait -> orders (orders) to orders.migrating",
                               "the instances consume orders.migrating beside orders",
                               "move orders -> orders.migrating",
                               "wait until orders is empty and has no consumer",
                               "delete queue orders",
                               "queue orders",
                               "move binding orders.in -> orders.migrating (order.*) to orders",
                               "move binding orders.in -> orders.migrating (refund.*) to orders",
                               "move binding orders.wait -> orders.migrating (orders) to orders",
                               "the instances consume orders alone again",
                               "move orders.migrating -> orders",
                               "wait until orders.migrating is empty and has no consumer",
                               "delete queue orders.migrating",
                           });
  // The holding queue has the file's arguments, the new type among them.
  const Step& holding = plan.steps.front();
  REQUIRE(holding.action.arguments.find("x-queue-type"));
  CHECK(topology::format_value(*holding.action.arguments.find("x-queue-type")) == "quorum");
  CHECK(plan.messages_to_move == 600);
  CHECK(plan.drain_time == 0ms);
  CHECK(plan.steps[0].why == "the service queue differs from the file (first: x-queue-type)");
  // Each binding passes to the holding queue, bound there before it is unbound here, before
  // anything is moved: a publish in between reaches one queue or both, never none.
  size_t first_move = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].kind == StepKind::move && first_move == 0) first_move = i;
  }
  CHECK(plan.steps[1].kind == StepKind::move_binding);
  CHECK(plan.steps[1].action.name == "orders.migrating");
  CHECK(plan.steps[1].target == "orders");
  CHECK(first_move == 5);
  // The old queue is deleted as the classic queue it is, the holding queue as a quorum queue.
  CHECK_FALSE(plan.steps[7].quorum);
  CHECK(plan.steps[15].quorum);
}

TEST_CASE(
    "A queue whose refusal names another argument than x-queue-type may be a quorum queue, and "
    "is deleted without if-empty and if-unused, which RabbitMQ refuses for those",
    "[migrate]") {
  // A quorum service made classic: declared without x-queue-type, it was refused for another
  // argument first.
  Survey survey = matching();
  survey.service_queue = found("orders", Found::differs, 10, "x-delivery-limit");
  survey.stale_wait_queues = {found("orders.wait.1m", Found::matches, 0)};
  const MigrationPlan plan = make_migration_plan(orders(R"("queue_type": "classic")"), survey);
  size_t deletes = 0;
  for (const Step& step : plan.steps) {
    if (step.kind != StepKind::delete_queue) continue;
    ++deletes;
    INFO(step.queue);
    // The holding queue is classic, as the file says: the only one known.
    CHECK(step.quorum == (step.queue != "orders.migrating"));
  }
  CHECK(deletes == 3);
  // Classic made quorum: the refusal named the type, so the old queue is known to be classic.
  survey.service_queue = found("orders", Found::differs, 10, "x-queue-type");
  const MigrationPlan back = make_migration_plan(orders(), survey);
  for (const Step& step : back.steps) {
    if (step.kind == StepKind::delete_queue)
      CHECK(step.quorum == (step.queue == "orders.migrating"));
  }
}

TEST_CASE(
    "A delay level added is declared and bound, one removed is unbound and deleted once what "
    "waits in it has come due, and one changed waits out its delay twice, nothing moved",
    "[migrate]") {
  Survey survey = matching();
  survey.wait_queues[0] = found("orders.wait.5s", Found::missing);
  survey.wait_queues[1] = found("orders.wait.30s", Found::differs, 40, "x-queue-type");
  survey.stale_wait_queues = {found("orders.wait.1m", Found::matches, 7)};
  const MigrationPlan plan = make_migration_plan(orders(), survey);
  CHECK(described(plan) == std::vector<std::string>{
                               "queue orders.wait.5s",
                               "binding orders.wait -> orders.wait.5s (5s)",
                               "queue orders.wait.30s.migrating",
                               "move binding orders.wait -> orders.wait.30s (30s) to "
                               "orders.wait.30s.migrating",
                               "wait until orders.wait.30s is empty (its retries come due "
                               "within 30s)",
                               "delete queue orders.wait.30s",
                               "queue orders.wait.30s",
                               "move binding orders.wait -> orders.wait.30s.migrating (30s) to "
                               "orders.wait.30s",
                               "wait until orders.wait.30s.migrating is empty (its retries "
                               "come due within 30s)",
                               "delete queue orders.wait.30s.migrating",
                               "unbind orders.wait -> orders.wait.1m (1m)",
                               "wait until orders.wait.1m is empty (its retries come due within "
                               "1m)",
                               "delete queue orders.wait.1m",
                           });
  CHECK(plan.messages_to_move == 0);
  // No instance runs: the changed level waits out its delay once (what it held), the holding
  // queue takes no retry, and the removed level waits out its own.
  CHECK(plan.drain_time == 30s + 1min);
  CHECK(estimate(plan, 5000) == 90s);

  // Instances run: the holding queue may take retries, and levels found empty may too before
  // they are unbound.
  survey.service_queue.consumers = 2;
  survey.wait_queues[1].messages = 0;
  survey.stale_wait_queues[0].messages = 0;
  CHECK(make_migration_plan(orders(), survey).drain_time == 2 * 30s + 1min);
  // Neither: every drain is empty at once.
  survey.service_queue.consumers = 0;
  CHECK(make_migration_plan(orders(), survey).drain_time == 0ms);
}

TEST_CASE("A parking queue whose arguments change keeps every parked message, moved out and back",
          "[migrate]") {
  Survey survey = matching();
  survey.parking_queue = found("orders.parking", Found::differs, 12, "x-max-length");
  const MigrationPlan plan = make_migration_plan(
      orders(R"("queue_type": "quorum", "parking": {"max_length": 5000})"), survey);
  const auto steps = described(plan);
  REQUIRE(steps.size() == 10);
  CHECK(steps[0] == "queue orders.parking.migrating");
  CHECK(steps[1] == "move binding orders.parking -> orders.parking to orders.parking.migrating");
  CHECK(steps[2] == "move orders.parking -> orders.parking.migrating");
  CHECK(steps[7] == "move orders.parking.migrating -> orders.parking");
  for (const Step& step : plan.steps)
    CHECK(step.kind != StepKind::announce);  // no instance consumes parking
  CHECK(plan.messages_to_move == 24);
}

TEST_CASE(
    "An exchange with other arguments is refused with the reason and the manual steps, and the "
    "whole migration with it",
    "[migrate]") {
  Survey survey = matching();
  survey.exchanges[0] = found("orders.in", Found::differs, 0, "type");
  survey.service_queue = found("orders", Found::differs, 300, "x-queue-type");
  const MigrationPlan plan = make_migration_plan(orders(), survey);
  CHECK(plan.steps.empty());
  REQUIRE(plan.refused.size() == 1);
  CHECK(plan.refused[0].object == "exchange orders.in");
  CHECK_THAT(plan.refused[0].reason, Catch::Contains("type differs"));
  CHECK_THAT(plan.refused[0].manual_steps, Catch::Contains("topology apply"));
  const auto json = to_json(plan);
  CHECK(json["refused"][0]["object"] == "exchange orders.in");
}

TEST_CASE(
    "A migration records its progress after each step, and a rerun from the record goes on at "
    "the first step not done, with the same plan only",
    "[migrate]") {
  Survey survey = matching();
  survey.service_queue = found("orders", Found::differs, 300, "x-queue-type");
  const MigrationPlan plan = make_migration_plan(orders(), survey);
  Migration migration(plan, "m-1234", survey, 1'800'000'000'000);
  REQUIRE(migration.current());
  CHECK(migration.current()->kind == StepKind::declare_queue);
  for (int i = 0; i < 6; ++i)
    migration.done(1'800'000'000'000 + i);
  migration.moved(300);
  REQUIRE(migration.current()->kind == StepKind::drain);
  CHECK(migration.record().holding == "orders.migrating");  // announced at step 5

  // Killed here: what was recorded last is what the rerun reads.
  const Record& record = migration.record();
  std::string error;
  auto decoded = decode_record(encode_record(record), error);
  INFO(error);
  REQUIRE(decoded);
  CHECK(decoded->next_step == 6);
  CHECK(decoded->moved == 300);
  CHECK(decoded->id == "m-1234");

  // The rerun surveys a broker on which orders has been unbound: its plan is made from the
  // recorded survey, not from what it finds now.
  auto resumed = Migration::resume(make_migration_plan(orders(), decoded->survey), *decoded, error);
  REQUIRE(resumed);
  CHECK(resumed->current_index() == 6);
  CHECK(resumed->current()->queue == "orders");
  CHECK(resumed->record().holding == "orders.migrating");
  while (resumed->current())
    resumed->done(1'800'000'001'000);
  CHECK(resumed->record().finished);
  CHECK(resumed->record().holding.empty());  // back to the service queue alone

  // Another file makes another plan: refused, with what to do.
  auto other = Migration::resume(
      make_migration_plan(orders(R"("queue_type": "classic")"), decoded->survey), *decoded, error);
  CHECK_FALSE(other);
  CHECK_THAT(error, Catch::Contains("another file"));
  CHECK_FALSE(decode_record("{\"service\": \"orders\"}", error));
  CHECK(error == "the record has no \"id\"");
}

TEST_CASE(
    "A drain looks again after a tenth of its level's delay, between 100 ms and 1 s, and is "
    "overdue only well past the delay",
    "[migrate]") {
  Survey survey = matching();
  survey.stale_wait_queues = {found("orders.wait.1m", Found::matches, 7)};
  const MigrationPlan plan = make_migration_plan(orders(), survey);
  Migration migration(plan, "m-1", survey, 0);
  migration.done(0);  // unbound
  REQUIRE(migration.current()->kind == StepKind::drain);
  CHECK_FALSE(migration.wake_at());
  migration.not_yet(10s, 1000);
  CHECK(migration.wake_at() == 11s);
  CHECK(migration.draining_for(31'000) == 30s);
  CHECK_FALSE(migration.overdue(61'000, 60s));
  CHECK(migration.overdue(71'001, 60s));
  migration.done(72'000);
  CHECK_FALSE(migration.wake_at());
  CHECK(migration.draining_for(72'000) == 0ms);
  CHECK(migration.current()->kind == StepKind::delete_queue);
}

TEST_CASE("A copied log's entry holds its stamps one per line and gives them back as they were",
          "[migrate]") {
  const std::vector<std::string> stamps{"3f2a:id-00ff", "3f2a/orders.migrating/9c1d:7", "x"};
  CHECK(encode_copied(stamps) == "3f2a:id-00ff\n3f2a/orders.migrating/9c1d:7\nx\n");
  CHECK(decode_copied(encode_copied(stamps)) == stamps);
  CHECK(decode_copied("").empty());
  CHECK(decode_copied(encode_copied({})).empty());
  // A body cut short, or with blank lines, gives what it has.
  CHECK(decode_copied("a\n\nb") == std::vector<std::string>{"a", "b"});
}
