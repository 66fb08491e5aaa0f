#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>

namespace retryloop::outage {

/// A pace for the calls to a dependency that answered that it is overloaded (a 429): a token
/// bucket whose rate is learnt from what the dependency accepted, as the adaptive retry modes of
/// the cloud SDKs do. A concurrency limit alone cannot hold a rate between two of its steps (a
/// call of 12 ms at 3 at once makes 250 calls a second, at 4 it makes 333); a pace can.
///
/// How it moves:
/// - inactive until the first overloaded(): calls are not paced at all;
/// - overloaded(): the rate becomes 95 % of the calls the dependency accepted over the last
///   second, and the bucket empties. Further 429s within a quarter of the interval are the same
///   congestion and change nothing;
/// - every interval without a 429 the rate grows: by 2.5 % after the first, then 5 %, then 10 %
///   per interval (at least one call a second), so that it stays near the rate that drew the 429
///   and still finds a dependency that has grown;
/// - an interval in which the pace held nothing back, twice in a row: the pace is lifted.
///
/// Like the breaker it has no clock: every call takes `now`, a monotonic clock's milliseconds.
class Pacer {
 public:
  /// `interval`: the ramp's interval (Ramp::interval), at which the rate grows.
  explicit Pacer(std::chrono::milliseconds interval);

  bool active() const { return rate_ > 0; }
  /// Calls per second, or 0 when the calls are not paced.
  double rate() const { return rate_; }

  /// Whether a call may start now: always when inactive; when paced, takes a token if one is there.
  bool try_take(std::chrono::milliseconds now);
  /// A call ended with an answer that was not a 429: the dependency accepted it.
  void accepted(std::chrono::milliseconds now);
  /// A call ended with a 429. True when the rate changed (the first 429 of a congestion).
  /// `quiet`: the answer's Retry-After; no call is let through before `now + quiet` (a later 429
  /// may push that further, never nearer), and the pace starts from there.
  bool overloaded(std::chrono::milliseconds now,
                  std::chrono::milliseconds quiet = std::chrono::milliseconds(0));
  /// Time has passed: the rate grows at each interval, and the pace may be lifted. True when the
  /// pace was lifted.
  bool tick(std::chrono::milliseconds now);
  /// When tick() has something to do next; nullopt when inactive.
  std::optional<std::chrono::milliseconds> due() const;
  /// Forgets the rate and what was accepted: the dependency went down, or a ramp starts afresh.
  void reset();

 private:
  void refill(std::chrono::milliseconds now);
  double accepted_per_second(std::chrono::milliseconds now);

  std::chrono::milliseconds interval_;
  /// Calls accepted per tenth of a second, over the last second: constant work per call, as
  /// every call of a consumer passes here, paced or not.
  struct Slice {
    int64_t index = -1;
    uint32_t count = 0;
  };
  std::array<Slice, 10> accepted_{};
  std::optional<std::chrono::milliseconds> measuring_since_;
  double rate_ = 0;
  double tokens_ = 0;
  std::chrono::milliseconds refilled_at_{0};
  std::chrono::milliseconds next_growth_{0};
  std::chrono::milliseconds congestion_until_{0};
  /// No call before this: the last Retry-After of a 429.
  std::chrono::milliseconds quiet_until_{0};
  /// The growth of the next interval without a 429, as a fraction of the rate.
  double growth_ = 0;
  /// Whether try_take refused a call since the last growth, and how many intervals in a row did
  /// not.
  bool held_back_ = false;
  int idle_intervals_ = 0;
};

}  // namespace retryloop::outage
