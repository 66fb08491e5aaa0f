// Feeds arbitrary bytes to the frame parser, in two chunks split at a point taken from the data,
// and decodes every frame's payload the way a connection would. Oracles: the split feed yields
// the same frames and error as a single feed, and whatever decodes re-encodes to a stable form.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/methods.hpp"

using namespace retryloop::amqp;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

struct Frame {
  FrameType type;
  uint16_t channel;
  std::string payload;
  bool operator==(const Frame& o) const {
    return type == o.type && channel == o.channel && payload == o.payload;
  }
};

std::string encode_method(const AnyMethod& method) {
  std::string out;
  std::error_code ec =
      std::visit([&](const auto& m) { return append_method_frame(out, 0, m); }, method);
  check(!ec);
  return out.substr(kFrameHeaderSize, out.size() - kFrameOverhead);
}

void decode_method_payload(std::string_view payload) {
  MethodId id;
  if (peek_method_id(payload, id)) {
    check(payload.size() < 4);
    return;
  }
  AnyMethod method;
  std::error_code ec = decode_method(payload, method);
  bool known = method_name(id.class_id, id.method_id) != nullptr;
  if (ec) {
    check((ec == CodecError::unknown_method) == !known);
    return;
  }
  check(known);
  // Bits past a method's fields and non-canonical booleans do not survive a round trip, so
  // compare the re-encoding with its own re-encoding.
  std::string first = encode_method(method);
  AnyMethod again;
  check(!decode_method(first, again));
  check(again.index() == method.index());
  check(encode_method(again) == first);
}

void decode_header_payload(std::string_view payload) {
  ContentHeader header;
  if (decode_header_frame(payload, header)) return;
  std::string first;
  check(!append_header_frame(first, 0, header.body_size, header.properties));
  ContentHeader again;
  check(!decode_header_frame(
      std::string_view(first).substr(kFrameHeaderSize, first.size() - kFrameOverhead), again));
  check(again.body_size == header.body_size);
  std::string second;
  check(!append_header_frame(second, 0, again.body_size, again.properties));
  check(first == second);
}

std::error_code parse(const std::vector<std::string_view>& chunks, std::vector<Frame>& frames) {
  FrameParser parser(kFrameMinSize);
  for (std::string_view chunk : chunks) {
    std::error_code ec = parser.feed(chunk, [&](const FrameView& f) {
      check(f.payload.size() + kFrameOverhead <= kFrameMinSize);
      frames.push_back(Frame{f.type, f.channel, std::string(f.payload)});
    });
    if (ec) {
      check(parser.failed());
      return ec;
    }
  }
  return parser.finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string_view input(reinterpret_cast<const char*>(data) + 2, size - 2);
  size_t split = ((size_t{data[0]} << 8) | data[1]) % (input.size() + 1);

  std::vector<Frame> whole;
  std::error_code whole_error = parse({input}, whole);
  std::vector<Frame> split_frames;
  std::error_code split_error = parse({input.substr(0, split), input.substr(split)}, split_frames);
  check(whole == split_frames);
  check(whole_error == split_error);

  for (const Frame& f : whole) {
    switch (f.type) {
      case FrameType::method:
        decode_method_payload(f.payload);
        break;
      case FrameType::header:
        decode_header_payload(f.payload);
        break;
      case FrameType::body:
      case FrameType::heartbeat:
        break;
    }
  }
  return 0;
}
