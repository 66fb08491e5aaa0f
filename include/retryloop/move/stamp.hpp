#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/amqp/properties.hpp"

namespace retryloop::move {

/// A name for a message that is the same each time the message is read, for a stamp that a rerun
/// of a killed move gives its copy again: "id-" and 32 hex digits, the first 128 bits of the
/// SHA-256 of its message id, its other properties and headers, and its body. The broker's
/// redelivery counts (`x-delivery-count`, `x-acquired-count`), which a quorum queue adds when a
/// killed move's deliveries return, are left out, and so is the header `stamp_header`.
///
/// Empty for a message without a message id: two such messages may have the same bytes, and a
/// stamp made of the bytes alone would take them for one. Two messages with the same id and the
/// same bytes are one message to it, as they are to an inbox. Empty too when the properties
/// cannot be encoded.
std::string stable_stamp(const amqp::BasicProperties& properties, std::string_view body,
                         std::string_view stamp_header);

/// The stamps a move has copied, to drop a second copy of a message. Each stamp is kept as the
/// first 128 bits of its SHA-256, in an open-addressed table at most three quarters full: 21 to 43
/// bytes a stamp, whatever its length, where a set of the texts took about 130 (a migration of
/// 1,000,000 messages kept 160 MB). Two stamps are taken for one only when those 128 bits agree,
/// which among 10^9 stamps happens with a probability below 10^-20.
class StampSet {
 public:
  /// Adds `stamp`; false when it was there already.
  bool insert(std::string_view stamp);
  size_t size() const { return size_; }
  /// Bytes the table holds.
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Key); }

 private:
  struct Key {
    uint64_t high = 0;
    uint64_t low = 0;
    bool operator==(const Key& other) const { return high == other.high && low == other.low; }
  };
  /// The first 128 bits of the stamp's SHA-256; nullopt only when OpenSSL cannot compute it, and
  /// then the stamp counts as new (a second copy may stay; none is ever dropped).
  static std::optional<Key> key_of(std::string_view stamp);
  /// The slot that holds `key`, or the free slot where it goes; `slots_` is never full.
  size_t slot_of(const Key& key) const;
  void grow();

  /// {0, 0} marks a free slot; a stamp whose key is {0, 0} is `zero_` instead.
  std::vector<Key> slots_;
  size_t size_ = 0;
  bool zero_ = false;
};

}  // namespace retryloop::move
