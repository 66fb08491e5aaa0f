#include "retryloop/retry/backoff.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace retryloop::retry {

std::chrono::milliseconds Backoff::delay(uint32_t attempt, double random) const {
  const double cap = static_cast<double>(std::max(max, initial).count());
  double base = static_cast<double>(initial.count()) * std::pow(std::max(multiplier, 1.0), attempt);
  if (!(base < cap)) base = cap;  // also catches overflow to infinity
  const double spread = std::clamp(jitter, 0.0, 1.0);
  const double factor = 1.0 + spread * (2.0 * std::clamp(random, 0.0, 1.0) - 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(base * factor)));
}

std::chrono::milliseconds Backoff::delay(uint32_t attempt) const {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return delay(attempt, std::uniform_real_distribution<double>(0.0, 1.0)(engine));
}

}  // namespace retryloop::retry
