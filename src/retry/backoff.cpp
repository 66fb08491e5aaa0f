#include "retryloop/retry/backoff.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <system_error>

#include "retryloop/random/os_random.hpp"

namespace retryloop::retry {

std::chrono::milliseconds Backoff::delay(uint32_t attempt, double random) const {
  const double cap = static_cast<double>(std::max(max, initial).count());
  double base = static_cast<double>(initial.count()) * std::pow(std::max(multiplier, 1.0), attempt);
  if (!(base < cap)) base = cap;  // also catches overflow to infinity
  const double spread = std::clamp(jitter, 0.0, 1.0);
  const double factor = 1.0 + spread * (2.0 * std::clamp(random, 0.0, 1.0) - 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(base * factor)));
}

namespace {

/// A number in [0, 1) from the monotonic clock's nanoseconds, mixed (splitmix64's finalizer).
double clock_fraction() noexcept {
  uint64_t x = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return double(x >> 11) * 0x1.0p-53;
}

}  // namespace

std::chrono::milliseconds Backoff::delay(uint32_t attempt) const noexcept {
  std::error_code error;
  double random = random::random_fraction(error);
  if (error) random = clock_fraction();
  return delay(attempt, random);
}

}  // namespace retryloop::retry
