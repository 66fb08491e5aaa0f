#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop parking list|stats|replay|purge`. The chosen command stores its exit code in
/// `exit_code` (or throws Failure).
void add_parking_commands(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
