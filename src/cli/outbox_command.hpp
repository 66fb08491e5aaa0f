#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop outbox init|relay|list|stats|retry|purge`. The chosen command stores its exit
/// code in `exit_code` (or throws Failure).
void add_outbox_commands(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
