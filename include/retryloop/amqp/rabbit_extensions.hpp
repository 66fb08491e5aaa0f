#pragma once

#include <cstdint>
#include <string>

#include "retryloop/amqp/buffer.hpp"

namespace retryloop::amqp {

// RabbitMQ's protocol extensions that the extended spec XML does not describe. Same shape as the
// generated method structs, so the frame helpers take them too.

/// connection.blocked (class 10, method 60): the broker stopped reading from publishers (a
/// memory or disk alarm); `reason` says which.
struct ConnectionBlocked {
  static constexpr uint16_t class_id = 10;
  static constexpr uint16_t method_id = 60;
  static constexpr bool synchronous = false;
  static constexpr bool has_content = false;
  static constexpr const char* name = "connection.blocked";

  std::string reason;

  void encode(Writer& w) const { w.short_string(reason); }
  void decode(Reader& r) { reason = r.short_string(); }
};

/// connection.unblocked (class 10, method 61): publishing may resume.
struct ConnectionUnblocked {
  static constexpr uint16_t class_id = 10;
  static constexpr uint16_t method_id = 61;
  static constexpr bool synchronous = false;
  static constexpr bool has_content = false;
  static constexpr const char* name = "connection.unblocked";

  void encode(Writer&) const {}
  void decode(Reader&) {}
};

}  // namespace retryloop::amqp
