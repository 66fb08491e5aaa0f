#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace retryloop::retry {

/// Handler latencies in fixed buckets (upper bounds from 100 us to 60 s, then overflow).
/// Recording is O(log buckets) with no allocation.
class LatencyHistogram {
 public:
  /// Upper bounds of the buckets, in microseconds; the last bucket takes everything above.
  static constexpr std::array<uint64_t, 20> bounds_us = {
      100,     250,      500,      1000,     2500,     5000,      10000,
      25000,   50000,    100000,   250000,   500000,   1000000,   2500000,
      5000000, 10000000, 20000000, 30000000, 60000000, UINT64_MAX};

  void record(std::chrono::nanoseconds latency);

  uint64_t count() const { return count_; }
  /// The sum of every latency recorded (microseconds, each rounded down).
  std::chrono::microseconds sum() const { return std::chrono::microseconds(sum_us_); }
  std::chrono::microseconds max() const { return std::chrono::microseconds(max_us_); }
  std::chrono::microseconds mean() const;
  /// The upper bound of the bucket holding quantile `q` (0..1), capped at the largest value
  /// seen; zero when nothing was recorded.
  std::chrono::microseconds quantile(double q) const;
  const std::array<uint64_t, bounds_us.size()>& buckets() const { return buckets_; }
  /// Adds another histogram's recordings to this one (for several consumers of one queue).
  void add(const LatencyHistogram& other);

 private:
  std::array<uint64_t, bounds_us.size()> buckets_{};
  uint64_t count_ = 0;
  uint64_t sum_us_ = 0;
  uint64_t max_us_ = 0;
};

/// Counters of one consumer since it was created (reconnects do not reset them).
struct Metrics {
  uint64_t delivered = 0;    ///< deliveries received
  uint64_t redelivered = 0;  ///< of which the broker flagged as redelivered
  uint64_t acked = 0;        ///< settled by ack (handler said ack)
  uint64_t retried = 0;      ///< sent to a wait queue (rejected, or republished and confirmed)
  /// `retried` by the delay's label (retry_delay_label in retry_policy.hpp: a wait queue's
  /// delay such as `30s`, or a power-of-two step of the delay levels): few distinct keys.
  std::map<std::string, uint64_t> retried_by_delay;
  uint64_t parked_exhausted = 0;
  uint64_t parked_permanent = 0;
  uint64_t parked_poison = 0;
  uint64_t parked_delivery_limit = 0;  ///< dead-lettered by the broker's delivery limit
  uint64_t dropped = 0;                ///< acked on purpose without processing (handler said drop)
  uint64_t handler_errors = 0;         ///< exceptions that escaped the handler
  uint64_t publish_failures = 0;       ///< retry or parking copies nacked or returned (tried again)
  uint64_t abandoned = 0;              ///< results dropped because their channel died (redelivered)
  uint64_t reconnects = 0;             ///< sessions re-established after a loss
  /// Handler runs that said the dependency is unavailable and whose delivery was kept, uncharged,
  /// to run again (docs/outage.md); one delivery may count several times.
  uint64_t held_unavailable = 0;
  /// Copies whose properties did not fit in frame_max even with retryloop-error shortened: a
  /// retry became a retry by reject (also counted in `retried`), a parking copy was made again
  /// without the message's own headers (counted in `parked_*` once confirmed).
  uint64_t copies_too_large = 0;
  LatencyHistogram handler_latency;

  uint64_t parked() const {
    return parked_exhausted + parked_permanent + parked_poison + parked_delivery_limit;
  }
  /// Adds another consumer's counters and latencies to these.
  void add(const Metrics& other);
  /// One line for logs: `delivered=... acked=... ... latency_p50=...`.
  std::string summary() const;
};

/// Text for Prometheus' text format: backslash and newline escaped, and the double quote too in
/// a label value (not in HELP). Every `/metrics` of retryloop escapes with it.
std::string prometheus_escaped(std::string_view text, bool label_value);

/// The labels of a Prometheus sample: names, and values as they are (prometheus_sample escapes).
using PrometheusLabels = std::vector<std::pair<std::string_view, std::string>>;

/// Microseconds as seconds, exactly: 250 -> "0.00025", 60000000 -> "60".
std::string prometheus_seconds(uint64_t microseconds);

/// One sample line of Prometheus' text format: `name{label="value",...} value`, and a newline.
std::string prometheus_sample(std::string_view name, const PrometheusLabels& labels,
                              std::string_view value);

/// The sample lines of `histogram` as the Prometheus histogram `name`, in seconds: `name_bucket`
/// for each bound (cumulative, `le` in seconds, the last `+Inf`), `name_sum` and `name_count`,
/// each labelled `labels`.
std::string prometheus_histogram(std::string_view name, const PrometheusLabels& labels,
                                 const LatencyHistogram& histogram);

}  // namespace retryloop::retry
