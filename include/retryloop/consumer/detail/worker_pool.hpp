#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace retryloop::consumer::detail {

/// Threads for blocking handlers, started on demand up to a limit. A job runs on a worker
/// thread; its `done` runs afterwards on the loop thread. Jobs start in the order they were
/// posted; a worker that finishes one takes the next without sleeping, and the `done` of the jobs
/// that finished meanwhile run together, when the loop wakes: a worker wakes it only when no job
/// is left, 16 have finished, a job took over 200 µs or one finished over 1 ms ago; otherwise
/// the loop's check phase collects them after its next read. Closing waits, for a bounded time,
/// for the jobs still running; a job still running after that is abandoned: it finishes on its
/// own thread and its `done` never runs, so a stuck handler cannot hold the loop open for ever.
class WorkerPool {
 public:
  using Job = std::function<void()>;
  /// Runs on the loop thread: `started` true after the job ran, false when withdraw() took it
  /// back before a worker started it.
  using Done = std::function<void(bool started)>;

  WorkerPool(uv_loop_t* loop, size_t max_threads);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Queues `job`; its `done` runs on the loop thread once it ran, or when withdraw() takes it.
  void post(Job job, Done done);
  /// Takes back every job that no worker has started yet and runs their `done(false)`, in the
  /// order they were posted, on the calling (loop) thread. Returns how many it took back.
  size_t withdraw();
  /// Takes no more jobs (queued ones are dropped, their `done` never runs), lets idle threads
  /// exit, waits up to `wait` for the running jobs to return, and closes its handles;
  /// `on_closed` runs from the last close callback, on the loop thread. The pool may be
  /// destroyed after that.
  void close(std::chrono::milliseconds wait, std::function<void()> on_closed);

  /// Jobs running now. Any thread.
  size_t running() const;
  /// Blocks the calling thread until no job runs or `timeout` passes; returns whether none
  /// runs. Any thread (jobs never need the loop).
  bool wait_idle(std::chrono::milliseconds timeout) const;

 private:
  struct Task {
    Job job;
    Done done;
  };
  struct Shared {
    mutable std::mutex mutex;
    std::condition_variable wake;
    mutable std::condition_variable idle_changed;
    std::deque<Task> jobs;
    /// Finished tasks, whose `done` the loop runs and whose captures it destroys.
    std::vector<Task> finished;
    /// finished.size(), for the loop's check phase to read without the lock.
    std::atomic<size_t> unsettled{0};
    /// When the oldest of `finished` finished (uv_hrtime).
    uint64_t first_finished_ns = 0;
    bool closing = false;
    size_t threads = 0;
    size_t idle = 0;
    size_t active = 0;
    /// Null once the handle is closing: workers no longer wake the loop.
    uv_async_t* async = nullptr;
  };
  /// Owns the handles until their close callbacks.
  struct Handle {
    uv_async_t async{};
    uv_check_t check{};
    uv_timer_t timer{};
    bool timer_started = false;
    int open = 0;
    std::shared_ptr<Shared> shared;
    std::function<void()> on_closed;
    /// The finished tasks being run, on the loop thread.
    std::vector<Task> collecting;
  };

  static void run_worker(const std::shared_ptr<Shared>& shared);
  /// Runs the `done` of the jobs that finished, on the loop thread.
  static void collect(Handle* handle);
  static void finish_close(Handle* handle);

  uv_loop_t* loop_;
  size_t max_threads_;
  std::shared_ptr<Shared> shared_;
  Handle* handle_;
};

}  // namespace retryloop::consumer::detail
