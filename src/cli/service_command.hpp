#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop service pause|resume|status`: an operator's hand on a service's shared
/// breaker (docs/outage.md). The chosen command stores its exit code in `exit_code` (or throws
/// Failure).
void add_service_commands(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
