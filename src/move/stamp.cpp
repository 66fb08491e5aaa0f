#include "retryloop/move/stamp.hpp"

#include <openssl/sha.h>

#include <cstdint>
#include <exception>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/retry/headers.hpp"

namespace retryloop::move {

std::string stable_stamp(const amqp::BasicProperties& properties, std::string_view body,
                         std::string_view stamp_header) {
  if (!properties.message_id || properties.message_id->empty()) return {};
  amqp::BasicProperties kept = properties;
  if (kept.headers) {
    kept.headers->erase_if([stamp_header](std::string_view name) {
      return name == stamp_header || name == retry::header::delivery_count ||
             name == retry::header::acquired_count;
    });
  }
  std::string input = "retryloop stamp 1";
  try {
    amqp::Writer writer(input);
    kept.encode(writer);
    writer.u64(body.size());
    writer.raw(body);
  } catch (const std::exception&) {
    return {};
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest);
  static constexpr char hex[] = "0123456789abcdef";
  std::string stamp = "id-";
  for (int i = 0; i < 16; ++i) {
    stamp += hex[digest[i] >> 4];
    stamp += hex[digest[i] & 0xF];
  }
  return stamp;
}

}  // namespace retryloop::move
