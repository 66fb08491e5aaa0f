#include "retryloop/client/timer.hpp"

#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

namespace retryloop::client {
namespace {

struct Timer {
  uv_timer_t handle{};
  std::function<void()> fn;
};

/// The timers run_after started that have not fired yet, so that close_timers can free them.
struct Pending {
  std::mutex mutex;
  std::unordered_set<Timer*> timers;
};

Pending& pending() {
  static Pending* instance = new Pending;  // outlives every loop, torn down at exit or not
  return *instance;
}

void close_timer(Timer* timer) {
  {
    std::lock_guard<std::mutex> lock(pending().mutex);
    pending().timers.erase(timer);
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&timer->handle),
           [](uv_handle_t* closed) { delete static_cast<Timer*>(closed->data); });
}

}  // namespace

void run_after(uv_loop_t* loop, std::chrono::milliseconds delay, std::function<void()> fn) {
  auto* timer = new Timer{};
  timer->fn = std::move(fn);
  uv_timer_init(loop, &timer->handle);
  timer->handle.data = timer;
  {
    std::lock_guard<std::mutex> lock(pending().mutex);
    pending().timers.insert(timer);
  }
  uv_timer_start(
      &timer->handle,
      [](uv_timer_t* handle) {
        auto* timer = static_cast<Timer*>(handle->data);
        std::function<void()> fn = std::move(timer->fn);
        close_timer(timer);
        fn();
      },
      uint64_t(std::max<int64_t>(0, delay.count())), 0);
}

void close_timers(uv_loop_t* loop) {
  std::vector<Timer*> closing;
  {
    std::lock_guard<std::mutex> lock(pending().mutex);
    for (Timer* timer : pending().timers)
      if (timer->handle.loop == loop) closing.push_back(timer);
  }
  for (Timer* timer : closing)
    close_timer(timer);
}

}  // namespace retryloop::client
