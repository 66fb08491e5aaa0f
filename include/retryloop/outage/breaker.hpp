#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "retryloop/outage/pacer.hpp"
#include "retryloop/outage/settings.hpp"
#include "retryloop/outage/sliding_window.hpp"

namespace retryloop::outage {

/// Where a service's breaker stands (docs/outage.md, "The state machine").
enum class State {
  /// Deliveries run at the consumer's full concurrency; outcomes are counted toward a trip.
  closed,
  /// The dependency is down: no delivery starts until the next probe is due.
  open,
  /// One call may run (a delivery or the service's probe); its outcome decides.
  probing,
  /// The probe succeeded: the concurrency limit starts at an eighth of the concurrency (at least
  /// 2) and doubles every ramp interval without a failure; after a failure (a step back) it grows
  /// by a quarter per interval.
  ramping,
  /// An operator paused the service: nothing starts, whatever the outcomes, until resume().
  paused,
};

/// What a finished call says about the dependency: the breaker's reading of an outcome
/// (retry::breaker_verdict maps the handler's outcomes onto it).
enum class Verdict {
  /// The dependency answered: ack, drop.
  success,
  /// The handler said the dependency is down: Outcome::unavailable, UnavailableError.
  unavailable,
  /// A failure the handler did not classify (retry): counted only by the failure-rate trip,
  /// when the settings have one.
  failure,
  /// The message's own fault (permanent, poison): says nothing of the dependency.
  not_counted,
  /// The dependency answered that it is overloaded (a 429): it is up, so this never trips the
  /// breaker nor counts toward a trip, but the calls are paced from then on (outage::Pacer), in
  /// whatever state. A probe that gets it succeeded.
  overloaded,
};

/// Why the breaker moved.
enum class Reason {
  consecutive_unavailable,  ///< closed or ramping -> open: K unavailable in a row
  failure_rate,             ///< closed or ramping -> open: the window's failure rate
  probe_due,                ///< open -> probing: the probe interval has passed
  probe_failed,             ///< probing -> open
  probe_succeeded,          ///< probing -> ramping (or closed, when the ramp has nothing to do)
  ramp_up,                  ///< ramping -> ramping with a doubled limit, or -> closed at the top
  step_back,                ///< ramping -> ramping with a halved limit (not below 2)
  overloaded,               ///< closed or ramping, the same state: a 429 set a lower pace
  pace_lifted,              ///< closed or ramping, the same state: the pace held nothing back
  paused,                   ///< any state -> paused (pause())
  resumed,                  ///< paused -> probing, or open with a probe due at once (resume())
  opened_elsewhere,         ///< closed, ramping or probing -> open: another instance tripped
  recovered_elsewhere,      ///< open or probing -> ramping: another instance's probe succeeded
  prober_elsewhere,         ///< probing -> open: this instance may no longer probe
};

/// One change: a move between states, a new concurrency limit within the ramp (from == to ==
/// ramping), or a new pace (from == to). The listener gets one per change, in order, and nothing
/// else; the pace's growth between two 429s is not an event.
struct Event {
  State from = State::closed;
  State to = State::closed;
  Reason reason = Reason::probe_due;
  /// The concurrency limit after the change (0 while open or paused, 1 while probing).
  int limit = 0;
  std::chrono::milliseconds at{0};
  /// The pace after the change, in calls a second; 0 when the calls are not paced.
  double rate = 0;
};

using EventHandler = std::function<void(const Event& event)>;

class Breaker;

/// A call the breaker let start (try_start). Hand it back to Breaker::finished() with what it
/// said; a call dropped without that (a delivery parked before its handler ran, a handler taken
/// back, any exit that forgets it) ends as Verdict::not_counted would, so that a probe never stays
/// running for good. Outcomes of calls started before the breaker last opened, or before the ramp
/// last stepped back, are not taken as news about the dependency a second time.
///
/// Move-only. Drop it on the breaker's thread; dropping it after its breaker is gone does nothing.
class Call {
 public:
  Call() = default;
  Call(Call&& other) noexcept;
  Call& operator=(Call&& other) noexcept;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call();

  /// The breaker's generation when it started.
  uint64_t generation() const { return generation_; }
  /// Whether it is the probe (at most one runs at a time).
  bool probe() const { return probe_; }
  /// Handed back to finished(), or dropped: it says nothing more.
  bool ended() const { return breaker_.expired(); }

 private:
  friend class Breaker;
  Call(std::weak_ptr<std::atomic<Breaker*>> breaker, uint64_t generation, bool probe)
      : breaker_(std::move(breaker)), generation_(generation), probe_(probe) {}
  void end();

  std::weak_ptr<std::atomic<Breaker*>> breaker_;
  uint64_t generation_ = 0;
  bool probe_ = false;
};

/// Counters for the metrics: trips, probes, and time spent open (open and probing); and the pace.
struct Stats {
  uint64_t trips = 0;
  uint64_t probes = 0;
  std::chrono::milliseconds time_open{0};
  /// Calls a second while a 429 paces the calls (Pacer::rate); 0 when they are not paced.
  double pace = 0;
};

/// One service's circuit breaker: a state machine with no clock, no timer, no I/O and no
/// threads. Every call takes `now`, a monotonic clock's milliseconds (such as uv_now), and time
/// passes only through those calls: tests move it by hand.
///
/// How a consumer wires it: before it starts a delivery, try_start(now); a delivery it may not
/// start waits, held unsettled and uncharged (the consumer keeps consuming: its prefetch bounds
/// what it holds). When the handler has answered, finished(call, verdict, now). One timer: arm it
/// for wake_at() after every call, and when it fires call tick(now). The listener hears each
/// change as it happens, from inside the call that caused it, to log a line and to tell the
/// service's other instances (outage::Coordinator).
///
/// Threads: none of its own, and no locking. Call it from one thread, the consumer's loop
/// thread; the listener runs there too and must not call back into the breaker.
class Breaker {
 public:
  /// `concurrency`: the consumer's configured concurrency, what the ramp climbs to (at least 1).
  /// `settings` must pass check().
  Breaker(Settings settings, int concurrency, EventHandler on_event = {});
  Breaker(const Breaker&) = delete;
  Breaker& operator=(const Breaker&) = delete;
  ~Breaker();

  State state() const { return state_; }
  /// How many calls may run at once now: the concurrency when closed, the ramp's current limit
  /// when ramping, 1 when probing, 0 when open or paused.
  int limit() const;
  /// Whether a call may start now, given how many are running; when it may, the call is counted
  /// as started and returned. Open: a due probe turns the breaker to probing first (an event), so
  /// the call returned is the probe. At most one probe runs at a time.
  std::optional<Call> try_start(int running, std::chrono::milliseconds now);
  /// A started call ended with `verdict`; the call has ended after it (a second finished() of the
  /// same call does nothing). `quiet`, for an overloaded verdict: the answer's Retry-After, before
  /// which no further call starts (Pacer::overloaded).
  void finished(Call& call, Verdict verdict, std::chrono::milliseconds now,
                std::chrono::milliseconds quiet = std::chrono::milliseconds(0));
  void finished(Call&& call, Verdict verdict, std::chrono::milliseconds now,
                std::chrono::milliseconds quiet = std::chrono::milliseconds(0)) {
    finished(call, verdict, now, quiet);
  }
  /// The time the consumer's timer should fire next: the next probe when open, the next ramp step
  /// when ramping, the pace's next growth when paced; nullopt when nothing is due by time alone.
  /// While paced, a call held back for want of a token may start at any later time: the
  /// consumer's timer should run at a short period (the consumer's runs every 100 ms).
  std::optional<std::chrono::milliseconds> wake_at() const;
  /// Time has passed: an open breaker whose probe is due turns to probing; a ramp whose interval
  /// has passed without a step back doubles its limit. Harmless when nothing is due.
  void tick(std::chrono::milliseconds now);

  /// An operator's stop: nothing starts until resume(), and outcomes of calls still running are
  /// ignored. Pausing a paused breaker does nothing.
  void pause(std::chrono::milliseconds now);
  /// Ends a pause with a probe (probing): one call first, then the ramp, so that a service paused
  /// during an outage does not flatten its dependency. An instance that may not probe goes to
  /// open instead, its probe due at once, and waits for the prober's verdict. Does nothing when
  /// not paused.
  void resume(std::chrono::milliseconds now);

  /// For a breaker shared by the instances of a service (outage::Coordinator): whether this
  /// instance probes when open (the default). Without it, an open breaker stays open until
  /// recovered_elsewhere() or until it may probe again; a probe under way is given up (a
  /// prober_elsewhere event) and its outcome ignored.
  void set_may_probe(bool may_probe, std::chrono::milliseconds now);
  bool may_probe() const { return may_probe_; }
  /// Another instance tripped: closed, ramping and probing turn to open, as a trip of its own
  /// does, but not counted as one here. Does nothing when open or paused.
  void opened_elsewhere(std::chrono::milliseconds now);
  /// Another instance's probe succeeded: open and probing start the ramp, as a probe of its own
  /// does. Does nothing when closed, ramping or paused.
  void recovered_elsewhere(std::chrono::milliseconds now);

  Stats stats(std::chrono::milliseconds now) const;
  const Settings& settings() const { return settings_; }
  /// The pace a 429 set, in calls a second; 0 when the calls are not paced.
  double pace() const { return pacer_.rate(); }

 private:
  friend class Call;
  /// A call dropped without an outcome: a probe it was no longer runs.
  void dropped(const Call& call);
  void move(State to, Reason reason, std::chrono::milliseconds now);
  void trip(Reason reason, std::chrono::milliseconds now);
  void count(Verdict verdict, std::chrono::milliseconds now);
  void step_back(std::chrono::milliseconds now);
  void start_ramp(Reason reason, std::chrono::milliseconds now);
  void open_until_probe(Reason reason, std::chrono::milliseconds due,
                        std::chrono::milliseconds now);
  bool counts_as_failure(Verdict verdict) const;

  Settings settings_;
  int concurrency_;
  EventHandler on_event_;
  State state_ = State::closed;
  /// Bumped when the breaker opens, pauses and steps back: a call of an older generation is stale.
  uint64_t generation_ = 0;
  /// The generation at which the current closed or ramping phase began.
  uint64_t phase_generation_ = 0;
  int ramp_limit_ = 0;
  /// This ramp has stepped back: it grows by a quarter per interval instead of doubling.
  bool backed_off_ = false;
  bool probe_running_ = false;
  bool may_probe_ = true;
  std::chrono::milliseconds due_{0};
  int unavailable_in_a_row_ = 0;
  SlidingWindow window_;
  Pacer pacer_;
  Stats stats_;
  std::optional<std::chrono::milliseconds> open_since_;
  /// What the calls it hands out point at; emptied when the breaker goes.
  std::shared_ptr<std::atomic<Breaker*>> self_;
};

/// Whether a delivery whose handler said `unavailable` is held to run again, uncharged (true), or
/// charged as a failure of its own (false). `state` is the breaker's after the outcome was counted;
/// `in_a_row` is the delivery's own count of unavailable outcomes in a row while the breaker stayed
/// closed, which this updates. While the breaker is not closed, every unavailable outcome is the
/// dependency's, and the row starts again. While it stays closed the dependency answers other
/// deliveries: this one runs again up to `consecutive_unavailable` times in a row, and the next is
/// its own failure, so that no message loops uncharged for ever.
bool holds_unavailable(State state, int& in_a_row, int consecutive_unavailable);

const char* to_string(State state);
const char* to_string(Verdict verdict);
const char* to_string(Reason reason);

}  // namespace retryloop::outage
