// The bridge that hands work from other threads to the loop thread.

#include <uv.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "retryloop/client/loop_bridge.hpp"

using namespace std::chrono_literals;
using retryloop::client::LoopBridge;

TEST_CASE("A call that timed out waiting for the loop never runs, and one that ran is waited for",
          "[client]") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  std::atomic<int> runs{0};
  {
    LoopBridge bridge(&loop);
    // The loop is busy elsewhere: the wait times out, and the task must then never run.
    CHECK_FALSE(bridge.call([&] { ++runs; }, 50ms));
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(runs == 0);

    bool answered = false;
    std::thread caller([&] { answered = bridge.call([&] { runs += 10; }, 10s); });
    while (runs == 0)
      uv_run(&loop, UV_RUN_NOWAIT);
    caller.join();
    CHECK(answered);
    CHECK(runs == 10);

    // A task that throws still ends its call.
    answered = false;
    std::atomic<bool> thrown_call_ended{false};
    std::thread thrower(
        [&] { thrown_call_ended = bridge.call([] { throw std::runtime_error("x"); }, 10s); });
    while (!thrown_call_ended)
      uv_run(&loop, UV_RUN_NOWAIT);
    thrower.join();

    bridge.close();
    CHECK_FALSE(bridge.call([] {}, 10s));
    CHECK_FALSE(bridge.post([] {}));
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE(
    "Refusing calls abandons queued ones at once and still takes posts, and close runs its "
    "callback once the handle is closed",
    "[client]") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    LoopBridge bridge(&loop);
    std::atomic<bool> waiting{false};
    bool answered = true;
    int ran = 0;
    std::thread caller([&] {
      waiting = true;
      answered = bridge.call([&] { ++ran; }, 10s);
    });
    while (!waiting)
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);  // the call is queued, the loop not yet run
    bridge.refuse_calls();
    caller.join();  // returns at once, not after 10 s
    CHECK_FALSE(answered);
    CHECK_FALSE(bridge.call([&] { ++ran; }, 10s));

    std::thread poster([&] { CHECK(bridge.post([&] { ran += 100; })); });
    poster.join();
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(ran == 100);

    bool closed = false;
    bridge.close([&] { closed = true; });
    CHECK_FALSE(closed);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(closed);
  }
  CHECK(uv_loop_close(&loop) == 0);
}
