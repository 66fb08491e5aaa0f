#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace retryloop::cli {

/// A man page (roff, section 1), written from the command line's own definition: its
/// descriptions, options, environment variables, help footers and exit codes.
struct ManPage {
  std::string file_name;  ///< retryloop.1, retryloop-topology.1, ...
  std::string text;
};

/// The man pages of `app` (as build_command_line makes it): retryloop(1), and one page per
/// command group or command (retryloop-topology(1), retryloop-send(1), ...) that describes each
/// of its subcommands. `date` goes into the pages' title line (YYYY-MM-DD).
std::vector<ManPage> man_pages(const CLI::App& app, const std::string& version,
                               const std::string& date);

/// A bash completion script for `app`: command groups, subcommands and options, file names where
/// an option or argument takes a FILE, and service names (read with `retryloop topology plan
/// --json` from the topology file on the command line, or from RETRYLOOP_TOPOLOGY) where one
/// takes a service.
std::string bash_completion(const CLI::App& app);

}  // namespace retryloop::cli
