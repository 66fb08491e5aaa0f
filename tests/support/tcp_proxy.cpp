#include "support/tcp_proxy.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

namespace retryloop::test {

/// One proxied connection: the client side, the upstream side, and bytes held while frozen.
struct TcpProxy::Pipe {
  TcpProxy* proxy = nullptr;
  uv_tcp_t client{};
  uv_tcp_t upstream{};
  uv_connect_t connect_req{};
  bool upstream_connected = false;
  /// The upstream closed while frozen: a frozen network delivers no FIN either, so the client
  /// learns of it only at thaw.
  bool upstream_ended = false;
  bool closing = false;
  int open_handles = 2;
  std::string to_upstream;  // read from the client, not yet forwarded
  std::string to_client;
  char buffer[65536];
};

namespace {

struct WriteRequest {
  uv_write_t req;
  std::string data;
};

void write_to(uv_tcp_t* target, std::string& data) {
  if (data.empty()) return;
  auto* request = new WriteRequest;
  request->data.swap(data);
  uv_buf_t buf = uv_buf_init(request->data.data(), static_cast<unsigned int>(request->data.size()));
  int rc = uv_write(&request->req, reinterpret_cast<uv_stream_t*>(target), &buf, 1,
                    [](uv_write_t* req, int) { delete reinterpret_cast<WriteRequest*>(req); });
  if (rc < 0) delete request;
}

}  // namespace

TcpProxy::TcpProxy(uv_loop_t* loop, uint16_t upstream_port)
    : loop_(loop), upstream_port_(upstream_port) {
  uv_tcp_init(loop_, &listener_);
  listener_.data = this;
  sockaddr_in address{};
  uv_ip4_addr("127.0.0.1", 0, &address);
  REQUIRE(uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&address), 0) == 0);
  REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 16,
                    [](uv_stream_t* server, int status) {
                      if (status == 0) static_cast<TcpProxy*>(server->data)->on_accept();
                    }) == 0);
  sockaddr_storage bound{};
  int length = sizeof(bound);
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

TcpProxy::~TcpProxy() {
  close();
  // The handles live inside this object: wait for their close callbacks before it goes.
  while (!pipes_.empty() || !listener_closed_)
    uv_run(loop_, UV_RUN_ONCE);
}

void TcpProxy::on_accept() {
  auto owned = std::make_unique<Pipe>();
  Pipe* pipe = owned.get();
  pipe->proxy = this;
  uv_tcp_init(loop_, &pipe->client);
  uv_tcp_init(loop_, &pipe->upstream);
  pipe->client.data = pipe;
  pipe->upstream.data = pipe;
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                reinterpret_cast<uv_stream_t*>(&pipe->client)) != 0) {
    pipes_.push_back(std::move(owned));
    close_pipe(pipe);
    return;
  }
  ++accepted_;
  pipes_.push_back(std::move(owned));

  auto alloc = [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
    auto* p = static_cast<Pipe*>(handle->data);
    *buf = uv_buf_init(p->buffer, sizeof(p->buffer));
  };
  uv_read_start(reinterpret_cast<uv_stream_t*>(&pipe->client), alloc,
                [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
                  auto* p = static_cast<Pipe*>(stream->data);
                  if (n < 0) {
                    p->proxy->close_pipe(p);
                    return;
                  }
                  p->to_upstream.append(buf->base, static_cast<size_t>(n));
                  if (!p->proxy->frozen_ && p->upstream_connected)
                    write_to(&p->upstream, p->to_upstream);
                });

  sockaddr_in address{};
  uv_ip4_addr("127.0.0.1", upstream_port_, &address);
  pipe->connect_req.data = pipe;
  uv_tcp_connect(&pipe->connect_req, &pipe->upstream, reinterpret_cast<const sockaddr*>(&address),
                 [](uv_connect_t* req, int status) {
                   auto* p = static_cast<Pipe*>(req->data);
                   if (p->closing) return;
                   if (status < 0) {
                     p->proxy->close_pipe(p);
                     return;
                   }
                   p->upstream_connected = true;
                   if (!p->proxy->frozen_) write_to(&p->upstream, p->to_upstream);
                   uv_read_start(
                       reinterpret_cast<uv_stream_t*>(&p->upstream),
                       [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
                         auto* pp = static_cast<Pipe*>(handle->data);
                         *buf = uv_buf_init(pp->buffer, sizeof(pp->buffer));
                       },
                       [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
                         auto* pp = static_cast<Pipe*>(stream->data);
                         if (n < 0) {
                           if (pp->proxy->frozen_ || pp->proxy->replies_held_) {
                             pp->upstream_ended = true;
                             uv_read_stop(stream);
                             return;
                           }
                           pp->proxy->close_pipe(pp);
                           return;
                         }
                         pp->proxy->from_upstream_ += static_cast<uint64_t>(n);
                         pp->to_client.append(buf->base, static_cast<size_t>(n));
                         if (!pp->proxy->frozen_ && !pp->proxy->replies_held_) {
                           write_to(&pp->client, pp->to_client);
                         }
                       });
                 });
}

void TcpProxy::freeze() {
  frozen_ = true;
}

size_t TcpProxy::held_from_clients() const {
  size_t held = 0;
  for (const auto& pipe : pipes_)
    held += pipe->to_upstream.size();
  return held;
}

void TcpProxy::hold_replies() {
  replies_held_ = true;
  if (!std::exchange(frozen_, false)) return;
  for (auto& pipe : pipes_) {
    if (!pipe->closing && pipe->upstream_connected) write_to(&pipe->upstream, pipe->to_upstream);
  }
}

void TcpProxy::thaw() {
  frozen_ = false;
  replies_held_ = false;
  for (auto& pipe : pipes_) {
    if (pipe->closing) continue;
    if (pipe->upstream_ended) {
      close_pipe(pipe.get());
      continue;
    }
    if (pipe->upstream_connected) write_to(&pipe->upstream, pipe->to_upstream);
    write_to(&pipe->client, pipe->to_client);
  }
}

void TcpProxy::cut() {
  for (auto& pipe : pipes_)
    close_pipe(pipe.get());
}

void TcpProxy::close_pipe(Pipe* pipe) {
  if (pipe->closing) return;
  pipe->closing = true;
  auto on_closed = [](uv_handle_t* handle) {
    auto* p = static_cast<Pipe*>(handle->data);
    if (--p->open_handles == 0) {
      TcpProxy* proxy = p->proxy;
      proxy->pipes_.remove_if([p](const std::unique_ptr<Pipe>& owned) { return owned.get() == p; });
    }
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe->client), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe->upstream), on_closed);
}

void TcpProxy::close() {
  if (closed_) return;
  closed_ = true;
  cut();
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* handle) {
    static_cast<TcpProxy*>(handle->data)->listener_closed_ = true;
  });
}

}  // namespace retryloop::test
