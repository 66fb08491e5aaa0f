#include "retryloop/consumer/detail/worker_pool.hpp"

#include <thread>

namespace retryloop::consumer::detail {

namespace {

// A worker wakes the loop for what has finished only when the loop has something to do about it
// soon: no job is left to start (the loop must hand over more, or it is the last), enough have
// finished to be worth a wake-up, a job took long (the next may too), or a finished job has
// waited long enough. Otherwise the loop finds them when it wakes anyway (a read from the
// broker, a timer), in its check phase: under load, one wake-up of the loop settles a batch.
constexpr size_t kWakeBatch = 16;
constexpr uint64_t kLongJobNs = 200'000;
constexpr uint64_t kLongestWaitNs = 1'000'000;

}  // namespace

WorkerPool::WorkerPool(uv_loop_t* loop, size_t max_threads)
    : loop_(loop),
      max_threads_(max_threads == 0 ? 1 : max_threads),
      shared_(std::make_shared<Shared>()),
      handle_(new Handle) {
  handle_->shared = shared_;
  handle_->async.data = handle_;
  handle_->check.data = handle_;
  uv_async_init(loop, &handle_->async,
                [](uv_async_t* async) { collect(static_cast<Handle*>(async->data)); });
  uv_check_init(loop, &handle_->check);
  uv_check_start(&handle_->check, [](uv_check_t* check) {
    auto* handle = static_cast<Handle*>(check->data);
    if (handle->shared->unsettled.load(std::memory_order_acquire) != 0) collect(handle);
  });
  uv_unref(reinterpret_cast<uv_handle_t*>(&handle_->check));  // the async keeps the loop alive
  shared_->async = &handle_->async;
}

void WorkerPool::collect(Handle* handle) {
  // Two vectors trade places, so that neither thread allocates for them once they have grown.
  std::vector<Task>& finished = handle->collecting;
  bool closing = false;
  bool closed_and_idle = false;
  {
    std::lock_guard<std::mutex> lock(handle->shared->mutex);
    finished.swap(handle->shared->finished);
    handle->shared->unsettled.store(0, std::memory_order_relaxed);
    closing = handle->shared->closing;
    closed_and_idle = closing && handle->shared->active == 0;
  }
  if (closing) {
    // A closing pool reports nothing more (close() dropped what had finished): what ran while it
    // closed is only destroyed, here on the loop thread.
    finished.clear();
    if (closed_and_idle) finish_close(handle);
    return;
  }
  for (auto& task : finished)
    task.done(true);
  finished.clear();
}

void WorkerPool::post(Job job, Done done) {
  bool start_thread = false;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closing) return;
    shared_->jobs.push_back({std::move(job), std::move(done)});
    if (shared_->idle < shared_->jobs.size() && shared_->threads < max_threads_) {
      ++shared_->threads;
      start_thread = true;
    }
    // A busy worker takes the job when it finishes its own: no wake-up for it.
    wake = shared_->idle > 0;
  }
  if (start_thread) {
    std::thread([shared = shared_] { run_worker(shared); }).detach();
  } else if (wake) {
    shared_->wake.notify_one();
  }
}

size_t WorkerPool::withdraw() {
  std::deque<Task> taken;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    taken.swap(shared_->jobs);
  }
  for (auto& task : taken) {
    task.done(false);
  }
  return taken.size();
}

void WorkerPool::run_worker(const std::shared_ptr<Shared>& shared) {
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (;;) {
    ++shared->idle;
    shared->wake.wait(lock, [&] { return shared->closing || !shared->jobs.empty(); });
    --shared->idle;
    if (shared->closing) break;
    // The task goes back to the loop thread whole, to be destroyed there: what the loop
    // allocated is freed by the loop, not by a worker contending for the loop's malloc arena.
    Task task = std::move(shared->jobs.front());
    shared->jobs.pop_front();
    ++shared->active;
    lock.unlock();
    const uint64_t started_ns = uv_hrtime();
    task.job();
    const uint64_t finished_ns = uv_hrtime();
    lock.lock();
    --shared->active;
    if (shared->active == 0) shared->idle_changed.notify_all();
    if (shared->closing) {
      if (shared->async != nullptr) {
        // The pool still waits for its jobs: the task goes back to be destroyed on the loop
        // thread, with what it holds of the loop's objects (a delivery's breaker call).
        shared->finished.push_back(std::move(task));
        uv_async_send(shared->async);
      } else {
        lock.unlock();
        task = Task{};
        lock.lock();
      }
      break;
    }
    shared->finished.push_back(std::move(task));
    shared->unsettled.store(shared->finished.size(), std::memory_order_release);
    if (shared->finished.size() == 1) shared->first_finished_ns = finished_ns;
    const bool wake = shared->jobs.empty() || shared->finished.size() >= kWakeBatch ||
                      finished_ns - started_ns >= kLongJobNs ||
                      finished_ns - shared->first_finished_ns >= kLongestWaitNs;
    if (wake && shared->async != nullptr) uv_async_send(shared->async);
  }
  --shared->threads;
}

void WorkerPool::close(std::chrono::milliseconds wait, std::function<void()> on_closed) {
  Handle* handle = handle_;
  if (handle == nullptr) return;
  handle_ = nullptr;
  bool idle = false;
  std::deque<Task> dropped;
  std::vector<Task> finished;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->closing = true;
    dropped.swap(shared_->jobs);
    finished.swap(shared_->finished);
    shared_->unsettled.store(0, std::memory_order_relaxed);
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
  // Tasks a worker handed back after the last wake-up are destroyed here, on the loop thread, not
  // with the shared state by whichever thread lets go of it last.
  std::vector<Task> finished;
  {
    std::lock_guard<std::mutex> lock(handle->shared->mutex);
    if (handle->shared->async == nullptr) return;  // already closing
    handle->shared->async = nullptr;
    finished.swap(handle->shared->finished);
  }
  finished.clear();
  auto closed = [](uv_handle_t* h) {
    auto* handle = static_cast<Handle*>(h->data);
    if (--handle->open != 0) return;
    std::function<void()> on_closed = std::move(handle->on_closed);
    delete handle;
    if (on_closed) on_closed();
  };
  handle->open = handle->timer_started ? 3 : 2;
  uv_close(reinterpret_cast<uv_handle_t*>(&handle->async), closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&handle->check), closed);
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
