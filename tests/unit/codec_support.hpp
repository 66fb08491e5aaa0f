#pragma once

// Shared helpers and golden bytes for the codec tests.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "retryloop/amqp/frame.hpp"

namespace Catch {
template <>
struct StringMaker<std::error_code> {
  static std::string convert(const std::error_code& ec) {
    if (!ec) return "no error";
    return ec.category().name() + std::string(": ") + ec.message();
  }
};
}  // namespace Catch

namespace retryloop::amqp::test {

/// Bytes from hex digits; spaces are ignored so that tests can group fields.
inline std::string from_hex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  int high = -1;
  for (char c : hex) {
    int n = nibble(c);
    if (n < 0) continue;
    if (high < 0) {
      high = n;
    } else {
      out.push_back(static_cast<char>((high << 4) | n));
      high = -1;
    }
  }
  return out;
}

inline std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

/// A frame the parser yielded, copied out of the callback.
struct Frame {
  FrameType type;
  uint16_t channel;
  std::string payload;
  friend bool operator==(const Frame& a, const Frame& b) {
    return a.type == b.type && a.channel == b.channel && a.payload == b.payload;
  }
};

/// Parses `bytes` fed in one chunk and returns every frame; the parser's error goes to `error`.
inline std::vector<Frame> parse_frames(std::string_view bytes, std::error_code& error,
                                       uint32_t frame_max = 131072) {
  FrameParser parser(frame_max);
  std::vector<Frame> frames;
  error = parser.feed(bytes, [&](const FrameView& f) {
    frames.push_back(Frame{f.type, f.channel, std::string(f.payload)});
  });
  if (!error) error = parser.finish();
  return frames;
}

/// The payload of the single frame in `frame_bytes`.
inline std::string payload_of(std::string_view frame_bytes) {
  return std::string(frame_bytes.substr(kFrameHeaderSize, frame_bytes.size() - kFrameOverhead));
}

// ---- Golden bytes: whole frames, hex ----
// The *310 frames were captured from a RabbitMQ 3.10.8 broker over a raw socket; the others
// were encoded by pika 1.2 (an independent encoder) and accepted by the same broker.

// connection.start exactly as RabbitMQ 3.10.8 sends it (cluster name set to rabbit@localhost).
inline constexpr std::string_view kConnectionStart310 =
    "010000000001f7000a000a0009000001d20c6361706162696c697469657346000000c7127075626c69736865"
    "725f636f6e6669726d7374011a65786368616e67655f65786368616e67655f62696e64696e677374010a6261"
    "7369632e6e61636b740116636f6e73756d65725f63616e63656c5f6e6f74696679740112636f6e6e65637469"
    "6f6e2e626c6f636b6564740113636f6e73756d65725f7072696f72697469657374011c61757468656e746963"
    "6174696f6e5f6661696c7572655f636c6f73657401107065725f636f6e73756d65725f716f7374010f646972"
    "6563745f7265706c795f746f74010c636c75737465725f6e616d655300000010726162626974406c6f63616c"
    "686f737409636f707972696768745300000037436f707972696768742028632920323030372d323032322056"
    "4d776172652c20496e632e206f722069747320616666696c69617465732e0b696e666f726d6174696f6e5300"
    "0000394c6963656e73656420756e64657220746865204d504c20322e302e20576562736974653a2068747470"
    "733a2f2f7261626269746d712e636f6d08706c6174666f726d530000001145726c616e672f4f54502032352e"
    "322e330770726f6475637453000000085261626269744d510776657273696f6e5300000006332e31302e3800"
    "00000e504c41494e20414d51504c41494e00000005656e5f5553ce";

// connection.tune from RabbitMQ 3.10.8: channel_max 2047, frame_max 131072, heartbeat 60.
inline constexpr std::string_view kConnectionTune310 = "0100000000000c000a001e07ff00020000003cce";

// queue.declare-ok for rl.wait from RabbitMQ 3.10.8 on channel 1.
inline constexpr std::string_view kQueueDeclareOk310 =
    "010001000000140032000b07726c2e776169740000000000000000ce";

// A publisher confirm (basic.ack, delivery tag 1) from RabbitMQ 3.10.8.
inline constexpr std::string_view kBasicAckConfirm310 =
    "0100010000000d003c0050000000000000000100ce";

// basic.deliver from RabbitMQ 3.10.8: consumer tag ctag-1, delivery tag 3, routing key rl.work.
inline constexpr std::string_view kBasicDeliver310 =
    "0100010000001d003c003c06637461672d310000000000000003000007726c2e776f726bce";

// Content header of a message dead-lettered rejected from rl.work, expired from rl.wait, back in
// rl.work (RabbitMQ 3.10.8). The older x-death entry keeps RabbitMQ's unsorted key order.
inline constexpr std::string_view kXDeathHeader310 =
    "02000100000181003c00000000000000000005b0800a746578742f706c61696e0000015f0361707053000000"
    "0464656d6f07782d646561746841000000e7460000006e05636f756e746c0000000000000001086578636861"
    "6e676553000000000571756575655300000007726c2e7761697406726561736f6e5300000007657870697265"
    "640c726f7574696e672d6b657973410000000c5300000007726c2e776169740474696d6554000000006b02a0"
    "22460000006f05636f756e746c000000000000000106726561736f6e530000000872656a6563746564057175"
    "6575655300000007726c2e776f726b0474696d6554000000006b02a0220865786368616e676553000000000c"
    "726f7574696e672d6b657973410000000c5300000007726c2e776f726b16782d66697273742d64656174682d"
    "65786368616e6765530000000013782d66697273742d64656174682d71756575655300000007726c2e776f72"
    "6b14782d66697273742d64656174682d726561736f6e530000000872656a656374656402036d2d31ce";

// The same message one loop later: both x-death counts are 2 and both entries are sorted.
inline constexpr std::string_view kXDeathHeaderCount2 =
    "02000100000181003c00000000000000000005b0800a746578742f706c61696e0000015f0361707053000000"
    "0464656d6f07782d646561746841000000e7460000006e05636f756e746c0000000000000002086578636861"
    "6e676553000000000571756575655300000007726c2e7761697406726561736f6e5300000007657870697265"
    "640c726f7574696e672d6b657973410000000c5300000007726c2e776169740474696d6554000000006b02a0"
    "22460000006f05636f756e746c00000000000000020865786368616e67655300000000057175657565530000"
    "0007726c2e776f726b06726561736f6e530000000872656a65637465640c726f7574696e672d6b6579734100"
    "00000c5300000007726c2e776f726b0474696d6554000000006b02a02216782d66697273742d64656174682d"
    "65786368616e6765530000000013782d66697273742d64656174682d71756575655300000007726c2e776f72"
    "6b14782d66697273742d64656174682d726561736f6e530000000872656a656374656402036d2d31ce";

// The body frame of that message.
inline constexpr std::string_view kBodyHello310 = "0300010000000568656c6c6fce";

// queue.declare of a wait queue with x-message-ttl (I), DLX and DL routing key (S), as pika encodes
// it.
inline constexpr std::string_view kQueueDeclareWithArguments =
    "0100010000006f0032000a00000f6f72646572732e776169742e33307302000000540d782d6d657373616765"
    "2d74746c490000753016782d646561642d6c65747465722d65786368616e6765530000000019782d64656164"
    "2d6c65747465722d726f7574696e672d6b657953000000066f7264657273ce";

// basic.publish to orders.in with mandatory set, as pika encodes it.
inline constexpr std::string_view kBasicPublish =
    "0100010000001f003c00280000096f72646572732e696e0d6f726465722e6372656174656401ce";

// A content header with all 14 basic properties set, as pika encodes it.
inline constexpr std::string_view kHeaderAllProperties =
    "0200010000008f003c0000000000000000000bfffc106170706c69636174696f6e2f6a736f6e04677a697000"
    "0000251172657472796c6f6f702d726574726965734900000002057472616365530000000361626302050663"
    "6f72722d31077265706c696573053630303030066d73672d3432000000006553f1000d6f726465722e637265"
    "617465640567756573740473686f70026331ce";

// basic.ack delivery tag 7, multiple, as pika encodes it.
inline constexpr std::string_view kBasicAckMultiple = "0100010000000d003c0050000000000000000701ce";

}  // namespace retryloop::amqp::test
