#pragma once

#include <cstdint>
#include <limits>

namespace retryloop::retry::detail {

/// a + b for counts that are never negative, held at INT64_MAX instead of overflowing.
inline int64_t saturating_add(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

}  // namespace retryloop::retry::detail
