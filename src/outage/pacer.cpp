#include "retryloop/outage/pacer.hpp"

#include <algorithm>

namespace retryloop::outage {
namespace {

/// The share of the accepted rate that the pace keeps after a 429.
constexpr double kept_after_overload = 0.95;
/// The growth of the first interval without a 429; it doubles each further interval, up to the
/// fastest. Instances that share a dependency each grow on their own: a faster growth makes their
/// sum overshoot it by more, and every 429 costs a call.
constexpr double first_growth = 0.025;
constexpr double fastest_growth = 0.1;
constexpr double slowest_rate = 1.0;
/// The bucket holds this much of a second's calls: a burst small enough for a limiter that
/// counts per second.
constexpr double burst_seconds = 0.02;
/// What was accepted is counted per slice of this many milliseconds, ten slices a second.
constexpr int64_t slice_ms = 100;
/// Intervals in a row in which the pace held nothing back, after which it is lifted.
constexpr int idle_intervals_to_lift = 2;

}  // namespace

Pacer::Pacer(std::chrono::milliseconds interval)
    : interval_(std::max(interval, std::chrono::milliseconds(1))) {}

bool Pacer::try_take(std::chrono::milliseconds now) {
  if (!active()) return true;
  if (now < quiet_until_) {
    held_back_ = true;
    return false;
  }
  refill(now);
  if (tokens_ < 1) {
    held_back_ = true;
    return false;
  }
  tokens_ -= 1;
  return true;
}

void Pacer::accepted(std::chrono::milliseconds now) {
  if (!measuring_since_) measuring_since_ = now;
  const int64_t index = now.count() / slice_ms;
  Slice& slice = accepted_[size_t(index % int64_t(accepted_.size()))];
  if (slice.index != index) slice = Slice{index, 0};
  ++slice.count;
}

bool Pacer::overloaded(std::chrono::milliseconds now, std::chrono::milliseconds quiet) {
  const bool quieter = quiet.count() > 0 && now + quiet > quiet_until_;
  if (quieter) quiet_until_ = now + quiet;
  bool changed = false;
  if (!active() || now >= congestion_until_) {
    congestion_until_ = now + interval_ / 4;
    rate_ = std::max(slowest_rate, kept_after_overload * accepted_per_second(now));
    tokens_ = 0;
    growth_ = first_growth;
    next_growth_ = std::max(now, quiet_until_) + interval_;
    held_back_ = false;
    idle_intervals_ = 0;
    changed = true;
  }
  if (changed || quieter) refilled_at_ = std::max(now, quiet_until_);
  // Asked to wait: one call at the quiet's end, then the pace.
  if (quieter) tokens_ = 1;
  return changed;
}

bool Pacer::tick(std::chrono::milliseconds now) {
  if (!active() || now < next_growth_) return false;
  refill(now);
  idle_intervals_ = held_back_ ? 0 : idle_intervals_ + 1;
  if (idle_intervals_ >= idle_intervals_to_lift) {
    reset();
    return true;
  }
  rate_ += std::max(slowest_rate, rate_ * growth_);
  growth_ = std::min(growth_ * 2, fastest_growth);
  held_back_ = false;
  next_growth_ = now + interval_;
  return false;
}

std::optional<std::chrono::milliseconds> Pacer::due() const {
  if (!active()) return std::nullopt;
  return next_growth_;
}

void Pacer::reset() {
  rate_ = 0;
  quiet_until_ = std::chrono::milliseconds(0);
  tokens_ = 0;
  growth_ = 0;
  held_back_ = false;
  idle_intervals_ = 0;
  accepted_.fill(Slice{});
  measuring_since_.reset();
}

void Pacer::refill(std::chrono::milliseconds now) {
  if (now <= refilled_at_) return;
  const double capacity = std::max(1.0, rate_ * burst_seconds);
  tokens_ = std::min(capacity, tokens_ + rate_ * double((now - refilled_at_).count()) / 1000.0);
  refilled_at_ = now;
}

double Pacer::accepted_per_second(std::chrono::milliseconds now) {
  if (!measuring_since_) return 0;
  const int64_t current = now.count() / slice_ms;
  const int64_t oldest = current - int64_t(accepted_.size()) + 1;
  uint64_t count = 0;
  for (const Slice& slice : accepted_)
    if (slice.index >= oldest && slice.index <= current) count += slice.count;
  if (count == 0) return 0;
  // Measured over the slices counted, or since the first accepted call when that is more recent
  // (a ramp that began a moment ago), but never over less than a tenth of a second.
  const auto counted_from =
      std::max(std::chrono::milliseconds(oldest * slice_ms), *measuring_since_);
  const auto span = std::max(now - counted_from, std::chrono::milliseconds(100));
  return double(count) * 1000.0 / double(span.count());
}

}  // namespace retryloop::outage
