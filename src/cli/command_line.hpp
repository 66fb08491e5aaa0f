#pragma once

#include <CLI/CLI.hpp>

namespace retryloop::cli {

/// The whole retryloop command line: the top-level command and every command group, with their
/// options, help texts and exit-code footers. The command itself parses with it, and the man pages
/// and the bash completion are generated from it, so that neither can drift from the command.
/// A command that runs sets `exit_code`.
void build_command_line(CLI::App& app, int& exit_code);

}  // namespace retryloop::cli
