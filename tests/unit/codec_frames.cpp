#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "codec_support.hpp"
#include "retryloop/amqp/frame.hpp"

using namespace retryloop::amqp;
using retryloop::amqp::test::Frame;
using retryloop::amqp::test::from_hex;
using retryloop::amqp::test::to_hex;

namespace {

// What a consumer connection receives: the handshake, a delivery with an x-death header, its
// body, and a heartbeat.
std::string broker_stream() {
  std::string s;
  s += from_hex(test::kConnectionStart310);
  s += from_hex(test::kConnectionTune310);
  s += from_hex(test::kQueueDeclareOk310);
  s += from_hex(test::kBasicDeliver310);
  s += from_hex(test::kXDeathHeaderCount2);
  s += from_hex(test::kBodyHello310);
  append_heartbeat_frame(s);
  s += from_hex(test::kBasicAckConfirm310);
  return s;
}

std::vector<Frame> feed_chunks(const std::vector<std::string_view>& chunks, std::error_code& ec) {
  FrameParser parser;
  std::vector<Frame> frames;
  for (std::string_view chunk : chunks) {
    ec = parser.feed(chunk, [&](const FrameView& f) {
      frames.push_back(Frame{f.type, f.channel, std::string(f.payload)});
    });
    if (ec) return frames;
  }
  ec = parser.finish();
  return frames;
}

}  // namespace

TEST_CASE("The parser yields every frame of a captured broker conversation", "[codec]") {
  std::error_code ec;
  std::vector<Frame> frames = test::parse_frames(broker_stream(), ec);
  REQUIRE_FALSE(ec);
  REQUIRE(frames.size() == 8);
  CHECK(frames[0].type == FrameType::method);
  CHECK(frames[0].channel == 0);
  CHECK(frames[3].channel == 1);
  CHECK(frames[4].type == FrameType::header);
  CHECK(frames[5].type == FrameType::body);
  CHECK(frames[5].payload == "hello");
  CHECK(frames[6].type == FrameType::heartbeat);
  CHECK(frames[6].channel == 0);
  CHECK(frames[6].payload.empty());
  CHECK(frames[7].payload == test::payload_of(from_hex(test::kBasicAckConfirm310)));
}

TEST_CASE("Frames fed one byte at a time come out the same", "[codec]") {
  std::string stream = broker_stream();
  std::error_code ec;
  std::vector<Frame> whole = test::parse_frames(stream, ec);
  REQUIRE_FALSE(ec);

  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < stream.size(); ++i)
    bytes.push_back(std::string_view(stream).substr(i, 1));
  std::vector<Frame> one_by_one = feed_chunks(bytes, ec);
  REQUIRE_FALSE(ec);
  CHECK(one_by_one == whole);
}

TEST_CASE("Frames split at every position into two or three chunks come out the same", "[codec]") {
  std::string stream = broker_stream();
  std::string_view s(stream);
  std::error_code ec;
  std::vector<Frame> whole = test::parse_frames(stream, ec);
  REQUIRE_FALSE(ec);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    CAPTURE(cut);
    std::vector<Frame> two = feed_chunks({s.substr(0, cut), s.substr(cut)}, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(two == whole);
  }
  // Three chunks, the middle one small, at every position: catches a frame begun in one chunk,
  // continued in a second and finished in a third.
  for (size_t cut = 0; cut + 5 <= s.size(); ++cut) {
    CAPTURE(cut);
    std::vector<Frame> three =
        feed_chunks({s.substr(0, cut), s.substr(cut, 5), s.substr(cut + 5)}, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(three == whole);
  }
}

TEST_CASE("A stream cut short at any byte leaves finish reporting a truncated frame", "[codec]") {
  std::string frame = from_hex(test::kBasicDeliver310);
  for (size_t n = 1; n < frame.size(); ++n) {
    CAPTURE(n);
    FrameParser parser;
    int frames = 0;
    CHECK_FALSE(
        parser.feed(std::string_view(frame).substr(0, n), [&](const FrameView&) { ++frames; }));
    CHECK(frames == 0);
    CHECK(parser.finish() == CodecError::truncated);
  }
  FrameParser empty;
  CHECK_FALSE(empty.finish());
}

TEST_CASE("A frame end octet other than 0xCE is an error", "[codec]") {
  std::string frame = from_hex(test::kBasicAckConfirm310);
  frame.back() = '\xcd';
  std::error_code ec;
  auto frames = test::parse_frames(frame, ec);
  CHECK(frames.empty());
  CHECK(ec == CodecError::bad_frame_end);
  CHECK(ec.message() == "frame end octet is not 0xCE");
}

TEST_CASE("A frame larger than frame_max is rejected from its header alone", "[codec]") {
  FrameParser parser(4096);
  // Type, channel and a payload size of 4089: 4097 bytes with overhead.
  std::string head = from_hex("03 0001 00000ff9");
  CHECK(parser.feed(head, [](const FrameView&) {}) == CodecError::frame_too_large);

  // Exactly frame_max bytes is accepted.
  std::string body(4096 - kFrameOverhead, 'b');
  std::string out;
  append_body_frames(out, 1, body, 4096);
  REQUIRE(out.size() == 4096);
  std::error_code ec;
  auto frames = test::parse_frames(out, ec, 4096);
  CHECK_FALSE(ec);
  CHECK(frames.size() == 1);

  // A payload size near 2^32 must not wrap around the limit check.
  FrameParser wrap(131072);
  CHECK(wrap.feed(from_hex("03 0001 fffffffc"), [](const FrameView&) {}) ==
        CodecError::frame_too_large);
}

namespace {

std::string u32_bytes(uint32_t v) {
  return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

/// A content header frame of exactly `total` bytes (overhead included) on channel 1: class basic,
/// a 5-byte body, and one long-string header "h" padded to size.
std::string header_frame_of_size(size_t total) {
  const size_t value_size = total - 33;
  std::string frame = from_hex("02 0001") + u32_bytes(uint32_t(total - kFrameOverhead)) +
                      from_hex("003c 0000 0000000000000005 2000") +
                      u32_bytes(uint32_t(value_size + 7)) + from_hex("01 68 53") +
                      u32_bytes(uint32_t(value_size)) + std::string(value_size, 'x') +
                      from_hex("ce");
  REQUIRE(frame.size() == total);
  return frame;
}

/// Feeds `frame` whole, then one byte at a time, to a parser limited to `limit`; the error of
/// each run must agree, and a frame that passes must come out with its payload intact.
std::error_code feed_at_limit(const std::string& frame, uint32_t limit) {
  std::error_code whole;
  std::vector<Frame> frames = test::parse_frames(frame, whole, limit);
  FrameParser parser(limit);
  std::error_code bytewise;
  size_t count = 0;
  for (size_t i = 0; i < frame.size(); ++i) {
    bytewise = parser.feed(std::string_view(frame).substr(i, 1), [&](const FrameView& f) {
      ++count;
      CHECK(f.payload ==
            std::string_view(frame).substr(kFrameHeaderSize, frame.size() - kFrameOverhead));
    });
    if (bytewise) break;
  }
  CHECK(whole == bytewise);
  if (!whole) {
    CHECK(frames.size() == 1);
    CHECK(count == 1);
    ContentHeader header;
    CHECK_FALSE(decode_header_frame(frames[0].payload, header));
    CHECK(header.body_size == 5);
  }
  return whole;
}

}  // namespace

TEST_CASE("A content header frame of limit - 1 and limit bytes passes and limit + 1 is refused",
          "[codec]") {
  for (uint32_t limit : {uint32_t{4096}, uint32_t{131072}, inbound_frame_limit(131072, 131072)}) {
    INFO("limit " << limit);
    CHECK_FALSE(feed_at_limit(header_frame_of_size(limit - 1), limit));
    CHECK_FALSE(feed_at_limit(header_frame_of_size(limit), limit));
    CHECK(feed_at_limit(header_frame_of_size(size_t{limit} + 1), limit) ==
          CodecError::frame_too_large);
    FrameParser parser(limit);
    parser.feed(header_frame_of_size(size_t{limit} + 1), [](const FrameView&) {});
    CHECK(parser.refused_frame_size() == size_t{limit} + 1);
  }
}

TEST_CASE("A client accepts frames past frame_max up to the broker's own limit plus 1 MiB",
          "[codec]") {
  // RabbitMQ takes a publisher's frame of its frame_max + 8 bytes and passes it on, and adds
  // x-delivery-count or x-death to it on the way out.
  CHECK(inbound_frame_limit(131072, 131072) == 131072 + 8 + 1048576);
  CHECK(inbound_frame_limit(131072, 4096) == 131072 + 8 + 1048576);
  CHECK(inbound_frame_limit(4096, 131072) == 131072 + 8 + 1048576);
  CHECK(inbound_frame_limit(0xFFFFFFFFu, 131072) == 0xFFFFFFFFu);
  CHECK(inbound_frame_limit(0, 131072) == 0);
  const uint32_t limit = inbound_frame_limit(131072, 131072);
  CHECK_FALSE(feed_at_limit(header_frame_of_size(131072 + 8), limit));
  CHECK_FALSE(feed_at_limit(header_frame_of_size(131072 + 8 + 26), limit));
}

TEST_CASE("Frame types other than method, header, body and heartbeat are errors", "[codec]") {
  for (int type : {0, 4, 5, 6, 7, 9, 0x41 /* 'A' not followed by MQP */, 255}) {
    CAPTURE(type);
    std::string frame = from_hex("00 0000 00000000 ce");
    frame[0] = static_cast<char>(type);
    std::error_code ec;
    test::parse_frames(frame, ec);
    CHECK(ec == CodecError::unknown_frame_type);
  }
}

TEST_CASE("A protocol header from the server is reported as a version refusal", "[codec]") {
  std::error_code ec;
  test::parse_frames(kProtocolHeader, ec);
  CHECK(ec == CodecError::protocol_header);

  // Also when it trickles in byte by byte.
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < kProtocolHeader.size(); ++i)
    bytes.push_back(kProtocolHeader.substr(i, 1));
  feed_chunks(bytes, ec);
  CHECK(ec == CodecError::protocol_header);

  // And when the server offers another version, as RabbitMQ does for an unknown header.
  test::parse_frames(std::string_view("AMQP\x00\x00\x09\x00", 8), ec);
  CHECK(ec == CodecError::protocol_header);
}

TEST_CASE("After an error the parser yields nothing more", "[codec]") {
  FrameParser parser;
  int frames = 0;
  auto count = [&](const FrameView&) { ++frames; };
  std::string bad = from_hex("05 0000 00000000 ce");
  CHECK(parser.feed(bad, count) == CodecError::unknown_frame_type);
  CHECK(parser.failed());
  CHECK(parser.feed(from_hex(test::kBasicAckConfirm310), count) == CodecError::unknown_frame_type);
  CHECK(frames == 0);
  CHECK(parser.finish() == CodecError::unknown_frame_type);
}

TEST_CASE("Returning false from the frame callback stops parsing the chunk", "[codec]") {
  std::string stream = broker_stream();
  FrameParser parser;
  int frames = 0;
  CHECK_FALSE(parser.feed(stream, [&](const FrameView&) {
    ++frames;
    return frames < 2;
  }));
  CHECK(frames == 2);
}

TEST_CASE("A heartbeat frame is eight fixed bytes", "[codec]") {
  std::string out = "x";
  append_heartbeat_frame(out);
  CHECK(to_hex(out) ==
        "78"
        "08000000000000ce");
}

TEST_CASE("A 10 MB body with frame_max 4096 becomes frames that reassemble exactly", "[codec]") {
  std::string body(10 * 1024 * 1024, '\0');
  for (size_t i = 0; i < body.size(); ++i)
    body[i] = static_cast<char>((i * 131) ^ (i >> 9));
  std::string out;
  append_body_frames(out, 7, body, 4096);

  const size_t chunk = 4096 - kFrameOverhead;
  const size_t expected_frames = (body.size() + chunk - 1) / chunk;
  CHECK(out.size() == body.size() + expected_frames * kFrameOverhead);

  FrameParser parser(4096);
  std::string reassembled;
  size_t frames = 0;
  bool all_small = true;
  bool all_full_but_last = true;
  REQUIRE_FALSE(parser.feed(out, [&](const FrameView& f) {
    ++frames;
    all_small = all_small && f.payload.size() + kFrameOverhead <= 4096 &&
                f.type == FrameType::body && f.channel == 7;
    if (reassembled.size() + f.payload.size() < body.size()) {
      all_full_but_last = all_full_but_last && f.payload.size() == chunk;
    }
    reassembled.append(f.payload);
  }));
  REQUIRE_FALSE(parser.finish());
  CHECK(frames == expected_frames);
  CHECK(all_small);
  CHECK(all_full_but_last);
  CHECK(reassembled == body);
}

TEST_CASE("An empty body produces no body frames", "[codec]") {
  std::string out;
  append_body_frames(out, 1, "", 4096);
  CHECK(out.empty());
}

TEST_CASE("A body of frame_max minus 8 bytes is one frame and one byte more is two", "[codec]") {
  std::string out;
  append_body_frames(out, 1, std::string(4088, 'a'), 4096);
  CHECK(out.size() == 4096);
  out.clear();
  append_body_frames(out, 1, std::string(4089, 'a'), 4096);
  std::error_code ec;
  auto frames = test::parse_frames(out, ec, 4096);
  REQUIRE_FALSE(ec);
  REQUIRE(frames.size() == 2);
  CHECK(frames[0].payload.size() == 4088);
  CHECK(frames[1].payload == "a");
}

TEST_CASE("A content header with all 14 properties matches pika's bytes", "[codec]") {
  std::string golden = from_hex(test::kHeaderAllProperties);
  ContentHeader header;
  REQUIRE_FALSE(decode_header_frame(test::payload_of(golden), header));
  CHECK(header.class_id == 60);
  CHECK(header.body_size == 11);
  const BasicProperties& p = header.properties;
  CHECK(p.content_type == "application/json");
  CHECK(p.content_encoding == "gzip");
  REQUIRE(p.headers);
  CHECK(p.headers->find("retryloop-retries")->type_letter() == 'I');
  CHECK(p.headers->find("retryloop-retries")->as_int64() == 2);
  CHECK(p.headers->find("trace")->as_string() == "abc");
  CHECK(p.delivery_mode == 2);
  CHECK(p.priority == 5);
  CHECK(p.correlation_id == "corr-1");
  CHECK(p.reply_to == "replies");
  CHECK(p.expiration == "60000");
  CHECK(p.message_id == "msg-42");
  CHECK(p.timestamp == 1700000000u);
  CHECK(p.type == "order.created");
  CHECK(p.user_id == "guest");
  CHECK(p.app_id == "shop");
  CHECK(p.cluster_id == "c1");

  BasicProperties built;
  built.content_type = "application/json";
  built.content_encoding = "gzip";
  built.headers =
      FieldTable{{"retryloop-retries", FieldValue(int32_t{2})}, {"trace", FieldValue("abc")}};
  built.delivery_mode = 2;
  built.priority = 5;
  built.correlation_id = "corr-1";
  built.reply_to = "replies";
  built.expiration = "60000";
  built.message_id = "msg-42";
  built.timestamp = 1700000000;
  built.type = "order.created";
  built.user_id = "guest";
  built.app_id = "shop";
  built.cluster_id = "c1";
  CHECK(built == p);
  std::string out;
  REQUIRE_FALSE(append_header_frame(out, 1, 11, built));
  CHECK(to_hex(out) == to_hex(golden));
}

TEST_CASE("A content header without properties is flags zero", "[codec]") {
  std::string out;
  REQUIRE_FALSE(append_header_frame(out, 3, 0, BasicProperties{}));
  CHECK(to_hex(out) ==
        "02"
        "0003"
        "0000000e"
        "003c"
        "0000"
        "0000000000000000"
        "0000"
        "ce");
  ContentHeader header;
  header.properties.message_id = "stale";
  REQUIRE_FALSE(decode_header_frame(test::payload_of(out), header));
  CHECK(header.properties == BasicProperties{});
}

TEST_CASE("Each property alone sets its own flag bit from bit 15 down", "[codec]") {
  using Set = void (*)(BasicProperties&);
  const std::pair<uint16_t, Set> cases[] = {
      {0x8000, [](BasicProperties& p) { p.content_type = "t"; }},
      {0x4000, [](BasicProperties& p) { p.content_encoding = "e"; }},
      {0x2000, [](BasicProperties& p) { p.headers = FieldTable{}; }},
      {0x1000, [](BasicProperties& p) { p.delivery_mode = 1; }},
      {0x0800, [](BasicProperties& p) { p.priority = 9; }},
      {0x0400, [](BasicProperties& p) { p.correlation_id = "c"; }},
      {0x0200, [](BasicProperties& p) { p.reply_to = "r"; }},
      {0x0100, [](BasicProperties& p) { p.expiration = "1"; }},
      {0x0080, [](BasicProperties& p) { p.message_id = "m"; }},
      {0x0040, [](BasicProperties& p) { p.timestamp = 1; }},
      {0x0020, [](BasicProperties& p) { p.type = "y"; }},
      {0x0010, [](BasicProperties& p) { p.user_id = "u"; }},
      {0x0008, [](BasicProperties& p) { p.app_id = "a"; }},
      {0x0004, [](BasicProperties& p) { p.cluster_id = "k"; }},
  };
  for (const auto& [flag, set] : cases) {
    CAPTURE(flag);
    BasicProperties p;
    set(p);
    std::string out;
    Writer w(out);
    p.encode(w);
    REQUIRE(out.size() >= 2);
    CHECK(((uint8_t(out[0]) << 8) | uint8_t(out[1])) == flag);
    Reader r(out);
    BasicProperties back;
    back.decode(r);
    CHECK(r.ok());
    CHECK(r.at_end());
    CHECK(back == p);
  }
}

TEST_CASE("A content header with the continuation bit or an unused flag bit is rejected",
          "[codec]") {
  for (const char* flags : {"0001", "0002", "0003", "8001"}) {
    CAPTURE(flags);
    std::string payload = from_hex(std::string("003c 0000 0000000000000000 ") + flags);
    ContentHeader header;
    CHECK(decode_header_frame(payload, header) == CodecError::bad_content_header);
  }
}

TEST_CASE("A content header of another class or with a weight is rejected", "[codec]") {
  ContentHeader header;
  CHECK(decode_header_frame(from_hex("0032 0000 0000000000000000 0000"), header) ==
        CodecError::bad_content_header);
  CHECK(decode_header_frame(from_hex("003c 0001 0000000000000000 0000"), header) ==
        CodecError::bad_content_header);
}

TEST_CASE("A content header with bytes after its properties is rejected", "[codec]") {
  ContentHeader header;
  CHECK(decode_header_frame(from_hex("003c 0000 0000000000000005 0000 00"), header) ==
        CodecError::trailing_bytes);
}

TEST_CASE("A content header cut short at any byte fails as truncated", "[codec]") {
  std::string payload = test::payload_of(from_hex(test::kHeaderAllProperties));
  for (size_t n = 0; n < payload.size(); ++n) {
    CAPTURE(n);
    ContentHeader header;
    CHECK(decode_header_frame(std::string_view(payload).substr(0, n), header) ==
          CodecError::truncated);
  }
}

TEST_CASE("A property short string over 255 bytes fails and leaves the buffer as it was",
          "[codec]") {
  BasicProperties p;
  p.message_id = std::string(256, 'm');
  std::string out = "keep";
  CHECK(append_header_frame(out, 1, 0, p) == CodecError::string_too_long);
  CHECK(out == "keep");
}

TEST_CASE("peek_method_id reads the ids and needs four bytes", "[codec]") {
  MethodId id;
  REQUIRE_FALSE(peek_method_id(from_hex("003c 0050 ff"), id));
  CHECK(id.class_id == 60);
  CHECK(id.method_id == 80);
  CHECK(id.key() == 0x003c0050u);
  CHECK(peek_method_id(from_hex("003c 00"), id) == CodecError::truncated);
}

TEST_CASE("Every codec error has its own message in the amqp codec category", "[codec]") {
  std::vector<std::string> messages;
  for (int e = static_cast<int>(CodecError::truncated);
       e <= static_cast<int>(CodecError::unexpected_frame); ++e) {
    std::error_code ec = make_error_code(static_cast<CodecError>(e));
    CHECK(std::string(ec.category().name()) == "amqp codec");
    CHECK_FALSE(ec.message().empty());
    messages.push_back(ec.message());
  }
  std::sort(messages.begin(), messages.end());
  CHECK(std::adjacent_find(messages.begin(), messages.end()) == messages.end());
}
