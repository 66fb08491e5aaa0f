#pragma once

#include <uv.h>

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
/// thread; its `done` runs afterwards on the loop thread. Closing abandons jobs still running:
/// they finish on their own thread and their `done` never runs, so a stuck handler cannot hold
/// the loop open.
class WorkerPool {
 public:
  using Job = std::function<void()>;
  using Done = std::function<void()>;

  WorkerPool(uv_loop_t* loop, size_t max_threads);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void post(Job job, Done done);
  /// Takes no more jobs, lets idle threads exit, and closes the wake-up handle; `on_closed`
  /// runs from its close callback. The pool may be destroyed after that.
  void close(std::function<void()> on_closed);

 private:
  struct Shared {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::pair<Job, Done>> jobs;
    std::vector<Done> finished;
    bool closing = false;
    size_t threads = 0;
    size_t idle = 0;
    uv_async_t* async = nullptr;
  };
  /// Owns the async handle until its close callback.
  struct Handle {
    uv_async_t async{};
    std::shared_ptr<Shared> shared;
    std::function<void()> on_closed;
  };

  static void run_worker(const std::shared_ptr<Shared>& shared);

  size_t max_threads_;
  std::shared_ptr<Shared> shared_;
  Handle* handle_;
};

}  // namespace retryloop::consumer::detail
