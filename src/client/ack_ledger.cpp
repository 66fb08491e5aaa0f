#include "retryloop/client/detail/ack_ledger.hpp"

#include <algorithm>

namespace retryloop::client::detail {

bool AckLedger::ack(uint64_t tag, bool multiple) {
  // Once this ack is made, is every tag up to it settled? Then a multiple ack through the
  // highest such tag acks exactly what the application settled.
  const bool joins_held = multiple || tag == settled_through_ + 1;
  note_settled(tag, multiple);
  if (!joins_held) return false;
  held_through_ = std::max(held_through_, tag);
  ++held_;
  return true;
}

void AckLedger::settled_elsewhere(uint64_t tag, bool multiple) {
  note_settled(tag, multiple);
}

std::optional<uint64_t> AckLedger::take_held() {
  if (held_ == 0) return std::nullopt;
  const uint64_t through = held_through_;
  drop_held();
  return through;
}

void AckLedger::drop_held() {
  held_ = 0;
  held_through_ = 0;
}

void AckLedger::note_settled(uint64_t tag, bool multiple) {
  if (multiple) {
    settled_through_ = std::max(settled_through_, tag);
    settled_ahead_.erase(settled_ahead_.begin(), settled_ahead_.upper_bound(settled_through_));
  } else if (tag == settled_through_ + 1) {
    settled_through_ = tag;
  } else if (tag > settled_through_) {
    settled_ahead_.insert(tag);
  }
  while (!settled_ahead_.empty() && *settled_ahead_.begin() == settled_through_ + 1) {
    settled_through_ = *settled_ahead_.begin();
    settled_ahead_.erase(settled_ahead_.begin());
  }
}

}  // namespace retryloop::client::detail
