#pragma once

#include <cstdint>
#include <functional>

#include "retryloop/client/error.hpp"

namespace retryloop::client {

/// How a publish on a confirm-mode channel ended.
enum class PublishStatus {
  acked,     ///< the broker took responsibility (routed, or unroutable without mandatory)
  returned,  ///< mandatory and unroutable: returned, then acked; the message is NOT stored
  nacked,    ///< the broker refused it (for example a queue at max length with reject-publish)
  failed,    ///< the channel or connection ended before the broker answered: outcome unknown
};

struct PublishOutcome {
  PublishStatus status = PublishStatus::failed;
  uint64_t sequence = 0;
  /// For `returned`: the broker's reply (312 NO_ROUTE). For `failed`: why the channel ended.
  Error error;
  /// True only for `acked`: confirmed, and not returned.
  bool ok() const { return status == PublishStatus::acked; }
};
using PublishCallback = std::function<void(const PublishOutcome&)>;

}  // namespace retryloop::client
