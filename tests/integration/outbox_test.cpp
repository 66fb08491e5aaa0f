// The outbox on a real SQLite file and a real PostgreSQL server, relayed to a real broker:
// enqueue in the application's transaction, the table as a contract for plain SQL, the relay's
// confirms, returns, ordering keys, notifications and cleanup.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "outbox/rows.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/uri.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/relay.hpp"
#include "support/databases.hpp"
#include "support/harness.hpp"
#include "support/tcp_proxy.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

outbox::OutboxMessage message_to(const std::string& queue, const std::string& body,
                                 std::optional<std::string> key = std::nullopt) {
  outbox::OutboxMessage message;
  message.routing_key = queue;  // the default exchange routes it to the queue of that name
  message.body = body;
  message.ordering_key = std::move(key);
  return message;
}

void enqueue_committed(store::Database& db, const std::vector<outbox::OutboxMessage>& messages) {
  store::Transaction transaction(db);
  for (const auto& message : messages)
    outbox::enqueue(db, message);
  transaction.commit();
}

outbox::RelayOptions relay_options(const test::TestDatabase& database) {
  outbox::RelayOptions options;
  options.database = database.url;
  options.connection.uri = client::parse_uri(test::broker_url());
  options.recovery.initial = 50ms;
  options.recovery.max = 500ms;
  options.poll_interval = 50ms;
  return options;
}

// A relay that runs on the test loop until the test stops it.
struct RunningRelay {
  test::TestLoop& loop;
  std::shared_ptr<outbox::Relay> relay;
  bool stopped = false;
  std::string error;

  RunningRelay(test::TestLoop& l, outbox::RelayOptions options) : loop(l) {
    relay = outbox::Relay::create(loop.get(), std::move(options));
    relay->set_stopped_handler([this](const std::string& e) {
      stopped = true;
      error = e;
    });
    REQUIRE(relay->start().empty());
  }
  ~RunningRelay() {
    if (!stopped) relay->stop();
    loop.run_until([this] { return stopped; }, 10s);
  }
  void wait_idle() {
    REQUIRE(loop.run_until([this] { return relay->idle(); }));
  }
};

int64_t count_rows(store::Database& db, const std::string& where = "1 = 1") {
  return db.execute("SELECT count(*) FROM retryloop_outbox WHERE " + where).rows[0].integer(0);
}

// `per_key` rounds of one message for each of `keys` ordering keys ("K:N") and one without a key
// ("free:N").
std::vector<outbox::OutboxMessage> keyed_messages(const std::string& queue, int keys, int per_key) {
  std::vector<outbox::OutboxMessage> messages;
  for (int n = 0; n < per_key; ++n) {
    for (int k = 0; k < keys; ++k) {
      messages.push_back(message_to(queue, std::to_string(k) + ":" + std::to_string(n),
                                    "key-" + std::to_string(k)));
    }
    messages.push_back(message_to(queue, "free:" + std::to_string(n)));
  }
  return messages;
}

// Commits `messages` in transactions of `per_transaction`, running the loop between them, so
// that relays work while rows keep coming.
void enqueue_while_running(test::TestLoop& loop, store::Database& db,
                           const std::vector<outbox::OutboxMessage>& messages,
                           size_t per_transaction) {
  for (size_t first = 0; first < messages.size(); first += per_transaction) {
    enqueue_committed(db,
                      std::vector<outbox::OutboxMessage>(
                          messages.begin() + first,
                          messages.begin() + std::min(messages.size(), first + per_transaction)));
    loop.run_for(20ms);
  }
}

// Each key's messages of keyed_messages arrived once each, in order.
void check_key_order(const std::vector<client::GetResult>& received, int keys) {
  std::map<std::string, int> last;
  for (const auto& got : received) {
    const std::string& body = got.message.body;
    auto colon = body.find(':');
    std::string key = body.substr(0, colon);
    int n = std::stoi(body.substr(colon + 1));
    if (key == "free") continue;
    INFO("key " << key << ": " << n << " after " << (last.count(key) ? last[key] : -1));
    CHECK(n == (last.count(key) ? last[key] + 1 : 0));
    last[key] = n;
  }
  CHECK(last.size() == static_cast<size_t>(keys));
}

}  // namespace

TEST_CASE("An outbox row keeps every property, header and byte of the message", "[outbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "row").open();
  outbox::OutboxMessage message;
  message.exchange = "orders";
  message.routing_key = "order.created";
  message.body = std::string("\0\x01{\"order\": 7}\xff", 16);
  message.message_id = "order-7-created";
  message.ordering_key = "order-7";
  message.properties.content_type = "application/json";
  message.properties.correlation_id = "corr-1";
  message.properties.priority = 3;
  message.properties.timestamp = 1700000000;
  message.properties.headers = amqp::FieldTable{
      {"trace-id", "abc"},
      {"count", int64_t{42}},
      {"ratio", 0.5},
      {"flag", true},
      {"nothing", amqp::Void{}},
      {"list", amqp::FieldArray{int64_t{1}, "two"}},
      {"nested", amqp::FieldTable{{"inner", "value"}}},
  };
  int64_t id = 0;
  {
    store::Transaction transaction(*db);
    id = outbox::enqueue(*db, message);
    transaction.commit();
  }
  auto rows = outbox::list_rows(*db, outbox::RowState::pending, 10);
  REQUIRE(rows.size() == 1);
  const auto& row = rows[0];
  CHECK(row.id == id);
  CHECK(row.exchange == "orders");
  CHECK(row.routing_key == "order.created");
  CHECK(row.body == message.body);
  CHECK(row.message_id == "order-7-created");
  CHECK(row.ordering_key == std::optional<std::string>("order-7"));
  CHECK(row.properties.message_id == std::optional<std::string>("order-7-created"));
  CHECK(row.properties.content_type == message.properties.content_type);
  CHECK(row.properties.correlation_id == message.properties.correlation_id);
  CHECK(row.properties.priority == message.properties.priority);
  CHECK(row.properties.timestamp == message.properties.timestamp);
  CHECK(row.properties.delivery_mode == std::optional<uint8_t>(2));  // persistent by default
  REQUIRE(row.properties.headers);
  // Every header, with its value and kind; their order is not kept (jsonb sorts the keys).
  CHECK(row.properties.headers->size() == message.properties.headers->size());
  for (const auto& entry : *message.properties.headers) {
    INFO(entry.name);
    const amqp::FieldValue* value = row.properties.headers->find(entry.name);
    REQUIRE(value);
    CHECK(*value == entry.value);
  }
  CHECK(row.state == outbox::RowState::pending);
  CHECK(row.attempts == 0);

  // A message id left empty is generated, and differs per row.
  enqueue_committed(*db, {message_to("q", "a"), message_to("q", "b")});
  auto all = outbox::list_rows(*db, std::nullopt, 10);
  REQUIRE(all.size() == 3);
  CHECK_FALSE(all[1].message_id.empty());
  CHECK(all[1].message_id != all[2].message_id);
}

TEST_CASE("A row enqueued in a transaction that rolls back does not exist", "[outbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "rollback").open();
  {
    store::Transaction transaction(*db);
    outbox::enqueue(*db, message_to("q", "phantom"));
    db->execute_script("CREATE TABLE business (n integer)");
    // no commit: the business change and the message go together
  }
  CHECK(count_rows(*db) == 0);
}

TEST_CASE("Rows inserted with plain SQL, as docs/outbox.md describes, get their defaults",
          "[outbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "plain_sql").open();
  const bool postgres = label == "postgresql";
  db->execute(std::string("INSERT INTO retryloop_outbox (exchange, routing_key, headers, body) "
                          "VALUES ('ex', 'rk', ") +
                  (postgres ? "'{\"x-tenant\": \"t1\"}'::jsonb" : "'{\"x-tenant\": \"t1\"}'") +
                  ", $1)",
              {store::Blob{"payload"}});
  auto rows = outbox::list_rows(*db, std::nullopt, 10);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].state == outbox::RowState::pending);
  CHECK_FALSE(rows[0].message_id.empty());
  CHECK(rows[0].created_at_ms > 1700000000000);
  CHECK(rows[0].created_at_ms <= outbox::now_ms() + 1000);
  REQUIRE(rows[0].properties.headers);
  CHECK(rows[0].properties.headers->find("x-tenant")->as_string() == std::string_view("t1"));
  // A state outside the contract is refused by the table itself.
  CHECK_THROWS_AS(db->execute("UPDATE retryloop_outbox SET state = 'sent'"), store::StoreError);
}

TEST_CASE("The relay publishes every committed row with its properties, then deletes it",
          "[outbox][relay]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "relay");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.relay");
  auto& connection = target.connection;
  const std::string& queue = target.queue;

  std::vector<outbox::OutboxMessage> messages;
  for (int i = 0; i < 1200; ++i) {
    auto message = message_to(queue, "m" + std::to_string(i));
    message.message_id = "id-" + std::to_string(i);
    message.properties.headers = amqp::FieldTable{{"n", int64_t{i}}};
    messages.push_back(std::move(message));
  }
  enqueue_committed(*db, messages);

  auto options = relay_options(database);
  options.batch_size = 500;
  RunningRelay relay(loop, options);
  REQUIRE(
      test::eventually(loop, [&] { return test::queue_depth(loop, *connection, queue) == 1200; }));
  relay.wait_idle();
  auto stats = relay.relay->stats();
  CHECK(stats.published == 1200);
  CHECK(stats.failed == 0);
  CHECK(stats.batches >= 3);
  CHECK(count_rows(*db) == 0);

  auto received = test::drain_queue(loop, *connection, queue);
  REQUIRE(received.size() == 1200);
  for (int i = 0; i < 1200; ++i) {
    const auto& message = received[i].message;
    INFO(i);
    CHECK(message.body == "m" + std::to_string(i));
    CHECK(message.properties.message_id == std::optional<std::string>("id-" + std::to_string(i)));
    CHECK(message.properties.delivery_mode == std::optional<uint8_t>(2));
    REQUIRE(message.properties.headers);
    CHECK(message.properties.headers->find("n")->as_int64() == i);
  }
}

TEST_CASE("A row the broker returns stays failed with the error until it is retried",
          "[outbox][relay]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "returned");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.present");
  auto& connection = target.connection;
  auto& channel = target.channel;
  const std::string& present = target.queue;
  const std::string missing = test::unique_name("outbox.missing");

  // k1: a failed row holds back the rows of its key committed after it; k2 and unkeyed rows
  // flow on.
  enqueue_committed(*db, {message_to(missing, "lost?", "k1"), message_to(present, "k2", "k2")});
  {
    RunningRelay relay(loop, relay_options(database));
    REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().failed == 1; }));
    enqueue_committed(*db, {message_to(present, "k1 after", "k1"), message_to(present, "free")});
    REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().published == 2; }));
    relay.wait_idle();
    loop.run_for(200ms);
    CHECK(relay.relay->stats().published == 2);
    CHECK(test::queue_depth(loop, *connection, present) == 2);
  }
  auto failed = outbox::list_rows(*db, outbox::RowState::failed, 10);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].body == "lost?");
  CHECK(failed[0].attempts == 1);
  REQUIRE(failed[0].last_error);
  CHECK_THAT(*failed[0].last_error, Catch::Contains("312") && Catch::Contains("returned"));
  CHECK(outbox::stats(*db).pending == 1);  // "k1 after", held back

  // The operator fixes the route and retries: both k1 rows arrive, in their order.
  test::declare_queue(loop, *channel, missing);
  CHECK(outbox::retry_failed(*db, {}) == 1);
  CHECK(outbox::retry_failed(*db, {}) == 0);
  {
    RunningRelay relay(loop, relay_options(database));
    REQUIRE(test::eventually(loop, [&] { return count_rows(*db) == 0; }));
  }
  CHECK(test::queue_depth(loop, *connection, missing) == 1);
  auto present_messages = test::drain_queue(loop, *connection, present);
  REQUIRE(present_messages.size() == 3);
  CHECK(present_messages[2].message.body == "k1 after");
}

TEST_CASE("retry and purge act on failed rows only", "[outbox]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "purge").open();
  enqueue_committed(*db, {message_to("q", "1"), message_to("q", "2"), message_to("q", "3")});
  auto rows = outbox::list_rows(*db, std::nullopt, 10);
  db->execute("UPDATE retryloop_outbox SET state = 'failed' WHERE id IN ($1, $2)",
              {rows[0].id, rows[1].id});
  CHECK(outbox::purge_failed(*db, {rows[0].id, rows[2].id}) == 1);  // rows[2] is pending
  CHECK(outbox::stats(*db).failed == 1);
  CHECK(outbox::stats(*db).pending == 1);
  CHECK(outbox::purge_failed(*db, {}) == 1);
  CHECK(count_rows(*db) == 1);
}

TEST_CASE("With notifications, a commit wakes an idle relay long before its poll interval",
          "[outbox][relay]") {
  auto database = test::fresh_postgres("notify");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.notify");
  auto& connection = target.connection;
  const std::string& queue = target.queue;

  auto options = relay_options(database);
  options.poll_interval = std::chrono::minutes(10);  // only a notification can wake it in time
  RunningRelay relay(loop, options);
  relay.wait_idle();
  loop.run_for(200ms);
  enqueue_committed(*db, {message_to(queue, "wake up")});
  // A bound on a hang, not on speed: without the notification this would take ten minutes.
  REQUIRE(test::eventually(
      loop, [&] { return test::queue_depth(loop, *connection, queue) == 1; }, 60s));
  CHECK(test::eventually(loop, [&] { return count_rows(*db) == 0; }));
}

TEST_CASE("Published rows kept for a while are cleaned up later, in batches", "[outbox][relay]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "retain");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.retain");
  const std::string& queue = target.queue;
  std::vector<outbox::OutboxMessage> messages;
  for (int i = 0; i < 50; ++i)
    messages.push_back(message_to(queue, std::to_string(i)));
  enqueue_committed(*db, messages);

  auto options = relay_options(database);
  options.retain_published = std::chrono::hours(1);
  {
    RunningRelay relay(loop, options);
    REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().published == 50; }));
  }
  CHECK(outbox::stats(*db).published == 50);
  CHECK(count_rows(*db, "state = 'published' AND updated_at IS NOT NULL") == 50);
  CHECK(outbox::delete_published(*db, outbox::now_ms() - 3600 * 1000, 7) == 0);  // too young
  CHECK(outbox::delete_published(*db, outbox::now_ms() + 1000, 7) == 50);        // 8 statements
  CHECK(count_rows(*db) == 0);
}

TEST_CASE(
    "A claim that passed over some of a key's rows while another relay held the key leaves the "
    "key for a later batch",
    "[outbox][relay]") {
  // The claim takes a key's lock at the first of its rows it evaluates while the lock is free,
  // in the order its plan reads the table: it can pass over rows of a key and take the key's rows
  // before and after them. These batches are such claims' results, made by hand.
  auto db = test::fresh_postgres("overtaking").open();
  std::vector<outbox::OutboxMessage> messages;
  for (int i = 0; i < 5; ++i)
    messages.push_back(message_to("q", "a" + std::to_string(i), std::string("a")));
  for (int i = 0; i < 2; ++i)
    messages.push_back(message_to("q", "b" + std::to_string(i), std::string("b")));
  messages.push_back(message_to("q", "keyless"));
  enqueue_committed(*db, messages);
  const auto rows = outbox::list_rows(*db, outbox::RowState::pending, 100);
  REQUIRE(rows.size() == 8);
  std::map<std::string, outbox::OutboxRow> by_body;
  for (const auto& row : rows)
    by_body[row.body] = row;
  auto claim = [&](std::initializer_list<const char*> bodies) {
    std::vector<outbox::OutboxRow> batch;
    for (const char* body : bodies)
      batch.push_back(by_body.at(body));
    store::Transaction transaction(*db);
    const size_t left_out = outbox::detail::leave_out_overtaking_rows(*db, batch);
    std::vector<std::string> kept;
    for (const auto& row : batch)
      kept.push_back(row.body);
    CHECK(left_out + kept.size() == bodies.size());
    return kept;
  };
  using Bodies = std::vector<std::string>;
  // The keys' first rows, without a gap: all of them go.
  CHECK(claim({"a0", "a1", "b0", "keyless"}) == Bodies{"a0", "a1", "b0", "keyless"});
  // a1 passed over between a0 and a2: key a waits, b and the keyless row go.
  CHECK(claim({"a0", "a2", "a3", "b0", "b1", "keyless"}) == Bodies{"b0", "b1", "keyless"});
  // The key's first rows passed over: key a waits.
  CHECK(claim({"a3", "a4", "b0"}) == Bodies{"b0"});
  // A failed row between a key's claimed rows holds the key back too.
  REQUIRE(db->execute("UPDATE retryloop_outbox SET state = 'failed' WHERE id = $1",
                      {by_body.at("a1").id})
              .affected == 1);
  CHECK(claim({"a0", "a2", "b0"}) == Bodies{"b0"});
}

TEST_CASE("Three relays share a PostgreSQL table, and each ordering key arrives in commit order",
          "[outbox][relay]") {
  auto database = test::fresh_postgres("three_relays");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.three");
  auto& connection = target.connection;
  const std::string& queue = target.queue;
  constexpr int keys = 7;
  auto messages = keyed_messages(queue, keys, 300);
  auto options = relay_options(database);
  options.batch_size = 50;
  RunningRelay a(loop, options), b(loop, options), c(loop, options);
  enqueue_while_running(loop, *db, messages, 400);
  const uint32_t total = messages.size();
  REQUIRE(
      test::eventually(loop, [&] { return test::queue_depth(loop, *connection, queue) == total; }));
  // A relay counts a batch once the broker's confirms are in and the rows are marked: a moment
  // after the queue holds it (2,384 of 2,400 counted when the depth was first seen full).
  CHECK(test::eventually(loop, [&] {
    return a.relay->stats().published + b.relay->stats().published + c.relay->stats().published ==
           total;
  }));
  auto received = test::drain_queue(loop, *connection, queue);
  REQUIRE(received.size() == total);
  check_key_order(received, keys);
}

TEST_CASE("One relay with several batches out keeps each key's order and publishes each row once",
          "[outbox][relay]") {
  auto database = test::fresh_postgres("in_flight");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.in_flight");
  constexpr int keys = 5;
  auto messages = keyed_messages(target.queue, keys, 200);
  auto options = relay_options(database);
  options.batch_size = 40;
  options.batches_in_flight = 3;
  RunningRelay relay(loop, options);
  enqueue_while_running(loop, *db, messages, 300);
  const uint32_t total = messages.size();
  REQUIRE(test::eventually(
      loop, [&] { return test::queue_depth(loop, *target.connection, target.queue) == total; }));
  relay.wait_idle();
  CHECK(count_rows(*db) == 0);
  auto stats = relay.relay->stats();
  CHECK(stats.published == total);
  CHECK(stats.failed == 0);
  CHECK(stats.unsettled == 0);
  CHECK(stats.overlapped > 0);  // batches claimed while another was out
  auto received = test::drain_queue(loop, *target.connection, target.queue);
  REQUIRE(received.size() == total);
  check_key_order(received, keys);
}

TEST_CASE("A relay stopped with batches out: stop settles each of them, stop_now rolls them back",
          "[outbox][relay]") {
  auto database = test::fresh_postgres("stop_in_flight");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.stop_in_flight");
  constexpr int total = 3000;
  std::vector<outbox::OutboxMessage> messages;
  for (int i = 0; i < total; ++i)
    messages.push_back(message_to(target.queue, std::to_string(i) + std::string(1000, 'x')));
  enqueue_committed(*db, messages);
  auto options = relay_options(database);
  options.batch_size = 100;
  options.batches_in_flight = 3;
  RunningRelay relay(loop, options);
  REQUIRE(loop.run_until([&] { return relay.relay->stats().batches >= 3; }));

  SECTION("stop: every batch claimed is settled and committed") {
    relay.relay->stop();
    REQUIRE(loop.run_until([&] { return relay.stopped; }, 30s));
    CHECK(relay.error.empty());
    auto stats = relay.relay->stats();
    CHECK(stats.unsettled == 0);
    CHECK(stats.published < total);
    // What it published is gone from the table, the rest is pending, and the queue holds
    // exactly what it published.
    CHECK(count_rows(*db) == total - static_cast<int64_t>(stats.published));
    CHECK(count_rows(*db, "state = 'pending'") == count_rows(*db));
    CHECK(test::queue_depth(loop, *target.connection, target.queue) ==
          static_cast<uint32_t>(stats.published));
  }
  SECTION("stop_now: the batches roll back, and the next relay publishes their rows") {
    relay.relay->stop_now();
    REQUIRE(loop.run_until([&] { return relay.stopped; }, 10s));
    // Nothing was deleted that the broker had not confirmed: every row is in the queue or still
    // in the table (a rolled-back batch may be in both).
    const int64_t left = count_rows(*db);
    CHECK(left > 0);
    CHECK(test::queue_depth(loop, *target.connection, target.queue) + left >= total);
    RunningRelay next(loop, options);
    next.wait_idle();
    CHECK(count_rows(*db) == 0);
    std::set<std::string> bodies;
    for (const auto& got : test::drain_queue(loop, *target.connection, target.queue))
      bodies.insert(got.message.body);
    CHECK(bodies.size() == static_cast<size_t>(total));
  }
}

TEST_CASE(
    "On SQLite, a batch waiting for its confirms holds no lock: the application commits "
    "meanwhile",
    "[outbox][relay]") {
  auto database = test::fresh_sqlite("unlocked");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.unlocked");
  test::TcpProxy proxy(loop.get(), client::parse_uri(test::broker_url()).port);
  auto options = relay_options(database);
  options.connection.uri.port = proxy.port();
  RunningRelay relay(loop, options);
  relay.wait_idle();
  // The broker's confirms are held back: the relay's batch stays out.
  proxy.hold_replies();
  enqueue_committed(*db, {message_to(target.queue, "first")});
  REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().batches == 1; }));
  // The application's writer waits at most 100 ms for the write lock, and gets it.
  db->set_lock_timeout(100ms);
  REQUIRE_NOTHROW(enqueue_committed(*db, {message_to(target.queue, "second")}));
  CHECK(relay.relay->stats().published == 0);
  proxy.thaw();
  REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().published == 2; }));
  relay.wait_idle();
  CHECK(count_rows(*db) == 0);
  auto received = test::drain_queue(loop, *target.connection, target.queue);
  REQUIRE(received.size() == 2);
  CHECK(received[0].message.body == "first");
  CHECK(received[1].message.body == "second");
}

TEST_CASE("On SQLite one relay publishes and the others stand by, and one takes over when it stops",
          "[outbox][relay]") {
  auto database = test::fresh_sqlite("standby");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.standby");
  constexpr int keys = 3;
  auto messages = keyed_messages(target.queue, keys, 300);
  const size_t half = messages.size() / 2;
  auto options = relay_options(database);
  options.batch_size = 50;
  auto first = std::make_unique<RunningRelay>(loop, options);
  REQUIRE(test::eventually(loop, [&] { return first->relay->idle(); }));
  RunningRelay second(loop, options);
  enqueue_while_running(loop, *db, {messages.begin(), messages.begin() + half}, 200);
  REQUIRE(test::eventually(loop, [&] { return count_rows(*db) == 0; }));
  CHECK(first->relay->stats().published == half);
  CHECK(second.relay->stats().batches == 0);
  // Nothing pending: a standby has nothing to wait for.
  CHECK(test::eventually(loop, [&] { return second.relay->idle(); }));
  first.reset();  // stops it
  enqueue_while_running(loop, *db, {messages.begin() + half, messages.end()}, 200);
  REQUIRE(test::eventually(loop, [&] { return count_rows(*db) == 0; }));
  CHECK(second.relay->stats().published == messages.size() - half);
  auto received = test::drain_queue(loop, *target.connection, target.queue);
  REQUIRE(received.size() == messages.size());
  check_key_order(received, keys);
}

TEST_CASE(
    "A row written by hand that cannot become a message fails with the reason, and the rest "
    "flow on",
    "[outbox][relay]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "bad_row");
  auto db = database.open();
  test::TestLoop loop;
  test::QueueUnderTest target(loop, "outbox.bad");
  const std::string cast = label == "postgresql" ? "::jsonb" : "";
  db->execute("INSERT INTO retryloop_outbox (routing_key, headers, body) VALUES ($1, '[1, 2]'" +
                  cast + ", $2)",
              {target.queue, store::Blob{"headers not an object"}});
  db->execute(
      "INSERT INTO retryloop_outbox (routing_key, properties, body) VALUES ($1, "
      "'{\"priority\": \"high\"}'" +
          cast + ", $2)",
      {target.queue, store::Blob{"priority not a number"}});
  enqueue_committed(*db, {message_to(target.queue, "fine")});
  RunningRelay relay(loop, relay_options(database));
  REQUIRE(test::eventually(loop, [&] { return relay.relay->stats().published == 1; }));
  relay.wait_idle();
  auto failed = outbox::list_rows(*db, outbox::RowState::failed, 10);
  REQUIRE(failed.size() == 2);
  CHECK_THAT(*failed[0].last_error,
             Catch::Contains("cannot be published") && Catch::Contains("headers"));
  CHECK_THAT(*failed[1].last_error, Catch::Contains("priority"));
  CHECK(test::queue_depth(loop, *target.connection, target.queue) == 1);
}
