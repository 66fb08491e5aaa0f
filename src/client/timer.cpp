#include "retryloop/client/timer.hpp"

#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace retryloop::client {

void run_after(uv_loop_t* loop, std::chrono::milliseconds delay, std::function<void()> fn) {
  struct Timer {
    uv_timer_t handle{};
    std::function<void()> fn;
  };
  auto* timer = new Timer{};
  timer->fn = std::move(fn);
  uv_timer_init(loop, &timer->handle);
  timer->handle.data = timer;
  uv_timer_start(
      &timer->handle,
      [](uv_timer_t* handle) {
        auto* timer = static_cast<Timer*>(handle->data);
        std::function<void()> fn = std::move(timer->fn);
        uv_close(reinterpret_cast<uv_handle_t*>(handle),
                 [](uv_handle_t* closed) { delete static_cast<Timer*>(closed->data); });
        fn();
      },
      uint64_t(std::max<int64_t>(0, delay.count())), 0);
}

}  // namespace retryloop::client
