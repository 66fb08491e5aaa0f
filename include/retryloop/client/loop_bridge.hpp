#pragma once

#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace retryloop::console::detail {

/// An HTTP answer: status, content type and body.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

/// Hands work from the HTTP server's threads to the loop thread, which alone touches the
/// connection and the console's state: a task posted from any thread runs on the loop thread,
/// and the poster waits for its reply.
class LoopBridge {
 public:
  explicit LoopBridge(uv_loop_t* loop);
  LoopBridge(const LoopBridge&) = delete;
  LoopBridge& operator=(const LoopBridge&) = delete;
  /// Any thread. Runs `task` on the loop thread and waits up to `timeout` for it to start, then
  /// for its reply. nullopt when it never started: the wait timed out first (the task is then
  /// dropped, never to run) or the bridge is closed. A task that started is always waited for,
  /// so that nullopt always means that nothing was done.
  std::optional<Reply> call(std::function<Reply()> task, std::chrono::milliseconds timeout);
  /// Loop thread. Takes no more tasks; those still queued never run and their callers get
  /// nullopt at once. The handle closes; the loop must run on for that.
  void close();

 private:
  struct Shared;
  struct Call;
  static void on_async(uv_async_t* async);
  std::shared_ptr<Shared> shared_;
};

}  // namespace retryloop::console::detail
