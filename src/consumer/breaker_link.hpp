#pragma once

#include <spdlog/logger.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "retryloop/client/connection.hpp"
#include "retryloop/outage/coordinator.hpp"

namespace retryloop::consumer::detail {

/// What a breaker link tells its consumer. Nothing fires after `failed` or close().
struct BreakerLinkEvents {
  /// Set up: signals and tokens come from now on; `last` is the state queue's newest signal.
  std::function<void(const std::optional<outage::Signal>& last)> joined;
  std::function<void(const outage::Signal& signal)> signal;
  std::function<void(uint64_t delivery_tag, const std::optional<outage::Token>& token)> token;
  /// The link cannot go on (its channel closed, a declaration refused).
  std::function<void(const client::Error& error)> failed;
};

/// The broker's side of a consumer's outage::Coordinator, on a channel of its own on the consume
/// connection: declares the shared breaker's objects, binds a queue of this instance's own
/// (server-named, exclusive) to the breaker exchange, reads the state queue, then consumes the
/// signals and the probe tokens (prefetch 1, acked by ack_token). Publishing goes through the
/// consumer's publish channel, so that a blocked publisher never stalls this connection.
class BreakerLink : public std::enable_shared_from_this<BreakerLink> {
 public:
  static std::shared_ptr<BreakerLink> start(const std::shared_ptr<client::Connection>& connection,
                                            std::string service,
                                            std::shared_ptr<spdlog::logger> logger,
                                            BreakerLinkEvents events);
  /// The token's outage is over, or it is one too many.
  void ack_token(uint64_t delivery_tag);
  /// Hands the token on to the next instance in line (outage::Actions::pass_token): cancels the
  /// token consumer, requeues the token, and consumes the token queue again.
  void pass_token(uint64_t delivery_tag);
  /// Closes its channel (the broker gives a held token to another instance); no event after.
  void close();

 private:
  BreakerLink(std::string service, std::shared_ptr<spdlog::logger> logger,
              BreakerLinkEvents events);
  template <class Next>
  auto guarded(Next next);
  void fail(const client::Error& error);
  void declare();
  void bind_own_queue();
  void read_state();
  void consume_signals(const std::optional<outage::Signal>& last);
  void consume_tokens(const std::optional<outage::Signal>& last);
  /// Subscribes to the token queue; `subscribed` runs once the broker said so.
  void subscribe_tokens(std::function<void(BreakerLink& self)> subscribed);
  /// Consumes the instances queue, so that `retryloop service status` counts this instance.
  void count_in(const std::optional<outage::Signal>& last);
  void on_signal(client::Delivery&& delivery);
  void on_token(client::Delivery&& delivery);

  std::string service_;
  std::shared_ptr<spdlog::logger> logger_;
  BreakerLinkEvents events_;
  uv_loop_t* loop_ = nullptr;
  std::shared_ptr<client::Channel> channel_;
  std::string own_queue_;
  std::string token_consumer_;
  bool ended_ = false;
};

}  // namespace retryloop::consumer::detail
