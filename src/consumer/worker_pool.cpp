#include "worker_pool.hpp"

#include <thread>

namespace retryloop::consumer::detail {

WorkerPool::WorkerPool(uv_loop_t* loop, size_t max_threads)
    : loop_(loop),
      max_threads_(max_threads == 0 ? 1 : max_threads),
      shared_(std::make_shared<Shared>()),
      handle_(new Handle) {
  handle_->shared = shared_;
  handle_->async.data = handle_;
  uv_async_init(loop, &handle_->async, [](uv_async_t* async) {
    auto* handle = static_cast<Handle*>(async->data);
    std::vector<Done> finished;
    bool closed_and_idle = false;
    {
      std::lock_guard<std::mutex> lock(handle->shared->mutex);
      finished.swap(handle->shared->finished);
      closed_and_idle = handle->shared->closing && handle->shared->active == 0;
    }
    if (closed_and_idle) return finish_close(handle);
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
    ++shared->active;
    lock.unlock();
    job();
    job = nullptr;  // what it holds is released here, not after the loop has moved on
    lock.lock();
    --shared->active;
    if (shared->active == 0) shared->idle_changed.notify_all();
    if (shared->closing) {
      lock.unlock();
      done = nullptr;
      lock.lock();
      // Tells a closing pool that waits for its jobs; null once it has stopped waiting.
      if (shared->async != nullptr) uv_async_send(shared->async);
      break;
    }
    shared->finished.push_back(std::move(done));
    if (shared->async != nullptr) uv_async_send(shared->async);
  }
  --shared->threads;
}

void WorkerPool::close(std::chrono::milliseconds wait, std::function<void()> on_closed) {
  Handle* handle = handle_;
  if (handle == nullptr) return;
  handle_ = nullptr;
  bool idle = false;
  std::deque<std::pair<Job, Done>> dropped;
  std::vector<Done> finished;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->closing = true;
    dropped.swap(shared_->jobs);
    finished.swap(shared_->finished);
    idle = shared_->active == 0;
  }
  shared_->wake.notify_all();
  handle->on_closed = std::move(on_closed);
  if (idle || wait.count() <= 0) return finish_close(handle);
  uv_timer_init(loop_, &handle->timer);
  handle->timer.data = handle;
  handle->timer_started = true;
  uv_timer_start(
      &handle->timer, [](uv_timer_t* timer) { finish_close(static_cast<Handle*>(timer->data)); },
      uint64_t(wait.count()), 0);
}

void WorkerPool::finish_close(Handle* handle) {
  {
    std::lock_guard<std::mutex> lock(handle->shared->mutex);
    if (handle->shared->async == nullptr) return;  // already closing
    handle->shared->async = nullptr;
  }
  auto closed = [](uv_handle_t* h) {
    auto* handle = static_cast<Handle*>(h->data);
    if (--handle->open != 0) return;
    std::function<void()> on_closed = std::move(handle->on_closed);
    delete handle;
    if (on_closed) on_closed();
  };
  handle->open = handle->timer_started ? 2 : 1;
  uv_close(reinterpret_cast<uv_handle_t*>(&handle->async), closed);
  if (handle->timer_started) uv_close(reinterpret_cast<uv_handle_t*>(&handle->timer), closed);
}

size_t WorkerPool::running() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->active;
}

bool WorkerPool::wait_idle(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  return shared_->idle_changed.wait_for(lock, timeout, [&] { return shared_->active == 0; });
}

}  // namespace retryloop::consumer::detail
