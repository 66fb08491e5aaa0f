#include "retryloop/outage/sliding_window.hpp"

#include <algorithm>

namespace retryloop::outage {

SlidingWindow::SlidingWindow(std::chrono::milliseconds window, int buckets)
    : window_(std::max<std::chrono::milliseconds>(window, std::chrono::milliseconds(1))) {
  const int64_t count = std::clamp<int64_t>(buckets, 1, window_.count());
  slice_ms_ = (window_.count() + count - 1) / count;
  buckets_.resize(static_cast<size_t>(count));
}

int64_t SlidingWindow::slice_of(std::chrono::milliseconds now) {
  latest_ms_ = std::max(latest_ms_, static_cast<int64_t>(now.count()));
  return latest_ms_ / slice_ms_;
}

void SlidingWindow::expire(int64_t current) {
  const auto count = static_cast<int64_t>(buckets_.size());
  for (Bucket& bucket : buckets_) {
    if (bucket.slice >= 0 && bucket.slice <= current - count) {
      totals_.results -= bucket.results;
      totals_.failures -= bucket.failures;
      bucket = Bucket{};
    }
  }
}

void SlidingWindow::record(std::chrono::milliseconds now, bool failure) {
  const int64_t current = slice_of(now);
  expire(current);
  Bucket& bucket = buckets_[static_cast<size_t>(current % static_cast<int64_t>(buckets_.size()))];
  bucket.slice = current;
  ++bucket.results;
  ++totals_.results;
  if (failure) {
    ++bucket.failures;
    ++totals_.failures;
  }
}

SlidingWindow::Totals SlidingWindow::totals(std::chrono::milliseconds now) {
  expire(slice_of(now));
  return totals_;
}

void SlidingWindow::clear() {
  std::fill(buckets_.begin(), buckets_.end(), Bucket{});
  totals_ = Totals{};
}

}  // namespace retryloop::outage
