#include "retryloop/operations/http_endpoint.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <uv.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "retryloop/client/loop_bridge.hpp"
#include "retryloop/http/bounded_server.hpp"
#include "retryloop/operations/prometheus.hpp"

namespace retryloop::operations {

std::string ListenAddress::text() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

ListenAddress parse_listen_address(std::string_view text) {
  ListenAddress address;
  std::string_view port = text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw std::invalid_argument("\"" + std::string(text) +
                                  "\": an IPv6 address is written [ADDRESS]:PORT");
    }
    address.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    address.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  if (address.host.empty()) {
    throw std::invalid_argument("\"" + std::string(text) + "\" names no host: HOST:PORT");
  }
  unsigned value = 0;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || error != std::errc() || end != port.data() + port.size() || value > 65535) {
    throw std::invalid_argument("\"" + std::string(text) +
                                "\": the port is not a number from 0 to 65535");
  }
  address.port = static_cast<uint16_t>(value);
  return address;
}

namespace detail {

// The endpoint's state. The loop thread owns `consumers_`; the HTTP threads reach them only
// through the bridge. Closing: the bridge takes no more calls (waiting requests get 503), the
// server stops, a closer thread joins the listener (which joins the request threads) and posts to
// the loop one last time; the loop then closes the bridge, and the endpoint lets itself go once
// the bridge's handle is closed.
class HttpEndpointImpl : public std::enable_shared_from_this<HttpEndpointImpl> {
 public:
  HttpEndpointImpl(uv_loop_t* loop, HttpEndpointOptions options)
      : loop_(loop), options_(std::move(options)), server_(limits(options_)) {}

  void add(std::shared_ptr<consumer::Consumer> consumer) {
    if (consumer) consumers_.push_back(std::move(consumer));
  }
  void add_metrics(std::function<std::string()> source) {
    if (source) sources_.push_back(std::move(source));
  }

  client::Error start();
  void close(std::function<void()> done);
  uint16_t port() const { return port_; }

 private:
  enum class State { created, serving, closing, closed };
  using Snapshot = std::vector<ConsumerStatus>;
  /// On an HTTP thread: the text of the added metric sources, made on the loop thread.
  std::optional<std::string> other_metrics();

  void route();
  /// On an HTTP thread: the consumers' status, taken on the loop thread; nullopt when the loop
  /// did not answer in time or the endpoint is closing.
  std::optional<Snapshot> snapshot();
  void unavailable(httplib::Response& response) const;
  void on_closed();

  uv_loop_t* loop_;
  HttpEndpointOptions options_;
  State state_ = State::created;
  std::vector<std::shared_ptr<consumer::Consumer>> consumers_;
  std::vector<std::function<std::string()>> sources_;
  uint16_t port_ = 0;
  static http::ServerLimits limits(const HttpEndpointOptions& options) {
    http::ServerLimits limits;
    // Every route is a GET: a request with a body is refused (413) before it is read.
    limits.request.max_body_bytes = 0;
    limits.request_time = options.request_time;
    limits.max_connections = std::max<size_t>(options.max_connections, 1);
    return limits;
  }

  http::BoundedServer server_;
  std::thread listener_;
  std::thread closer_;
  std::unique_ptr<client::LoopBridge> bridge_;
  std::vector<std::function<void()>> on_closed_;
  std::shared_ptr<HttpEndpointImpl> self_;
};

client::Error HttpEndpointImpl::start() {
  if (state_ != State::created) {
    return client::Error(client::ClientError::invalid_argument,
                         "the HTTP endpoint was started before");
  }
  route();
  const ListenAddress& listen = options_.listen;
  const int bound = server_.bind(listen.host, listen.port);
  if (bound < 0) {
    const int error = errno;
    return client::Error(error != 0 ? std::error_code(error, std::generic_category())
                                    : std::make_error_code(std::errc::address_not_available),
                         "cannot listen on " + listen.text() +
                             (error != 0 ? ": " + std::string(strerror(error)) : ""));
  }
  port_ = static_cast<uint16_t>(bound);

  bridge_ = std::make_unique<client::LoopBridge>(loop_);
  self_ = shared_from_this();
  state_ = State::serving;
  listener_ = std::thread([this] { server_.listen_after_bind(); });
  // Server::stop() does nothing until the listener runs: wait for it, so that close() works at
  // any time after start() returns.
  for (int i = 0; i < 5000 && !server_.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (auto* log = options_.logger.get()) {
    log->info("operations endpoint on http://{}/ (/metrics, /healthz, /readyz)",
              ListenAddress{listen.host, port_}.text());
  }
  return {};
}

void HttpEndpointImpl::route() {
  const auto content_type = std::string(prometheus_content_type);
  server_.Get("/metrics", [this, content_type](const httplib::Request&, httplib::Response& res) {
    std::optional<Snapshot> consumers = snapshot();
    std::optional<std::string> others = consumers ? other_metrics() : std::nullopt;
    if (!consumers || !others) return unavailable(res);
    res.set_content(prometheus_text(*consumers) + *others, content_type.c_str());
  });
  server_.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    if (!snapshot()) return unavailable(res);
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  server_.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    std::optional<Snapshot> consumers = snapshot();
    if (!consumers) return unavailable(res);
    bool ready = !consumers->empty();
    std::string lines;
    for (const auto& status : *consumers) {
      ready = ready && is_ready(status);
      lines += "service " + status.service + " (queue " + status.queue +
               "): " + consumer::to_string(status.state) +
               (status.blocked ? ", publishing blocked by the broker" : "") + "\n";
    }
    if (consumers->empty()) lines = "no consumers\n";
    res.status = ready ? 200 : 503;
    res.set_content((ready ? "ready\n" : "not ready\n") + lines, "text/plain; charset=utf-8");
  });
}

void HttpEndpointImpl::unavailable(httplib::Response& response) const {
  response.status = 503;
  response.set_content("the consumers' loop thread did not answer within " +
                           std::to_string(options_.loop_timeout.count()) +
                           " ms, or the endpoint is closing\n",
                       "text/plain; charset=utf-8");
}

std::optional<HttpEndpointImpl::Snapshot> HttpEndpointImpl::snapshot() {
  Snapshot consumers;
  const bool ran = bridge_->call(
      [this, &consumers] {
        for (const auto& c : consumers_)
          consumers.push_back(status_of(*c));
      },
      options_.loop_timeout);
  if (!ran) return std::nullopt;
  return consumers;
}

std::optional<std::string> HttpEndpointImpl::other_metrics() {
  std::string text;
  const bool ran = bridge_->call(
      [this, &text] {
        for (const auto& source : sources_)
          text += source();
      },
      options_.loop_timeout);
  if (!ran) return std::nullopt;
  return text;
}

void HttpEndpointImpl::close(std::function<void()> done) {
  if (done) on_closed_.push_back(std::move(done));
  switch (state_) {
    case State::created:
      state_ = State::closed;
      [[fallthrough]];
    case State::closed: {
      auto callbacks = std::move(on_closed_);
      on_closed_.clear();
      for (auto& callback : callbacks)
        callback();
      return;
    }
    case State::closing:
      return;
    case State::serving:
      break;
  }
  state_ = State::closing;
  bridge_->refuse_calls();
  server_.stop();
  closer_ = std::thread([this] {
    listener_.join();
    bridge_->post([this] {
      closer_.join();
      bridge_->close([this] { on_closed(); });
    });
  });
}

void HttpEndpointImpl::on_closed() {
  state_ = State::closed;
  consumers_.clear();
  if (auto* log = options_.logger.get()) log->info("operations endpoint closed");
  std::shared_ptr<HttpEndpointImpl> keep_alive = std::move(self_);
  auto callbacks = std::move(on_closed_);
  on_closed_.clear();
  for (auto& callback : callbacks)
    callback();
}

}  // namespace detail

std::shared_ptr<HttpEndpoint> HttpEndpoint::create(uv_loop_t* loop, HttpEndpointOptions options) {
  return std::make_shared<HttpEndpoint>(
      std::make_shared<detail::HttpEndpointImpl>(loop, std::move(options)));
}

HttpEndpoint::HttpEndpoint(std::shared_ptr<detail::HttpEndpointImpl> impl)
    : impl_(std::move(impl)) {}
HttpEndpoint::~HttpEndpoint() = default;

void HttpEndpoint::add(std::shared_ptr<consumer::Consumer> consumer) {
  impl_->add(std::move(consumer));
}

void HttpEndpoint::add_metrics(std::function<std::string()> source) {
  impl_->add_metrics(std::move(source));
}

client::Error HttpEndpoint::start() {
  return impl_->start();
}
uint16_t HttpEndpoint::port() const {
  return impl_->port();
}
void HttpEndpoint::close(std::function<void()> done) {
  impl_->close(std::move(done));
}

}  // namespace retryloop::operations
