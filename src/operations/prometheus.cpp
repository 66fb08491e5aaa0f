#include "retryloop/operations/prometheus.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "retryloop/topology/topology.hpp"

namespace retryloop::operations {
namespace {

using Labels = retry::PrometheusLabels;

using retry::prometheus_escaped;

class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    text_ += "# HELP ";
    text_ += name;
    text_ += ' ';
    text_ += prometheus_escaped(help, false);
    text_ += "\n# TYPE ";
    text_ += name;
    text_ += ' ';
    text_ += type;
    text_ += '\n';
  }

  void sample(std::string_view name, const Labels& labels, const std::string& value) {
    text_ += retry::prometheus_sample(name, labels, value);
  }

  void append(const std::string& samples) { text_ += samples; }

  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

/// The labels of OpenTelemetry's messaging families.
Labels messaging_labels(const ConsumerStatus& status, std::string_view operation) {
  return {{"messaging_system", "rabbitmq"},
          {"messaging_operation_name", std::string(operation)},
          {"messaging_destination_name", status.queue},
          {"service", status.service}};
}

Labels own_labels(const ConsumerStatus& status) {
  return {{"service", status.service}, {"queue", status.queue}};
}

/// How far a breaker state is from taking deliveries freely.
int breaker_rank(outage::State state) {
  switch (state) {
    case outage::State::closed:
      return 0;
    case outage::State::ramping:
      return 1;
    case outage::State::probing:
      return 2;
    case outage::State::open:
      return 3;
    case outage::State::paused:
      return 4;
  }
  return 0;
}

/// Consumers of the same service and queue, added together: one series each.
std::vector<ConsumerStatus> merged(const std::vector<ConsumerStatus>& consumers) {
  std::vector<ConsumerStatus> out;
  for (const auto& status : consumers) {
    auto same = std::find_if(out.begin(), out.end(), [&](const ConsumerStatus& s) {
      return s.service == status.service && s.queue == status.queue;
    });
    if (same == out.end()) {
      out.push_back(status);
      continue;
    }
    same->metrics.add(status.metrics);
    same->in_flight += status.in_flight;
    same->blocked = same->blocked || status.blocked;
    if (status.state == consumer::ConsumerState::consuming) same->state = status.state;
    // The service's breaker as its most stopped consumer has it.
    if (breaker_rank(status.breaker) > breaker_rank(same->breaker)) same->breaker = status.breaker;
    same->breaker_limit += status.breaker_limit;
    same->breaker_stats.trips += status.breaker_stats.trips;
    same->breaker_stats.probes += status.breaker_stats.probes;
    same->breaker_stats.pace += status.breaker_stats.pace;
    same->breaker_stats.time_open =
        std::max(same->breaker_stats.time_open, status.breaker_stats.time_open);
    same->held += status.held;
    same->parking_alert_threshold =
        std::max(same->parking_alert_threshold, status.parking_alert_threshold);
  }
  return out;
}

/// A family with one sample per consumer, labelled service and queue.
struct Plain {
  const char* name;
  const char* type;
  const char* help;
  uint64_t (*value)(const ConsumerStatus& status);
};

const Plain own_families[] = {
    {"retryloop_redelivered_messages_total", "counter",
     "Deliveries the broker flagged as redelivered (they went back unsettled once).",
     [](const ConsumerStatus& s) { return s.metrics.redelivered; }},
    {"retryloop_acked_messages_total", "counter", "Messages acked because the handler said ack.",
     [](const ConsumerStatus& s) { return s.metrics.acked; }},
    {"retryloop_dropped_messages_total", "counter",
     "Messages acked on purpose because the handler said drop.",
     [](const ConsumerStatus& s) { return s.metrics.dropped; }},
    {"retryloop_handler_errors_total", "counter", "Exceptions that escaped the handler.",
     [](const ConsumerStatus& s) { return s.metrics.handler_errors; }},
    {"retryloop_copy_publish_failures_total", "counter",
     "Retry or parking copies the broker nacked or returned; each is published again while its "
     "original stays unacked.",
     [](const ConsumerStatus& s) { return s.metrics.publish_failures; }},
    {"retryloop_copies_too_large_total", "counter",
     "Copies whose properties did not fit in frame_max even with retryloop-error shortened.",
     [](const ConsumerStatus& s) { return s.metrics.copies_too_large; }},
    {"retryloop_abandoned_messages_total", "counter",
     "Deliveries left unsettled because their channel closed first; the broker delivers them "
     "again.",
     [](const ConsumerStatus& s) { return s.metrics.abandoned; }},
    {"retryloop_reconnects_total", "counter", "Sessions re-established after a loss.",
     [](const ConsumerStatus& s) { return s.metrics.reconnects; }},
    {"retryloop_in_flight_messages", "gauge",
     "Deliveries received and not yet settled: waiting, in a handler, or their copy being "
     "published.",
     [](const ConsumerStatus& s) { return uint64_t(s.in_flight); }},
    {"retryloop_consuming", "gauge",
     "1 while the consumer consumes, 0 while it connects, reconnects or "
     "has stopped.",
     [](const ConsumerStatus& s) {
       return uint64_t(s.state == consumer::ConsumerState::consuming ? 1 : 0);
     }},
    {"retryloop_breaker_trips_total", "counter",
     "Times the service's breaker opened: unavailable outcomes in a row or the failure rate "
     "(docs/outage.md).",
     [](const ConsumerStatus& s) { return s.breaker_stats.trips; }},
    {"retryloop_breaker_probes_total", "counter",
     "Calls the breaker let through while open to see whether the dependency answers again.",
     [](const ConsumerStatus& s) { return s.breaker_stats.probes; }},
    {"retryloop_breaker_limit", "gauge",
     "Handlers the breaker lets run at once now: the concurrency when closed, the ramp's limit, 1 "
     "while probing, 0 while open or paused.",
     [](const ConsumerStatus& s) { return uint64_t(std::max(s.breaker_limit, 0)); }},
    {"retryloop_breaker_pace", "gauge",
     "Calls a second the breaker lets start since the dependency answered 429 (docs/outage.md, "
     "\"The pace after a 429\"); 0 while the calls are not paced.",
     [](const ConsumerStatus& s) { return uint64_t(s.breaker_stats.pace + 0.5); }},
    {"retryloop_held_messages", "gauge",
     "Deliveries kept unsettled and uncharged while the breaker does not let them run.",
     [](const ConsumerStatus& s) { return uint64_t(s.held); }},
    {"retryloop_parking_alert_threshold", "gauge",
     "The parking depth above which the consumer warns (parking_alert_threshold; 0: none); the "
     "alert rules in ops/ compare the console's retryloop_parking_depth with it.",
     [](const ConsumerStatus& s) { return uint64_t(s.parking_alert_threshold); }},
    {"retryloop_publishing_blocked", "gauge",
     "1 while the broker blocks the connection that publishes retry and parking copies "
     "(connection.blocked: a memory or disk alarm).",
     [](const ConsumerStatus& s) { return uint64_t(s.blocked ? 1 : 0); }},
};

void write_latency(Exposition& out, const std::vector<ConsumerStatus>& consumers) {
  const char* name = "messaging_process_duration_seconds";
  out.family(name, "histogram",
             "How long the handler took, per delivery it ran for (the handler latency).");
  for (const auto& status : consumers) {
    out.append(retry::prometheus_histogram(name, messaging_labels(status, "process"),
                                           status.metrics.handler_latency));
  }
}

}  // namespace

ConsumerStatus status_of(const consumer::Consumer& consumer) {
  ConsumerStatus status;
  status.service = consumer.service().name;
  status.queue = topology::input_queue_name(consumer.service());
  status.state = consumer.state();
  status.blocked = consumer.is_blocked();
  status.in_flight = consumer.in_flight();
  status.metrics = consumer.metrics();
  status.breaker = consumer.breaker_state();
  status.breaker_limit = consumer.breaker_limit();
  status.breaker_stats = consumer.breaker_stats();
  status.held = consumer.held();
  status.parking_alert_threshold = consumer.parking_alert_threshold();
  return status;
}

bool is_ready(const ConsumerStatus& status) {
  return status.state == consumer::ConsumerState::consuming && !status.blocked;
}

std::string prometheus_text(const std::vector<ConsumerStatus>& all) {
  const std::vector<ConsumerStatus> consumers = merged(all);
  Exposition out;

  out.family("messaging_client_consumed_messages_total", "counter",
             "Messages the broker delivered to the consumer, redeliveries included.");
  for (const auto& status : consumers) {
    out.sample("messaging_client_consumed_messages_total", messaging_labels(status, "receive"),
               std::to_string(status.metrics.delivered));
  }
  write_latency(out, consumers);

  out.family("retryloop_retries_total", "counter",
             "Messages sent to wait for another attempt, by delay: the wait queue's delay, or "
             "through delay levels the delay rounded up to the base times a power of two.");
  for (const auto& status : consumers) {
    for (const auto& [delay, count] : status.metrics.retried_by_delay) {
      Labels labels = own_labels(status);
      labels.emplace_back("delay", delay);
      out.sample("retryloop_retries_total", labels, std::to_string(count));
    }
  }

  out.family("retryloop_parked_messages_total", "counter",
             "Messages parked (their parking copy confirmed), by reason.");
  for (const auto& status : consumers) {
    const std::pair<retry::ParkReason, uint64_t> parked[] = {
        {retry::ParkReason::exhausted, status.metrics.parked_exhausted},
        {retry::ParkReason::permanent, status.metrics.parked_permanent},
        {retry::ParkReason::poison, status.metrics.parked_poison},
        {retry::ParkReason::delivery_limit, status.metrics.parked_delivery_limit}};
    for (const auto& [reason, count] : parked) {
      Labels labels = own_labels(status);
      labels.emplace_back("reason", retry::to_string(reason));
      out.sample("retryloop_parked_messages_total", labels, std::to_string(count));
    }
  }

  for (const Plain& family : own_families) {
    out.family(family.name, family.type, family.help);
    for (const auto& status : consumers)
      out.sample(family.name, own_labels(status), std::to_string(family.value(status)));
  }

  out.family("retryloop_breaker_open_seconds_total", "counter",
             "Time the service's breaker spent open or probing.");
  for (const auto& status : consumers) {
    const auto open =
        std::chrono::duration_cast<std::chrono::microseconds>(status.breaker_stats.time_open);
    out.sample("retryloop_breaker_open_seconds_total", own_labels(status),
               retry::prometheus_seconds(uint64_t(open.count())));
  }
  out.family("retryloop_breaker_state", "gauge",
             "1 for the state the service's breaker is in (closed, open, probing, ramping, "
             "paused), 0 for the others.");
  for (const auto& status : consumers) {
    for (const outage::State state :
         {outage::State::closed, outage::State::open, outage::State::probing,
          outage::State::ramping, outage::State::paused}) {
      Labels labels = own_labels(status);
      labels.emplace_back("state", outage::to_string(state));
      out.sample("retryloop_breaker_state", labels, status.breaker == state ? "1" : "0");
    }
  }
  return out.take();
}

}  // namespace retryloop::operations
