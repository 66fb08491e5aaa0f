#include "retryloop/amqp/error.hpp"

#include <string>

namespace retryloop::amqp {

namespace {

class CodecCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "amqp codec"; }

  std::string message(int value) const override {
    switch (static_cast<CodecError>(value)) {
      case CodecError::truncated:
        return "the data ends inside a field, a frame or a payload";
      case CodecError::bad_frame_end:
        return "frame end octet is not 0xCE";
      case CodecError::frame_too_large:
        return "frame is larger than the largest frame accepted";
      case CodecError::unknown_frame_type:
        return "unknown frame type (not method, header, body or heartbeat)";
      case CodecError::protocol_header:
        return "the peer answered with an AMQP protocol header: it does not speak AMQP 0-9-1";
      case CodecError::unknown_field_type:
        return "field table or array holds an unknown type letter";
      case CodecError::nesting_too_deep:
        return "field tables and arrays nest deeper than the limit";
      case CodecError::unknown_method:
        return "method frame names an unknown class and method";
      case CodecError::trailing_bytes:
        return "method or content header payload is longer than its fields";
      case CodecError::string_too_long:
        return "short string is longer than 255 bytes";
      case CodecError::bad_content_header:
        return "malformed content header (class, weight or property flags)";
      case CodecError::unexpected_frame:
        return "frame or method arrived where the protocol does not allow it";
      case CodecError::value_too_long:
        return "long string, table, array or frame payload is longer than 4 GiB, the most its "
               "32-bit length can say";
    }
    return "unknown amqp codec error " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& codec_category() noexcept {
  static const CodecCategory category;
  return category;
}

std::error_code make_error_code(CodecError e) noexcept {
  return {static_cast<int>(e), codec_category()};
}

}  // namespace retryloop::amqp
