#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/topology/topology.hpp"

namespace retryloop::topology {

/// The outcome of reading a topology file: the model when the file is valid, otherwise every
/// problem found (never only the first).
struct ParseResult {
  /// Where the text came from (a file name), for messages; may be empty.
  std::string source;
  std::optional<Topology> topology;
  std::vector<TopologyError> errors;

  bool ok() const { return topology.has_value(); }
  /// One line per error: "SOURCE: services[1].retry.delays[0] (service "audit"): ...".
  std::vector<std::string> messages() const;
};

/// Reads a topology file's text (the JSON format of docs/topology.md) and validates it with
/// validate(). Malformed JSON gives one error with its line and column. Otherwise every problem is
/// listed with its field path: unknown or duplicate keys, wrong types, bad durations, and all that
/// validate() finds. Does not throw for any input.
ParseResult parse_topology(std::string_view text, std::string source_name = {});

/// Reads and parses the file at `path` (also the source name). A file that cannot be read gives
/// one error naming the reason; files above 16 MiB are refused.
ParseResult load_topology(const std::string& path);

}  // namespace retryloop::topology
