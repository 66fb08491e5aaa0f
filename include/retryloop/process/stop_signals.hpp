#pragma once

#include <functional>
#include <memory>

#include "retryloop/client/loop.hpp"

namespace retryloop::process {

/// SIGINT and SIGTERM as a two-step stop, the way a long-running command or service expects:
/// the first signal calls `graceful` (with its number), every later one `immediate`. The
/// handlers exist from construction until close(); all calls happen on the loop thread.
class StopSignals {
 public:
  StopSignals(uv_loop_t* loop, std::function<void(int signum)> graceful,
              std::function<void()> immediate);
  /// Closes the handles if close() was not called; the loop must run on for them to finish.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// Stops listening; `done` fires once the handles are closed. Safe to call more than once
  /// (`done` of a later call fires at once).
  void close(std::function<void()> done = {});

 private:
  struct Handles;
  std::unique_ptr<Handles> handles_;
};

}  // namespace retryloop::process
