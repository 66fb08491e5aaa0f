#include "retryloop/topology/duration.hpp"

#include <cstdint>
#include <limits>

namespace retryloop::topology {

namespace {

struct Unit {
  const char* suffix;
  int64_t ms;
};

// Longest suffix first where one is a suffix of another ("ms" before "s").
constexpr Unit units[] = {
    {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};

bool set_error(std::string* error, const char* text) {
  if (error != nullptr) *error = text;
  return false;
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text, std::string* error) {
  constexpr const char* hint =
      "is not a duration; write a whole number followed by ms, s, m, h or d, such as 250ms, 30s, "
      "5m, 1h or 14d";
  if (text.empty()) {
    set_error(error, "is empty; write a whole number followed by ms, s, m, h or d, such as 30s");
    return std::nullopt;
  }
  if (text.front() == '-') {
    set_error(error, "is negative; a duration must be longer than zero");
    return std::nullopt;
  }
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9')
    ++digits;
  std::string_view suffix = text.substr(digits);
  const Unit* unit = nullptr;
  for (const Unit& u : units) {
    if (suffix == u.suffix) unit = &u;
  }
  if (digits == 0 || unit == nullptr) {
    if (digits > 0 && suffix.empty()) {
      set_error(error, "has no unit; write ms, s, m, h or d after the number, such as 30s");
    } else {
      set_error(error, hint);
    }
    return std::nullopt;
  }
  int64_t value = 0;
  constexpr int64_t limit = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < digits; ++i) {
    int digit = text[i] - '0';
    if (value > (limit - digit) / 10) {
      set_error(error, "is too long to represent");
      return std::nullopt;
    }
    value = value * 10 + digit;
  }
  if (value > limit / unit->ms) {
    set_error(error, "is too long to represent");
    return std::nullopt;
  }
  return std::chrono::milliseconds(value * unit->ms);
}

std::string duration_label(std::chrono::milliseconds duration) {
  int64_t ms = duration.count();
  if (ms == 0) return "0ms";
  for (auto it = std::rbegin(units); it != std::rend(units); ++it) {
    if (ms % it->ms == 0) return std::to_string(ms / it->ms) + it->suffix;
  }
  return std::to_string(ms) + "ms";
}

}  // namespace retryloop::topology
