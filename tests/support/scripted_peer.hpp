#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/amqp/frame.hpp"
#include "retryloop/amqp/methods.hpp"
#include "retryloop/amqp/properties.hpp"

namespace retryloop::test {

/// A frame the client sent, as the peer read it. A content method (basic.publish) is recorded
/// once its header and body have arrived, with them.
struct Received {
  /// Which of the client's connections sent it: 1 for the first the peer accepted, and so on.
  int connection = 0;
  amqp::FrameType type = amqp::FrameType::method;
  uint16_t channel = 0;
  amqp::MethodId method;
  /// The method frame's payload (class and method ids first).
  std::string payload;
  std::optional<amqp::BasicProperties> properties;
  std::string body;

  bool is(uint16_t class_id, uint16_t method_id) const {
    return type == amqp::FrameType::method && method.class_id == class_id &&
           method.method_id == method_id;
  }
  template <class Method>
  bool is() const {
    return is(Method::class_id, Method::method_id);
  }
  /// The method's arguments; the test fails if they do not decode as `Method`.
  template <class Method>
  Method as() const;
};

/// The broker's side of a conversation, frame by frame, on the test's loop: a loopback TCP
/// server that clients connect to (a consumer opens two connections). It answers the handshake and
/// the synchronous methods as RabbitMQ does unless a test gives its own handler for a method,
/// records every frame the client sends, and sends whatever a test scripts (deliveries, returns,
/// confirms, closes, heartbeats, raw bytes). No broker, no timers: a test runs the loop until what
/// it waits for has happened.
class ScriptedPeer {
 public:
  struct Options {
    uint16_t channel_max = 2047;
    uint32_t frame_max = 131072;
    uint16_t heartbeat = 0;
    /// Confirm each basic.publish on a channel in confirm mode at once (basic.ack); false leaves
    /// confirms to the test.
    bool auto_confirm = true;
    /// The broker version connection.start announces (server property `version`).
    std::string version = "0.0.0";
  };
  using Handler = std::function<void(const Received&)>;

  ScriptedPeer(uv_loop_t* loop, Options options);
  explicit ScriptedPeer(uv_loop_t* loop) : ScriptedPeer(loop, Options{}) {}
  ~ScriptedPeer();
  ScriptedPeer(const ScriptedPeer&) = delete;
  ScriptedPeer& operator=(const ScriptedPeer&) = delete;

  uint16_t port() const { return port_; }
  /// `amqp://guest:guest@127.0.0.1:PORT/`.
  std::string url() const;

  /// Handles `Method` from the client instead of the default answer.
  template <class Method>
  void on(Handler handler) {
    handlers_[amqp::MethodId{Method::class_id, Method::method_id}.key()] = std::move(handler);
  }

  /// Sends on `connection` (Received::connection); -1: the newest open one.
  template <class Method>
  void send(uint16_t channel, const Method& method, int connection = -1) {
    std::string out;
    (void)amqp::append_method_frame(out, channel, method);
    send_raw(std::move(out), connection);
  }
  /// A content method (basic.deliver, basic.return, basic.get-ok) with its header and body.
  template <class Method>
  void send_content(uint16_t channel, const Method& method, const amqp::BasicProperties& properties,
                    const std::string& body, int connection = -1) {
    std::string out;
    (void)amqp::append_method_frame(out, channel, method);
    (void)amqp::append_header_frame(out, channel, body.size(), properties);
    amqp::append_body_frames(out, channel, body, options_.frame_max);
    send_raw(std::move(out), connection);
  }
  /// A content method whose header carries `property_bytes` as its property flags and list, as
  /// they are, so that a test can send what the encoder would refuse to.
  template <class Method>
  void send_raw_content(uint16_t channel, const Method& method, std::string_view property_bytes,
                        const std::string& body, int connection = -1) {
    std::string out;
    (void)amqp::append_method_frame(out, channel, method);
    std::string payload;
    amqp::Writer header(payload);
    header.u16(Method::class_id);
    header.u16(0);  // weight
    header.u64(body.size());
    header.raw(property_bytes);
    amqp::Writer frame(out);
    frame.u8(static_cast<uint8_t>(amqp::FrameType::header));
    frame.u16(channel);
    frame.u32(static_cast<uint32_t>(payload.size()));
    frame.raw(payload);
    frame.u8(amqp::kFrameEnd);
    amqp::append_body_frames(out, channel, body, options_.frame_max);
    send_raw(std::move(out), connection);
  }
  void send_heartbeat(int connection = -1);
  void send_raw(std::string bytes, int connection = -1);
  /// Closes every socket without a connection.close, as a lost network does.
  void drop();
  /// Answers the passive declares of `queue` from now on with `counts` as its message count, in
  /// turn, the last one again once they run out (by default a passive declare finds 0).
  void script_message_counts(const std::string& queue, std::vector<uint32_t> counts);
  /// Passive declares of `queue` answered from its script so far.
  size_t message_count_lookups(const std::string& queue) const;

  /// Whether a client connection is open.
  bool connected() const { return !clients_.empty(); }
  /// Clients that connected so far.
  int connections() const { return connections_; }
  /// Everything the client sent, in order (heartbeats as frames of type heartbeat).
  const std::vector<Received>& received() const { return received_; }
  template <class Method>
  size_t count() const {
    size_t n = 0;
    for (const auto& r : received_)
      n += r.is<Method>() ? 1 : 0;
    return n;
  }
  size_t heartbeats() const;
  /// The last `Method` the client sent; the test fails if there is none.
  template <class Method>
  Method last() const;
  /// The consumer tag of the last basic.consume-ok the peer sent by default.
  const std::string& last_consumer_tag() const { return last_consumer_tag_; }
  /// The publishes on `channel` so far, in order (of every connection).
  std::vector<Received> publishes(uint16_t channel) const;
  /// Confirm-mode sequence number of the last publish on `channel` of `connection` (-1: the
  /// newest open one; 0: none).
  uint64_t last_sequence(uint16_t channel, int connection = -1) const;

 private:
  struct Client;
  void on_accept();
  void on_bytes(Client& client, const char* data, size_t size);
  void on_frame(Client& client, const amqp::FrameView& frame);
  void record(Client& client, Received received);
  void answer(Client& client, const Received& received);
  void close_client(int id);
  Client* client(int connection) const;

  uv_loop_t* loop_;
  Options options_;
  uint16_t port_ = 0;
  uv_tcp_t listener_{};
  bool listener_closed_ = false;
  std::map<int, std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Client>> closing_;
  int open_clients_ = 0;
  int connections_ = 0;
  std::map<uint32_t, Handler> handlers_;
  struct MessageCounts {
    std::vector<uint32_t> counts;
    size_t answered = 0;
  };
  std::map<std::string, MessageCounts> message_counts_;
  std::string last_consumer_tag_;
  std::vector<Received> received_;
  int consumer_tags_ = 0;
};

template <class Method>
Method Received::as() const {
  Method method;
  const std::error_code error = amqp::decode_method_frame(payload, method);
  if (error) throw std::runtime_error(std::string("cannot decode ") + Method::name);
  return method;
}

template <class Method>
Method ScriptedPeer::last() const {
  for (auto it = received_.rbegin(); it != received_.rend(); ++it) {
    if (it->is<Method>()) return it->as<Method>();
  }
  throw std::runtime_error(std::string("the client sent no ") + Method::name);
}

}  // namespace retryloop::test
