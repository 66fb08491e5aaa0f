// The idempotent consumer on a real SQLite file and a real PostgreSQL server, behind a real retry
// consumer: duplicates absorbed, writes and ids committed together, failures rolled back,
// messages without an id, retention.

#include <catch2/catch.hpp>
#include <thread>

#include "retryloop/inbox/inbox.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "support/consumer_fixture.hpp"
#include "support/databases.hpp"

using namespace retryloop;
using namespace retryloop::test;
using namespace std::chrono_literals;
using consumer::Outcome;

namespace {

TestDatabase business_database(const std::string& label, const std::string& name) {
  auto database = test::database_for(label, name);
  database.open()->execute_script("CREATE TABLE effects (message_id text, body text)");
  return database;
}

std::shared_ptr<inbox::Inbox> make_inbox(const TestDatabase& database,
                                         const std::string& consumer = "billing") {
  inbox::InboxOptions options;
  options.database = database.url;
  options.consumer = consumer;
  return inbox::Inbox::create(options);
}

// The business effect: one row per handler run that committed.
Outcome write_effect(const consumer::Message& message, store::Database& db) {
  db.execute("INSERT INTO effects (message_id, body) VALUES ($1, $2)",
             {std::string(message.message_id()), message.body});
  return Outcome::ack();
}

int64_t effects(const TestDatabase& database, const std::string& id = "") {
  auto db = database.open();
  if (id.empty()) return db->execute("SELECT count(*) FROM effects").rows[0].integer(0);
  return db->execute("SELECT count(*) FROM effects WHERE message_id = $1", {id}).rows[0].integer(0);
}

uint64_t settled(const consumer::Consumer& c) {
  auto m = c.metrics();
  return m.acked + m.dropped + m.parked() + m.retried;
}

}  // namespace

TEST_CASE("A message delivered twice runs the handler once", "[inbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "twice");
  auto inbox = make_inbox(database);
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(unique_name("ib"), R"("delays": ["200ms"], "max_attempts": 3)");
  auto c = start(loop, options_for(service), inbox->wrap(write_effect));
  broker.publish(service.input.exchange, "key", "order-1", "first copy");
  broker.publish(service.input.exchange, "key", "order-1", "second copy");
  broker.publish(service.input.exchange, "key", "order-2", "other");
  REQUIRE(eventually(loop, [&] { return settled(*c) == 3; }));
  stop(loop, c);
  CHECK(c->metrics().acked == 2);
  CHECK(c->metrics().dropped == 1);
  CHECK(effects(database, "order-1") == 1);
  CHECK(effects(database, "order-2") == 1);
  auto stats = inbox->stats();
  CHECK(stats.handled == 2);
  CHECK(stats.duplicates == 1);
  // Another consumer name keeps its own record: it handles order-1 as well.
  auto other = make_inbox(database, "shipping");
  consumer::Message message;
  message.properties.message_id = "order-1";
  CHECK(other->wrap(write_effect)(message).kind == consumer::OutcomeKind::ack);
  CHECK(effects(database, "order-1") == 2);
}

TEST_CASE("Copies handled at the same moment: one runs, the others see the duplicate", "[inbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "concurrent");
  auto inbox = make_inbox(database);
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(unique_name("ic"), R"("delays": ["200ms"], "max_attempts": 3)");
  auto options = options_for(service);
  options.handler_on_loop = false;
  options.concurrency = 4;
  auto c =
      start(loop, options, inbox->wrap([](const consumer::Message& message, store::Database& db) {
        auto outcome = write_effect(message, db);
        std::this_thread::sleep_for(200ms);  // the others arrive meanwhile
        return outcome;
      }));
  for (int i = 0; i < 4; ++i)
    broker.publish(service.input.exchange, "key", "same", "copy");
  REQUIRE(eventually(loop, [&] { return settled(*c) == 4; }));
  stop(loop, c);
  CHECK(effects(database, "same") == 1);
  CHECK(inbox->stats().duplicates == 3);
  CHECK(c->metrics().handler_errors == 0);
}

TEST_CASE("A failed handler's writes and id roll back, and its retry runs it again", "[inbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "failed");
  auto inbox = make_inbox(database);
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(unique_name("if"), R"("delays": ["200ms"], "max_attempts": 3)");
  auto c = start(loop, options_for(service),
                 inbox->wrap([](const consumer::Message& message, store::Database& db) {
                   write_effect(message, db);
                   if (message.attempt == 1) return Outcome::retry("payment gateway timed out");
                   if (message.attempt == 2) throw std::runtime_error("connection reset");
                   return Outcome::ack();
                 }));
  broker.publish(service.input.exchange, "key", "pay-1", "pay");
  REQUIRE(eventually(loop, [&] { return c->metrics().acked == 1; }));
  stop(loop, c);
  CHECK(c->metrics().retried == 2);
  CHECK(effects(database, "pay-1") == 1);  // the third run's
  CHECK(inbox->stats().rolled_back == 2);
  CHECK(inbox->stats().handled == 1);
}

TEST_CASE(
    "A message without a message-id is parked as poison, naming why, unless asked to "
    "handle it",
    "[inbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "no_id");
  TestLoop loop;
  Broker broker(loop);
  const auto service = make_service(unique_name("in"), R"("delays": ["200ms"], "max_attempts": 3)");
  {
    auto inbox = make_inbox(database);
    auto c = start(loop, options_for(service), inbox->wrap(write_effect));
    broker.publish(service.input.exchange, "key", "", "anonymous");
    REQUIRE(eventually(loop, [&] { return c->metrics().parked_poison == 1; }));
    stop(loop, c);
    CHECK(inbox->stats().missing_id == 1);
  }
  CHECK(effects(database) == 0);
  auto parked = broker.drain(topology::parking_queue_name(service.name));
  REQUIRE(parked.size() == 1);
  const auto* error = parked[0].message.properties.headers->find("retryloop-error");
  REQUIRE(error);
  CHECK_THAT(std::string(*error->as_string()), Catch::Contains("no message-id"));

  inbox::InboxOptions options;
  options.database = database.url;
  options.consumer = "billing";
  options.missing_message_id = inbox::MissingMessageId::handle;
  auto lenient = inbox::Inbox::create(options);
  consumer::Message message;
  message.body = "anonymous";
  CHECK(lenient->wrap(write_effect)(message).kind == consumer::OutcomeKind::ack);
  CHECK(effects(database) == 1);
}

TEST_CASE("Ids older than the retention are deleted, and a copy after that runs again", "[inbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "retention");
  inbox::InboxOptions options;
  options.database = database.url;
  options.consumer = "billing";
  options.retention = 2s;
  options.cleanup_interval = std::chrono::hours(1);  // only the explicit clean_up below
  options.cleanup_batch = 2;
  auto inbox = inbox::Inbox::create(options);
  auto handler = inbox->wrap(write_effect);
  for (const char* id : {"a", "b", "c"}) {
    consumer::Message message;
    message.properties.message_id = id;
    handler(message);
    handler(message);
  }
  CHECK(effects(database) == 3);
  CHECK(inbox->clean_up() == 0);  // too young
  std::this_thread::sleep_for(2500ms);
  CHECK(inbox->clean_up() == 3);  // in statements of 2
  consumer::Message again;
  again.properties.message_id = "a";
  handler(again);
  CHECK(effects(database, "a") == 2);

  options.consumer.clear();
  CHECK_THROWS_WITH(inbox::Inbox::create(options), Catch::Contains("consumer name is empty"));
}

TEST_CASE(
    "A cancelled scheduled message is dropped by the inbox without its handler, and other messages "
    "with that id are not",
    "[inbox][schedule]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "cancel");
  inbox::InboxOptions options;
  options.database = database.url;
  options.consumer = "mailer";
  options.retention = 1h;
  auto inbox = inbox::Inbox::create(options);
  auto handler = inbox->wrap(write_effect);
  auto db = database.open();
  auto scheduled = [](const std::string& id) {
    consumer::Message message;
    message.body = id;
    message.properties.message_id = id;
    message.properties.headers.emplace();
    message.properties.headers->set(std::string(schedule::header::due_at), int64_t{1});
    return message;
  };
  const int64_t keep_until = outbox::now_ms() + 3600000;
  auto first = inbox::cancel_scheduled(*db, "reminder-1", keep_until);
  CHECK(first.recorded);
  CHECK(first.handled_by.empty());
  CHECK_FALSE(inbox::cancel_scheduled(*db, "reminder-1", keep_until).recorded);  // stands

  auto outcome = handler(scheduled("reminder-1"));
  CHECK(outcome.kind == consumer::OutcomeKind::drop);
  CHECK_THAT(outcome.text, Catch::Contains("cancelled"));
  CHECK(effects(database) == 0);
  CHECK(inbox->stats().cancelled == 1);
  CHECK_THAT(inbox::prometheus_text(inbox->stats(), "mailer"),
             Catch::Contains("retryloop_inbox_cancelled_total{consumer=\"mailer\"} 1\n") &&
                 Catch::Contains("# TYPE retryloop_inbox_duplicates_total counter"));
  // The cancellation is used up with the id recorded: a second copy is a duplicate.
  CHECK(db->execute("SELECT count(*) FROM retryloop_cancelled").rows[0].integer(0) == 0);
  CHECK_THAT(handler(scheduled("reminder-1")).text, Catch::Contains("duplicate"));

  // Not cancelled: handled. A message without the schedule header is never looked up.
  CHECK(handler(scheduled("reminder-2")).kind == consumer::OutcomeKind::ack);
  CHECK(inbox::cancel_scheduled(*db, "plain", keep_until).recorded);
  consumer::Message plain;
  plain.body = "plain";
  plain.properties.message_id = "plain";
  CHECK(handler(plain).kind == consumer::OutcomeKind::ack);
  CHECK(effects(database) == 2);
  // Too late: the inbox has the id already.
  auto late = inbox::cancel_scheduled(*db, "reminder-2", keep_until);
  CHECK(late.handled_by == std::vector<std::string>{"mailer"});
  // Kept until the message is due at the latest (plus the retention), then cleaned up.
  inbox::cancel_scheduled(*db, "expired", outbox::now_ms() - 2 * 3600000);
  inbox->clean_up();
  auto left = db->execute("SELECT message_id FROM retryloop_cancelled ORDER BY message_id");
  REQUIRE(left.rows.size() == 2);
  CHECK(left.rows[0].text(0) == "plain");
  CHECK(left.rows[1].text(0) == "reminder-2");
}
