#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace retryloop::cli {

/// Adds `retryloop send` and `retryloop schedule stats|cancel`. The chosen command stores its exit
/// code in `exit_code` (or throws Failure).
void add_schedule_commands(CLI::App& app, int& exit_code);

/// A time written as `2026-11-27T10:15:00Z`, `2026-11-27T10:15:00.250+02:00` or with a space
/// instead of the `T`: milliseconds since the Unix epoch; nullopt for anything else.
std::optional<int64_t> parse_time(const std::string& text);

/// Milliseconds since the Unix epoch as `2026-11-27T10:15:00.250Z`.
std::string iso_time_ms(int64_t milliseconds);

}  // namespace retryloop::cli
