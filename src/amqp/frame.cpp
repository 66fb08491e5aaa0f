#include "retryloop/amqp/frame.hpp"

#include <algorithm>
#include <limits>

namespace retryloop::amqp {

namespace {

constexpr uint16_t kBasicClassId = 60;

// Makes room for `extra` more bytes, growing geometrically so that many small appends to one
// buffer stay linear whatever the standard library's reserve does.
void grow(std::string& out, size_t extra) {
  size_t needed = out.size() + extra;
  if (needed > out.capacity()) out.reserve(std::max(needed, 2 * out.capacity()));
}

}  // namespace

std::error_code append_header_frame(std::string& out, uint16_t channel, uint64_t body_size,
                                    const BasicProperties& properties) {
  size_t start = out.size();
  grow(out, 64);
  Writer w(out);
  w.u8(static_cast<uint8_t>(FrameType::header));
  w.u16(channel);
  w.u32(0);
  w.u16(kBasicClassId);
  w.u16(0);
  w.u64(body_size);
  properties.encode(w);
  w.patch_size(start + 3);
  if (w.error()) {
    out.resize(start);
    return w.error();
  }
  w.u8(kFrameEnd);
  return {};
}

void append_body_frames(std::string& out, uint16_t channel, std::string_view body,
                        uint32_t frame_max) {
  if (body.empty()) return;
  size_t chunk = frame_max == 0 ? size_t{std::numeric_limits<uint32_t>::max()} - kFrameOverhead
                                : std::max<size_t>(frame_max, kFrameOverhead + 1) - kFrameOverhead;
  size_t frames = (body.size() + chunk - 1) / chunk;
  grow(out, body.size() + frames * kFrameOverhead);
  for (size_t pos = 0; pos < body.size(); pos += chunk) {
    size_t n = std::min(chunk, body.size() - pos);
    const char head[kFrameHeaderSize] = {static_cast<char>(FrameType::body),
                                         static_cast<char>(channel >> 8),
                                         static_cast<char>(channel),
                                         static_cast<char>(n >> 24),
                                         static_cast<char>(n >> 16),
                                         static_cast<char>(n >> 8),
                                         static_cast<char>(n)};
    out.append(head, kFrameHeaderSize);
    out.append(body.data() + pos, n);
    out.push_back(static_cast<char>(kFrameEnd));
  }
}

void append_heartbeat_frame(std::string& out) {
  static constexpr char kHeartbeat[kFrameOverhead] = {8, 0, 0, 0,
                                                      0, 0, 0, static_cast<char>(kFrameEnd)};
  out.append(kHeartbeat, kFrameOverhead);
}

std::error_code peek_method_id(std::string_view payload, MethodId& out) {
  if (payload.size() < 4) return make_error_code(CodecError::truncated);
  auto p = reinterpret_cast<const unsigned char*>(payload.data());
  out.class_id = static_cast<uint16_t>((p[0] << 8) | p[1]);
  out.method_id = static_cast<uint16_t>((p[2] << 8) | p[3]);
  return {};
}

std::error_code decode_header_frame(std::string_view payload, ContentHeader& out) {
  Reader r(payload);
  out.class_id = r.u16();
  uint16_t weight = r.u16();
  out.body_size = r.u64();
  if (!r.ok()) return r.error();
  if (out.class_id != kBasicClassId || weight != 0) {
    return make_error_code(CodecError::bad_content_header);
  }
  return decode_properties(payload.substr(kContentHeaderFixedSize), out.properties);
}

std::error_code decode_properties(std::string_view flags_and_list, BasicProperties& out) {
  Reader r(flags_and_list);
  out.decode(r);
  if (!r.ok()) return r.error();
  if (!r.at_end()) return make_error_code(CodecError::trailing_bytes);
  return {};
}

}  // namespace retryloop::amqp
