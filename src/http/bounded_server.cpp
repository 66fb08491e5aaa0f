#include "retryloop/http/bounded_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace retryloop::http {

namespace {

using Clock = std::chrono::steady_clock;

/// Set on the listener's thread while it turns away a connection beyond the limit.
thread_local bool turning_away = false;

const char* status_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

std::string seconds_text(std::chrono::milliseconds time) {
  if (time.count() % 1000 == 0) return std::to_string(time.count() / 1000) + " s";
  return std::to_string(time.count()) + " ms";
}

/// Writes all of `data` before `deadline`; false when the peer is gone or too slow.
bool write_all(int sock, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t sent = ::send(sock, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      data.remove_prefix(size_t(sent));
      continue;
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd writable{sock, POLLOUT, 0};
    if (::poll(&writable, 1, int(left.count())) == 0) return false;
  }
  return true;
}

/// Ends the sending side and reads what the client still sends, for at most a second or until it
/// closes its side.
void drain(int sock) {
  ::shutdown(sock, SHUT_WR);
  const auto until = Clock::now() + std::chrono::seconds(1);
  char buffer[64 * 1024];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    pollfd readable{sock, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&readable, 1, int(left.count())) <= 0) return;
    const ssize_t got = ::recv(sock, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return;
  }
}

/// A request already read whole, as httplib reads it; what httplib writes goes to `write`.
class RequestStream : public httplib::Stream {
 public:
  RequestStream(std::string_view request, std::string remote_ip, int remote_port, socket_t sock,
                const std::function<bool(std::string_view)>& write)
      : request_(request),
        remote_ip_(std::move(remote_ip)),
        remote_port_(remote_port),
        sock_(sock),
        write_(write) {}

  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - read_);
    std::memcpy(ptr, request_.data() + read_, n);
    read_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    return write_(std::string_view(ptr, size)) ? ssize_t(size) : -1;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_ip_;
    port = remote_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = 0;
  }
  socket_t socket() const override { return sock_; }

 private:
  std::string_view request_;
  size_t read_ = 0;
  std::string remote_ip_;
  int remote_port_;
  socket_t sock_;
  const std::function<bool(std::string_view)>& write_;
};

std::pair<std::string, int> peer_of(int sock) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {"", 0};
  char text[INET6_ADDRSTRLEN] = "";
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    return {text, ntohs(v4->sin_port)};
  }
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    return {text, ntohs(v6->sin6_port)};
  }
  return {"", 0};
}

}  // namespace

/// A thread for each connection, up to the limit; beyond it the listener's own thread turns the
/// connection away at once. shutdown() ends the connections still reading a request, and waits for
/// every thread, so that a request being answered gets its answer.
class BoundedServer::ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(BoundedServer& server) : server_(server) {}

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (running_ < server_.limits_.max_connections) {
        ++running_;
        std::thread([this, fn = std::move(fn)] {
          fn();
          std::lock_guard<std::mutex> lock(mutex_);
          --running_;
          ended_.notify_all();
        }).detach();
        return;
      }
    }
    turning_away = true;
    fn();
    turning_away = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(server_.mutex_);
      server_.stopping_ = true;
      for (const socket_t sock : server_.open_)
        ::shutdown(sock, SHUT_RDWR);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ended_.wait(lock, [this] { return running_ == 0; });
  }

 private:
  BoundedServer& server_;
  std::mutex mutex_;
  std::condition_variable ended_;
  size_t running_ = 0;
};

BoundedServer::BoundedServer(ServerLimits limits) : limits_(limits) {
  new_task_queue = [this] { return new ConnectionThreads(*this); };
  set_payload_max_length(limits_.request.max_body_bytes);
  set_keep_alive_max_count(1);
  // SO_REUSEADDR only: a restart may bind over the last run's TIME_WAIT connections, but a port
  // another socket listens on stays refused (httplib's default adds SO_REUSEPORT).
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

BoundedServer::~BoundedServer() = default;

int BoundedServer::bind(const std::string& host, int port) {
  errno = 0;
  const int bound = port == 0 ? bind_to_any_port(host) : bind_to_port(host, port) ? port : -1;
  // httplib listens with a backlog of 5: a burst of connections would wait for SYN retries
  // while the listener starts their threads. Listening again sets the backlog.
  if (bound >= 0) ::listen(svr_sock_, int(limits_.max_connections));
  return bound;
}

void BoundedServer::set_refusal_writer(RefusalWriter writer) {
  refusal_writer_ = std::move(writer);
}

size_t BoundedServer::connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_.size();
}

std::string BoundedServer::refusal(int status, const std::string& reason) const {
  httplib::Response response;
  response.status = status;
  if (refusal_writer_) {
    refusal_writer_(response, status, reason);
  } else {
    response.set_content(reason + "\n", "text/plain; charset=utf-8");
  }
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + status_phrase(status) + "\r\n";
  for (const auto& [name, value] : response.headers) {
    if (name != "Content-Length" && name != "Connection") out += name + ": " + value + "\r\n";
  }
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  return out + response.body;
}

void BoundedServer::dispatch(std::string_view request, const std::string& remote_ip,
                             int remote_port, const std::function<bool(std::string_view)>& write) {
  RequestStream stream(request, remote_ip, remote_port, INVALID_SOCKET, write);
  bool connection_closed = false;
  // httplib answers `Expect: 100-continue` with a 100 Continue of its own before routing, but the
  // request has come whole: the client was told to go on while it was read (or sent its body
  // unasked), and must not get a second interim answer.
  const auto no_expectation = [](httplib::Request& parsed) { parsed.headers.erase("Expect"); };
  process_request(stream, true, connection_closed, no_expectation);
}

std::string BoundedServer::answer(std::string_view request) {
  const RequestFraming framing = frame_request(request, limits_.request);
  switch (framing.status) {
    case RequestFraming::Status::refused:
      return refusal(framing.refusal_status, framing.reason);
    case RequestFraming::Status::incomplete:
      return refusal(408,
                     "the request was not complete within " + seconds_text(limits_.request_time));
    case RequestFraming::Status::complete:
      break;
  }
  std::string out;
  const std::function<bool(std::string_view)> write = [&out](std::string_view bytes) {
    out.append(bytes);
    return true;
  };
  dispatch(request.substr(0, framing.length), "127.0.0.1", 0, write);
  return out;
}

bool BoundedServer::process_and_close_socket(socket_t sock) {
  const auto deadline = Clock::now() + limits_.request_time;
  if (turning_away) {
    (void)write_all(sock,
                    refusal(503, "the server has " + std::to_string(limits_.max_connections) +
                                     " connections open, its most; try again"),
                    Clock::now());
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) open_.insert(sock);
  }
  // Each read is framed on from where the last one stopped.
  RequestFramer framer(limits_.request);
  const RequestFraming& framing = framer.framing();
  bool continued = false;
  bool stopped = false;
  for (;;) {
    if (framing.status != RequestFraming::Status::incomplete) break;
    if (framing.expects_continue && !continued) {
      continued = true;
      if (!write_all(sock, "HTTP/1.1 100 Continue\r\n\r\n", deadline)) break;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd readable{sock, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&readable, 1, int(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buffer[64 * 1024];
    const ssize_t got = ::recv(sock, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (got <= 0) {
      stopped = true;  // the client went away, or the server is stopping
      break;
    }
    framer.feed(std::string_view(buffer, size_t(got)));
  }
  {
    // What is left is bounded by the handler and the write time: a stop waits for it to answer.
    std::lock_guard<std::mutex> lock(mutex_);
    open_.erase(sock);
  }
  const auto write = [sock, this](std::string_view data) {
    return write_all(sock, data, Clock::now() + limits_.write_time);
  };
  if (!stopped) {
    switch (framing.status) {
      case RequestFraming::Status::complete: {
        const auto [ip, port] = peer_of(sock);
        const std::function<bool(std::string_view)> writer = write;
        dispatch(std::string_view(framer.bytes()).substr(0, framing.length), ip, port, writer);
        break;
      }
      case RequestFraming::Status::refused:
        // The rest of the request is unread: closing now would reset the connection and could
        // lose the answer, so the client gets a moment to read it first.
        if (write(refusal(framing.refusal_status, framing.reason))) drain(sock);
        break;
      case RequestFraming::Status::incomplete:
        // An idle connection is closed without a word; one that began a request is told why.
        if (!framer.bytes().empty()) {
          write(refusal(
              408, "the request was not complete within " + seconds_text(limits_.request_time)));
        }
        break;
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

}  // namespace retryloop::http
