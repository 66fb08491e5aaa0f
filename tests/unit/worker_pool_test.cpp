// The consumer's worker pool on a real libuv loop: one thread runs its jobs one at a time in the
// order posted, several never run more at once than they are, finished jobs are collected on the
// loop thread, and jobs that no worker has started can be taken back.

#include <uv.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "retryloop/consumer/detail/worker_pool.hpp"

using retryloop::consumer::detail::WorkerPool;
using namespace std::chrono_literals;

namespace {

/// A loop of its own; run_until turns it until `done` or 10 s.
struct Loop {
  uv_loop_t loop{};
  Loop() { uv_loop_init(&loop); }
  ~Loop() {
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
  }
  template <typename Done>
  bool run_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      uv_run(&loop, UV_RUN_NOWAIT);
      std::this_thread::sleep_for(100us);
    }
    return true;
  }
  void close(WorkerPool& pool) {
    bool closed = false;
    pool.close(5s, [&] { closed = true; });
    REQUIRE(run_until([&] { return closed; }));
  }
};

/// Holds jobs until opened.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    changed.notify_all();
  }
};

}  // namespace

TEST_CASE("A one-thread pool runs its jobs one at a time in the order posted, done on the loop",
          "[worker-pool]") {
  Loop l;
  WorkerPool pool(&l.loop, 1);
  const auto loop_thread = std::this_thread::get_id();
  std::atomic<int> active{0};
  std::atomic<int> most_at_once{0};
  std::mutex mutex;
  std::vector<int> ran;
  std::vector<int> finished;
  bool done_off_loop = false;
  bool told_not_started = false;
  const int jobs = 500;
  for (int k = 0; k < jobs; ++k) {
    pool.post(
        [&, k] {
          const int now = ++active;
          if (now > most_at_once) most_at_once = now;
          {
            std::lock_guard<std::mutex> lock(mutex);
            ran.push_back(k);
          }
          --active;
        },
        [&, k](bool started) {
          if (std::this_thread::get_id() != loop_thread) done_off_loop = true;
          if (!started) told_not_started = true;
          finished.push_back(k);
        });
  }
  REQUIRE(l.run_until([&] { return finished.size() == size_t(jobs); }));
  CHECK(most_at_once == 1);
  CHECK_FALSE(done_off_loop);
  CHECK_FALSE(told_not_started);
  std::vector<int> in_order(jobs);
  for (int k = 0; k < jobs; ++k)
    in_order[size_t(k)] = k;
  CHECK(ran == in_order);
  CHECK(finished == in_order);
  l.close(pool);
}

TEST_CASE("A pool of several threads runs every job once, at most that many at once",
          "[worker-pool]") {
  Loop l;
  WorkerPool pool(&l.loop, 4);
  std::atomic<int> active{0};
  std::atomic<int> most_at_once{0};
  std::vector<std::atomic<int>> runs(200);
  int finished = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    pool.post(
        [&, k] {
          const int now = ++active;
          if (now > most_at_once) most_at_once = now;
          ++runs[k];
          std::this_thread::sleep_for(200us);
          --active;
        },
        [&](bool started) { finished += started ? 1 : 0; });
  }
  REQUIRE(l.run_until([&] { return finished == int(runs.size()); }));
  CHECK(most_at_once <= 4);
  for (const auto& count : runs)
    CHECK(count == 1);
  l.close(pool);
}

TEST_CASE("withdraw takes back the jobs no worker started, in order, and the running one finishes",
          "[worker-pool]") {
  Loop l;
  WorkerPool pool(&l.loop, 1);
  Gate gate;
  std::atomic<bool> first_running{false};
  std::vector<int> done;
  std::vector<int> withdrawn;
  std::atomic<int> ran{0};
  for (int k = 0; k < 10; ++k) {
    pool.post(
        [&, k] {
          if (k == 0) {
            first_running = true;
            gate.wait();
          }
          ++ran;
        },
        [&, k](bool started) { (started ? done : withdrawn).push_back(k); });
  }
  REQUIRE(l.run_until([&] { return first_running.load(); }));
  CHECK(pool.withdraw() == 9);
  CHECK(withdrawn == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(pool.running() == 1);
  gate.release();
  REQUIRE(l.run_until([&] { return done.size() == 1; }));
  CHECK(done == std::vector<int>{0});
  CHECK(ran == 1);
  CHECK(pool.withdraw() == 0);
  // The pool goes on taking jobs after a withdraw.
  pool.post([&] { ++ran; }, [&](bool started) { (started ? done : withdrawn).push_back(10); });
  REQUIRE(l.run_until([&] { return done.size() == 2; }));
  CHECK(ran == 2);
  l.close(pool);
}
