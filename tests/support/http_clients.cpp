#include "support/http_clients.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace retryloop::test {

namespace {

int connect_to(uint16_t port) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  if (sock < 0) throw std::runtime_error("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(sock);
    throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  }
  return sock;
}

/// Whether the server closed or answered `sock`: something to read, or the end.
bool server_spoke(int sock) {
  pollfd readable{sock, POLLIN, 0};
  return ::poll(&readable, 1, 0) == 1;
}

}  // namespace

IdleClients::IdleClients(uint16_t port, size_t count) {
  for (size_t i = 0; i < count; ++i)
    sockets_.push_back(connect_to(port));
}

IdleClients::~IdleClients() {
  for (int sock : sockets_)
    ::close(sock);
}

size_t IdleClients::still_open() const {
  size_t open = 0;
  for (int sock : sockets_) {
    if (!server_spoke(sock)) ++open;
  }
  return open;
}

SlowClients::SlowClients(uint16_t port, size_t count, std::chrono::milliseconds interval) {
  for (size_t i = 0; i < count; ++i)
    sockets_.push_back(connect_to(port));
  thread_ = std::thread([this, interval] { run(interval); });
}

SlowClients::~SlowClients() {
  stop_ = true;
  thread_.join();
  for (int sock : sockets_)
    ::close(sock);
}

std::string SlowClients::first_answer() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_answer_;
}

void SlowClients::run(std::chrono::milliseconds interval) {
  const std::string head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  std::vector<bool> closed(sockets_.size(), false);
  for (size_t sent = 0; !stop_; ++sent) {
    for (size_t i = 0; i < sockets_.size(); ++i) {
      if (closed[i]) continue;
      if (server_spoke(sockets_[i])) {
        char answer[512];
        const ssize_t got = ::recv(sockets_[i], answer, sizeof answer, MSG_DONTWAIT);
        std::lock_guard<std::mutex> lock(mutex_);
        if (first_answer_.empty() && got > 0) {
          const std::string text(answer, size_t(got));
          first_answer_ = text.substr(0, text.find("\r\n"));
        }
        closed[i] = true;
        ++closed_;
        continue;
      }
      const char byte = sent < head.size() ? head[sent] : 'x';
      if (::send(sockets_[i], &byte, 1, MSG_NOSIGNAL) == 1) ++bytes_sent_;
    }
    for (auto until = std::chrono::steady_clock::now() + interval;
         !stop_ && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

std::string http_exchange(uint16_t port, const std::string& request,
                          std::chrono::milliseconds timeout) {
  const int sock = connect_to(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&deadline] {
    return int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                        deadline - std::chrono::steady_clock::now())
                                        .count()));
  };
  for (size_t at = 0; at < request.size() && !server_spoke(sock);) {
    pollfd writable{sock, POLLOUT, 0};
    if (::poll(&writable, 1, std::min(left(), 100)) == 0) {
      if (left() == 0) break;
      continue;
    }
    const ssize_t sent =
        ::send(sock, request.data() + at, std::min<size_t>(request.size() - at, 65536),
               MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent <= 0) break;
    at += size_t(sent);
  }
  std::string answer;
  char buffer[65536];
  for (;;) {
    pollfd readable{sock, POLLIN, 0};
    if (::poll(&readable, 1, left()) <= 0) break;
    const ssize_t got = ::recv(sock, buffer, sizeof buffer, 0);
    if (got <= 0) break;
    answer.append(buffer, size_t(got));
  }
  ::close(sock);
  return answer;
}

int http_status(const std::string& answer) {
  // The last status line: a 100 Continue may come first.
  size_t at = 0;
  for (size_t next; (next = answer.find("HTTP/1.1 100 ", at)) == at;)
    at = answer.find("\r\n\r\n", next) + 4;
  if (answer.compare(at, 5, "HTTP/") != 0 || answer.size() < at + 12) return 0;
  return std::atoi(answer.c_str() + at + 9);
}

std::string http_body(const std::string& answer) {
  size_t at = answer.find("\r\n\r\n");
  if (answer.compare(0, 13, "HTTP/1.1 100 ") == 0) at = answer.find("\r\n\r\n", at + 4);
  return at == std::string::npos ? "" : answer.substr(at + 4);
}

}  // namespace retryloop::test
