// The outbox's and the inbox's fault lanes. In each, an application commits outbox rows in
// transactions (some rolled back on purpose) while relay processes publish them to a service and
// an idempotent consumer process handles them through its inbox, and one fault hits mid-stream: a
// relay killed mid-batch, PostgreSQL restarted or killed, the broker restarted or killed under
// the relay, one of three relays killed, a consumer killed between its commit and its ack. Each
// lane runs on SQLite and on PostgreSQL (the PostgreSQL faults on PostgreSQL only) and ends with
// a row of the outbox table (outbox_harness.hpp): every committed row reached the broker and took
// effect exactly once; no row of a rolled-back transaction reached it or took effect; each
// ordering key's messages arrived in commit order (copies of what had arrived already aside);
// duplicates delivered are counted, and allowed.

#include <signal.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "outbox_harness.hpp"

using namespace retryloop;
using namespace retryloop::test::fault;
using test::ChildProcess;
using test::TcpProxy;

namespace {

std::string proxied_url(const TcpProxy& proxy) {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(proxy.port()) + "/";
}

size_t count_lines_containing(const std::string& text, const std::string& part) {
  size_t n = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(part) != std::string::npos) ++n;
  }
  return n;
}

/// What the relays logged about lost connections and about claimed rows they left for a later
/// batch (rows of a key with earlier rows still to publish), for the notes.
std::string relay_losses(const OutboxRun& run) {
  size_t database = 0;
  size_t broker = 0;
  size_t left_out = 0;
  for (const auto& relay : run.relays) {
    const std::string err = relay->err();
    database += count_lines_containing(err, "outbox relay: database");
    broker += count_lines_containing(err, "outbox relay: broker:");
    left_out += count_lines_containing(err, "for a later batch");
  }
  return "the relays logged " + std::to_string(database) + " database and " +
         std::to_string(broker) + " broker errors, and left keys for a later batch in " +
         std::to_string(left_out) + " claims";
}

/// Brings PostgreSQL back however a test that restarts or kills it ends.
struct PostgresBackUp {
  ~PostgresBackUp() {
    const char* ctl = std::getenv("RETRYLOOP_TEST_PG_CTL");
    const char* dir = std::getenv("RETRYLOOP_TEST_PG_DIR");
    if (ctl == nullptr || dir == nullptr) return;
    const std::string quiet = " >/dev/null 2>&1";
    if (std::system((std::string(ctl) + " status " + dir + quiet).c_str()) != 0) {
      std::system((std::string(ctl) + " start " + dir + quiet).c_str());
    }
  }
};

/// A PostgreSQL fault while the application commits and a relay publishes: `inject` runs it. The
/// relay goes through a proxy that holds its confirms back until the fault is over, so that the
/// fault finds it with a batch in flight: published, not yet settled; settling it then meets the
/// lost connection.
void postgres_lane(const std::string& fault, const std::function<void(OutboxRun&)>& inject) {
  PostgresBackUp back_up;
  OutboxRun run(fault, "postgresql");
  TcpProxy proxy(run.loop.get(), broker_amqp_port());
  run.start_consumer();
  run.start_relay(proxied_url(proxy));
  run.start_writer();
  run.wait_committed(0, 400);
  const uint64_t errors_before = run.writer.errors();
  const uint64_t committed_before = run.writer.committed();
  const auto in_flight = run.hold_batch_in_flight(proxy);
  inject(run);
  proxy.thaw();
  {
    INFO("the application saw no error: the fault missed it");
    CHECK(run.writer.errors() > errors_before);
  }
  // The application commits again, and keeps at it for a while.
  run.wait_committed(run.writer.committed(), 400);
  run.finish(std::to_string(committed_before) + " rows committed before the fault, " +
                 std::to_string(in_flight.size()) +
                 " in the relay's batch in flight, each published again; " + relay_losses(run),
             in_flight);
}

/// A broker fault under the relay while the application commits: `down` stops the broker, `up`
/// starts it again. The relay goes through a proxy that holds its confirms back until the broker
/// is down, then drops them with the connection: the relay loses the broker with a batch that
/// reached it, unconfirmed.
void broker_lane(const std::string& fault, const std::string& database,
                 const std::function<void(OutboxRun&)>& down,
                 const std::function<void(OutboxRun&)>& up) {
  BrokerBackUp back_up;
  OutboxRun run(fault, database);
  TcpProxy proxy(run.loop.get(), broker_amqp_port());
  run.start_consumer();
  run.start_relay(proxied_url(proxy));
  run.start_writer();
  run.wait_committed(0, 300);
  const auto in_flight = run.hold_batch_in_flight(proxy);
  down(run);
  proxy.cut();
  proxy.thaw();
  up(run);
  run.wait_committed(run.writer.committed(), 300);
  run.finish(std::to_string(in_flight.size()) + " rows in the relay's batch in flight; " +
                 relay_losses(run),
             in_flight);
}

/// Each relay goes through the proxy, which holds the broker's replies back once a kill is due:
/// the relay's batch reaches the broker, its confirms never come back, and the relay is killed
/// waiting for them. Another relay starts each time.
void relay_kill_lane(const std::string& database) {
  OutboxRun run("relay SIGKILL mid-batch", database);
  TcpProxy proxy(run.loop.get(), broker_amqp_port());
  run.start_consumer();
  run.start_writer();
  ChildProcess* relay = &run.start_relay(proxied_url(proxy));
  std::set<std::string> in_flight;
  uint64_t mark = 0;
  constexpr int kills = 2;
  for (int kill = 0; kill < kills; ++kill) {
    run.wait_committed(mark, 300);
    const auto batch = run.kill_relay_mid_batch(*relay, proxy);
    in_flight.insert(batch.begin(), batch.end());
    mark = run.writer.committed();
    relay = &run.start_relay(proxied_url(proxy));
  }
  run.wait_committed(mark, 300);
  run.finish(std::to_string(kills) + " relays killed with " + std::to_string(in_flight.size()) +
                 " rows published, unconfirmed and still pending: each published again",
             in_flight);
}

void broker_restart_lane(const std::string& database) {
  broker_lane(
      "broker restart under relay", database,
      [](OutboxRun& run) {
        std::string output;
        expect_ok(ctl_async(run.loop, {"stop_app"}, &output), output);
      },
      [](OutboxRun& run) {
        std::string output;
        expect_ok(ctl_async(run.loop, {"start_app"}, &output), output);
      });
}

void broker_kill_lane(const std::string& database) {
  broker_lane(
      "broker SIGKILL under relay", database,
      [](OutboxRun& run) {
        std::string output;
        // RabbitMQ writes its metadata log lazily: a binding declared a second or two before a
        // crash can be missing after it (seen on 3.10 with the audit queue's binding: all the
        // relay published after the restart went to the service's queue only). Have it written
        // now; the crash is about the messages, not about the lane's set-up.
        expect_ok(ctl_async(run.loop, {"eval", "catch mnesia:sync_log(), ok."}, &output), output);
        expect_ok(broker_script_async(run.loop, "kill", &output), output);
      },
      [](OutboxRun& run) {
        std::string output;
        expect_ok(broker_script_async(run.loop, "restart", &output), output);
      });
}

/// PostgreSQL: the relays share the table (SKIP LOCKED, a key's rows with one relay at a time).
/// SQLite: they take turns on the write lock. They start on a backlog of one key, longer than a
/// batch, while the application keeps committing: so a key's rows are spread over many batches of
/// different relays. The one behind the proxy is killed mid-batch twice: once with its batch at
/// the broker, unconfirmed; then (another one in its place) with its batch published into a frozen
/// network, so that it never reached the broker and the key's later rows must wait for it.
void three_relays_lane(const std::string& database) {
  constexpr int backlog = 2000;
  OutboxRun run(
      database == "sqlite" ? "3 relays, 4 SIGKILLed in turn" : "3 relays, 2 SIGKILLed in turn",
      database);
  TcpProxy proxy(run.loop.get(), broker_amqp_port());
  run.commit_backlog("backlog", backlog);
  run.start_consumer();
  run.start_writer();
  ChildProcess* victim = &run.start_relay(proxied_url(proxy));
  if (database == "sqlite") {
    // The first relay to take the relay lock publishes; the others stand by: let the proxied
    // one take it.
    REQUIRE(poll_until(run.loop, 30s, [&] {
      run.collect();
      return !run.received.empty();
    }));
  }
  run.start_relay();
  run.start_relay();
  run.wait_committed(0, 400);
  const auto in_flight = run.kill_relay_mid_batch(*victim, proxy);
  victim = &run.start_relay(proxied_url(proxy));
  if (database == "sqlite") {
    // One relay publishes at a time and the others stand by: the relay that took over is killed
    // too (mid-batch or not), and the next, so that the proxied one publishes; two more stand by.
    for (auto& relay : run.relays) {
      if (relay.get() == victim || !relay->running()) continue;
      relay->signal(SIGKILL);
      CHECK(relay->wait() == 128 + SIGKILL);
    }
    run.start_relay();
    run.start_relay();
  }
  run.wait_committed(run.writer.committed(), 300);
  run.kill_relay_behind_frozen_network(*victim, proxy);
  run.wait_committed(run.writer.committed(), 300);
  run.finish(std::to_string(backlog) + " rows of one key waiting when the relays started; " +
                 std::to_string(in_flight.size()) +
                 " rows of the first killed relay's batch reached the broker and were published "
                 "again; the second one was killed with its network frozen; " +
                 relay_losses(run),
             in_flight);
}

/// Two consumers kill themselves right after their Nth message commits, before the ack; a third
/// is killed from outside mid-stream; a fourth runs to the end.
void consumer_crash_lane(const std::string& database) {
  OutboxRun run("consumer SIGKILL commit..ack", database);
  run.start_relay();
  run.start_writer();
  run.wait_committed(0, 100);
  std::vector<std::string> crashed;
  for (uint64_t crash_after : {40, 60}) {
    ChildProcess& consumer = run.start_consumer(crash_after);
    REQUIRE(poll_until(
        run.loop, 60s, [&] { return !consumer.running(); }, 20ms));
    INFO(consumer.err());
    CHECK(consumer.wait() == 128 + SIGKILL);
    const std::string out = consumer.out();
    const size_t at = out.find("\ncrash ");
    REQUIRE(at != std::string::npos);
    crashed.push_back(out.substr(at + 7, out.find('\n', at + 1) - at - 7));
  }
  {
    ChildProcess& consumer = run.start_consumer();
    REQUIRE(poll_until(
        run.loop, 60s, [&] { return count_lines_containing(consumer.out(), "handled ") >= 100; },
        5ms));
    consumer.signal(SIGKILL);
    CHECK(consumer.wait() == 128 + SIGKILL);
  }
  const uint64_t mark = run.writer.committed();
  run.start_consumer();
  run.wait_committed(mark, 200);
  auto answered_as_duplicate = [&](const std::string& id) {
    for (const auto& consumer : run.consumers) {
      if (count_lines_containing(consumer->out(), "duplicate " + id) != 0) return true;
    }
    return false;
  };
  std::string answered;
  for (const auto& id : crashed)
    answered += " " + id + (answered_as_duplicate(id) ? " (duplicate)" : " (NOT SEEN AGAIN)");
  auto tally = run.finish("crashed after committing:" + answered);
  // The message each crash cut off after its commit came back, and the inbox said duplicate.
  for (const auto& id : crashed) {
    INFO(id << " was committed by a consumer that died before acking it");
    CHECK(answered_as_duplicate(id));
  }
  CHECK(tally.absorbed >= crashed.size());
}

}  // namespace

TEST_CASE(
    "Outbox on SQLite: a relay killed with SIGKILL mid-batch and another started loses nothing",
    "[fault][outbox]") {
  relay_kill_lane("sqlite");
}

TEST_CASE(
    "Outbox on PostgreSQL: a relay killed with SIGKILL mid-batch and another started loses nothing",
    "[fault][outbox]") {
  relay_kill_lane("postgresql");
}

TEST_CASE("Outbox on PostgreSQL: PostgreSQL restarted mid-run loses nothing", "[fault][outbox]") {
  postgres_lane("PostgreSQL restart", [](OutboxRun& run) {
    std::string output;
    expect_ok(postgres_async(run.loop, "restart", &output), output);
  });
}

TEST_CASE("Outbox on PostgreSQL: PostgreSQL killed with SIGKILL and started mid-run loses nothing",
          "[fault][outbox]") {
  postgres_lane("PostgreSQL SIGKILL + start", [](OutboxRun& run) {
    std::string output;
    const uint64_t errors = run.writer.errors();
    expect_ok(postgres_async(run.loop, "kill", &output), output);
    // Down until the application has noticed (a loaded machine may take a while to run it).
    const bool noticed = poll_until(
        run.loop, 60s, [&] { return run.writer.errors() > errors; }, 20ms);
    INFO("the application saw no error within 60 s of the kill");
    CHECK(noticed);
    expect_ok(postgres_async(run.loop, "start", &output), output);
  });
}

TEST_CASE(
    "Outbox on SQLite: the broker restarted (stop_app then start_app) under the relay loses "
    "nothing",
    "[fault][outbox]") {
  broker_restart_lane("sqlite");
}

TEST_CASE(
    "Outbox on PostgreSQL: the broker restarted (stop_app then start_app) under the relay loses "
    "nothing",
    "[fault][outbox]") {
  broker_restart_lane("postgresql");
}

TEST_CASE(
    "Outbox on SQLite: the broker killed with SIGKILL and restarted under the relay loses nothing",
    "[fault][outbox]") {
  broker_kill_lane("sqlite");
}

TEST_CASE(
    "Outbox on PostgreSQL: the broker killed with SIGKILL and restarted under the relay loses "
    "nothing",
    "[fault][outbox]") {
  broker_kill_lane("postgresql");
}

TEST_CASE(
    "Outbox on SQLite: three relays, one publishing and two standing by, the publishing one "
    "killed four times (the proxied one mid-batch, twice): nothing lost and each ordering key in "
    "commit order",
    "[fault][outbox]") {
  three_relays_lane("sqlite");
}

TEST_CASE(
    "Outbox on PostgreSQL: three relays sharing the table with the proxied one killed mid-batch "
    "twice: nothing lost and each ordering key in commit order",
    "[fault][outbox]") {
  three_relays_lane("postgresql");
}

TEST_CASE(
    "Inbox on SQLite: a consumer killed between its commit and its ack gets the message again and "
    "the inbox runs its effect once",
    "[fault][outbox]") {
  consumer_crash_lane("sqlite");
}

TEST_CASE(
    "Inbox on PostgreSQL: a consumer killed between its commit and its ack gets the message again "
    "and the inbox runs its effect once",
    "[fault][outbox]") {
  consumer_crash_lane("postgresql");
}

TEST_CASE(
    "Outbox on PostgreSQL: a relay killed holding a key while another relay's claim scans the "
    "table does not let the key's later rows overtake its first",
    "[fault][outbox]") {
  // The race the three-relay lane can hit by chance, made likely: a long backlog of one key, so
  // that a claim scanning the table takes tens of milliseconds, and the relay holding the key
  // dies in the middle of one.
  constexpr int backlog = 60000;
  OutboxRun run("relay killed mid-claim", "postgresql");
  TcpProxy proxy(run.loop.get(), broker_amqp_port());
  ChildProcess& victim = run.start_relay(proxied_url(proxy));
  REQUIRE(
      run.db.query("INSERT INTO retryloop_outbox (exchange, routing_key, message_id) VALUES ($1, "
                   "'key', 'first')",
                   {run.lane->exchange()}));
  REQUIRE(poll_until(run.loop, 30s, [&] {
    run.collect();
    return !run.received.empty();
  }));
  // The victim's next batch, the first rows of the backlog, never reaches the broker.
  proxy.freeze();
  REQUIRE(run.db.query(
      "INSERT INTO retryloop_outbox (exchange, routing_key, message_id, ordering_key) SELECT $1, "
      "'key', 'bulk/' || i, 'k0' FROM generate_series(1, $2::int) i ORDER BY i",
      {run.lane->exchange(), int64_t{backlog}}));
  REQUIRE(
      run.db.query("INSERT INTO app_events (message_id, ordering_key, seq) SELECT 'bulk/' || i, "
                   "'k0', i FROM generate_series(1, $1::int) i",
                   {int64_t{backlog}}));
  REQUIRE(poll_until(
      run.loop, 30s,
      [&] {
        auto held = run.db.query(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND query "
            "LIKE '%retryloop_outbox%' AND now() - state_change > interval '200 milliseconds'");
        return held && held->rows.at(0).integer(0) > 0;
      },
      50ms));
  // A second relay: its claims skip the key, held by the victim. It is waited for until its
  // connection has listened, claimed and gone idle (a loaded machine may take a while to start
  // it): a connection of PostgreSQL's that is new, idle, and did something after its LISTEN.
  auto before = run.db.query("SELECT pid FROM pg_stat_activity");
  REQUIRE(before);
  std::string known = "pg_backend_pid()";
  for (const auto& row : before->rows)
    known += ", " + std::to_string(row.integer(0));
  ChildProcess& second = run.start_relay();
  REQUIRE(poll_until(
      run.loop, 60s,
      [&] {
        auto idle = run.db.query(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query NOT LIKE "
            "'LISTEN %' AND pid NOT IN (" +
            known + ")");
        return idle && idle->rows.at(0).integer(0) > 0;
      },
      50ms));
  // A row wakes it; while its claim scans the backlog, the victim dies and its batch rolls back.
  REQUIRE(run.db.query(
      "INSERT INTO retryloop_outbox (exchange, routing_key, message_id) VALUES ($1, 'key', 'wake')",
      {run.lane->exchange()}));
  const auto woken = Clock::now();
  bool scanning = false;
  while (!scanning && Clock::now() - woken < 60s) {
    auto active = run.db.query(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT%FROM "
        "retryloop_outbox o%' AND pid <> pg_backend_pid()");
    scanning = active && active->rows.at(0).integer(0) > 0;
  }
  REQUIRE(scanning);
  victim.signal(SIGKILL);
  CHECK(victim.wait() == 128 + SIGKILL);
  proxy.cut();
  proxy.thaw();
  auto arrived = [&](const std::string& id) {
    return std::find(run.received.begin(), run.received.end(), id) != run.received.end();
  };
  REQUIRE(poll_until(
      run.loop, 60s,
      [&] {
        run.collect();
        return arrived("bulk/1");
      },
      100ms));
  second.signal(SIGTERM);
  CHECK(second.wait() == 0);
  std::map<std::string, std::pair<std::string, int64_t>> keyed;
  std::string first_of_key;
  for (const auto& id : run.received) {
    if (id.rfind("bulk/", 0) != 0) continue;
    keyed[id] = {"k0", std::stoll(id.substr(5))};
    if (first_of_key.empty()) first_of_key = id;
  }
  std::vector<std::string> problems;
  const size_t disorder = check_order(run.received, keyed, problems);
  // Whether the race happened: the second relay's claim took later rows of the key, and it
  // left them for a later batch.
  const size_t left_out = count_lines_containing(second.err(), "for a later batch");
  note("relay killed mid-claim, postgresql: the key's first message to arrive was " + first_of_key +
       "; " + std::to_string(disorder) +
       " of its messages arrived out of order; the second relay left the key for a later " +
       "batch in " + std::to_string(left_out) + " claims");
  std::string lines;
  for (size_t i = 0; i < problems.size() && i < 10; ++i)
    lines += problems[i] + "\n";
  INFO(lines);
  CHECK(disorder == 0);
  run.lane->remove(run.probe);
}
