#include "parking_depth.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "retryloop/topology/topology.hpp"

namespace retryloop::consumer::detail {

struct ParkingDepthMonitor::State {
  std::string service;
  std::string queue;
  uint32_t threshold = 0;
  uint64_t interval_ms = 0;
  ParkingDepthHandler on_depth;
  std::shared_ptr<spdlog::logger> logger;
  uint64_t last_check_ms = 0;
  bool in_flight = false;
  bool soon = false;
  bool above = false;
};

ParkingDepthMonitor::ParkingDepthMonitor(const ConsumerOptions& options)
    : state_(std::make_shared<State>()) {
  state_->service = options.service.name;
  state_->queue = topology::parking_queue_name(options.service.name);
  state_->threshold = options.parking_alert_threshold;
  state_->interval_ms = uint64_t(options.parking_check_interval.count());
  state_->on_depth = options.on_parking_depth;
  state_->logger = options.logger;
}

void ParkingDepthMonitor::soon() {
  state_->soon = true;
}

void ParkingDepthMonitor::tick(uint64_t now_ms,
                               const std::shared_ptr<client::Connection>& connection) {
  State& state = *state_;
  if (state.threshold == 0 || state.in_flight) return;
  const uint64_t wait_ms =
      state.soon ? std::min<uint64_t>(1000, state.interval_ms) : state.interval_ms;
  if (now_ms - state.last_check_ms < wait_ms) return;
  state.last_check_ms = now_ms;
  state.soon = false;
  state.in_flight = true;
  std::weak_ptr<State> weak = state_;
  client::look_up_queue(
      connection, state.queue, [weak](const client::Error& error, const client::QueueInfo& info) {
        auto state = weak.lock();
        if (!state) return;
        state->in_flight = false;
        if (error) return;  // tried again at the next interval
        const bool above = info.message_count > state->threshold;
        if (above && !state->above) {
          if (state->logger) {
            state->logger->warn("service={} queue={} parking depth {} is above {}", state->service,
                                state->queue, info.message_count, state->threshold);
          }
          if (state->on_depth) {
            state->on_depth(ParkingDepthEvent{state->service, state->queue, info.message_count,
                                              state->threshold});
          }
        }
        state->above = above;
      });
}

}  // namespace retryloop::consumer::detail
