#pragma once

// The fault suite's harness. A run publishes a scripted workload through four services at once
// (reject and republish mode, classic and quorum queues: one "lane" each), injects one fault while
// the messages flow, waits until every loop is quiet, drains every queue, and classifies each
// message id against what its script predicts.

#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "retryloop/client/connection.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

namespace retryloop::test::fault {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- the workload ----------------------------------------------------------------------------

/// Messages per lane, and the retry settings every lane uses.
inline constexpr int messages_per_lane = 300;
inline constexpr std::chrono::milliseconds retry_delay{200};
inline constexpr int max_attempts = 3;
inline constexpr uint16_t consumer_prefetch = 20;
inline constexpr uint32_t consumer_concurrency = 2;
/// Each handler call sleeps this long, so that a first pass over a lane takes a few seconds. A
/// fault made by a command (rabbitmqctl, scripts/broker: seconds to start on a loaded machine)
/// holds the stream until it is in place (InProcessRun::hold), so that it still lands mid-stream.
inline constexpr int handler_sleep_ms = 25;

/// Where a message should end up once the loop is quiet.
enum class Expect {
  acked,             ///< the handler said ack (possibly after some retries)
  parked_exhausted,  ///< in parking, retryloop-reason=exhausted
  parked_permanent,  ///< in parking, retryloop-reason=permanent
  parked_poison,     ///< in parking, retryloop-reason=poison
  parked_unrouted,   ///< in parking without retryloop-reason: a retry that found no wait queue,
                     ///< routed there by the wait exchange's alternate exchange
  queued,            ///< still in the input queue (nothing consumed it)
};
const char* to_string(Expect expect);

/// What a message's body asks of the handler (the body format of examples/demo_consumer).
enum class Kind { success, fail_then_ack, exhausted, permanent, poison };

struct Script {
  std::string id;
  Kind kind = Kind::success;
  /// Attempts that fail before the ack (fail_then_ack), or more than max_attempts (exhausted).
  int fail_times = 0;
  std::string body;
  Expect expect = Expect::acked;
  /// When not 0: a header pads its content header frame to this size, overhead included.
  size_t header_frame_size = 0;
};

/// The expected end of a message whose next handler call is attempt `next_attempt`, when a retry
/// can no longer reach a wait queue (every retry from that attempt on lands in parking unrouted).
Expect expect_without_wait_queue(const Script& script, int64_t next_attempt);

/// What the handler does with a message, the same rules as examples/demo_consumer. With `outage`
/// every message that is not permanent or poison fails (a broken downstream), without sleeping.
consumer::Outcome run_script(const consumer::Message& message, bool outage = false);

// ---- lanes -----------------------------------------------------------------------------------

/// One service under test: its topology (also written to a file for the processes) and its
/// scripted messages.
struct Lane {
  /// With `delay_levels` (republish mode), the service has delay levels of delay_level_base and
  /// every failure asks for a delay of its own (Outcome::retry_after), 0.5 to 3 s.
  Lane(const std::string& fault, topology::RetryMode mode, topology::QueueType queue_type,
       std::chrono::milliseconds delay = retry_delay, bool delay_levels = false);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  /// "reject", "republish", or "levels" for a republish lane with delay levels.
  std::string mode_name() const { return delay_levels ? "levels" : topology::to_string(mode); }
  std::string queue_type_name() const { return topology::to_string(queue_type); }
  std::string label() const { return mode_name() + "/" + queue_type_name(); }
  const std::string& input_queue() const { return topology::input_queue_name(service); }
  std::string wait_queue() const { return topology::wait_queue_name(service.name, delay); }
  /// Where a retry of this lane waits: its wait queue, and with delay levels every level queue
  /// and the levels' unrouted queue (shared with no other lane of the run).
  std::vector<std::string> waiting_queues() const;
  std::string parking_queue() const { return topology::parking_queue_name(service.name); }
  topology::Plan plan() const { return topology::make_plan(topology::Topology{{service}}); }
  size_t expected_count(Expect expect) const;
  size_t expected_parked() const;

  topology::RetryMode mode;
  topology::QueueType queue_type;
  bool delay_levels = false;
  /// The lane's one retry delay (retry_delay unless a fault needs retries to wait longer).
  std::chrono::milliseconds delay;
  topology::Service service;
  std::string topology_path;
  std::vector<Script> scripts;
  /// Message id -> prediction; starts as each script's `expect`, and a fault may revise it: the
  /// wait-queue deletion, from what was handled before it, and the topology mismatch, where
  /// nothing is consumed.
  std::map<std::string, Expect> expected;
  /// The last lines the lane's in-process consumers logged, shown when the lane fails.
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(300);
};

/// The base of the delay levels of lanes that have them.
inline constexpr std::chrono::milliseconds delay_level_base{100};

/// The lanes of a fault run: reject and republish, each with every queue type in `types`
/// (classic and quorum: four lanes); with `delay_levels`, also a republish lane with delay levels
/// for each queue type.
std::vector<std::unique_ptr<Lane>> make_lanes(
    const std::string& fault, std::chrono::milliseconds delay = retry_delay,
    const std::vector<topology::QueueType>& types = {topology::QueueType::classic,
                                                     topology::QueueType::quorum},
    bool delay_levels = false);

// ---- evidence of acks --------------------------------------------------------------------------

/// Every handler call an in-process consumer made, with the outcome it returned. Thread-safe.
class Ledger {
 public:
  struct Call {
    std::string id;
    int64_t attempt = 0;
    bool redelivered = false;
    consumer::OutcomeKind outcome = consumer::OutcomeKind::ack;
    Clock::time_point at = Clock::now();
  };
  void add(const consumer::Message& message, consumer::OutcomeKind outcome);
  /// For outcomes known from elsewhere (demo_consumer's output).
  void add(Call call);
  std::vector<Call> calls() const;
  size_t size() const;
  /// Ids the handler acked, once per ack.
  std::multiset<std::string> acks() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Call> calls_;
};

/// demo_consumer's output lines as ledger calls (the id field is null for poison bodies).
void add_demo_output(Ledger& ledger, const std::string& output);

/// Holds handlers back while closed (counts those waiting); opening lets them all through.
class Gate {
 public:
  void close();
  void open();
  void pass();
  int waiting() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool closed_ = false;
  int waiting_ = 0;
};

// ---- the broker, asked without failing the test
// ----------------------------------------------------

/// Polls at the top level: runs the loop for `interval`, then checks `done` (which may use a
/// Probe, so it must not be called from inside the loop). Returns whether `done` became true
/// within `timeout`.
bool poll_until(TestLoop& loop, std::chrono::milliseconds timeout,
                const std::function<bool()>& done, std::chrono::milliseconds interval = 100ms);

/// Runs a program while the loop keeps running (consumers and proxies stay live); returns its
/// exit code (-1 on timeout, after killing it). Its output goes to `output` when given.
int run_async(TestLoop& loop, std::vector<std::string> argv, std::chrono::milliseconds timeout,
              std::string* output = nullptr);
/// rabbitmqctl of the test broker, run as with run_async.
int ctl_async(TestLoop& loop, std::vector<std::string> args, std::string* output = nullptr);
/// scripts/broker COMMAND on the test broker's directory, run as with run_async.
int broker_script_async(TestLoop& loop, const std::string& command, std::string* output = nullptr);

/// How many messages of the lanes' quorum queues RabbitMQ's at-least-once dead-letter workers
/// hold (rabbitmqctl's messages_dlx): dead-lettered, not yet confirmed by a target queue.
size_t held_by_dead_letter_workers(TestLoop& loop, const std::vector<const Lane*>& lanes);

/// RabbitMQ 3.10 sometimes restarts a single-node quorum queue without ever electing its leader
/// (rabbitmq-server issue #10070): every operation on it waits forever and its messages are out
/// of reach, though not lost. This does what an operator does about it: for each quorum queue of
/// the lanes that has no leader, `ra:trigger_election`. Returns the queues it had to elect
/// (empty when all had a leader).
std::vector<std::string> elect_leaderless_quorum_queues(TestLoop& loop,
                                                        const std::vector<const Lane*>& lanes);

/// A connection for looking at and changing the broker that reconnects when a fault has closed
/// it. Every call reports failure instead of failing the test, so it can be used while the
/// broker is down.
class Probe {
 public:
  Probe(TestLoop& loop, std::string url);
  ~Probe();

  struct Depth {
    bool ok = false;       ///< the broker answered
    bool missing = false;  ///< the queue does not exist (ok is true, messages 0)
    uint32_t messages = 0;
    uint32_t consumers = 0;
  };
  Depth depth(const std::string& queue);
  /// Every message of `queue` (get and ack), in order; false when the broker failed meanwhile
  /// (what was taken is in `out`) and true for a missing queue.
  bool drain(const std::string& queue, std::vector<client::GetResult>& out);
  client::Error apply(const topology::Plan& plan);
  /// Deletes the objects of `plan` (a delete plan), messages and all.
  client::Error remove(const topology::Plan& plan);
  client::Error declare_queue(const std::string& name, const amqp::FieldTable& arguments);
  client::Error bind_queue(const std::string& queue, const std::string& exchange,
                           const std::string& routing_key);
  client::Error unbind_queue(const std::string& queue, const std::string& exchange,
                             const std::string& routing_key);
  client::Error delete_queue(const std::string& name, bool if_empty);
  /// Publishes persistent messages with mandatory and confirms, pipelined; returns how many were
  /// confirmed and routed.
  /// `header_frame_size[i]`, when given and not 0, pads message i's content header frame to that
  /// size with a header.
  size_t publish(const std::string& exchange, const std::string& routing_key,
                 const std::vector<std::pair<std::string, std::string>>& id_and_body,
                 const std::vector<size_t>& header_frame_size = {});
  void close();

 private:
  std::shared_ptr<client::Connection> connection();
  std::shared_ptr<client::Channel> channel(client::Error& error);

  TestLoop& loop_;
  std::string url_;
  std::shared_ptr<client::Connection> connection_;
};

/// Observes a resource alarm (memory, disk) as the broker's clients meet it. RabbitMQ blocks a
/// connection, and tells it so (connection.blocked), when it publishes while an alarm is in place;
/// an alarm closes no connection and leaves connections that do not publish alone. The witness is
/// a connection of its own that publishes a message routed nowhere every 100 ms until the broker
/// blocks it.
class AlarmWitness {
 public:
  AlarmWitness(TestLoop& loop, const std::string& url);
  /// Closes the connection (the broker reads its close only once the alarm is over).
  ~AlarmWitness();
  AlarmWitness(const AlarmWitness&) = delete;
  AlarmWitness& operator=(const AlarmWitness&) = delete;

  /// When the broker blocked the witness, waiting up to `timeout`; nullopt when it did not.
  std::optional<Clock::time_point> wait_blocked(std::chrono::milliseconds timeout = 60s);
  /// When the broker unblocked it again, waiting up to `timeout`; nullopt when it did not.
  std::optional<Clock::time_point> wait_unblocked(std::chrono::milliseconds timeout = 60s);
  /// Whether the broker blocks it now.
  bool blocked() const;

 private:
  struct State {
    bool blocked = false;
    std::optional<Clock::time_point> blocked_at;
    std::optional<Clock::time_point> unblocked_at;
  };
  TestLoop& loop_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::shared_ptr<client::Connection> connection_;
  std::shared_ptr<client::Channel> channel_;
};

// ---- consumers ---------------------------------------------------------------------------------

/// A retry consumer in this process, on the test loop, whose handler runs the lane's scripts on
/// worker threads and records every outcome in `ledger`.
class LaneConsumer {
 public:
  LaneConsumer(TestLoop& loop, Lane& lane, const std::string& url, Ledger& ledger,
               Gate* gate = nullptr, bool outage = false);
  ~LaneConsumer();
  /// Starts it; returns at once (it connects and declares on the loop).
  void start();
  bool ready() const { return *ready_; }
  /// Graceful stop; waits until it has stopped.
  void stop();
  const consumer::Consumer& get() const { return *consumer_; }
  bool idle() const { return consumer_->is_consuming() && consumer_->in_flight() == 0; }
  /// When it first stopped consuming after it was ready (a fault seen), if it has.
  std::optional<Clock::time_point> lost_at() const { return watch_->lost_at; }
  /// How many times it stopped consuming after it was ready, and when it last did.
  int losses() const { return watch_->losses; }
  std::optional<Clock::time_point> last_lost_at() const { return watch_->last_lost_at; }
  /// When it last consumed again after a loss, if it has.
  std::optional<Clock::time_point> last_resumed_at() const { return watch_->last_resumed_at; }

 private:
  /// Checks every 2 ms whether the consumer still consumes; owned by the loop once closed.
  struct Watch {
    uv_timer_t timer{};
    const consumer::Consumer* consumer = nullptr;
    std::shared_ptr<bool> ready;
    bool consuming = false;
    int losses = 0;
    std::optional<Clock::time_point> lost_at;
    std::optional<Clock::time_point> last_lost_at;
    std::optional<Clock::time_point> last_resumed_at;
  };
  TestLoop& loop_;
  std::shared_ptr<consumer::Consumer> consumer_;
  Watch* watch_ = new Watch;
  std::shared_ptr<bool> ready_ = std::make_shared<bool>(false);
  std::shared_ptr<bool> stopped_ = std::make_shared<bool>(false);
  bool started_ = false;
};

/// examples/demo_consumer for a lane.
std::unique_ptr<ChildProcess> start_demo_consumer(const Lane& lane, const std::string& url);

// ---- the run -----------------------------------------------------------------------------------

/// Creates the lanes' objects, then publishes every lane's messages (all confirmed and routed).
void set_up(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes);

/// Whether a lane's loop is quiet: its input and wait queues are empty (a deleted wait queue
/// counts as empty), `idle` holds, and the outcomes the script predicts are all in (every
/// predicted ack seen, at least the predicted number parked). When a fault has lost messages the
/// last condition never holds: then the loop counts as quiet once nothing has changed for
/// `stable` (longer where the broker is known to hold messages back for a while), and the
/// classification shows what is missing.
struct QuietCheck {
  Lane* lane;
  std::function<bool()> idle;
  std::function<std::multiset<std::string>()> acks;
  /// The broker may drop some of this lane's messages (a classic lane under classic_may_lose):
  /// once its queues are empty and nothing moves, it counts as settled, and report() names the
  /// loss.
  bool may_lose = false;
};
bool wait_quiet(TestLoop& loop, Probe& probe, const std::vector<QuietCheck>& checks,
                std::chrono::milliseconds timeout = 120s, std::chrono::milliseconds stable = 8s);

/// The counts of one lane's run.
struct Tally {
  size_t published = 0;
  size_t acked = 0;       ///< ids acked (and nowhere else)
  size_t parked = 0;      ///< ids in parking (and nowhere else)
  size_t queued = 0;      ///< ids still in the input queue
  size_t lost = 0;        ///< predicted acked or parked, and neither acked nor in any queue
  size_t duplicated = 0;  ///< extra copies: acks or parked copies beyond the first
  size_t unexpected = 0;  ///< in another place than predicted, or an id nobody published
  std::vector<std::string> problems;    ///< one line per lost or unexpected id
  std::vector<std::string> duplicates;  ///< one line per duplicated id
};

/// Drains the lane's input, wait and parking queues and classifies every id against
/// `lane.expected`, with `acks` as the evidence of acks.
Tally classify(Probe& probe, const Lane& lane, const std::multiset<std::string>& acks);

/// Prints a note under the table (and appends it to $RETRYLOOP_FAULT_REPORT when set).
void note(const std::string& text);

/// Prints one table row (and appends it to $RETRYLOOP_FAULT_REPORT when set), then checks the
/// run: 0 lost, 0 unexpected, and at most `allowed_duplicates` duplicates (the at-least-once
/// window of this fault). With `classic_may_lose`, a classic lane's losses are reported, not
/// checked: its queues dead-letter at most once, and a broker that stops while a retry moves
/// between them may drop it (docs/topology.md, "Safety rules").
void report(const std::string& fault, const Lane& lane, const Tally& tally, double seconds,
            size_t allowed_duplicates, bool classic_may_lose = false);

/// An outage: consumers whose handler fails every message that is not permanent or poison run
/// until every lane's messages are all parked; then they stop.
void park_everything(TestLoop& loop, Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes);

/// Consumers drain the lanes with their scripts running as written (after a replay), until the
/// loops are quiet; then every lane is classified and reported (at most `allowed_duplicates`
/// duplicates each), and its objects deleted.
void drain_and_report(TestLoop& loop, Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes,
                      const std::string& fault, Clock::time_point started,
                      size_t allowed_duplicates);

/// Stops each lane's demo consumer process gracefully (SIGTERM; each must exit 0) and adds what
/// it printed to the lane's ledger (`ledgers[i]` may already hold an earlier process's acks); then
/// every lane is classified and reported (at most `allowed_duplicates` duplicates each), and its
/// objects deleted.
void finish_demo_consumers(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes,
                           const std::vector<std::unique_ptr<ChildProcess>>& consumers,
                           std::vector<Ledger>& ledgers, const std::string& fault,
                           Clock::time_point started, size_t allowed_duplicates);

/// Deletes a lane's objects so that later faults restart a lighter broker.
void tear_down(Probe& probe, const std::vector<std::unique_ptr<Lane>>& lanes);

double seconds_since(Clock::time_point start);

/// Fails the test when a command that injects or ends a fault did not succeed.
void expect_ok(int exit_code, const std::string& output);

/// Brings the test broker back however a test that stops or kills it ends, so that one failure
/// does not fail every test after it.
struct BrokerBackUp {
  ~BrokerBackUp();
};

/// A run with one in-process consumer per lane, against test::broker_url().
struct InProcessRun {
  struct Options {
    bool gated = false;
    /// Changes each lane (its scripts) before anything is published.
    std::function<void(Lane&)> adjust;
    std::chrono::milliseconds delay = retry_delay;
    std::vector<topology::QueueType> types = {topology::QueueType::classic,
                                              topology::QueueType::quorum};
    /// Also republish lanes with delay levels (Lane).
    bool delay_levels = false;
    /// The fault stops the broker while retries move between classic queues (report).
    bool classic_may_lose = false;
  };
  explicit InProcessRun(const std::string& fault, bool gated = false,
                        const std::function<void(Lane&)>& adjust = {});
  InProcessRun(const std::string& fault, Options options);
  ~InProcessRun();

  /// Starts the consumers (through `url`) and waits until each consumes.
  void start(const std::string& url);
  /// Waits until every lane's handler has been called for `fraction` of its messages.
  void wait_flowing(double fraction);
  /// Holds the stream (a gated run): closes every gate, so that handlers that have not started
  /// wait there until release(). A test holds it before the command that makes its fault and
  /// releases it once it has observed the fault in place: starting rabbitmqctl or scripts/broker
  /// can take longer than the whole stream on a loaded machine, and the fault must still land
  /// mid-stream.
  void hold();
  /// hold(), then waits until every handler that had passed its gate has returned and its
  /// outcome is settled (acked, rejected, its copy confirmed): from then on nothing of the lanes
  /// moves, and no copy is on its way, until release().
  void hold_settled();
  void release();
  /// Checks that the fault hit every lane mid-stream: some of its messages were not yet acked
  /// when the fault was observed. `observed_at`: that moment, for a fault that costs no consumer
  /// its connection (an alarm the broker reported, a frozen link). Without it, each lane counts
  /// from when its consumer was seen to lose its connection, waited for (up to 60 s; the test
  /// fails if one never does), not from when the command that made the fault returned.
  void check_mid_stream(std::optional<Clock::time_point> observed_at = std::nullopt);
  bool wait_quiet(std::chrono::milliseconds timeout = 120s, std::chrono::milliseconds stable = 8s);
  /// After a broker restart: waits until every consumer consumes again and the loops are quiet.
  /// When RabbitMQ has restarted a quorum queue without a leader (a broker bug), it gets an
  /// election by hand, as an operator would do, and a note under the table says so.
  bool wait_quiet_after_restart(const std::string& fault);
  /// Stops the consumers, classifies and reports every lane. Duplicates are allowed up to the
  /// prefetch once per session the consumer lost (none when it lost none), plus `extra[i]` for
  /// lane i when given.
  void finish(const std::string& fault, const std::vector<size_t>& extra = {});

  TestLoop loop;
  Probe probe{loop, test::broker_url()};
  std::vector<std::unique_ptr<Lane>> lanes;
  bool classic_may_lose = false;
  std::vector<std::unique_ptr<Ledger>> ledgers;
  std::vector<std::unique_ptr<Gate>> gates;
  std::vector<std::unique_ptr<LaneConsumer>> consumers;
  Clock::time_point started = Clock::now();
};

}  // namespace retryloop::test::fault
