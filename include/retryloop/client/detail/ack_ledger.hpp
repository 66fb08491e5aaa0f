#pragma once

#include <cstdint>
#include <optional>
#include <set>

namespace retryloop::client::detail {

/// Which acks a channel sends, with no socket: the bookkeeping behind Channel::ack.
///
/// Acks are held back and sent as one `multiple` ack when that acks exactly what the application
/// settled: an ack joins the held one only while every delivery tag up to it is settled (acked,
/// nacked or rejected). Any other ack is sent at once, on its own.
class AckLedger {
 public:
  /// The application acks `tag` (and every tag up to it, with `multiple`). True: it joins the
  /// held ack; false: send a single ack for `tag` now.
  bool ack(uint64_t tag, bool multiple);
  /// A nack or a reject of `tag` (every tag up to it, with `multiple`) was sent.
  void settled_elsewhere(uint64_t tag, bool multiple);
  /// The held ack, as the tag a `multiple` ack must name, and forgets it; nullopt when none is
  /// held.
  std::optional<uint64_t> take_held();
  /// How many acks the held ack stands for.
  uint32_t held() const { return held_; }
  /// The channel ended: the broker requeues what the held ack stood for.
  void drop_held();

 private:
  void note_settled(uint64_t tag, bool multiple);

  /// Every delivery tag up to this one is settled; those above it settled out of order.
  uint64_t settled_through_ = 0;
  std::set<uint64_t> settled_ahead_;
  uint64_t held_through_ = 0;
  uint32_t held_ = 0;
};

}  // namespace retryloop::client::detail
