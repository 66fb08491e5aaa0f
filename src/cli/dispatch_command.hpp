#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// Adds `retryloop dispatch`: the retry consumer of a service, whose handler is an HTTP request
/// to an application in any language (docs/dispatch.md). It stores its exit code in `exit_code`
/// (or throws Failure).
void add_dispatch_command(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
