#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace retryloop::test {

/// The node directories of the cluster under test (RETRYLOOP_TEST_NODE_DIRS, set by
/// scripts/with-broker --nodes N), in node order; fails the test when it is not set.
std::vector<std::string> node_dirs();

/// The directory of the node listening for AMQP on `port`.
std::string node_on_port(uint16_t port);

/// Runs `scripts/broker COMMAND DIR` (kill, stop, restart, ...) and returns its exit code.
int broker_script(TestLoop& loop, const std::string& command, const std::string& dir);

/// Every node's management API in one URL (RETRYLOOP_TEST_MANAGEMENT_URL).
std::string management_url();

}  // namespace retryloop::test
