#include "support/scripted_peer.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

#include "support/fake_server.hpp"

namespace retryloop::test {

struct ScriptedPeer::Client {
  ScriptedPeer* peer = nullptr;
  int id = 0;
  uv_tcp_t socket{};
  char buffer[65536];
  bool header_read = false;
  std::string header;
  amqp::FrameParser parser{0};
  /// A content method waiting for its header and body, by channel.
  std::map<uint16_t, Received> pending_content;
  std::map<uint16_t, uint64_t> expected_body;
  std::set<uint16_t> confirm_channels;
  std::map<uint16_t, uint64_t> sequences;
};

namespace {

struct Write {
  uv_write_t request{};
  std::string bytes;
};

amqp::FieldTable server_properties(const std::string& version) {
  amqp::FieldTable capabilities;
  for (const char* name :
       {"publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
        "connection.blocked", "authentication_failure_close", "per_consumer_qos"}) {
    capabilities.append(name, true);
  }
  amqp::FieldTable properties;
  properties.append("capabilities", capabilities);
  properties.append("product", "ScriptedPeer");
  properties.append("version", version);
  return properties;
}

}  // namespace

ScriptedPeer::ScriptedPeer(uv_loop_t* loop, Options options) : loop_(loop), options_(options) {
  port_ = listen_on_loopback(loop_, listener_, this, [](uv_stream_t* listener, int status) {
    if (status == 0) static_cast<ScriptedPeer*>(listener->data)->on_accept();
  });
}

ScriptedPeer::~ScriptedPeer() {
  drop();
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* handle) {
    static_cast<ScriptedPeer*>(handle->data)->listener_closed_ = true;
  });
  // The handles live in this object: wait for their close callbacks before it goes.
  while (open_clients_ > 0 || !listener_closed_)
    uv_run(loop_, UV_RUN_ONCE);
}

std::string ScriptedPeer::url() const {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(port_) + "/";
}

void ScriptedPeer::on_accept() {
  auto accepted = std::make_unique<Client>();
  Client* c = accepted.get();
  c->peer = this;
  c->id = ++connections_;
  c->socket.data = c;
  uv_tcp_init(loop_, &c->socket);
  ++open_clients_;
  clients_[c->id] = std::move(accepted);
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                reinterpret_cast<uv_stream_t*>(&c->socket)) != 0) {
    return close_client(c->id);
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->socket),
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        auto* c = static_cast<Client*>(handle->data);
        *buf = uv_buf_init(c->buffer, sizeof(c->buffer));
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Client*>(stream->data);
        if (n < 0) return c->peer->close_client(c->id);
        if (n > 0) c->peer->on_bytes(*c, buf->base, size_t(n));
      });
}

void ScriptedPeer::on_bytes(Client& c, const char* data, size_t size) {
  std::string_view chunk(data, size);
  if (!c.header_read) {
    const size_t wanted = amqp::kProtocolHeader.size() - c.header.size();
    c.header.append(chunk.substr(0, wanted));
    chunk.remove_prefix(std::min(wanted, chunk.size()));
    if (c.header.size() < amqp::kProtocolHeader.size()) return;
    c.header_read = true;
    REQUIRE(c.header == amqp::kProtocolHeader);
    amqp::ConnectionStart start;
    start.version_major = 0;
    start.version_minor = 9;
    start.server_properties = server_properties(options_.version);
    start.mechanisms = "PLAIN AMQPLAIN";
    start.locales = "en_US";
    send(0, start, c.id);
  }
  if (chunk.empty()) return;
  const int id = c.id;
  const std::error_code error = c.parser.feed(chunk, [this, id](const amqp::FrameView& frame) {
    Client* live = client(id);  // a handler may have dropped it
    if (live != nullptr) on_frame(*live, frame);
    return live != nullptr;
  });
  REQUIRE_FALSE(error);
}

void ScriptedPeer::on_frame(Client& c, const amqp::FrameView& frame) {
  Received r;
  r.connection = c.id;
  r.type = frame.type;
  r.channel = frame.channel;
  switch (frame.type) {
    case amqp::FrameType::heartbeat:
      return record(c, std::move(r));
    case amqp::FrameType::method: {
      r.payload = std::string(frame.payload);
      REQUIRE_FALSE(amqp::peek_method_id(frame.payload, r.method));
      if (r.is<amqp::BasicPublish>()) {
        c.pending_content[frame.channel] = std::move(r);
        return;
      }
      return record(c, std::move(r));
    }
    case amqp::FrameType::header: {
      auto it = c.pending_content.find(frame.channel);
      REQUIRE(it != c.pending_content.end());
      amqp::ContentHeader header;
      REQUIRE_FALSE(amqp::decode_header_frame(frame.payload, header));
      it->second.properties = std::move(header.properties);
      c.expected_body[frame.channel] = header.body_size;
      break;
    }
    case amqp::FrameType::body: {
      auto it = c.pending_content.find(frame.channel);
      REQUIRE(it != c.pending_content.end());
      it->second.body.append(frame.payload);
      break;
    }
  }
  auto it = c.pending_content.find(frame.channel);
  if (it != c.pending_content.end() && it->second.properties &&
      it->second.body.size() >= c.expected_body[frame.channel]) {
    Received publish = std::move(it->second);
    c.pending_content.erase(it);
    if (c.confirm_channels.count(publish.channel) != 0) ++c.sequences[publish.channel];
    record(c, std::move(publish));
  }
}

void ScriptedPeer::record(Client& c, Received received) {
  received_.push_back(received);
  if (received.type != amqp::FrameType::method) return;
  auto handler = handlers_.find(received.method.key());
  if (handler != handlers_.end()) return handler->second(received_.back());
  answer(c, received);
}

void ScriptedPeer::script_message_counts(const std::string& queue, std::vector<uint32_t> counts) {
  if (counts.empty()) throw std::invalid_argument("script_message_counts: no counts");
  message_counts_[queue] = MessageCounts{std::move(counts), 0};
}

size_t ScriptedPeer::message_count_lookups(const std::string& queue) const {
  auto scripted = message_counts_.find(queue);
  return scripted == message_counts_.end() ? 0 : scripted->second.answered;
}

void ScriptedPeer::answer(Client& c, const Received& r) {
  const uint16_t channel = r.channel;
  auto send = [this, &c](uint16_t on, const auto& method) { this->send(on, method, c.id); };
  if (r.is<amqp::ConnectionStartOk>()) {
    amqp::ConnectionTune tune;
    tune.channel_max = options_.channel_max;
    tune.frame_max = options_.frame_max;
    tune.heartbeat = options_.heartbeat;
    send(0, tune);
  } else if (r.is<amqp::ConnectionOpen>()) {
    send(0, amqp::ConnectionOpenOk{});
  } else if (r.is<amqp::ConnectionClose>()) {
    send(0, amqp::ConnectionCloseOk{});
  } else if (r.is<amqp::ConnectionCloseOk>()) {
    close_client(c.id);
  } else if (r.is<amqp::ChannelOpen>()) {
    send(channel, amqp::ChannelOpenOk{});
  } else if (r.is<amqp::ChannelClose>()) {
    c.confirm_channels.erase(channel);
    c.sequences.erase(channel);
    send(channel, amqp::ChannelCloseOk{});
  } else if (r.is<amqp::ConfirmSelect>()) {
    c.confirm_channels.insert(channel);
    if (!r.as<amqp::ConfirmSelect>().nowait) send(channel, amqp::ConfirmSelectOk{});
  } else if (r.is<amqp::BasicQos>()) {
    send(channel, amqp::BasicQosOk{});
  } else if (r.is<amqp::QueueDeclare>()) {
    const auto declare = r.as<amqp::QueueDeclare>();
    amqp::QueueDeclareOk ok;
    ok.queue = declare.queue;
    auto scripted = message_counts_.find(declare.queue);
    if (declare.passive && scripted != message_counts_.end()) {
      auto& [counts, answered] = scripted->second;
      ok.message_count = counts[std::min(answered++, counts.size() - 1)];
    }
    if (!declare.no_wait) send(channel, ok);
  } else if (r.is<amqp::ExchangeDeclare>()) {
    send(channel, amqp::ExchangeDeclareOk{});
  } else if (r.is<amqp::QueueBind>()) {
    send(channel, amqp::QueueBindOk{});
  } else if (r.is<amqp::ExchangeBind>()) {
    send(channel, amqp::ExchangeBindOk{});
  } else if (r.is<amqp::BasicConsume>()) {
    const auto consume = r.as<amqp::BasicConsume>();
    amqp::BasicConsumeOk ok;
    ok.consumer_tag = consume.consumer_tag.empty() ? "amq.ctag-" + std::to_string(++consumer_tags_)
                                                   : consume.consumer_tag;
    last_consumer_tag_ = ok.consumer_tag;
    if (!consume.no_wait) send(channel, ok);
  } else if (r.is<amqp::BasicCancel>()) {
    amqp::BasicCancelOk ok;
    ok.consumer_tag = r.as<amqp::BasicCancel>().consumer_tag;
    send(channel, ok);
  } else if (r.is<amqp::BasicPublish>()) {
    if (options_.auto_confirm && c.confirm_channels.count(channel) != 0) {
      amqp::BasicAck ack;
      ack.delivery_tag = c.sequences[channel];
      send(channel, ack);
    }
  }
}

void ScriptedPeer::send_heartbeat(int connection) {
  std::string out;
  amqp::append_heartbeat_frame(out);
  send_raw(std::move(out), connection);
}

ScriptedPeer::Client* ScriptedPeer::client(int connection) const {
  if (clients_.empty()) return nullptr;
  if (connection < 0) return clients_.rbegin()->second.get();
  auto it = clients_.find(connection);
  return it == clients_.end() ? nullptr : it->second.get();
}

void ScriptedPeer::send_raw(std::string bytes, int connection) {
  Client* c = client(connection);
  if (c == nullptr) return;
  auto* write = new Write;
  write->bytes = std::move(bytes);
  write->request.data = write;
  uv_buf_t buffer = uv_buf_init(write->bytes.data(), unsigned(write->bytes.size()));
  const int status =
      uv_write(&write->request, reinterpret_cast<uv_stream_t*>(&c->socket), &buffer, 1,
               [](uv_write_t* request, int) { delete static_cast<Write*>(request->data); });
  if (status != 0) delete write;
}

void ScriptedPeer::drop() {
  while (!clients_.empty())
    close_client(clients_.begin()->first);
}

void ScriptedPeer::close_client(int id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  closing_.push_back(std::move(it->second));
  clients_.erase(it);
  uv_close(reinterpret_cast<uv_handle_t*>(&closing_.back()->socket),
           [](uv_handle_t* handle) { --static_cast<Client*>(handle->data)->peer->open_clients_; });
}

size_t ScriptedPeer::heartbeats() const {
  size_t n = 0;
  for (const auto& r : received_)
    n += r.type == amqp::FrameType::heartbeat ? 1 : 0;
  return n;
}

std::vector<Received> ScriptedPeer::publishes(uint16_t channel) const {
  std::vector<Received> out;
  for (const auto& r : received_) {
    if (r.channel == channel && r.is<amqp::BasicPublish>()) out.push_back(r);
  }
  return out;
}

uint64_t ScriptedPeer::last_sequence(uint16_t channel, int connection) const {
  const Client* c = client(connection);
  if (c == nullptr) return 0;
  auto it = c->sequences.find(channel);
  return it == c->sequences.end() ? 0 : it->second;
}

}  // namespace retryloop::test
