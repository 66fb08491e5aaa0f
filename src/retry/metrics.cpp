#include "retryloop/retry/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace retryloop::retry {

void LatencyHistogram::record(std::chrono::nanoseconds latency) {
  const uint64_t us = latency.count() <= 0 ? 0 : uint64_t(latency.count()) / 1000;
  const auto it = std::lower_bound(bounds_us.begin(), bounds_us.end(), us);
  ++buckets_[size_t(it - bounds_us.begin())];
  ++count_;
  sum_us_ += us;
  max_us_ = std::max(max_us_, us);
}

void LatencyHistogram::add(const LatencyHistogram& other) {
  for (size_t i = 0; i < buckets_.size(); ++i)
    buckets_[i] += other.buckets_[i];
  count_ += other.count_;
  sum_us_ += other.sum_us_;
  max_us_ = std::max(max_us_, other.max_us_);
}

std::chrono::microseconds LatencyHistogram::mean() const {
  return std::chrono::microseconds(count_ == 0 ? 0 : sum_us_ / count_);
}

std::chrono::microseconds LatencyHistogram::quantile(double q) const {
  if (count_ == 0) return std::chrono::microseconds(0);
  const double clamped = std::clamp(q, 0.0, 1.0);
  const uint64_t rank = std::max<uint64_t>(1, uint64_t(std::ceil(clamped * double(count_))));
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::chrono::microseconds(std::min(bounds_us[i], max_us_));
  }
  return std::chrono::microseconds(max_us_);
}

void Metrics::add(const Metrics& other) {
  delivered += other.delivered;
  redelivered += other.redelivered;
  acked += other.acked;
  retried += other.retried;
  for (const auto& [delay, count] : other.retried_by_delay)
    retried_by_delay[delay] += count;
  parked_exhausted += other.parked_exhausted;
  parked_permanent += other.parked_permanent;
  parked_poison += other.parked_poison;
  parked_delivery_limit += other.parked_delivery_limit;
  dropped += other.dropped;
  handler_errors += other.handler_errors;
  publish_failures += other.publish_failures;
  abandoned += other.abandoned;
  reconnects += other.reconnects;
  held_unavailable += other.held_unavailable;
  copies_too_large += other.copies_too_large;
  handler_latency.add(other.handler_latency);
}

std::string Metrics::summary() const {
  auto ms = [](std::chrono::microseconds us) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1fms", double(us.count()) / 1000.0);
    return std::string(text);
  };
  return "delivered=" + std::to_string(delivered) + " redelivered=" + std::to_string(redelivered) +
         " acked=" + std::to_string(acked) + " retried=" + std::to_string(retried) +
         " parked_exhausted=" + std::to_string(parked_exhausted) +
         " parked_permanent=" + std::to_string(parked_permanent) +
         " parked_poison=" + std::to_string(parked_poison) +
         " parked_delivery_limit=" + std::to_string(parked_delivery_limit) +
         " dropped=" + std::to_string(dropped) +
         " handler_errors=" + std::to_string(handler_errors) +
         " publish_failures=" + std::to_string(publish_failures) +
         " abandoned=" + std::to_string(abandoned) + " reconnects=" + std::to_string(reconnects) +
         " copies_too_large=" + std::to_string(copies_too_large) +
         " held_unavailable=" + std::to_string(held_unavailable) +
         " latency_p50=" + ms(handler_latency.quantile(0.5)) +
         " latency_p99=" + ms(handler_latency.quantile(0.99)) +
         " latency_max=" + ms(handler_latency.max());
}

std::string prometheus_escaped(std::string_view text, bool label_value) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace retryloop::retry
