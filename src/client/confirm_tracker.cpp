#include "retryloop/client/detail/confirm_tracker.hpp"

namespace retryloop::client::detail {

std::string publish_identity(std::string_view exchange, std::string_view routing_key,
                             std::string_view properties, std::string_view body) {
  std::string identity;
  identity.reserve(32 + exchange.size() + routing_key.size() + properties.size() + body.size());
  for (std::string_view part : {exchange, routing_key, body, properties}) {
    const uint64_t size = part.size();
    identity.append(reinterpret_cast<const char*>(&size), sizeof size);
    identity.append(part);
  }
  return identity;
}

uint64_t ConfirmTracker::add(PublishCallback callback, bool mandatory, std::string identity) {
  Pending pending;
  pending.callback = std::move(callback);
  pending.mandatory = mandatory;
  if (mandatory) pending.identity = std::move(identity);
  pending_.push_back(std::move(pending));
  ++unconfirmed_;
  return next_sequence_++;
}

bool ConfirmTracker::returned(const std::string& identity, size_t properties_size, Error error) {
  const size_t length_size = sizeof(uint64_t);
  const size_t without_properties = identity.size() >= properties_size + length_size
                                        ? identity.size() - properties_size - length_size
                                        : identity.size();
  Pending* match = nullptr;
  Pending* same_but_properties = nullptr;
  for (auto& pending : pending_) {
    if (pending.settled || !pending.mandatory || pending.returned) continue;
    if (pending.identity == identity) {
      match = &pending;
      break;
    }
    if (same_but_properties == nullptr &&
        pending.identity.compare(0, without_properties, identity, 0, without_properties) == 0) {
      same_but_properties = &pending;
    }
  }
  if (match == nullptr) match = same_but_properties;
  if (match == nullptr) return false;
  match->returned = true;
  match->identity = std::string();
  match->return_error = std::move(error);
  return true;
}

std::optional<ConfirmTracker::Ready> ConfirmTracker::confirm(uint64_t tag, bool multiple,
                                                             bool ack) {
  if (tag < first_sequence_ || tag >= next_sequence_) return std::nullopt;
  Ready ready;
  for (uint64_t seq = multiple ? first_sequence_ : tag; seq <= tag; ++seq) {
    Pending& pending = pending_[seq - first_sequence_];
    if (pending.settled) continue;
    pending.settled = true;
    pending.identity = std::string();
    --unconfirmed_;
    PublishOutcome outcome;
    outcome.sequence = seq;
    if (!ack) {
      outcome.status = PublishStatus::nacked;
    } else if (pending.returned) {
      outcome.status = PublishStatus::returned;
      outcome.error = std::move(pending.return_error);
    } else {
      outcome.status = PublishStatus::acked;
    }
    if (pending.callback) ready.emplace_back(std::move(pending.callback), std::move(outcome));
  }
  while (!pending_.empty() && pending_.front().settled) {
    pending_.pop_front();
    ++first_sequence_;
  }
  return ready;
}

ConfirmTracker::Ready ConfirmTracker::fail_all(const Error& reason) {
  Ready ready;
  uint64_t seq = first_sequence_;
  for (auto& pending : pending_) {
    const uint64_t sequence = seq++;
    if (pending.settled || !pending.callback) continue;
    PublishOutcome outcome;
    outcome.status = PublishStatus::failed;
    outcome.sequence = sequence;
    outcome.error = reason;
    ready.emplace_back(std::move(pending.callback), std::move(outcome));
  }
  pending_.clear();
  first_sequence_ = next_sequence_;
  unconfirmed_ = 0;
  return ready;
}

}  // namespace retryloop::client::detail
