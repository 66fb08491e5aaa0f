#pragma once

#include <cstdint>
#include <memory>

#include "retryloop/client/connection.hpp"
#include "retryloop/consumer/consumer.hpp"

namespace retryloop::consumer::detail {

/// The parking-depth alert of ConsumerOptions: reads the service's parking queue depth every
/// `parking_check_interval` (within a second after soon()), and tells `on_parking_depth` (and
/// the log) when it rises above `parking_alert_threshold`; once more after it has fallen back
/// to or below it and risen again. One lookup at a time; a failed one is tried again at the next
/// interval.
class ParkingDepthMonitor {
 public:
  explicit ParkingDepthMonitor(const ConsumerOptions& options);

  /// Looks the depth up on `connection` when a lookup is due; call it on every tick.
  void tick(uint64_t now_ms, const std::shared_ptr<client::Connection>& connection);
  /// A message was just parked: look within a second instead of waiting out the interval.
  void soon();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace retryloop::consumer::detail
