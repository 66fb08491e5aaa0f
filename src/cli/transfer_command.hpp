#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "retryloop/transfer/transfer.hpp"

namespace retryloop::cli {

/// Adds `retryloop topology transfer` to the `topology` group: a service's messages moved to
/// another broker, retries' timing kept (docs/transfer.md). It stores its exit code in
/// `exit_code` (or throws Failure).
void add_transfer_command(CLI::App& topology_group, int& exit_code);

/// One line for a read of an old queue: "orders.wait.30s: 120 moved (12 due already, 108
/// through the levels, the longest 29.4s), 3 left to come due there".
std::string read_text(const transfer::SourceResult& result);

}  // namespace retryloop::cli
