// The connection's protocol core without a socket, a loop or a clock: the test hands it bytes and
// times, and reads the bytes, timers and events it answers with.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/methods.hpp"
#include "retryloop/amqp/rabbit_extensions.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/client/detail/connection_protocol.hpp"
#include "support/scripted_peer.hpp"

namespace {

using namespace retryloop;
using client::ClientError;
using client::Error;
using client::detail::ConnectionProtocol;
using client::detail::ProtocolTimer;
using test::Received;

struct Timer {
  uint64_t delay_ms = 0;
  uint64_t repeat_ms = 0;
};

// Plays the transport: keeps what the protocol asks for, and writes only when the test says so.
class RecordingTransport : public client::detail::ProtocolTransport {
 public:
  void output_ready() override { ++output_ready_calls; }
  bool write_in_flight() const override { return writing; }
  void start_timer(ProtocolTimer timer, uint64_t delay_ms, uint64_t repeat_ms) override {
    timers[timer] = Timer{delay_ms, repeat_ms};
  }
  void protocol_opened() override { opened = true; }
  // As the libuv transport does: the last bytes go out, then the protocol ends.
  void protocol_ended(const Error& error) override {
    last_words = protocol->output();
    ended = error;
    protocol->terminate(error);
  }
  void protocol_blocked(bool blocked, const std::string& reason) override {
    blocked_events.emplace_back(blocked, reason);
  }

  ConnectionProtocol* protocol = nullptr;
  int output_ready_calls = 0;
  bool writing = false;
  std::map<ProtocolTimer, Timer> timers;
  bool opened = false;
  std::optional<Error> ended;
  std::string last_words;
  std::vector<std::pair<bool, std::string>> blocked_events;
};

// The protocol and its transport, with the broker's side written as frames.
class Rig {
 public:
  explicit Rig(client::ConnectionOptions options = default_options())
      : protocol_(options, transport_) {
    transport_.protocol = &protocol_;
  }

  static client::ConnectionOptions default_options() {
    client::ConnectionOptions options;
    options.uri = client::parse_uri("amqp://shop:secret@broker.invalid:5672/orders");
    return options;
  }

  ConnectionProtocol& protocol() { return protocol_; }
  RecordingTransport& transport() { return transport_; }

  template <class Method>
  void receive(uint16_t channel, const Method& method, uint64_t now_ms) {
    std::string bytes;
    REQUIRE_FALSE(amqp::append_method_frame(bytes, channel, method));
    protocol_.receive(bytes, now_ms);
  }
  void receive_heartbeat(uint64_t now_ms) {
    std::string bytes;
    amqp::append_heartbeat_frame(bytes);
    protocol_.receive(bytes, now_ms);
  }

  // Writes what the protocol has for the wire at `now_ms`, and returns its frames.
  std::vector<Received> write(uint64_t now_ms) {
    protocol_.before_write();
    std::string bytes = std::move(protocol_.output());
    protocol_.output().clear();
    if (!bytes.empty()) protocol_.wrote(now_ms);
    return frames_of(bytes);
  }

  static std::vector<Received> frames_of(std::string_view bytes) {
    std::vector<Received> frames;
    amqp::FrameParser parser(0);
    const auto error = parser.feed(bytes, [&frames](const amqp::FrameView& frame) {
      Received received;
      received.type = frame.type;
      received.channel = frame.channel;
      if (frame.type == amqp::FrameType::method) {
        received.payload = std::string(frame.payload);
        REQUIRE_FALSE(amqp::peek_method_id(frame.payload, received.method));
      }
      frames.push_back(std::move(received));
      return true;
    });
    REQUIRE_FALSE(error);
    return frames;
  }

  // The handshake, answered as a broker that offers `heartbeat` seconds, at time 0.
  void open(uint16_t heartbeat) {
    protocol_.start(0);
    (void)take_header();
    amqp::ConnectionStart start;
    start.version_major = 0;
    start.version_minor = 9;
    start.mechanisms = "PLAIN AMQPLAIN";
    start.locales = "en_US";
    receive(0, start, 0);
    amqp::ConnectionTune tune;
    tune.channel_max = 2047;
    tune.frame_max = 131072;
    tune.heartbeat = heartbeat;
    receive(0, tune, 0);
    receive(0, amqp::ConnectionOpenOk{}, 0);
    REQUIRE(transport_.opened);
    (void)write(0);
  }

  std::string take_header() {
    protocol_.before_write();
    std::string bytes = std::move(protocol_.output());
    protocol_.output().clear();
    REQUIRE(bytes.size() >= amqp::kProtocolHeader.size());
    REQUIRE(bytes.substr(0, amqp::kProtocolHeader.size()) == amqp::kProtocolHeader);
    protocol_.output() = bytes.substr(amqp::kProtocolHeader.size());
    return bytes.substr(0, amqp::kProtocolHeader.size());
  }

  // Opens channel 1 and returns it.
  std::shared_ptr<client::Channel> open_channel(uint64_t now_ms) {
    std::shared_ptr<client::Channel> opened;
    REQUIRE_FALSE(protocol_.open_channel(
        [&opened](const Error& error, std::shared_ptr<client::Channel> channel) {
          REQUIRE_FALSE(error);
          opened = std::move(channel);
        }));
    const auto frames = write(now_ms);
    REQUIRE(frames.size() == 1);
    REQUIRE(frames[0].is<amqp::ChannelOpen>());
    REQUIRE(frames[0].channel == 1);
    receive(1, amqp::ChannelOpenOk{}, now_ms);
    REQUIRE(opened);
    return opened;
  }

 private:
  RecordingTransport transport_;
  ConnectionProtocol protocol_;
};

size_t heartbeats_in(const std::vector<Received>& frames) {
  size_t count = 0;
  for (const auto& frame : frames)
    count += frame.type == amqp::FrameType::heartbeat ? 1 : 0;
  return count;
}

}  // namespace

TEST_CASE("The protocol core negotiates from bytes alone and asks for the heartbeat timer",
          "[conversation][core]") {
  auto options = Rig::default_options();
  options.heartbeat_seconds = 20;
  Rig rig(options);
  rig.protocol().start(0);
  CHECK(rig.take_header() == amqp::kProtocolHeader);
  CHECK(rig.protocol().phase() == ConnectionProtocol::Phase::handshaking);

  amqp::ConnectionStart start;
  start.version_major = 0;
  start.version_minor = 9;
  start.mechanisms = "AMQPLAIN PLAIN";
  start.locales = "en_US";
  rig.receive(0, start, 1);
  auto frames = rig.write(1);
  REQUIRE(frames.size() == 1);
  REQUIRE(frames[0].is<amqp::ConnectionStartOk>());
  const auto start_ok = frames[0].as<amqp::ConnectionStartOk>();
  CHECK(start_ok.mechanism == "PLAIN");
  CHECK(start_ok.response == std::string("\0shop\0secret", 12));

  amqp::ConnectionTune tune;
  tune.channel_max = 100;
  tune.frame_max = 65536;
  tune.heartbeat = 60;
  rig.receive(0, tune, 2);
  frames = rig.write(2);
  REQUIRE(frames.size() == 2);
  REQUIRE(frames[0].is<amqp::ConnectionTuneOk>());
  const auto tune_ok = frames[0].as<amqp::ConnectionTuneOk>();
  CHECK(tune_ok.channel_max == 100);
  CHECK(tune_ok.frame_max == 65536);
  CHECK(tune_ok.heartbeat == 20);  // the smaller of the two
  REQUIRE(frames[1].is<amqp::ConnectionOpen>());
  CHECK(frames[1].as<amqp::ConnectionOpen>().virtual_host == "orders");
  CHECK_FALSE(rig.transport().opened);
  CHECK(rig.transport().timers.empty());

  rig.receive(0, amqp::ConnectionOpenOk{}, 3);
  CHECK(rig.transport().opened);
  CHECK(rig.protocol().phase() == ConnectionProtocol::Phase::open);
  REQUIRE(rig.transport().timers.count(ProtocolTimer::heartbeat) == 1);
  CHECK(rig.transport().timers[ProtocolTimer::heartbeat].delay_ms == 10000);
  CHECK(rig.transport().timers[ProtocolTimer::heartbeat].repeat_ms == 10000);
  CHECK(rig.protocol().tuning().frame_max == 65536);
}

TEST_CASE("The protocol core refuses a handshake method out of its order, with no socket",
          "[conversation][core]") {
  Rig rig;
  rig.protocol().start(0);
  (void)rig.take_header();
  rig.receive(0, amqp::ConnectionOpenOk{}, 1);
  REQUIRE(rig.transport().ended);
  CHECK(rig.transport().ended->code == make_error_code(ClientError::protocol_error));
  const auto last = Rig::frames_of(rig.transport().last_words);
  REQUIRE(last.size() == 1);
  REQUIRE(last[0].is<amqp::ConnectionClose>());
  CHECK(last[0].as<amqp::ConnectionClose>().reply_code == 505);
  CHECK(rig.protocol().phase() == ConnectionProtocol::Phase::closed);
}

TEST_CASE("Heartbeats go out and a silent peer is found by the time the transport gives",
          "[conversation][core]") {
  Rig rig;
  rig.open(2);  // ticks every 1000 ms; silence for 4000 ms ends the connection

  rig.protocol().timer_fired(ProtocolTimer::heartbeat, 1000);
  CHECK(heartbeats_in(rig.write(1000)) == 1);
  rig.protocol().timer_fired(ProtocolTimer::heartbeat, 1200);
  CHECK(rig.write(1200).empty());  // one went out 200 ms ago

  SECTION("a write in flight holds the heartbeat back") {
    rig.transport().writing = true;
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 2200);
    CHECK(rig.write(2200).empty());
  }
  SECTION("the peer's heartbeats keep it open; silence ends it") {
    rig.receive_heartbeat(1500);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 2500);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 3500);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 4500);
    CHECK_FALSE(rig.transport().ended);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 5500);
    REQUIRE(rig.transport().ended);
    CHECK(rig.transport().ended->code == make_error_code(ClientError::heartbeat_timeout));
  }
  SECTION("a tick late by a whole interval (a stalled loop) waits for one more") {
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 9000);
    CHECK_FALSE(rig.transport().ended);
    rig.receive_heartbeat(9001);  // what arrived during the stall is read after it
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 10000);
    CHECK_FALSE(rig.transport().ended);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 20000);
    rig.protocol().timer_fired(ProtocolTimer::heartbeat, 21000);
    REQUIRE(rig.transport().ended);
    CHECK(rig.transport().ended->code == make_error_code(ClientError::heartbeat_timeout));
  }
}

TEST_CASE("A channel's acks wait for the ack_delay timer, and go at once with no delay",
          "[conversation][core]") {
  SECTION("with ack_delay: held until the timer fires, one timer for many acks") {
    Rig rig;
    rig.open(0);
    auto channel = rig.open_channel(10);
    REQUIRE_FALSE(channel->ack(1));
    REQUIRE_FALSE(channel->ack(2));
    CHECK(rig.write(11).empty());
    REQUIRE(rig.transport().timers.count(ProtocolTimer::ack_delay) == 1);
    CHECK(rig.transport().timers[ProtocolTimer::ack_delay].delay_ms == 1);
    CHECK(rig.transport().timers[ProtocolTimer::ack_delay].repeat_ms == 0);
    rig.transport().timers.clear();
    REQUIRE_FALSE(channel->ack(3));
    CHECK(rig.transport().timers.empty());  // the running timer serves it too

    rig.protocol().timer_fired(ProtocolTimer::ack_delay, 12);
    const auto frames = rig.write(12);
    REQUIRE(frames.size() == 1);
    REQUIRE(frames[0].is<amqp::BasicAck>());
    CHECK(frames[0].as<amqp::BasicAck>().delivery_tag == 3);
    CHECK(frames[0].as<amqp::BasicAck>().multiple);
  }
  SECTION("with ack_delay 0: the next write carries them") {
    auto options = Rig::default_options();
    options.ack_delay = std::chrono::milliseconds(0);
    Rig rig(options);
    rig.open(0);
    auto channel = rig.open_channel(10);
    REQUIRE_FALSE(channel->ack(7));
    CHECK(rig.transport().timers.count(ProtocolTimer::ack_delay) == 0);
    const auto frames = rig.write(11);
    REQUIRE(frames.size() == 1);
    REQUIRE(frames[0].is<amqp::BasicAck>());
    CHECK(frames[0].as<amqp::BasicAck>().delivery_tag == 7);
  }
}

TEST_CASE("The client's close waits for close-ok, and the close timer bounds the wait",
          "[conversation][core]") {
  Rig rig;
  rig.open(0);
  auto channel = rig.open_channel(10);
  REQUIRE_FALSE(channel->ack(4));  // held back: the close sends it first
  rig.protocol().close();
  CHECK(rig.protocol().phase() == ConnectionProtocol::Phase::closing);
  const auto frames = rig.write(20);
  REQUIRE(frames.size() == 2);
  CHECK(frames[0].is<amqp::BasicAck>());
  REQUIRE(frames[1].is<amqp::ConnectionClose>());
  CHECK(frames[1].as<amqp::ConnectionClose>().reply_code == 200);
  REQUIRE(rig.transport().timers.count(ProtocolTimer::close) == 1);
  CHECK(rig.transport().timers[ProtocolTimer::close].delay_ms == 5000);
  CHECK_FALSE(rig.transport().ended);

  SECTION("close-ok ends it") {
    rig.receive(0, amqp::ConnectionCloseOk{}, 30);
  }
  SECTION("no close-ok: the timer ends it") {
    rig.protocol().timer_fired(ProtocolTimer::close, 5020);
  }
  REQUIRE(rig.transport().ended);
  CHECK(rig.transport().ended->code == make_error_code(ClientError::closed_by_client));
  CHECK_FALSE(channel->is_open());
}

TEST_CASE("connection.blocked and unblocked reach the transport with the broker's reason",
          "[conversation][core]") {
  Rig rig;
  rig.open(0);
  amqp::ConnectionBlocked blocked;
  blocked.reason = "low on memory";
  rig.receive(0, blocked, 5);
  CHECK(rig.protocol().is_blocked());
  rig.receive(0, amqp::ConnectionUnblocked{}, 6);
  CHECK_FALSE(rig.protocol().is_blocked());
  REQUIRE(rig.transport().blocked_events.size() == 2);
  CHECK(rig.transport().blocked_events[0] == std::make_pair(true, std::string("low on memory")));
  CHECK(rig.transport().blocked_events[1] == std::make_pair(false, std::string()));
}

TEST_CASE("Bytes that are no AMQP frame end the connection with frame-error 501",
          "[conversation][core]") {
  Rig rig;
  rig.open(0);
  rig.protocol().receive(std::string("\x09\x00\x00\x00\x00\x00\x00\xce", 8), 5);
  REQUIRE(rig.transport().ended);
  CHECK(rig.transport().ended->code == make_error_code(ClientError::protocol_error));
  const auto last = Rig::frames_of(rig.transport().last_words);
  REQUIRE(last.size() == 1);
  REQUIRE(last[0].is<amqp::ConnectionClose>());
  CHECK(last[0].as<amqp::ConnectionClose>().reply_code == 501);
}
