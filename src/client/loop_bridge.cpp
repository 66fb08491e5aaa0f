#include "retryloop/client/loop_bridge.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

namespace retryloop::client {

struct LoopBridge::Task {
  enum class State { queued, started, ended, abandoned };
  std::function<void()> run;
  /// A call, whose caller waits; else a post.
  bool waited = false;
  State state = State::queued;
};

struct LoopBridge::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::shared_ptr<Task>> tasks;
  bool refusing_calls = false;
  bool closed = false;
  uv_async_t async{};
  std::function<void()> on_closed;
  /// Keeps this alive until the handle's close callback.
  std::shared_ptr<Shared> self;

  /// Under `mutex`: every queued call is abandoned (its caller gets false).
  void abandon_calls() {
    for (auto& task : tasks) {
      if (task->waited) task->state = Task::State::abandoned;
    }
  }
};

LoopBridge::LoopBridge(uv_loop_t* loop) : shared_(std::make_shared<Shared>()) {
  uv_async_init(loop, &shared_->async, &LoopBridge::on_async);
  shared_->async.data = shared_.get();
  shared_->self = shared_;
}

void LoopBridge::on_async(uv_async_t* async) {
  auto* shared = static_cast<Shared*>(async->data);
  std::deque<std::shared_ptr<Task>> tasks;
  {
    std::lock_guard<std::mutex> lock(shared->mutex);
    tasks.swap(shared->tasks);
  }
  for (auto& task : tasks) {
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (task->state == Task::State::abandoned) continue;
      if (shared->closed) {  // closed by an earlier task of this batch: its caller gets false
        task->state = Task::State::abandoned;
        shared->changed.notify_all();
        continue;
      }
      task->state = Task::State::started;
    }
    try {
      task->run();
    } catch (...) {  // documented: a task's exception ends it
    }
    if (!task->waited) continue;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      task->state = Task::State::ended;
    }
    shared->changed.notify_all();
  }
}

bool LoopBridge::call(std::function<void()> run, std::chrono::milliseconds timeout) {
  auto task = std::make_shared<Task>();
  task->run = std::move(run);
  task->waited = true;
  std::unique_lock<std::mutex> lock(shared_->mutex);
  if (shared_->closed || shared_->refusing_calls) return false;
  shared_->tasks.push_back(task);
  uv_async_send(&shared_->async);
  const bool started =
      shared_->changed.wait_for(lock, timeout, [&] { return task->state != Task::State::queued; });
  if (!started) {
    task->state = Task::State::abandoned;
    return false;
  }
  shared_->changed.wait(lock, [&] {
    return task->state == Task::State::ended || task->state == Task::State::abandoned;
  });
  return task->state == Task::State::ended;
}

bool LoopBridge::post(std::function<void()> run) {
  auto task = std::make_shared<Task>();
  task->run = std::move(run);
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->closed) return false;
  shared_->tasks.push_back(std::move(task));
  uv_async_send(&shared_->async);
  return true;
}

void LoopBridge::refuse_calls() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->refusing_calls = true;
    shared_->abandon_calls();
  }
  shared_->changed.notify_all();
}

void LoopBridge::close(std::function<void()> closed) {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed) return;
    shared_->closed = true;
    shared_->abandon_calls();
    shared_->tasks.clear();
  }
  shared_->changed.notify_all();
  shared_->on_closed = std::move(closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&shared_->async), [](uv_handle_t* handle) {
    std::shared_ptr<Shared> last = std::move(static_cast<Shared*>(handle->data)->self);
    auto on_closed = std::move(last->on_closed);
    if (on_closed) on_closed();
  });
}

}  // namespace retryloop::client
