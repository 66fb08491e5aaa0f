#include "loop_bridge.hpp"

#include <future>
#include <utility>

namespace retryloop::console::detail {

struct LoopBridge::Shared {
  std::mutex mutex;
  /// Each task's promise is kept apart, so that a task dropped at close still answers.
  struct Task {
    std::function<Reply()> run;
    std::shared_ptr<std::promise<std::optional<Reply>>> reply;
  };
  std::deque<Task> tasks;
  bool closed = false;
  uv_async_t async{};
  /// Keeps this alive until the handle's close callback.
  std::shared_ptr<Shared> self;
};

LoopBridge::LoopBridge(uv_loop_t* loop) : shared_(std::make_shared<Shared>()) {
  uv_async_init(loop, &shared_->async, &LoopBridge::on_async);
  shared_->async.data = shared_.get();
  shared_->self = shared_;
}

void LoopBridge::on_async(uv_async_t* async) {
  auto* shared = static_cast<Shared*>(async->data);
  std::deque<Shared::Task> tasks;
  {
    std::lock_guard<std::mutex> lock(shared->mutex);
    tasks.swap(shared->tasks);
  }
  for (auto& task : tasks) {
    try {
      task.reply->set_value(task.run());
    } catch (...) {
      task.reply->set_value(Reply{500, R"({"error": "internal error"})"});
    }
  }
}

std::optional<Reply> LoopBridge::call(std::function<Reply()> task,
                                      std::chrono::milliseconds timeout) {
  auto reply = std::make_shared<std::promise<std::optional<Reply>>>();
  std::future<std::optional<Reply>> future = reply->get_future();
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed) return std::nullopt;
    shared_->tasks.push_back({std::move(task), reply});
    uv_async_send(&shared_->async);
  }
  if (future.wait_for(timeout) != std::future_status::ready) return std::nullopt;
  return future.get();
}

void LoopBridge::close() {
  std::deque<Shared::Task> dropped;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed) return;
    shared_->closed = true;
    dropped.swap(shared_->tasks);
  }
  for (auto& task : dropped)
    task.reply->set_value(std::nullopt);
  uv_close(reinterpret_cast<uv_handle_t*>(&shared_->async), [](uv_handle_t* handle) {
    std::shared_ptr<Shared> last = std::move(static_cast<Shared*>(handle->data)->self);
  });
}

}  // namespace retryloop::console::detail
