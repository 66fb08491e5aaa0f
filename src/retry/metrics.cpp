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

std::string prometheus_seconds(uint64_t microseconds) {
  std::string out = std::to_string(microseconds / 1000000);
  const uint64_t fraction = microseconds % 1000000;
  if (fraction == 0) return out;
  std::string digits = std::to_string(fraction);
  digits.insert(0, 6 - digits.size(), '0');
  digits.erase(digits.find_last_not_of('0') + 1);
  return out + "." + digits;
}

std::string prometheus_sample(std::string_view name, const PrometheusLabels& labels,
                              std::string_view value) {
  std::string text(name);
  if (!labels.empty()) {
    text += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) text += ',';
      text += labels[i].first;
      text += "=\"";
      text += prometheus_escaped(labels[i].second, true);
      text += '"';
    }
    text += '}';
  }
  text += ' ';
  text += value;
  text += '\n';
  return text;
}

std::string prometheus_histogram(std::string_view name, const PrometheusLabels& labels,
                                 const LatencyHistogram& histogram) {
  std::string text;
  const std::string prefix(name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::bounds_us.size(); ++i) {
    cumulative += histogram.buckets()[i];
    const uint64_t bound = LatencyHistogram::bounds_us[i];
    PrometheusLabels with_le = labels;
    with_le.emplace_back("le", bound == UINT64_MAX ? "+Inf" : prometheus_seconds(bound));
    text += prometheus_sample(prefix + "_bucket", with_le, std::to_string(cumulative));
  }
  text += prometheus_sample(prefix + "_sum", labels,
                            prometheus_seconds(uint64_t(histogram.sum().count())));
  text += prometheus_sample(prefix + "_count", labels, std::to_string(histogram.count()));
  return text;
}

}  // namespace retryloop::retry
