#pragma once

#include <system_error>

namespace retryloop::amqp {

/// Errors the codec reports. Every decoder returns one of these instead of reading out of
/// bounds; after an error the decoded value is unspecified and must not be used.
enum class CodecError {
  truncated = 1,       ///< the data ends inside a field, a frame or a payload
  bad_frame_end,       ///< the octet after a frame payload is not 0xCE
  frame_too_large,     ///< a frame is larger than the parser accepts (see inbound_frame_limit)
  unknown_frame_type,  ///< a frame type other than method, header, body or heartbeat
  protocol_header,     ///< the peer sent an AMQP protocol header: it refused our version
  unknown_field_type,  ///< a field table or array holds a type letter RabbitMQ does not define
  nesting_too_deep,    ///< tables and arrays nest deeper than the configured limit
  unknown_method,      ///< a method frame names a class and method the spec does not define
  trailing_bytes,      ///< a method or header payload is longer than its fields
  string_too_long,     ///< a short string over 255 bytes was given to the encoder
  bad_content_header,  ///< a content header frame is malformed (class, flags, size)
  unexpected_frame,    ///< a frame arrived where the protocol does not allow it
  value_too_long,  ///< a long string, table, array or frame payload over 4 GiB given to the encoder
};

/// The error category of CodecError; its messages name what is wrong in plain words.
const std::error_category& codec_category() noexcept;

std::error_code make_error_code(CodecError e) noexcept;

}  // namespace retryloop::amqp

namespace std {
template <>
struct is_error_code_enum<retryloop::amqp::CodecError> : true_type {};
}  // namespace std
