#pragma once

#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>

namespace retryloop::client {

/// Hands work from other threads (an HTTP server's, say) to the loop thread, which alone may
/// touch connections, channels and consumers: a task posted from any thread runs on the loop
/// thread.
class LoopBridge {
 public:
  explicit LoopBridge(uv_loop_t* loop);
  LoopBridge(const LoopBridge&) = delete;
  LoopBridge& operator=(const LoopBridge&) = delete;
  /// Any thread. Runs `task` on the loop thread and waits up to `timeout` for it to start, then
  /// until it ends. False when it never started: the wait timed out first (the task is then
  /// dropped, never to run) or the bridge refuses calls. A task that started is always waited
  /// for, so that false always means that nothing was done. A task that throws ends the call
  /// with true; the exception is not passed on.
  bool call(std::function<void()> task, std::chrono::milliseconds timeout);
  /// Any thread. Runs `task` on the loop thread soon, without waiting; false when the bridge is
  /// closed (the task never runs).
  bool post(std::function<void()> task);
  /// Loop thread. Takes no more calls; those still queued never run and their callers get false
  /// at once. Posts are still taken until close().
  void refuse_calls();
  /// Loop thread. Takes nothing more; what is still queued never runs. The handle closes (the
  /// loop must run on for that), then `closed` fires on the loop thread.
  void close(std::function<void()> closed = {});

 private:
  struct Shared;
  struct Task;
  static void on_async(uv_async_t* async);
  std::shared_ptr<Shared> shared_;
};

}  // namespace retryloop::client
