#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/migrate/migration.hpp"

namespace retryloop::cli {

/// Adds `retryloop topology migrate` to the `topology` group: a live change of what `apply`
/// refuses to change (docs/migrate.md). It stores its exit code in `exit_code` (or throws
/// Failure).
void add_migrate_command(CLI::App& topology_group, int& exit_code);

/// The unfinished migrations of `services`, by service, read from their records. A record that
/// cannot be read (no read permission on it, say) counts as none: this only adds to a report.
using UnfinishedCallback = std::function<void(std::map<std::string, migrate::Record> unfinished)>;
void read_unfinished_migrations(const std::shared_ptr<client::Connection>& connection,
                                std::vector<std::string> services, UnfinishedCallback done);

/// "migration 3f2a… of orders, at step 5, begun 2026-12-05T11:02:03Z: run `retryloop topology
/// migrate FILE --service orders` to finish it (the instances follow it meanwhile)".
std::string unfinished_text(const migrate::Record& record, const std::string& file);
/// "[#########.....] 64% 6400 of 10000": a move's progress on a terminal, the bar `width` wide.
/// A move may count past the depth it began with (messages that came meanwhile): the bar stops
/// full.
std::string progress_bar(uint64_t done, uint64_t total, int width);

/// The record as `service status --json` and `topology verify --json` give it.
nlohmann::json unfinished_json(const migrate::Record& record);

}  // namespace retryloop::cli
