#include "support/fake_server.hpp"

#include <catch2/catch.hpp>

namespace retryloop::test {

struct FakeServer::Client {
  FakeServer* server = nullptr;
  uv_tcp_t socket{};
  uv_write_t write{};
  std::string header;
  bool answered = false;
  bool closing = false;
  char buffer[4096];
};

uint16_t listen_on_loopback(uv_loop_t* loop, uv_tcp_t& listener, void* owner,
                            uv_connection_cb on_connection) {
  uv_tcp_init(loop, &listener);
  listener.data = owner;
  sockaddr_in address{};
  uv_ip4_addr("127.0.0.1", 0, &address);
  REQUIRE(uv_tcp_bind(&listener, reinterpret_cast<const sockaddr*>(&address), 0) == 0);
  REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&listener), 8, on_connection) == 0);
  sockaddr_storage bound{};
  int length = sizeof(bound);
  uv_tcp_getsockname(&listener, reinterpret_cast<sockaddr*>(&bound), &length);
  return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

FakeServer::FakeServer(uv_loop_t* loop, std::string script, bool close_after)
    : loop_(loop), script_(std::move(script)), close_after_(close_after) {
  port_ = listen_on_loopback(loop_, listener_, this, [](uv_stream_t* listener, int status) {
    if (status == 0) static_cast<FakeServer*>(listener->data)->on_accept();
  });
}

FakeServer::~FakeServer() {
  for (auto& client : clients_)
    close_client(client.get());
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* handle) {
    static_cast<FakeServer*>(handle->data)->listener_closed_ = true;
  });
  // The handles live in this object: wait for their close callbacks before it goes.
  while (open_clients_ > 0 || !listener_closed_)
    uv_run(loop_, UV_RUN_ONCE);
}

void FakeServer::on_accept() {
  clients_.push_back(std::make_unique<Client>());
  Client* client = clients_.back().get();
  client->server = this;
  client->socket.data = client;
  uv_tcp_init(loop_, &client->socket);
  ++open_clients_;
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                reinterpret_cast<uv_stream_t*>(&client->socket)) != 0) {
    close_client(client);
    return;
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&client->socket),
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        auto* c = static_cast<Client*>(handle->data);
        *buf = uv_buf_init(c->buffer, sizeof(c->buffer));
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Client*>(stream->data);
        FakeServer* self = c->server;
        if (n < 0) return self->close_client(c);
        self->received_.append(buf->base, size_t(n));
        c->header.append(buf->base, size_t(n));
        if (c->answered || c->header.size() < 8) return;
        c->answered = true;
        uv_buf_t out = uv_buf_init(self->script_.data(), unsigned(self->script_.size()));
        c->write.data = c;
        uv_write(&c->write, stream, &out, 1, [](uv_write_t* req, int) {
          auto* client = static_cast<Client*>(req->data);
          if (client->server->close_after_) client->server->close_client(client);
        });
      });
}

void FakeServer::close_client(Client* client) {
  if (client->closing) return;
  client->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&client->socket), [](uv_handle_t* handle) {
    --static_cast<Client*>(handle->data)->server->open_clients_;
  });
}

}  // namespace retryloop::test
