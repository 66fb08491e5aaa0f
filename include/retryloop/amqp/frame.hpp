#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/error.hpp"
#include "retryloop/amqp/methods.hpp"

namespace retryloop::amqp {

enum class FrameType : uint8_t { method = 1, header = 2, body = 3, heartbeat = 8 };

inline constexpr uint8_t kFrameEnd = 0xCE;
/// Type (1) + channel (2) + size (4) before the payload, frame-end (1) after it.
inline constexpr uint32_t kFrameHeaderSize = 7;
inline constexpr uint32_t kFrameOverhead = 8;
/// The smallest frame_max a peer may negotiate, and the limit before tuning.
inline constexpr uint32_t kFrameMinSize = 4096;
/// How far past frame_max an inbound frame may go (see inbound_frame_limit).
inline constexpr uint32_t kInboundFrameAllowance = 1024 * 1024;
/// Bytes of a content header payload before the property flags: class, weight, body size.
inline constexpr size_t kContentHeaderFixedSize = 12;
/// The 8 bytes a client sends first: "AMQP" 0 0 9 1.
inline constexpr std::string_view kProtocolHeader{"AMQP\x00\x00\x09\x01", 8};

/// The largest inbound frame a client accepts, overhead included, given the broker's own frame_max
/// from connection.tune (`broker_frame_max`, 0 = none) and the frame_max agreed on
/// (`negotiated`). Larger than the agreed frame_max on purpose: RabbitMQ takes frames of up to
/// its own frame_max plus 8 bytes from a publisher (whose frame_max may be larger than this
/// client's) and passes a content header on to consumers unchanged, and it adds headers of its
/// own when it delivers (x-delivery-count on a quorum redelivery, x-death and x-first-death-* when
/// it dead-letters) without checking any frame_max. A client that refused such a frame would
/// drop the connection and get the same message again, forever; pika and the Java client accept
/// it. The limit is the larger of the two plus kInboundFrameAllowance (1 MiB) for headers the
/// broker adds, at most 2^32 - 1; 0 (no limit) when the broker sets none.
constexpr uint32_t inbound_frame_limit(uint32_t broker_frame_max, uint32_t negotiated) {
  if (broker_frame_max == 0) return 0;
  const uint64_t limit =
      uint64_t{std::max(broker_frame_max, negotiated)} + kFrameOverhead + kInboundFrameAllowance;
  return limit > 0xFFFFFFFFu ? 0xFFFFFFFFu : static_cast<uint32_t>(limit);
}

/// One frame as the parser yields it. `payload` points into the parser's input or its own
/// buffer and is valid only during the callback that receives it.
struct FrameView {
  FrameType type;
  uint16_t channel;
  std::string_view payload;
};

/// A sans-I/O frame parser: feed it bytes in chunks split anywhere and it yields whole frames.
/// It copies only the bytes of frames that span chunk boundaries. After the first error it stays
/// failed and yields nothing more.
class FrameParser {
 public:
  /// `max_frame_size` is the largest frame accepted, overhead included (0 = no limit beyond
  /// 2^32-1): a frame of exactly that size is accepted, one byte more is frame_too_large. A
  /// connection sets it to inbound_frame_limit(), not to the frame_max it agreed on.
  explicit FrameParser(uint32_t max_frame_size = 131072) : max_frame_size_(max_frame_size) {}

  void set_max_frame_size(uint32_t max_frame_size) { max_frame_size_ = max_frame_size; }
  uint32_t max_frame_size() const { return max_frame_size_; }

  /// Parses `chunk`, calling `on_frame(const FrameView&)` for each complete frame, in order.
  /// `on_frame` returns void, or bool where false stops parsing (the rest of the chunk is then
  /// dropped; used when the receiver tears the connection down). Returns the first protocol
  /// error: a bad frame end, an oversize frame, an unknown frame type or a protocol header.
  template <class OnFrame>
  std::error_code feed(std::string_view chunk, OnFrame&& on_frame);

  /// Called at end of stream: CodecError::truncated if a frame was left incomplete.
  std::error_code finish() const {
    if (error_) return error_;
    return pending_.empty() ? std::error_code{} : make_error_code(CodecError::truncated);
  }

  bool failed() const { return static_cast<bool>(error_); }
  /// After frame_too_large: the refused frame's size, overhead included (up to 2^32 + 7).
  uint64_t refused_frame_size() const { return refused_frame_size_; }
  std::error_code error() const { return error_; }

 private:
  /// Checks the 7-byte header at `p`; returns the payload size or sets error_.
  bool check_header(const unsigned char* p, uint32_t& payload_size);
  template <class OnFrame>
  bool deliver(const unsigned char* frame, uint32_t payload_size, OnFrame& on_frame);

  uint32_t max_frame_size_;
  uint64_t refused_frame_size_ = 0;
  std::string pending_;
  std::error_code error_;
};

/// Appends a complete method frame for `method` (any generated method struct).
template <class Method>
std::error_code append_method_frame(std::string& out, uint16_t channel, const Method& method) {
  size_t start = out.size();
  Writer w(out);
  w.u8(static_cast<uint8_t>(FrameType::method));
  w.u16(channel);
  w.u32(0);
  w.u16(Method::class_id);
  w.u16(Method::method_id);
  method.encode(w);
  w.patch_size(start + 3);
  if (w.error()) {
    out.resize(start);
    return w.error();
  }
  w.u8(kFrameEnd);
  return {};
}

/// Appends a content header frame (class basic) for a body of `body_size` bytes.
std::error_code append_header_frame(std::string& out, uint16_t channel, uint64_t body_size,
                                    const BasicProperties& properties);

/// Appends the body frames for `body`, each at most `frame_max` bytes including overhead.
void append_body_frames(std::string& out, uint16_t channel, std::string_view body,
                        uint32_t frame_max);

/// Appends a heartbeat frame (type 8, channel 0, empty payload).
void append_heartbeat_frame(std::string& out);

/// The class and method ids at the start of a method frame payload.
struct MethodId {
  uint16_t class_id = 0;
  uint16_t method_id = 0;
  constexpr uint32_t key() const { return (uint32_t{class_id} << 16) | method_id; }
};

/// MethodId::key of a generated method type: `method_key<QueueDeclareOk>()`.
template <class Method>
constexpr uint32_t method_key() {
  return MethodId{Method::class_id, Method::method_id}.key();
}

/// Reads the ids of a method frame payload; CodecError::truncated if it is under 4 bytes.
std::error_code peek_method_id(std::string_view payload, MethodId& out);

/// Decodes the arguments of a method frame payload (ids included) into `out`. The ids must
/// match `Method`; trailing bytes are an error.
template <class Method>
std::error_code decode_method_frame(std::string_view payload, Method& out) {
  Reader r(payload);
  if (r.u16() != Method::class_id || r.u16() != Method::method_id) {
    return r.ok() ? make_error_code(CodecError::unexpected_frame) : r.error();
  }
  out.decode(r);
  if (!r.ok()) return r.error();
  if (!r.at_end()) return make_error_code(CodecError::trailing_bytes);
  return {};
}

/// The parsed fixed part of a content header frame payload.
struct ContentHeader {
  uint16_t class_id = 0;
  uint64_t body_size = 0;
  BasicProperties properties;
};

/// Decodes a content header frame payload. Only class basic (60) is accepted.
std::error_code decode_header_frame(std::string_view payload, ContentHeader& out);

/// Decodes the property flags and list of a content header (the payload after its fixed part),
/// all of them: bytes left over fail with CodecError::trailing_bytes.
std::error_code decode_properties(std::string_view flags_and_list, BasicProperties& out);

// ---- template implementation ----

inline bool FrameParser::check_header(const unsigned char* p, uint32_t& payload_size) {
  uint8_t type = p[0];
  if (type == 'A' && p[1] == 'M' && p[2] == 'Q' && p[3] == 'P') {
    error_ = make_error_code(CodecError::protocol_header);
    return false;
  }
  if (type != 1 && type != 2 && type != 3 && type != 8) {
    error_ = make_error_code(CodecError::unknown_frame_type);
    return false;
  }
  payload_size = (uint32_t{p[3]} << 24) | (uint32_t{p[4]} << 16) | (uint32_t{p[5]} << 8) | p[6];
  if (max_frame_size_ != 0 && uint64_t{payload_size} + kFrameOverhead > max_frame_size_) {
    refused_frame_size_ = uint64_t{payload_size} + kFrameOverhead;
    error_ = make_error_code(CodecError::frame_too_large);
    return false;
  }
  return true;
}

template <class OnFrame>
bool FrameParser::deliver(const unsigned char* frame, uint32_t payload_size, OnFrame& on_frame) {
  if (frame[kFrameHeaderSize + payload_size] != kFrameEnd) {
    error_ = make_error_code(CodecError::bad_frame_end);
    return false;
  }
  FrameView view{
      static_cast<FrameType>(frame[0]), static_cast<uint16_t>((frame[1] << 8) | frame[2]),
      std::string_view(reinterpret_cast<const char*>(frame) + kFrameHeaderSize, payload_size)};
  if constexpr (std::is_same_v<decltype(on_frame(view)), bool>) {
    return on_frame(view);
  } else {
    on_frame(view);
    return true;
  }
}

template <class OnFrame>
std::error_code FrameParser::feed(std::string_view chunk, OnFrame&& on_frame) {
  if (error_) return error_;
  auto data = reinterpret_cast<const unsigned char*>(chunk.data());
  size_t len = chunk.size();
  size_t pos = 0;
  uint32_t payload_size = 0;

  // Complete a frame begun in an earlier chunk.
  if (!pending_.empty()) {
    if (pending_.size() < kFrameHeaderSize) {
      size_t take = std::min(len, size_t{kFrameHeaderSize} - pending_.size());
      pending_.append(chunk.data(), take);
      pos = take;
      if (pending_.size() < kFrameHeaderSize) return {};
    }
    auto head = reinterpret_cast<const unsigned char*>(pending_.data());
    if (!check_header(head, payload_size)) return error_;
    size_t frame_size = size_t{payload_size} + kFrameOverhead;
    size_t take = std::min(len - pos, frame_size - pending_.size());
    pending_.append(chunk.data() + pos, take);
    pos += take;
    if (pending_.size() < frame_size) return {};
    bool go_on =
        deliver(reinterpret_cast<const unsigned char*>(pending_.data()), payload_size, on_frame);
    pending_.clear();
    if (error_) return error_;
    if (!go_on) return {};
  }

  // Whole frames straight from the chunk, without copying.
  while (len - pos >= kFrameHeaderSize) {
    if (!check_header(data + pos, payload_size)) return error_;
    size_t frame_size = size_t{payload_size} + kFrameOverhead;
    if (len - pos < frame_size) break;
    bool go_on = deliver(data + pos, payload_size, on_frame);
    if (error_) return error_;
    pos += frame_size;
    if (!go_on) return {};
  }
  pending_.assign(chunk.data() + pos, len - pos);
  return {};
}

}  // namespace retryloop::amqp
