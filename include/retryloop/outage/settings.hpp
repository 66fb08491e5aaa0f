#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace retryloop::outage {

/// The failure-rate trip: over the last `window`, once at least `minimum_calls` calls have
/// ended, the breaker opens when `threshold` or more of them failed. Failures here are the
/// unavailable outcomes and the retries a handler did not classify; successes are acks and drops.
/// It counts whether or not any call ever succeeded.
struct FailureRate {
  /// A fraction, above 0 and at most 1: 0.5 trips when half the calls failed.
  double threshold = 0.5;
  std::chrono::milliseconds window = std::chrono::seconds(10);
  int minimum_calls = 20;
};

/// The slow start after a probe succeeded: the number of deliveries that may run at once starts
/// at an eighth of the consumer's concurrency (at least 2) and doubles every `interval` without a
/// failure, up to the concurrency. A failure halves it (not below 2), and from then on it grows by
/// a quarter (at least 1) per interval without a failure, as TCP's congestion avoidance does. A
/// pace set by a 429 (outage::Pacer) also grows once per `interval`.
struct Ramp {
  std::chrono::milliseconds interval = std::chrono::seconds(2);
};

/// A service's breaker: the `outage` object of its topology entry (docs/outage.md). The defaults
/// trip within 2 s at 100 messages a second: 5 unavailable outcomes in a row take 50 ms at that
/// rate, and the failure-rate trip, when asked for, sees its 20 calls in 200 ms.
struct Settings {
  /// Opens after this many unavailable outcomes in a row (a success starts the count again).
  int consecutive_unavailable = 5;
  /// nullopt: unclassified failures never trip the breaker, and a handler that never answers
  /// `unavailable` behaves as if there were no breaker.
  std::optional<FailureRate> failure_rate;
  /// While open: one call per interval, a real delivery or the service's probe.
  std::chrono::milliseconds probe_interval = std::chrono::seconds(5);
  Ramp ramp;
};

/// One value out of range: `key` is its path inside the `outage` object ("probe_interval",
/// "failure_rate.threshold"), so that the topology's error can name the whole path.
struct SettingProblem {
  std::string key;
  std::string message;
};

/// Every value out of range, in declaration order; empty when the settings are usable.
std::vector<SettingProblem> check(const Settings& settings);

}  // namespace retryloop::outage
