#pragma once

#include <chrono>
#include <cstdint>

namespace retryloop::retry {

/// Capped exponential backoff with jitter, as a value: it computes delays and never sleeps.
/// Delay k (k = 0, 1, ...) is min(initial * multiplier^k, max), then moved by up to
/// +/- jitter of itself.
struct Backoff {
  std::chrono::milliseconds initial{500};
  std::chrono::milliseconds max{30000};
  double multiplier = 2.0;
  /// Fraction of the delay, 0 to 1: 0.25 spreads each delay over [0.75 d, 1.25 d].
  double jitter = 0.25;

  /// The delay before try `attempt` (0-based). `random` is a number in [0, 1) that picks the
  /// jitter, so the function stays pure and testable.
  std::chrono::milliseconds delay(uint32_t attempt, double random) const;
  /// The same, with the jitter drawn from the operating system (random::random_fraction). Never
  /// throws (it runs in event-loop callbacks): when that source fails, the jitter comes from the
  /// monotonic clock instead, which spreads retries as well and needs no secret.
  std::chrono::milliseconds delay(uint32_t attempt) const noexcept;
};

}  // namespace retryloop::retry
