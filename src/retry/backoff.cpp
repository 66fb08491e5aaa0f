#include "retryloop/retry/backoff.hpp"

#include <algorithm>
#include <cmath>
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

std::chrono::milliseconds Backoff::delay(uint32_t attempt) const {
  std::error_code error;
  const double random = random::random_fraction(error);
  if (error) throw std::system_error(error, "getrandom");
  return delay(attempt, random);
}

}  // namespace retryloop::retry
