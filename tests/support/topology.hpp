#pragma once

// Shared by the unit and broker tests of topologies.

#include <catch2/catch.hpp>

#include <string>

#include "retryloop/topology/topology_json.hpp"

/// Parses a topology that must be valid; on failure the test stops and shows every message.
inline retryloop::topology::Topology parse_valid_topology(const std::string& text) {
  retryloop::topology::ParseResult result = retryloop::topology::parse_topology(text);
  std::string messages;
  for (const auto& m : result.messages())
    messages += m + "\n";
  INFO(messages);
  REQUIRE(result.ok());
  return *result.topology;
}
