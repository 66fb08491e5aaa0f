#include "retryloop/outage/breaker.hpp"

#include <algorithm>
#include <utility>

namespace retryloop::outage {
namespace {

/// The ramp's floor: double the probe's one call.
constexpr int ramp_floor = 2;

/// The ramp's first limit: an eighth of the concurrency (as TCP starts with a window of a few
/// segments, not one), and never less than the floor nor more than the concurrency.
int ramp_start(int concurrency) {
  return std::min(std::max(concurrency / 8, ramp_floor), concurrency);
}

bool counts_as_open(State state) {
  return state == State::open || state == State::probing;
}

}  // namespace

Call::Call(Call&& other) noexcept
    : breaker_(std::move(other.breaker_)), generation_(other.generation_), probe_(other.probe_) {
  other.breaker_.reset();
}

Call& Call::operator=(Call&& other) noexcept {
  if (this != &other) {
    end();
    breaker_ = std::move(other.breaker_);
    other.breaker_.reset();
    generation_ = other.generation_;
    probe_ = other.probe_;
  }
  return *this;
}

Call::~Call() {
  end();
}

void Call::end() {
  const std::shared_ptr<std::atomic<Breaker*>> anchor = breaker_.lock();
  breaker_.reset();
  // A call dropped after its breaker (with the worker job that held it) finds it null.
  Breaker* breaker = anchor ? anchor->load() : nullptr;
  if (breaker != nullptr) breaker->dropped(*this);
}

Breaker::Breaker(Settings settings, int concurrency, EventHandler on_event)
    : settings_(std::move(settings)),
      concurrency_(std::max(concurrency, 1)),
      on_event_(std::move(on_event)),
      window_(settings_.failure_rate ? settings_.failure_rate->window : std::chrono::seconds(1)),
      pacer_(settings_.ramp.interval),
      self_(std::make_shared<std::atomic<Breaker*>>(this)) {}

Breaker::~Breaker() {
  self_->store(nullptr);
}

int Breaker::limit() const {
  switch (state_) {
    case State::closed:
      return concurrency_;
    case State::ramping:
      return ramp_limit_;
    case State::probing:
      return 1;
    case State::open:
    case State::paused:
      return 0;
  }
  return 0;
}

std::optional<Call> Breaker::try_start(int running, std::chrono::milliseconds now) {
  tick(now);
  switch (state_) {
    case State::closed:
    case State::ramping:
      if (running >= limit() || !pacer_.try_take(now)) return std::nullopt;
      return Call(self_, generation_, false);
    case State::probing:
      if (probe_running_) return std::nullopt;
      probe_running_ = true;
      ++stats_.probes;
      return Call(self_, generation_, true);
    case State::open:
    case State::paused:
      return std::nullopt;
  }
  return std::nullopt;
}

void Breaker::finished(Call& call, Verdict verdict, std::chrono::milliseconds now,
                       std::chrono::milliseconds quiet) {
  if (call.ended()) return;
  call.breaker_.reset();
  tick(now);
  if (call.generation_ < phase_generation_) return;
  if (state_ == State::probing) {
    if (!call.probe_ || call.generation_ != generation_) return;
    probe_running_ = false;
    if (verdict == Verdict::success || verdict == Verdict::overloaded) {
      start_ramp(Reason::probe_succeeded, now);
      // Up, but asked to wait: the ramp's calls keep to the dependency's Retry-After.
      if (verdict == Verdict::overloaded && quiet.count() > 0) pacer_.overloaded(now, quiet);
    } else if (counts_as_failure(verdict)) {
      open_until_probe(Reason::probe_failed, now + settings_.probe_interval, now);
    }
    // Anything else said nothing of the dependency: the next call is the probe.
    return;
  }
  if (state_ != State::closed && state_ != State::ramping) return;
  if (verdict == Verdict::overloaded) {
    // Told to slow down, not that it is down: the calls are paced from now on. The limit stays.
    if (pacer_.overloaded(now, quiet)) move(state_, Reason::overloaded, now);
    return;
  }
  if (verdict != Verdict::unavailable) pacer_.accepted(now);
  const State before = state_;
  count(verdict, now);
  if (state_ == State::ramping && before == State::ramping && counts_as_failure(verdict) &&
      call.generation_ == generation_) {
    step_back(now);
  }
}

void Breaker::dropped(const Call& call) {
  // As finished() with not_counted, without the time: nothing but the probe's slot changes.
  if (state_ == State::probing && call.probe_ && call.generation_ == generation_) {
    probe_running_ = false;
  }
}

std::optional<std::chrono::milliseconds> Breaker::wake_at() const {
  std::optional<std::chrono::milliseconds> at;
  if ((state_ == State::open && may_probe_) || state_ == State::ramping) at = due_;
  if (const auto pace = pacer_.due()) at = at ? std::min(*at, *pace) : *pace;
  return at;
}

void Breaker::tick(std::chrono::milliseconds now) {
  if (pacer_.tick(now)) move(state_, Reason::pace_lifted, now);
  if (now < due_) return;
  if (state_ == State::open && may_probe_) {
    probe_running_ = false;
    move(State::probing, Reason::probe_due, now);
  } else if (state_ == State::ramping) {
    const int grown = backed_off_ ? ramp_limit_ + std::max(1, ramp_limit_ / 4) : ramp_limit_ * 2;
    ramp_limit_ = std::min(grown, concurrency_);
    due_ = now + settings_.ramp.interval;
    move(ramp_limit_ >= concurrency_ ? State::closed : State::ramping, Reason::ramp_up, now);
  }
}

void Breaker::pause(std::chrono::milliseconds now) {
  if (state_ == State::paused) return;
  ++generation_;
  probe_running_ = false;
  pacer_.reset();
  move(State::paused, Reason::paused, now);
}

void Breaker::resume(std::chrono::milliseconds now) {
  if (state_ != State::paused) return;
  probe_running_ = false;
  if (may_probe_) {
    move(State::probing, Reason::resumed, now);
  } else {
    due_ = now;
    move(State::open, Reason::resumed, now);
  }
}

void Breaker::set_may_probe(bool may_probe, std::chrono::milliseconds now) {
  if (may_probe_ == may_probe) return;
  may_probe_ = may_probe;
  if (!may_probe && state_ == State::probing) {
    open_until_probe(Reason::prober_elsewhere, now + settings_.probe_interval, now);
  }
}

void Breaker::opened_elsewhere(std::chrono::milliseconds now) {
  if (state_ == State::open || state_ == State::paused) return;
  unavailable_in_a_row_ = 0;
  window_.clear();
  open_until_probe(Reason::opened_elsewhere, now + settings_.probe_interval, now);
}

void Breaker::recovered_elsewhere(std::chrono::milliseconds now) {
  if (state_ != State::open && state_ != State::probing) return;
  ++generation_;  // a probe of its own still running says nothing any more
  start_ramp(Reason::recovered_elsewhere, now);
}

Stats Breaker::stats(std::chrono::milliseconds now) const {
  Stats stats = stats_;
  if (open_since_ && now > *open_since_) stats.time_open += now - *open_since_;
  stats.pace = pacer_.rate();
  return stats;
}

bool Breaker::counts_as_failure(Verdict verdict) const {
  return verdict == Verdict::unavailable ||
         (verdict == Verdict::failure && settings_.failure_rate.has_value());
}

void Breaker::count(Verdict verdict, std::chrono::milliseconds now) {
  if (verdict == Verdict::not_counted) return;
  if (verdict == Verdict::failure && !settings_.failure_rate) return;
  if (verdict == Verdict::success) {
    unavailable_in_a_row_ = 0;
  } else if (verdict == Verdict::unavailable) {
    ++unavailable_in_a_row_;
  }
  if (settings_.failure_rate) window_.record(now, verdict != Verdict::success);
  if (verdict == Verdict::unavailable &&
      unavailable_in_a_row_ >= settings_.consecutive_unavailable) {
    trip(Reason::consecutive_unavailable, now);
    return;
  }
  if (verdict != Verdict::success && settings_.failure_rate) {
    const FailureRate& rate = *settings_.failure_rate;
    const SlidingWindow::Totals totals = window_.totals(now);
    if (totals.results >= static_cast<uint64_t>(rate.minimum_calls) &&
        static_cast<double>(totals.failures) >=
            rate.threshold * static_cast<double>(totals.results)) {
      trip(Reason::failure_rate, now);
    }
  }
}

void Breaker::trip(Reason reason, std::chrono::milliseconds now) {
  ++stats_.trips;
  unavailable_in_a_row_ = 0;
  window_.clear();
  open_until_probe(reason, now + settings_.probe_interval, now);
}

void Breaker::open_until_probe(Reason reason, std::chrono::milliseconds due,
                               std::chrono::milliseconds now) {
  ++generation_;
  probe_running_ = false;
  pacer_.reset();  // what it learnt of an overloaded dependency is stale once it is down
  due_ = due;
  move(State::open, reason, now);
}

void Breaker::start_ramp(Reason reason, std::chrono::milliseconds now) {
  probe_running_ = false;
  phase_generation_ = generation_;
  unavailable_in_a_row_ = 0;
  window_.clear();
  ramp_limit_ = ramp_start(concurrency_);
  backed_off_ = false;
  due_ = now + settings_.ramp.interval;
  move(ramp_limit_ >= concurrency_ ? State::closed : State::ramping, reason, now);
}

void Breaker::step_back(std::chrono::milliseconds now) {
  // Overloaded, not down: the limit halves, not below the ramp's start, and grows by a quarter
  // per interval from now on. Only the trip rules open the breaker again.
  backed_off_ = true;
  ++generation_;
  due_ = now + settings_.ramp.interval;
  const int floor = std::min(ramp_floor, concurrency_);
  if (ramp_limit_ <= floor) return;  // already at the floor: the interval starts again
  ramp_limit_ = std::max(ramp_limit_ / 2, floor);
  move(State::ramping, Reason::step_back, now);
}

void Breaker::move(State to, Reason reason, std::chrono::milliseconds now) {
  const State from = state_;
  if (counts_as_open(from) && !counts_as_open(to) && open_since_) {
    if (now > *open_since_) stats_.time_open += now - *open_since_;
    open_since_.reset();
  } else if (!counts_as_open(from) && counts_as_open(to)) {
    open_since_ = now;
  }
  state_ = to;
  if (on_event_) on_event_(Event{from, to, reason, limit(), now, pacer_.rate()});
}

bool holds_unavailable(State state, int& in_a_row, int consecutive_unavailable) {
  if (state != State::closed) {
    in_a_row = 0;
    return true;
  }
  return ++in_a_row < consecutive_unavailable;
}

const char* to_string(State state) {
  switch (state) {
    case State::closed:
      return "closed";
    case State::open:
      return "open";
    case State::probing:
      return "probing";
    case State::ramping:
      return "ramping";
    case State::paused:
      return "paused";
  }
  return "unknown";
}

const char* to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::success:
      return "success";
    case Verdict::unavailable:
      return "unavailable";
    case Verdict::failure:
      return "failure";
    case Verdict::not_counted:
      return "not_counted";
    case Verdict::overloaded:
      return "overloaded";
  }
  return "unknown";
}

const char* to_string(Reason reason) {
  switch (reason) {
    case Reason::consecutive_unavailable:
      return "consecutive_unavailable";
    case Reason::failure_rate:
      return "failure_rate";
    case Reason::probe_due:
      return "probe_due";
    case Reason::probe_failed:
      return "probe_failed";
    case Reason::probe_succeeded:
      return "probe_succeeded";
    case Reason::ramp_up:
      return "ramp_up";
    case Reason::step_back:
      return "step_back";
    case Reason::overloaded:
      return "overloaded";
    case Reason::pace_lifted:
      return "pace_lifted";
    case Reason::paused:
      return "paused";
    case Reason::resumed:
      return "resumed";
    case Reason::opened_elsewhere:
      return "opened_elsewhere";
    case Reason::recovered_elsewhere:
      return "recovered_elsewhere";
    case Reason::prober_elsewhere:
      return "prober_elsewhere";
  }
  return "unknown";
}

}  // namespace retryloop::outage
