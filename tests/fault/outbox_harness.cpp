#include "outbox_harness.hpp"

#include <signal.h>
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "retryloop/outbox/outbox.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"

namespace retryloop::test::fault {

using client::Error;

namespace {

// The application's own tables: each key's count of committed rows, a row per message written
// (the ground truth of what committed), and a row per effect (no unique key: an effect that
// happens twice shows as two rows).
const char* const app_schema = R"sql(
CREATE TABLE app_keys (name TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE app_events (message_id TEXT PRIMARY KEY, ordering_key TEXT, seq INTEGER);
CREATE TABLE app_effects (message_id TEXT NOT NULL, pid TEXT NOT NULL);
CREATE INDEX app_effects_message ON app_effects (message_id);
)sql";

std::string env_or_fail(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run the fault suite through scripts/test, or through "
                 "scripts/with-broker -- scripts/with-postgres");
  }
  return value;
}

std::string last_lines(const std::string& text, size_t count) {
  if (text.empty()) return text;
  size_t start = text.size();
  for (size_t n = 0; n <= count && start > 0;) {
    start = text.rfind('\n', start - 1);
    if (start == std::string::npos) return text;
    ++n;
  }
  return text.substr(start + 1);
}

// The text without the lines logged at debug level (a --verbose relay's batches).
std::string without_debug(const std::string& text) {
  std::string kept;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" debug ") == std::string::npos) kept += line + "\n";
  }
  return kept;
}

// The lines of a --verbose relay's log that show a batch holding one of `keys` going out, and
// how each such batch settled.
std::string batches_of_keys(const std::string& log, const std::set<std::string>& keys) {
  const std::string marker = "outbox relay: batch ";
  std::set<std::string> batches;
  std::string shown;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    const size_t number = at + marker.size();
    const std::string batch = line.substr(number, line.find_first_of(" :", number) - number);
    bool shows = batches.count(batch) != 0;
    for (const auto& key : keys) {
      if (line.find("keys: " + key + " ") != std::string::npos ||
          line.find(", " + key + " ") != std::string::npos) {
        shows = true;
      }
    }
    if (!shows) continue;
    batches.insert(batch);
    shown += line + "\n";
  }
  return shown;
}

// Fails the test when the relay about to be killed has exited by itself, with what it said.
void require_running(ChildProcess& relay) {
  if (relay.running()) return;
  const int status = relay.wait(100);
  INFO("the relay to be killed had exited by itself, with status " << status << ":\n"
                                                                   << without_debug(relay.err()));
  FAIL("the relay to be killed is not running");
}

size_t count_lines_starting(const std::string& text, const std::string& prefix) {
  size_t n = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

/// Runs the loop until `child` has exited (at most `timeout`), then returns its exit code.
int wait_child(TestLoop& loop, ChildProcess& child, std::chrono::milliseconds timeout) {
  poll_until(
      loop, timeout, [&] { return !child.running(); }, 20ms);
  return child.wait(100);
}

}  // namespace

// ---- the lane -----------------------------------------------------------------------------------

OutboxLane::OutboxLane(const std::string& fault_, const std::string& database_label)
    : fault(fault_) {
  std::string slug;
  for (char c : fault_) {
    if (std::isalnum(static_cast<unsigned char>(c)) && slug.size() < 12) {
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  const std::string name = unique_name("ob." + slug);
  database = database_label == "sqlite" ? fresh_sqlite(name) : fresh_postgres(name);
  {
    auto db = database.open();
    db->execute_script(app_schema);
    for (int k = 0; k < ordering_keys; ++k)
      db->execute("INSERT INTO app_keys (name, seq) VALUES ($1, 0)", {"k" + std::to_string(k)});
  }
  // Retries wait 500 ms, up to 40 attempts: a handler that fails while the database restarts
  // (its transaction cannot even begin) tries again for 20 s before anything is parked.
  const nlohmann::json file = {
      {"services",
       {{{"name", name},
         {"queue_type", "classic"},
         {"input", {{"exchange", name + ".in"}, {"type", "direct"}, {"bindings", {"key"}}}},
         {"retry", {{"mode", "reject"}, {"delays", {"500ms"}}, {"max_attempts", 40}}}}}}};
  topology::ParseResult parsed = topology::parse_topology(file.dump());
  std::string problems;
  for (const auto& line : parsed.messages())
    problems += line + "\n";
  INFO(problems);
  REQUIRE(parsed.ok());
  service = parsed.topology->services.at(0);
  topology_path = (std::filesystem::temp_directory_path() / (name + ".json")).string();
  std::ofstream(topology_path) << file.dump(2);
  audit_queue = name + ".audit";
}

OutboxLane::~OutboxLane() {
  std::error_code ignored;
  std::filesystem::remove(topology_path, ignored);
}

const std::string& OutboxLane::input_queue() const {
  return topology::input_queue_name(service);
}

std::string OutboxLane::wait_queue() const {
  return topology::wait_queue_name(service.name, std::chrono::milliseconds(500));
}

std::string OutboxLane::parking_queue() const {
  return topology::parking_queue_name(service.name);
}

void OutboxLane::declare(Probe& probe) const {
  Error error = probe.apply(topology::make_plan(topology::Topology{{service}}));
  INFO(error.message());
  REQUIRE_FALSE(error);
  REQUIRE_FALSE(probe.declare_queue(audit_queue, {}));
  REQUIRE_FALSE(probe.bind_queue(audit_queue, exchange(), "key"));
}

void OutboxLane::remove(Probe& probe) const {
  if (Error error = probe.remove(topology::make_delete_plan(topology::Topology{{service}}))) {
    WARN("could not delete the objects of " << service.name << ": " << error.message());
  }
  if (Error error = probe.delete_queue(audit_queue, false)) {
    WARN("could not delete " << audit_queue << ": " << error.message());
  }
}

// ---- the application ----------------------------------------------------------------------------

AppWriter::AppWriter(std::string url, std::string exchange, std::string prefix, int threads,
                     std::chrono::milliseconds pause)
    : url_(std::move(url)),
      exchange_(std::move(exchange)),
      prefix_(std::move(prefix)),
      thread_count_(threads),
      pause_(pause) {}

AppWriter::~AppWriter() {
  stop();
}

void AppWriter::start() {
  for (int t = 0; t < thread_count_; ++t)
    threads_.emplace_back([this, t] { run(t); });
}

void AppWriter::stop() {
  stopping_ = true;
  for (auto& thread : threads_)
    thread.join();
  threads_.clear();
}

std::set<std::string> AppWriter::attempted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return attempted_;
}

std::set<std::string> AppWriter::rolled_back() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rolled_back_;
}

std::vector<std::string> AppWriter::error_samples() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_samples_;
}

void AppWriter::run(int thread) {
  std::mt19937 random(static_cast<uint32_t>(7919 * (thread + 1)));
  std::unique_ptr<store::Database> db;
  auto failed = [&](const std::string& what) {
    ++errors_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_samples_.size() < 5) error_samples_.push_back(what);
  };
  for (uint64_t n = 1; !stopping_; ++n) {
    if (!db) {
      try {
        db = store::Database::open(url_, false);
      } catch (const store::StoreError& error) {
        failed(error.what());
        std::this_thread::sleep_for(50ms);
        continue;
      }
    }
    const int rows = 1 + static_cast<int>(random() % 3);
    std::optional<std::string> key;
    if (random() % 10 < 6) key = "k" + std::to_string(random() % ordering_keys);
    const bool roll_back = n % 6 == 0;
    std::vector<std::string> ids;
    for (int i = 0; i < rows; ++i) {
      ids.push_back(prefix_ + "/" + std::to_string(thread) + "." + std::to_string(n) + "." +
                    std::to_string(i));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      attempted_.insert(ids.begin(), ids.end());
    }
    try {
      store::Transaction transaction(*db);
      for (const auto& id : ids) {
        outbox::OutboxMessage message;
        message.exchange = exchange_;
        message.routing_key = "key";
        message.message_id = id;
        message.ordering_key = key;
        message.properties.content_type = "application/json";
        message.body = "{\"id\": \"" + id + "\"}";
        outbox::enqueue(*db, message);
        if (key) {
          // After the enqueue, which took the key's lock (PostgreSQL; SQLite: the write lock):
          // seq is the key's commit order.
          db->execute("UPDATE app_keys SET seq = seq + 1 WHERE name = $1", {*key});
          const int64_t seq =
              db->execute("SELECT seq FROM app_keys WHERE name = $1", {*key}).rows.at(0).integer(0);
          db->execute("INSERT INTO app_events (message_id, ordering_key, seq) VALUES ($1, $2, $3)",
                      {id, *key, seq});
        } else {
          db->execute("INSERT INTO app_events (message_id) VALUES ($1)", {id});
        }
      }
      if (roll_back) {
        std::lock_guard<std::mutex> lock(mutex_);
        rolled_back_.insert(ids.begin(), ids.end());
        // The transaction's destructor rolls back.
      } else {
        transaction.commit();
        committed_ += ids.size();
      }
    } catch (const store::StoreError& error) {
      failed(error.what());
      // A broken connection, or one a failed COMMIT left inside its transaction (SQLite): a new
      // one (closing it rolls back).
      if (!db->usable() || db->in_transaction()) db.reset();
      std::this_thread::sleep_for(20ms);
    }
    std::this_thread::sleep_for(pause_);
  }
}

// ---- the checker's database connection ----------------------------------------------------------

std::optional<store::Result> LaneDatabase::query(const std::string& sql,
                                                 const std::vector<store::Value>& parameters) {
  try {
    if (!db_ || !db_->usable()) {
      db_.reset();
      db_ = store::Database::open(url_, false);
    }
    return db_->execute(sql, parameters);
  } catch (const store::StoreError&) {
    if (db_ && !db_->usable()) db_.reset();
    return std::nullopt;
  }
}

std::optional<LaneDatabase::Rows> LaneDatabase::outbox_rows() {
  auto result = query("SELECT state, count(*) FROM retryloop_outbox GROUP BY state");
  if (!result) return std::nullopt;
  Rows rows;
  for (const auto& row : result->rows) {
    if (*row.text(0) == "pending") rows.pending = row.integer(1);
    if (*row.text(0) == "failed") rows.failed = row.integer(1);
  }
  return rows;
}

std::set<std::string> LaneDatabase::pending_among(const std::vector<std::string>& ids) {
  std::set<std::string> pending;
  constexpr size_t chunk = 500;
  for (size_t first = 0; first < ids.size(); first += chunk) {
    const size_t count = std::min(chunk, ids.size() - first);
    std::vector<store::Value> values(ids.begin() + first, ids.begin() + first + count);
    auto result = query(
        "SELECT message_id FROM retryloop_outbox WHERE state = 'pending' AND message_id IN (" +
            store::placeholders(1, count) + ")",
        values);
    if (!result) continue;
    for (const auto& row : result->rows)
      pending.insert(*row.text(0));
  }
  return pending;
}

// ---- the checker --------------------------------------------------------------------------------

size_t check_order(const std::vector<std::string>& received,
                   const std::map<std::string, std::pair<std::string, int64_t>>& keyed,
                   std::vector<std::string>& problems) {
  struct KeyState {
    std::set<std::string> seen;
    int64_t highest = 0;
    std::string highest_id;
  };
  std::map<std::string, KeyState> keys;
  size_t disorder = 0;
  for (const auto& id : received) {
    auto it = keyed.find(id);
    if (it == keyed.end()) continue;  // no ordering key, or not committed (a phantom)
    const auto& [key, seq] = it->second;
    KeyState& state = keys[key];
    if (!state.seen.insert(id).second) continue;  // a copy of a message already seen
    if (seq < state.highest) {
      ++disorder;
      problems.push_back("key " + key + ": " + id + " (seq " + std::to_string(seq) +
                         ") arrived after " + state.highest_id + " (seq " +
                         std::to_string(state.highest) + ") had arrived");
    } else {
      state.highest = seq;
      state.highest_id = id;
    }
  }
  return disorder;
}

// ---- the run ------------------------------------------------------------------------------------

OutboxRun::OutboxRun(const std::string& fault, const std::string& database_label)
    : lane(std::make_unique<OutboxLane>(fault, database_label)),
      writer(lane->database.url, lane->exchange(), "app"),
      db(lane->database.url) {
  lane->declare(probe);
}

OutboxRun::~OutboxRun() {
  writer.stop();
  for (auto& child : relays)
    child->signal(SIGKILL);
  for (auto& child : consumers)
    child->signal(SIGKILL);
}

ChildProcess& OutboxRun::start_relay(const std::string& url) {
  // --verbose: the relays log their batches, which the report shows for a key out of order.
  relays.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
      built_program("retryloop"), "outbox", "relay", "--db", lane->database.url, "--url",
      url.empty() ? broker_url() : url, "--batch", "100", "--verbose"}));
  return *relays.back();
}

ChildProcess& OutboxRun::start_consumer(uint64_t crash_after) {
  consumers.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
      built_program("tests/fault/fault_inbox_consumer"), "--db", lane->database.url, "--url",
      broker_url(), "--topology", lane->topology_path, "--service", lane->service.name,
      "--crash-after", std::to_string(crash_after)}));
  return *consumers.back();
}

void OutboxRun::commit_backlog(const std::string& key, int rows) {
  auto database = lane->database.open();
  store::Transaction transaction(*database);
  const std::string numbers =
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) ";
  database->execute(numbers +
                        "INSERT INTO retryloop_outbox (exchange, routing_key, message_id, "
                        "ordering_key) SELECT $2, 'key', $3 || '/' || i, $3 FROM n ORDER BY i",
                    {int64_t{rows}, lane->exchange(), key});
  database->execute(numbers +
                        "INSERT INTO app_events (message_id, ordering_key, seq) SELECT $2 || '/' "
                        "|| i, $2, i FROM n",
                    {int64_t{rows}, key});
  transaction.commit();
}

void OutboxRun::wait_committed(uint64_t since, uint64_t rows, std::chrono::milliseconds timeout) {
  const bool committed = poll_until(
      loop, timeout, [&] { return writer.committed() >= since + rows; }, 20ms);
  INFO("the application committed " << writer.committed() - since << " rows, not " << rows
                                    << "; errors: " << writer.errors());
  REQUIRE(committed);
}

bool OutboxRun::collect() {
  std::vector<client::GetResult> got;
  const bool drained = probe.drain(lane->audit_queue, got);
  for (const auto& m : got)
    received.push_back(m.message.properties.message_id.value_or(""));
  return drained;
}

std::set<std::string> OutboxRun::hold_batch_in_flight(TcpProxy& proxy) {
  std::set<std::string> batch;
  // The victim publishes into a freeze only when it won a claim just before it, which a loaded
  // machine makes rarer: try for a while, not a number of times.
  const auto give_up = Clock::now() + 120s;
  for (int attempt = 0; batch.empty() && (attempt < 30 || Clock::now() < give_up); ++attempt) {
    if (attempt > 0) {
      // The relay waited for confirms that the freeze held: let them through, and freeze again a
      // moment later (a different one each time).
      proxy.thaw();
      loop.run_for(std::chrono::milliseconds(20 + attempt * 37 % 130));
    }
    proxy.freeze();
    // Until the relay publishes into the frozen network (a row's publish is about 150 bytes, a
    // heartbeat 8).
    if (!poll_until(
            loop, 500ms, [&] { return proxy.held_from_clients() > 100; }, 10ms)) {
      continue;
    }
    // Every row whose confirm passed before the freeze reached the audit queue before it (a
    // queue takes a message before the broker confirms it): this takes them. What arrives later
    // was published into the freeze, and its confirm is held.
    collect();
    const size_t from = received.size();
    proxy.hold_replies();
    std::set<std::string> previous;
    poll_until(
        loop, 5s,
        [&] {
          collect();
          const auto pending =
              db.pending_among(std::vector<std::string>(received.begin() + from, received.end()));
          for (const auto& id : pending) {
            if (previous.count(id) != 0) batch.insert(id);
          }
          previous = pending;
          return !batch.empty();
        },
        300ms);
  }
  std::string logs;
  for (const auto& relay : relays)
    logs += without_debug(relay->err());
  INFO(logs);
  REQUIRE_FALSE(batch.empty());
  return batch;
}

std::set<std::string> OutboxRun::kill_relay_mid_batch(ChildProcess& relay, TcpProxy& proxy) {
  const auto batch = hold_batch_in_flight(proxy);
  require_running(relay);
  relay.signal(SIGKILL);
  CHECK(relay.wait() == 128 + SIGKILL);
  proxy.cut();
  proxy.thaw();
  // Where relays share the table, a row of another relay's batch, slow to settle, can pass for
  // one of this one's; the dead relay settles nothing more, so the rows still pending are its.
  return db.pending_among({batch.begin(), batch.end()});
}

void OutboxRun::kill_relay_behind_frozen_network(ChildProcess& relay, TcpProxy& proxy) {
  proxy.freeze();
  // A batch's publishes held back by the frozen network (one row's are about 150 bytes, a
  // heartbeat 8); or, when the relay had a batch out as the network froze, 5 s of waiting for
  // confirms that cannot come.
  poll_until(
      loop, 5s, [&] { return proxy.held_from_clients() > 100; }, 100ms);
  require_running(relay);
  relay.signal(SIGKILL);
  CHECK(relay.wait() == 128 + SIGKILL);
  proxy.cut();
  proxy.thaw();
}

OutboxTally OutboxRun::finish(const std::string& notes, const std::set<std::string>& in_flight) {
  writer.stop();
  // Quiet: the outbox is empty, every committed row has taken effect, and the service's queues
  // are empty; or nothing has changed for 10 s, or for 40 s while rows are pending: a relay whose
  // broker was down long (a slow restart) waits up to its largest recovery backoff, 30 s, before
  // it connects again (then the tally shows what is missing).
  std::string last_signature;
  auto last_change = Clock::now();
  const bool quiet = poll_until(
      loop, 120s,
      [&] {
        auto rows = db.outbox_rows();
        auto missing = db.query(
            "SELECT count(*) FROM app_events e WHERE NOT EXISTS (SELECT 1 FROM app_effects f "
            "WHERE f.message_id = e.message_id)");
        const auto input = probe.depth(lane->input_queue());
        const auto wait = probe.depth(lane->wait_queue());
        if (!rows || !missing || !input.ok || !wait.ok) return false;
        const int64_t without_effect = missing->rows.at(0).integer(0);
        const std::string signature =
            std::to_string(rows->pending) + "/" + std::to_string(rows->failed) + "/" +
            std::to_string(without_effect) + "/" + std::to_string(input.messages) + "/" +
            std::to_string(wait.messages);
        if (signature != last_signature) {
          last_signature = signature;
          last_change = Clock::now();
        }
        if (rows->pending == 0 && rows->failed == 0 && without_effect == 0 && input.messages == 0 &&
            wait.messages == 0) {
          return true;
        }
        return Clock::now() - last_change > (rows->pending > 0 ? 40s : 10s);
      },
      250ms);
  const double seconds = seconds_since(started);
  if (!quiet) WARN("not quiet (pending/failed/without effect/input/wait): " << last_signature);
  CHECK(poll_until(loop, 30s, [&] { return collect(); }));
  std::vector<client::GetResult> parked;
  probe.drain(lane->parking_queue(), parked);

  // Everything stops gracefully.
  std::string logs;
  for (size_t i = 0; i < relays.size(); ++i) {
    ChildProcess& relay = *relays[i];
    if (relay.running()) {
      relay.signal(SIGTERM);
      INFO("relay " << i << ":\n" << without_debug(relay.err()));
      CHECK(wait_child(loop, relay, 30s) == 0);
    }
    logs += "relay " + std::to_string(i) + ":\n" + last_lines(without_debug(relay.err()), 15);
  }
  for (size_t i = 0; i < consumers.size(); ++i) {
    ChildProcess& consumer = *consumers[i];
    if (consumer.running()) {
      consumer.signal(SIGTERM);
      INFO("consumer " << i << ":\n" << consumer.err());
      CHECK(wait_child(loop, consumer, 30s) == 0);
    }
    logs += "consumer " + std::to_string(i) + ":\n" + last_lines(consumer.err(), 15);
  }

  OutboxTally tally;
  std::set<std::string> committed;
  std::map<std::string, std::pair<std::string, int64_t>> keyed;
  auto events = db.query("SELECT message_id, ordering_key, seq FROM app_events");
  REQUIRE(events);
  for (const auto& row : events->rows) {
    committed.insert(*row.text(0));
    if (!row.is_null(1)) keyed[*row.text(0)] = {*row.text(1), row.integer(2)};
  }
  std::map<std::string, int64_t> effects;
  auto effect_rows = db.query("SELECT message_id, count(*) FROM app_effects GROUP BY message_id");
  REQUIRE(effect_rows);
  for (const auto& row : effect_rows->rows)
    effects[*row.text(0)] = row.integer(1);
  std::map<std::string, size_t> copies;
  for (const auto& id : received)
    ++copies[id];

  tally.committed = committed.size();
  for (const auto& id : writer.attempted())
    tally.rolled_back += committed.count(id) == 0 ? 1 : 0;
  std::set<std::string> phantoms;
  for (const auto& [id, n] : copies) {
    tally.duplicates += n - 1;
    if (committed.count(id) != 0) {
      ++tally.received;
    } else if (phantoms.insert(id).second) {
      tally.problems.push_back(id + ": PHANTOM, reached the broker " + std::to_string(n) +
                               "x but its transaction did not commit");
    }
  }
  for (const auto& [id, n] : effects) {
    if (committed.count(id) == 0) {
      if (phantoms.insert(id).second) {
        tally.problems.push_back(id + ": PHANTOM, took effect but its transaction did not commit");
      }
    } else {
      ++tally.effects;
    }
    if (n > 1) {
      ++tally.doubles;
      tally.problems.push_back(id + ": took effect " + std::to_string(n) + " times");
    }
  }
  tally.phantoms = phantoms.size();
  for (const auto& id : committed) {
    const bool arrived = copies.count(id) != 0;
    const bool took_effect = effects.count(id) != 0;
    if (arrived && took_effect) continue;
    ++tally.lost;
    tally.problems.push_back(id + ": LOST, committed but " +
                             (arrived       ? std::string("never took effect")
                              : took_effect ? "never reached the audit queue"
                                            : "neither arrived nor took effect"));
  }
  size_t committed_yet_rolled_back = 0;
  for (const auto& id : writer.rolled_back()) {
    if (committed.count(id) != 0) {
      ++committed_yet_rolled_back;
      tally.problems.push_back(id + ": rolled back on purpose, yet in app_events");
    }
  }
  tally.disorder = check_order(received, keyed, tally.problems);
  if (tally.disorder != 0) {
    // The relays log their batches (--verbose): show those of each key out of order.
    std::set<std::string> keys;
    for (const auto& problem : tally.problems) {
      if (problem.rfind("key ", 0) == 0) keys.insert(problem.substr(4, problem.find(':') - 4));
    }
    for (size_t i = 0; i < relays.size(); ++i) {
      logs += "relay " + std::to_string(i) + "'s batches of the keys out of order:\n" +
              batches_of_keys(relays[i]->err(), keys);
    }
  }
  for (const auto& consumer : consumers)
    tally.absorbed += count_lines_starting(consumer->out(), "duplicate ");
  tally.unexpected = tally.phantoms + tally.doubles + tally.disorder + committed_yet_rolled_back;
  for (const auto& m : parked) {
    tally.problems.push_back("parked: " + m.message.properties.message_id.value_or("(no id)"));
  }
  CHECK(parked.empty());

  size_t in_flight_twice = 0;
  for (const auto& id : in_flight) {
    auto it = copies.find(id);
    if (it != copies.end() && it->second >= 2) ++in_flight_twice;
  }
  {
    INFO("rows in flight when their relay died or lost its broker must be published again");
    CHECK(in_flight_twice == in_flight.size());
  }
  std::string all_notes = notes;
  if (!in_flight.empty()) {
    all_notes += (all_notes.empty() ? "" : "; ") + std::to_string(in_flight_twice) + " of the " +
                 std::to_string(in_flight.size()) + " in flight published again";
  }
  if (writer.errors() != 0) {
    all_notes += (all_notes.empty() ? "" : "; ") + std::string("the application saw ") +
                 std::to_string(writer.errors()) + " database errors";
  }
  report_outbox(lane->fault, lane->database.label, tally, seconds, all_notes, logs);
  lane->remove(probe);
  return tally;
}

// ---- the report ---------------------------------------------------------------------------------

void report_outbox(const std::string& fault, const std::string& database, const OutboxTally& tally,
                   double seconds, const std::string& notes, const std::string& logs) {
  static bool header_printed = false;
  const char* const header_format = "%-30s %-10s %9s %8s %8s %7s %8s %7s %6s %5s %4s %4s %10s %7s";
  char header[256];
  std::snprintf(header, sizeof header, header_format, "outbox fault", "database", "committed",
                "rolledbk", "received", "effects", "absorbed", "phantom", "double", "order", "lost",
                "dup", "unexpected", "seconds");
  char row[256];
  std::snprintf(row, sizeof row,
                "%-30s %-10s %9zu %8zu %8zu %7zu %8zu %7zu %6zu %5zu %4zu %4zu %10zu %7.1f",
                fault.c_str(), database.c_str(), tally.committed, tally.rolled_back, tally.received,
                tally.effects, tally.absorbed, tally.phantoms, tally.doubles, tally.disorder,
                tally.lost, tally.duplicates, tally.unexpected, seconds);
  if (!header_printed) {
    std::printf("%s\n", header);
    header_printed = true;
  }
  std::printf("%s\n", row);
  if (!notes.empty())
    std::printf("  note: %s, %s: %s\n", fault.c_str(), database.c_str(), notes.c_str());
  std::fflush(stdout);
  if (const char* path = std::getenv("RETRYLOOP_FAULT_REPORT"); path != nullptr && *path != '\0') {
    std::string existing;
    {
      std::ifstream in(path);
      std::stringstream buffer;
      buffer << in.rdbuf();
      existing = buffer.str();
    }
    std::ofstream out(path, std::ios::app);
    if (existing.find(header) == std::string::npos) out << header << "\n";
    out << row << "\n";
    if (!notes.empty()) out << "  note: " << fault << ", " << database << ": " << notes << "\n";
  }

  std::string problems;
  for (size_t i = 0; i < tally.problems.size() && i < 30; ++i)
    problems += tally.problems[i] + "\n";
  if (tally.problems.size() > 30) {
    problems += "... and " + std::to_string(tally.problems.size() - 30) + " more\n";
  }
  INFO(fault << ", " << database << "\n"
             << problems
             << (tally.lost != 0 || tally.unexpected != 0
                     ? "the processes' last log lines:\n" + logs
                     : ""));
  CHECK(tally.lost == 0);
  CHECK(tally.unexpected == 0);
}

int postgres_async(TestLoop& loop, const std::string& command, std::string* output) {
  return run_async(
      loop, {env_or_fail("RETRYLOOP_TEST_PG_CTL"), command, env_or_fail("RETRYLOOP_TEST_PG_DIR")},
      120s, output);
}

uint16_t broker_amqp_port() {
  return static_cast<uint16_t>(std::stoi(env_or_fail("RETRYLOOP_TEST_AMQP_PORT")));
}

}  // namespace retryloop::test::fault
