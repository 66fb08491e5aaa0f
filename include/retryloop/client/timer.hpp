#pragma once

#include <chrono>
#include <functional>

#include "retryloop/client/loop.hpp"

namespace retryloop::client {

/// Runs `fn` once on `loop`'s thread after `delay` (0 or less: on the loop's next turn). The
/// timer frees itself after it fired; it keeps the loop alive until then. Call it on the loop's
/// thread. `fn` must check that what it works on still lives (hold a weak_ptr).
void run_after(uv_loop_t* loop, std::chrono::milliseconds delay, std::function<void()> fn);

/// Closes the timers run_after started on `loop` that have not fired, without running them, and
/// frees them once the loop runs their close. For a program that tears its loop down by closing
/// every handle (uv_walk): call it first, on the loop's thread, or their memory is lost.
void close_timers(uv_loop_t* loop);

}  // namespace retryloop::client
