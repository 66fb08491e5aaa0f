#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace retryloop::consumer::detail {

/// Seconds since the epoch, for the timestamps a copy carries.
inline uint64_t unix_seconds() {
  return uint64_t(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

/// A uniform number in [0, 1), for backoff jitter.
inline double random_unit() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
}

}  // namespace retryloop::consumer::detail
