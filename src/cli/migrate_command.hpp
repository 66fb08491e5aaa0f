#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop topology migrate` to the `topology` group: a live change of what `apply`
/// refuses to change (docs/migrate.md). It stores its exit code in `exit_code` (or throws
/// Failure).
void add_migrate_command(CLI::App& topology_group, int& exit_code);

}  // namespace retryloop::cli
