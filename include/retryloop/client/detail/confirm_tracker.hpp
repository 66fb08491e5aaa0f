#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "retryloop/client/error.hpp"
#include "retryloop/client/publish.hpp"

namespace retryloop::client::detail {

/// What a basic.return is matched against: exchange, routing key, body and the encoded
/// properties, each with its length in front, so that no two different messages share one. The
/// properties come last, so that the rest can be compared alone.
std::string publish_identity(std::string_view exchange, std::string_view routing_key,
                             std::string_view properties, std::string_view body);

/// The publishes of a confirm-mode channel that await their confirms, with no socket: the
/// bookkeeping behind Channel::publish, basic.return and basic.ack / basic.nack.
class ConfirmTracker {
 public:
  /// Callbacks to call, in publish order, with their outcomes.
  using Ready = std::vector<std::pair<PublishCallback, PublishOutcome>>;

  /// Tracks the next publish and returns its sequence number. A mandatory publish gives its
  /// publish_identity, which a return of it matches.
  uint64_t add(PublishCallback callback, bool mandatory, std::string identity = {});

  /// A basic.return, whose exchange, routing key, body and properties make `identity` (the
  /// properties are its last `properties_size` bytes, plus their length). The broker returns
  /// before it acks, in publish order: the oldest unconfirmed mandatory publish with this
  /// identity, not yet returned, is marked returned with `error`; failing one, the oldest whose
  /// identity matches but for the properties (should the broker re-encode them). False when none
  /// matches.
  bool returned(const std::string& identity, size_t properties_size, Error error);

  /// A basic.ack (`ack`) or basic.nack for `tag`, and with `multiple` every earlier one: their
  /// callbacks and outcomes (acked, returned or nacked). nullopt when `tag` is not awaited.
  std::optional<Ready> confirm(uint64_t tag, bool multiple, bool ack);

  /// The channel ended: every publish still awaited fails with `reason`.
  Ready fail_all(const Error& reason);

  uint64_t next_sequence() const { return next_sequence_; }
  size_t unconfirmed() const { return unconfirmed_; }

 private:
  struct Pending {
    PublishCallback callback;
    std::string identity;
    bool mandatory = false;
    bool returned = false;
    bool settled = false;
    Error return_error;
  };

  uint64_t next_sequence_ = 1;
  uint64_t first_sequence_ = 1;
  size_t unconfirmed_ = 0;
  std::deque<Pending> pending_;
};

}  // namespace retryloop::client::detail
