#include "worker_pool.hpp"

#include <thread>

namespace retryloop::consumer::detail {

WorkerPool::WorkerPool(uv_loop_t* loop, size_t max_threads)
    : max_threads_(max_threads == 0 ? 1 : max_threads),
      shared_(std::make_shared<Shared>()),
      handle_(new Handle) {
  handle_->shared = shared_;
  handle_->async.data = handle_;
  uv_async_init(loop, &handle_->async, [](uv_async_t* async) {
    auto* handle = static_cast<Handle*>(async->data);
    std::vector<Done> finished;
    {
      std::lock_guard<std::mutex> lock(handle->shared->mutex);
      finished.swap(handle->shared->finished);
    }
    for (auto& done : finished)
      done();
  });
  shared_->async = &handle_->async;
}

void WorkerPool::post(Job job, Done done) {
  bool start_thread = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closing) return;
    shared_->jobs.emplace_back(std::move(job), std::move(done));
    if (shared_->idle < shared_->jobs.size() && shared_->threads < max_threads_) {
      ++shared_->threads;
      start_thread = true;
    }
  }
  if (start_thread) {
    std::thread([shared = shared_] { run_worker(shared); }).detach();
  } else {
    shared_->wake.notify_one();
  }
}

void WorkerPool::run_worker(const std::shared_ptr<Shared>& shared) {
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (;;) {
    ++shared->idle;
    shared->wake.wait(lock, [&] { return shared->closing || !shared->jobs.empty(); });
    --shared->idle;
    if (shared->closing) break;
    auto [job, done] = std::move(shared->jobs.front());
    shared->jobs.pop_front();
    lock.unlock();
    job();
    lock.lock();
    if (shared->closing) break;
    shared->finished.push_back(std::move(done));
    uv_async_send(shared->async);  // safe: the handle is closed only after `closing` is set
  }
  --shared->threads;
}

void WorkerPool::close(std::function<void()> on_closed) {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closing) return;
    shared_->closing = true;
    shared_->jobs.clear();
    shared_->finished.clear();
    shared_->async = nullptr;
  }
  shared_->wake.notify_all();
  handle_->on_closed = std::move(on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&handle_->async), [](uv_handle_t* h) {
    auto* handle = static_cast<Handle*>(h->data);
    std::function<void()> on_closed = std::move(handle->on_closed);
    delete handle;
    if (on_closed) on_closed();
  });
  handle_ = nullptr;
}

}  // namespace retryloop::consumer::detail
