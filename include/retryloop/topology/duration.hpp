#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace retryloop::topology {

/// The largest TTL RabbitMQ accepts for `x-message-ttl`: 2^32-1 ms, about 49.7 days.
inline constexpr std::chrono::milliseconds max_ttl{4294967295LL};

/// Parses a duration written as a whole number and a unit: `250ms`, `30s`, `5m`, `1h`, `14d`.
/// Returns nullopt for anything else (a sign, a fraction, a space, another unit, an overflow),
/// and then, when `error` is given, stores there why, as a predicate to put after the quoted text
/// ("is negative; ..."). Zero parses; whether zero is allowed is for the caller to decide.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text,
                                                        std::string* error = nullptr);

/// The canonical text of a duration: the number in the largest unit (d, h, m, s, ms) that divides
/// it exactly. `30000ms` gives `30s`, `90s` gives `90s`, `1500ms` gives `1500ms`, `48h` gives
/// `2d`. Wait-queue names and routing keys use this text.
std::string duration_label(std::chrono::milliseconds duration);

}  // namespace retryloop::topology
