#include "retryloop/process/stop_signals.hpp"

#include <uv.h>

#include <csignal>

namespace retryloop::process {

struct StopSignals::Handles {
  uv_signal_t sigint{};
  uv_signal_t sigterm{};
  int seen = 0;
  int open = 0;
  bool closing = false;
  /// The StopSignals is gone: the last close callback frees this.
  bool orphaned = false;
  std::function<void(int)> graceful;
  std::function<void()> immediate;
  std::function<void()> on_closed;
};

StopSignals::StopSignals(uv_loop_t* loop, std::function<void(int signum)> graceful,
                         std::function<void()> immediate)
    : handles_(std::make_unique<Handles>()) {
  handles_->graceful = std::move(graceful);
  handles_->immediate = std::move(immediate);
  for (auto [handle, signum] :
       {std::pair{&handles_->sigint, SIGINT}, std::pair{&handles_->sigterm, SIGTERM}}) {
    uv_signal_init(loop, handle);
    handle->data = handles_.get();
    ++handles_->open;
    uv_signal_start(
        handle,
        [](uv_signal_t* h, int number) {
          auto* self = static_cast<Handles*>(h->data);
          if (self->closing) return;
          if (++self->seen == 1) {
            if (self->graceful) self->graceful(number);
          } else if (self->immediate) {
            self->immediate();
          }
        },
        signum);
  }
}

StopSignals::~StopSignals() {
  if (handles_->open == 0) return;
  close();
  handles_->on_closed = nullptr;
  handles_.release()->orphaned = true;  // freed by the last close callback
}

void StopSignals::close(std::function<void()> done) {
  if (handles_->closing) {
    if (done) done();
    return;
  }
  handles_->closing = true;
  handles_->on_closed = std::move(done);
  for (uv_signal_t* handle : {&handles_->sigint, &handles_->sigterm}) {
    uv_close(reinterpret_cast<uv_handle_t*>(handle), [](uv_handle_t* h) {
      auto* self = static_cast<Handles*>(h->data);
      if (--self->open != 0) return;
      if (self->orphaned) {
        delete self;
      } else if (self->on_closed) {
        auto on_closed = std::move(self->on_closed);
        on_closed();
      }
    });
  }
}

}  // namespace retryloop::process
