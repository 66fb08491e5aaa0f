#include "retryloop/move/stamp.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <exception>
#include <memory>
#include <optional>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/retry/headers.hpp"

namespace retryloop::move {

std::string stable_stamp(const amqp::BasicProperties& properties, std::string_view body,
                         std::string_view stamp_header) {
  if (!properties.message_id || properties.message_id->empty()) return {};
  const auto left_out = [stamp_header](std::string_view name) {
    return name == stamp_header || name == retry::header::delivery_count ||
           name == retry::header::acquired_count;
  };
  // A copy of the properties only when a header must be left out.
  std::optional<amqp::BasicProperties> kept;
  if (properties.headers) {
    for (const auto& entry : *properties.headers) {
      if (!left_out(entry.name)) continue;
      kept = properties;
      kept->headers->erase_if(left_out);
      break;
    }
  }
  std::string head = "retryloop stamp 1";
  try {
    amqp::Writer writer(head);
    (kept ? *kept : properties).encode(writer);
    writer.u64(body.size());
  } catch (const std::exception&) {
    return {};
  }
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                        &EVP_MD_CTX_free);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(context.get(), head.data(), head.size()) != 1 ||
      EVP_DigestUpdate(context.get(), body.data(), body.size()) != 1 ||
      EVP_DigestFinal_ex(context.get(), digest, &length) != 1 || length < 16) {
    return {};
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string stamp = "id-";
  for (int i = 0; i < 16; ++i) {
    stamp += hex[digest[i] >> 4];
    stamp += hex[digest[i] & 0xF];
  }
  return stamp;
}

std::optional<StampSet::Key> StampSet::key_of(std::string_view stamp) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(stamp.data(), stamp.size(), digest, &length, EVP_sha256(), nullptr) != 1 ||
      length < 16) {
    return std::nullopt;
  }
  Key key;
  std::memcpy(&key.high, digest, 8);
  std::memcpy(&key.low, digest + 8, 8);
  return key;
}

size_t StampSet::slot_of(const Key& key) const {
  const size_t mask = slots_.size() - 1;
  for (size_t slot = key.low & mask;; slot = (slot + 1) & mask) {
    if (slots_[slot] == key || slots_[slot] == Key{}) return slot;
  }
}

bool StampSet::insert(std::string_view stamp) {
  const std::optional<Key> found = key_of(stamp);
  if (!found) return true;  // kept as new: a duplicate may stay, no message is dropped
  const Key& key = *found;
  if (key == Key{}) {
    if (zero_) return false;
    zero_ = true;
    ++size_;
    return true;
  }
  if ((size_ + 1) * 4 > slots_.size() * 3) grow();
  Key& slot = slots_[slot_of(key)];
  if (slot == key) return false;
  slot = key;
  ++size_;
  return true;
}

void StampSet::grow() {
  std::vector<Key> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Key{});
  for (const Key& key : old) {
    if (!(key == Key{})) slots_[slot_of(key)] = key;
  }
}

}  // namespace retryloop::move
