#pragma once

// What every command group of the retryloop binary shares: exit codes, the connection URL
// (--url / RETRYLOOP_URL), connecting on a private loop, loading a topology file, and aligned
// tables for readable output.

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/uri.hpp"
#include "retryloop/process/stop_signals.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::cli {

/// The process exit codes, documented in --help and docs/topology.md.
enum ExitCode : int {
  exit_ok = 0,
  exit_usage = 1,           ///< bad command line (unknown flag, missing argument, bad URL)
  exit_invalid_file = 2,    ///< the topology file is unreadable or invalid
  exit_broker_refused = 3,  ///< the broker refused, or differs from the file, or holds messages
  exit_connection = 4,      ///< could not connect, or the connection failed midway
  exit_output = 6,          ///< standard output could not be written (closed pipe, full disk)
};

/// The exit-code table for --help footers.
extern const char* const exit_codes_help;

/// A failure a command reports with a message on stderr and an exit code. Thrown from command
/// code, caught in main.
class Failure : public std::runtime_error {
 public:
  Failure(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

/// The broker URL of a command: --url, else RETRYLOOP_URL, else the default.
struct ConnectionArgs {
  std::string url = "amqp://guest:guest@localhost:5672/%2F";
};

/// Adds --url (with RETRYLOOP_URL) to a command.
void add_connection_option(CLI::App& command, ConnectionArgs& args);

/// Parses the URL; throws Failure(exit_usage) naming the problem (never the password).
client::Uri parse_url(const ConnectionArgs& args);

/// `text` with the password of every URL in it replaced by `***`: after each `scheme://`, the part
/// between the first ':' and the last '@' of the same line (a password may hold '@', '/' or '?').
/// Hides more than the password when a line is odd, never less.
std::string hide_passwords(std::string text);

/// Called once connected; must call `done(exit_code)` exactly once, on the loop thread.
using ConnectedWork = std::function<void(const std::shared_ptr<client::Connection>& connection,
                                         std::function<void(int exit_code)> done)>;

/// Connects to `uri` on a private libuv loop, runs `work`, closes the connection and returns the
/// exit code `work` gave. When the connection cannot be made, prints why (with the redacted URL)
/// and returns exit_connection.
int with_connection(const client::Uri& uri, const ConnectedWork& work);

/// Prints "retryloop: WHAT: error" to stderr and returns the exit code for it: exit_connection
/// when the connection was lost, else exit_broker_refused.
int error_exit(const client::Error& error, const std::string& what);

/// A duration option's value (`30s`, `5m`); throws Failure(exit_usage) naming the option.
std::chrono::milliseconds duration_or_fail(const std::string& option, const std::string& text);

/// Checks a whole-number option's text before CLI11 converts it (which would wrap "-5" around in
/// an unsigned option): "must be a whole number from MIN to MAX".
CLI::Validator whole_number(int64_t min, int64_t max);

/// Selects `services` of `topology` (all when empty); throws Failure(exit_usage) for an unknown
/// service name.
topology::Topology select_services_or_fail(const topology::Topology& topology,
                                           const std::vector<std::string>& services);

/// Loads and validates a topology file and selects `services` (all when empty). Prints every
/// problem to stderr and throws Failure(exit_invalid_file) when the file is invalid, or
/// Failure(exit_usage) for an unknown service name.
topology::Topology load_topology_or_fail(const std::string& path,
                                         const std::vector<std::string>& services);

/// Runs `run` for each service of the file that `services` selects (load_topology_or_fail), in
/// file order, until one gives an exit code other than exit_ok, and returns the last code. With
/// `json`, prints {"services": [...]} once done: each run appends its result to `services`.
int run_per_service(
    const std::string& path, const std::vector<std::string>& services, bool json,
    const std::function<int(const topology::Service& service, nlohmann::json& services)>& run);
/// The same, on a topology already loaded: for a command that needs more of the file than each
/// service.
int run_per_service(
    const topology::Topology& topology, bool json,
    const std::function<int(const topology::Service& service, nlohmann::json& services)>& run);

/// Rows of text printed with aligned columns (the last column is not padded).
class Table {
 public:
  void add(std::vector<std::string> row) { rows_.push_back({false, std::move(row)}); }
  /// A line printed as it is (a heading), not aligned with the rows.
  void add_line(std::string text) { rows_.push_back({true, {std::move(text)}}); }
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& out, const std::string& indent = "  ") const;
  /// The width of each column but the last, as print() aligns them.
  std::vector<size_t> widths() const;
  /// One row aligned to `widths` (a longer cell pushes the rest of its row to the right).
  static void print_row(std::ostream& out, const std::vector<std::string>& row,
                        const std::vector<size_t>& widths, const std::string& indent = "  ");

 private:
  struct Row {
    bool verbatim;
    std::vector<std::string> cells;
  };
  std::vector<Row> rows_;
};

/// "1 queue" / "3 queues".
/// The items with `separator` between them.
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

std::string plural(size_t count, const std::string& singular, const std::string& plural_form = {});

/// A Unix time as `2026-11-23T10:15:00Z`.
std::string iso_time(uint64_t seconds);

/// An age in at most two units: "45s", "12m30s", "3h5m", "2d4h".
std::string age_text(uint64_t seconds);

/// JSON text on one line; bytes that are not UTF-8 in strings become U+FFFD instead of failing.
std::string dump(const nlohmann::json& json);

/// Printable text for a table cell: control and non-ASCII bytes escaped, cut to `width`.
std::string preview(std::string_view text, size_t width);

/// `text` broken into lines of at most `width` columns at spaces (for --help paragraphs).
std::string wrap(const std::string& text, size_t width = 96);

/// Ctrl-C (or SIGTERM) for a command that moves messages: the first says so and runs `settle`,
/// which lets the copies in flight settle; the second runs `stop_now`. Close it when the command
/// ends.
std::shared_ptr<process::StopSignals> settle_on_interrupt(uv_loop_t* loop,
                                                          std::function<void()> settle,
                                                          std::function<void()> stop_now);

/// The exit-code footer for a command's --help, and usage errors printed through
/// hide_passwords (CLI11 echoes unexpected arguments, which may be a URL given without --url).
/// Subcommands added afterwards inherit the latter.
void describe_command(CLI::App& command);

}  // namespace retryloop::cli
