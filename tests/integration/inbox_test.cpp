// The idempotent consumer on a real SQLite file and a real PostgreSQL server, behind a real retry
// consumer: duplicates absorbed, writes and ids committed together, failures rolled back,
// messages without an id, retention.

#include <sqlite3.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <thread>

#include "retryloop/inbox/inbox.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/schema.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "support/consumer_fixture.hpp"
#include "support/databases.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using test::Broker;
using test::eventually;
using test::make_service;
using test::options_for;
using test::start;
using test::stop;
using test::TestDatabase;
using test::TestLoop;
using test::unique_name;

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

/// A message scheduled for `queue`, as the retry consumer of that queue hands it to a handler.
consumer::Message scheduled(const std::string& queue, const std::string& id) {
  consumer::Message message;
  message.body = id;
  message.queue = queue;
  message.properties.message_id = id;
  message.properties.headers.emplace();
  message.properties.headers->set(std::string(schedule::header::due_at), int64_t{1});
  return message;
}

/// A connection of its own for a cancel, which tells whether a statement on it waits for a lock
/// another transaction holds: on PostgreSQL by the server's lock table, on SQLite by its busy
/// handler.
class WatchedConnection {
 public:
  explicit WatchedConnection(const TestDatabase& database) {
    if (database.label == "sqlite") {
      const std::string path = database.url.substr(std::string("sqlite:").size());
      REQUIRE(sqlite3_open_v2(path.c_str(), &sqlite_, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
      sqlite3_busy_handler(
          sqlite_,
          [](void* waited, int) {
            static_cast<std::atomic<bool>*>(waited)->store(true);
            sqlite3_sleep(1);
            return 1;
          },
          &sqlite_waited_);
      db = store::Database::adopt(sqlite_);
    } else {
      db = database.open();
      pid_ = db->execute("SELECT pg_backend_pid()").rows[0].integer(0);
      probe_ = database.open();
    }
  }
  ~WatchedConnection() {
    db.reset();
    if (sqlite_) sqlite3_close(sqlite_);
  }

  /// True once a statement on `db` has waited for a lock (SQLite), or while one waits
  /// (PostgreSQL).
  bool waiting() {
    if (!probe_) return sqlite_waited_.load();
    return probe_->execute("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", {pid_})
               .rows[0]
               .integer(0) > 0;
  }

  std::unique_ptr<store::Database> db;

 private:
  sqlite3* sqlite_ = nullptr;
  std::atomic<bool> sqlite_waited_{false};
  int64_t pid_ = 0;
  std::unique_ptr<store::Database> probe_;
};

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
  const int64_t keep_until = outbox::now_ms() + 3600000;
  auto first = inbox::cancel_scheduled(*db, "mail", "reminder-1", keep_until);
  CHECK(first.recorded);
  CHECK(first.handled_by.empty());
  CHECK_FALSE(inbox::cancel_scheduled(*db, "mail", "reminder-1", keep_until).recorded);  // stands

  auto outcome = handler(scheduled("mail", "reminder-1"));
  CHECK(outcome.kind == consumer::OutcomeKind::drop);
  CHECK_THAT(outcome.text, Catch::Contains("cancelled"));
  CHECK(effects(database) == 0);
  CHECK(inbox->stats().cancelled == 1);
  CHECK_THAT(inbox::prometheus_text(inbox->stats(), "mailer"),
             Catch::Contains("retryloop_inbox_cancelled_total{consumer=\"mailer\"} 1\n") &&
                 Catch::Contains("# TYPE retryloop_inbox_duplicates_total counter"));
  // The cancellation is used up with the id recorded: a second copy is a duplicate.
  CHECK(db->execute("SELECT count(*) FROM retryloop_cancelled").rows[0].integer(0) == 0);
  CHECK_THAT(handler(scheduled("mail", "reminder-1")).text, Catch::Contains("duplicate"));

  // Not cancelled: handled. A message without the schedule header is never looked up.
  CHECK(handler(scheduled("mail", "reminder-2")).kind == consumer::OutcomeKind::ack);
  CHECK(inbox::cancel_scheduled(*db, "mail", "plain", keep_until).recorded);
  consumer::Message plain;
  plain.body = "plain";
  plain.properties.message_id = "plain";
  plain.queue = "mail";
  CHECK(handler(plain).kind == consumer::OutcomeKind::ack);
  CHECK(effects(database) == 2);
  // Too late: the inbox has the id already.
  auto late = inbox::cancel_scheduled(*db, "mail", "reminder-2", keep_until);
  CHECK(late.handled_by == std::vector<std::string>{"mailer"});
  // Kept until the message is due at the latest (plus the retention), then cleaned up.
  inbox::cancel_scheduled(*db, "mail", "expired", outbox::now_ms() - 2 * 3600000);
  inbox->clean_up();
  auto left = db->execute("SELECT message_id FROM retryloop_cancelled ORDER BY message_id");
  REQUIRE(left.rows.size() == 2);
  CHECK(left.rows[0].text(0) == "plain");
  CHECK(left.rows[1].text(0) == "reminder-2");
}

TEST_CASE(
    "A cancel that runs while the inbox handles its message waits for the handler's transaction, "
    "and its answer holds whether that commits or rolls back",
    "[inbox][schedule]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  const bool commits = GENERATE(true, false);
  INFO(label << (commits ? ", the handler commits" : ", the handler rolls back"));
  auto database = business_database(label, "cancel_race");
  auto inbox = make_inbox(database, "mailer");
  std::promise<void> entered, release;
  auto handler = inbox->wrap([&](const consumer::Message& message, store::Database& db) {
    entered.set_value();
    release.get_future().wait();  // between the inbox's insert and its commit
    write_effect(message, db);
    return commits ? Outcome::ack() : Outcome::retry("mail server busy");
  });
  Outcome handled;
  std::thread handling([&] { handled = handler(scheduled("mail", "reminder-1")); });
  entered.get_future().wait();

  WatchedConnection cancel(database);
  std::atomic<bool> answered{false};
  inbox::CancelResult result;
  std::exception_ptr failure;
  std::thread cancelling([&] {
    try {
      result = inbox::cancel_scheduled(*cancel.db, "mail", "reminder-1", outbox::now_ms());
    } catch (...) {
      failure = std::current_exception();
    }
    answered = true;
  });
  while (!answered && !cancel.waiting())
    std::this_thread::sleep_for(5ms);
  const bool answered_while_handling = answered.load();
  release.set_value();
  handling.join();
  cancelling.join();
  REQUIRE_FALSE(failure);
  CHECK_FALSE(answered_while_handling);  // it waited for the handler's transaction
  CHECK(result.recorded);
  if (commits) {
    CHECK(handled.kind == consumer::OutcomeKind::ack);
    CHECK(effects(database, "reminder-1") == 1);
    // Never "cancelled" alone while the handler commits: the cancel says it came too late.
    CHECK(result.handled_by == std::vector<std::string>{"mailer"});
  } else {
    CHECK(handled.kind == consumer::OutcomeKind::retry);
    CHECK(result.handled_by.empty());
    // The retry of the message finds the cancellation.
    CHECK_THAT(handler(scheduled("mail", "reminder-1")).text, Catch::Contains("cancelled"));
    CHECK(effects(database, "reminder-1") == 0);
  }
}

TEST_CASE(
    "A cancellation names its queue: the same id scheduled for another queue is handled there, "
    "and a cancel is too late only where its own queue's message came",
    "[inbox][schedule]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "cancel_queues");
  auto mail = make_inbox(database, "mailer")->wrap(write_effect);
  auto sms = make_inbox(database, "texter")->wrap(write_effect);
  auto db = database.open();
  const int64_t keep_until = outbox::now_ms() + 3600000;
  CHECK(inbox::cancel_scheduled(*db, "mail", "reminder-1", keep_until).recorded);
  CHECK(sms(scheduled("sms", "reminder-1")).kind == consumer::OutcomeKind::ack);
  CHECK_THAT(mail(scheduled("mail", "reminder-1")).text, Catch::Contains("cancelled"));
  CHECK(effects(database, "reminder-1") == 1);

  CHECK(sms(scheduled("sms", "reminder-2")).kind == consumer::OutcomeKind::ack);
  auto mail_cancel = inbox::cancel_scheduled(*db, "mail", "reminder-2", keep_until);
  CHECK(mail_cancel.handled_by.empty());  // only the other queue's message came
  auto sms_cancel = inbox::cancel_scheduled(*db, "sms", "reminder-2", keep_until);
  CHECK(sms_cancel.handled_by == std::vector<std::string>{"texter"});
  CHECK_THAT(mail(scheduled("mail", "reminder-2")).text, Catch::Contains("cancelled"));

  CHECK_THROWS_WITH(inbox::cancel_scheduled(*db, "", "reminder-3", keep_until),
                    Catch::Contains("the queue is empty"));
}

TEST_CASE(
    "A cancellation outlives the longest delay until its message is seen, and goes once the "
    "inbox's retention has passed after that",
    "[inbox][schedule]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "cancel_keep");
  inbox::InboxOptions options;
  options.database = database.url;
  options.consumer = "mailer";
  options.retention = 1h;
  options.cleanup_interval = std::chrono::hours(1);
  auto inbox = inbox::Inbox::create(options);
  auto db = database.open();
  // Due at the latest a minute ago: the message waits longer (in the unrouted queue, or behind a
  // backlog).
  inbox::cancel_scheduled(*db, "mail", "late", outbox::now_ms() - 60000);
  inbox::cancel_scheduled(*db, "mail", "gone", outbox::now_ms() - 2 * 3600000);
  CHECK(inbox->clean_up() == 1);  // only the one past its due time plus the retention
  CHECK_THAT(inbox->wrap(write_effect)(scheduled("mail", "late")).text,
             Catch::Contains("cancelled"));
  CHECK(db->execute("SELECT count(*) FROM retryloop_cancelled").rows[0].integer(0) == 0);
}

TEST_CASE(
    "Migrating schema version 2 keeps its cancellations, which apply to the id in every queue",
    "[inbox][schedule][store]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = business_database(label, "cancel_v2");
  auto db = database.open();
  // Version 2's tables, as an earlier release left them, with a cancellation and an id.
  db->execute_script(R"sql(
DROP TABLE retryloop_cancelled;
CREATE TABLE retryloop_cancelled (
  message_id text PRIMARY KEY,
  cancelled_at bigint NOT NULL,
  keep_until bigint NOT NULL
);
CREATE INDEX retryloop_cancelled_keep ON retryloop_cancelled (keep_until);
ALTER TABLE retryloop_inbox DROP COLUMN queue;
UPDATE retryloop_schema SET version = 2;
)sql");
  const int64_t now = outbox::now_ms();
  db->execute(
      "INSERT INTO retryloop_cancelled (message_id, cancelled_at, keep_until) VALUES ($1, $2, $3)",
      {std::string("old-cancel"), now, now + 3600000});
  db->execute("INSERT INTO retryloop_inbox (consumer, message_id, received_at) VALUES ($1, $2, $3)",
              {std::string("mailer"), std::string("old-id"), now});
  CHECK_THROWS_WITH(make_inbox(database), Catch::Contains("retryloop outbox init"));

  auto migration = outbox::migrate(*db);
  CHECK(migration.from == 2);
  CHECK(migration.to == outbox::schema_version);
  auto handler = make_inbox(database)->wrap(write_effect);
  CHECK_THAT(handler(scheduled("sms", "old-cancel")).text, Catch::Contains("cancelled"));
  auto late = inbox::cancel_scheduled(*db, "mail", "old-id", now + 3600000);
  CHECK(late.handled_by == std::vector<std::string>{"mailer"});  // its queue is not known
}
