#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace retryloop::outage {

/// Counts results over the last `window` of time, in `buckets` equal slices: a result recorded at
/// time t is counted until the slice holding t is more than `window` old, so the window slides
/// one slice at a time. It knows nothing of calls, outcomes or threads: a time and a flag go in,
/// two counts come out. Times are a monotonic clock's milliseconds, passed in by the caller;
/// they must not go backwards (an earlier time is taken as the latest one seen).
class SlidingWindow {
 public:
  struct Totals {
    uint64_t results = 0;
    uint64_t failures = 0;
  };

  /// `window` of at least 1 ms; `buckets` from 1 to `window` in milliseconds (clamped so).
  explicit SlidingWindow(std::chrono::milliseconds window, int buckets = 10);

  void record(std::chrono::milliseconds now, bool failure);
  /// The results recorded in the window that ends at `now`.
  Totals totals(std::chrono::milliseconds now);
  /// Forgets every result.
  void clear();

  std::chrono::milliseconds window() const { return window_; }

 private:
  struct Bucket {
    int64_t slice = -1;
    uint64_t results = 0;
    uint64_t failures = 0;
  };

  /// Empties the buckets whose slices have left the window ending in slice `current`.
  void expire(int64_t current);
  int64_t slice_of(std::chrono::milliseconds now);

  std::chrono::milliseconds window_;
  int64_t slice_ms_;
  std::vector<Bucket> buckets_;
  int64_t latest_ms_ = 0;
  Totals totals_;
};

}  // namespace retryloop::outage
