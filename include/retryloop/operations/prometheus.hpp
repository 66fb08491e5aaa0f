#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/consumer/consumer.hpp"

namespace retryloop::operations {

/// One consumer as the operations endpoint reports it, taken at one moment on its loop thread.
struct ConsumerStatus {
  std::string service;
  /// The service's input queue.
  std::string queue;
  consumer::ConsumerState state = consumer::ConsumerState::not_started;
  /// The broker blocks its publishing connection (Consumer::is_blocked).
  bool blocked = false;
  size_t in_flight = 0;
  retry::Metrics metrics;
  /// The service's breaker in this consumer (Consumer::breaker_state and the rest).
  outage::State breaker = outage::State::closed;
  int breaker_limit = 0;
  outage::Stats breaker_stats;
  size_t held = 0;
  /// ConsumerOptions::parking_alert_threshold (0: none).
  uint32_t parking_alert_threshold = 0;
};

/// The status of `consumer` now. On its loop thread only, like every call of a Consumer.
ConsumerStatus status_of(const consumer::Consumer& consumer);

/// Ready means consuming and not blocked: what `/readyz` answers 200 for.
bool is_ready(const ConsumerStatus& status);

/// The Content-Type of prometheus_text's output.
inline constexpr std::string_view prometheus_content_type =
    "text/plain; version=0.0.4; charset=utf-8";

/// The consumers' metrics in Prometheus' text exposition format 0.0.4: each family with
/// `# HELP` and `# TYPE`, counters ending in `_total`, times in seconds, label values escaped.
/// Every sample is labelled with the service (never with message ids); consumers of the same
/// service and queue are added together. The families follow OpenTelemetry's messaging semantic
/// conventions where one fits (`messaging_client_consumed_messages_total`,
/// `messaging_process_duration_seconds`, labelled `messaging_system="rabbitmq"`,
/// `messaging_destination_name` and `messaging_operation_name`); retryloop's own start with
/// `retryloop_` and are labelled `service` and `queue`. The README lists them all.
std::string prometheus_text(const std::vector<ConsumerStatus>& consumers);

}  // namespace retryloop::operations
