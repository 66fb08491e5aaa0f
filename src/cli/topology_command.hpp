#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop topology plan|apply|verify|export|delete`. The chosen command stores its exit
/// code in `exit_code` (or throws Failure).
void add_topology_commands(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
