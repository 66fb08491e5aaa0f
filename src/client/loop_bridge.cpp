#include "retryloop/console/detail/loop_bridge.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

namespace retryloop::console::detail {

struct LoopBridge::Call {
  enum class State { queued, started, answered, abandoned };
  std::function<Reply()> task;
  State state = State::queued;
  std::optional<Reply> reply;
};

struct LoopBridge::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::shared_ptr<Call>> calls;
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
  std::deque<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(shared->mutex);
    calls.swap(shared->calls);
  }
  for (auto& call : calls) {
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (call->state == Call::State::abandoned) continue;
      call->state = Call::State::started;
    }
    Reply reply;
    try {
      reply = call->task();
    } catch (...) {
      reply = Reply{500, R"({"error": "internal error"})"};
    }
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      call->reply = std::move(reply);
      call->state = Call::State::answered;
    }
    shared->changed.notify_all();
  }
}

std::optional<Reply> LoopBridge::call(std::function<Reply()> task,
                                      std::chrono::milliseconds timeout) {
  auto call = std::make_shared<Call>();
  call->task = std::move(task);
  std::unique_lock<std::mutex> lock(shared_->mutex);
  if (shared_->closed) return std::nullopt;
  shared_->calls.push_back(call);
  uv_async_send(&shared_->async);
  const bool started =
      shared_->changed.wait_for(lock, timeout, [&] { return call->state != Call::State::queued; });
  if (!started) {
    call->state = Call::State::abandoned;
    return std::nullopt;
  }
  shared_->changed.wait(lock, [&] {
    return call->state == Call::State::answered || call->state == Call::State::abandoned;
  });
  return std::move(call->reply);
}

void LoopBridge::close() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed) return;
    shared_->closed = true;
    for (auto& call : shared_->calls)
      call->state = Call::State::abandoned;
    shared_->calls.clear();
  }
  shared_->changed.notify_all();
  uv_close(reinterpret_cast<uv_handle_t*>(&shared_->async), [](uv_handle_t* handle) {
    std::shared_ptr<Shared> last = std::move(static_cast<Shared*>(handle->data)->self);
  });
}

}  // namespace retryloop::console::detail
