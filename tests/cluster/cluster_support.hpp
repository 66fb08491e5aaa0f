#pragma once

#include <cstddef>
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

/// The AMQP port of the node in `dir`.
uint16_t node_port(const std::string& dir);

/// Runs `scripts/broker COMMAND DIR` (kill, stop, restart, ...) and returns its exit code.
int broker_script(TestLoop& loop, const std::string& command, const std::string& dir);

/// Every node's management API in one URL (RETRYLOOP_TEST_MANAGEMENT_URL).
std::string management_url();

/// The cluster's URL (broker_url(), every node) with its hosts in another order: the hosts at
/// `first` and on come first. `query` (such as "heartbeat=5"), when given, is appended.
std::string url_starting_at(size_t first, const std::string& query = {});

/// The name of the node that leads `queue` in vhost "/", asked of the management API (the first
/// node that answers); fails the test when it cannot be asked.
std::string queue_leader(const std::string& queue);

}  // namespace retryloop::test
