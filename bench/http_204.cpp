// The application of the dispatch benchmark: an HTTP/1.1 server on one thread (epoll) that
// answers every request 204 at once and keeps the connection alive, so that what is measured is
// the dispatcher, not the application. It reads a request's head up to its blank line, skips a
// Content-Length body, and understands nothing else (no chunked bodies, no pipelining limits).
// Prints {"listening": PORT} once it listens, {"first": T} at the first request and, at the
// COUNT-th, {"first": T0, "last": T1, "requests": COUNT} (Unix seconds), then keeps answering.
//
//   bench_http_204 COUNT

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

namespace {

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

/// What a connection has read of its current request.
struct Connection {
  std::string head;
  size_t body_left = 0;
};

/// The Content-Length of a request head, 0 without one.
size_t content_length(const std::string& head) {
  for (size_t at = head.find('\n'); at != std::string::npos; at = head.find('\n', at + 1)) {
    if (strncasecmp(head.c_str() + at + 1, "content-length:", 15) == 0) {
      return size_t(std::strtoull(head.c_str() + at + 16, nullptr, 10));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: bench_http_204 COUNT\n");
    return 1;
  }
  const unsigned long count = std::strtoul(argv[1], nullptr, 10);
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener, 1024) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::perror("bench_http_204: listen");
    return 1;
  }
  std::printf("{\"listening\": %d}\n", ntohs(address.sin_port));
  std::fflush(stdout);

  const int poller = epoll_create1(0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = listener;
  epoll_ctl(poller, EPOLL_CTL_ADD, listener, &event);
  std::unordered_map<int, Connection> connections;
  static const char answer[] = "HTTP/1.1 204 No Content\r\n\r\n";
  unsigned long requests = 0;
  double first = 0;
  char buffer[65536];
  epoll_event ready[256];
  for (;;) {
    const int n = epoll_wait(poller, ready, 256, -1);
    if (n < 0 && errno != EINTR) return 1;
    for (int i = 0; i < n; ++i) {
      const int fd = ready[i].data.fd;
      if (fd == listener) {
        for (int client; (client = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
          epoll_event added{};
          added.events = EPOLLIN;
          added.data.fd = client;
          epoll_ctl(poller, EPOLL_CTL_ADD, client, &added);
          connections[client] = Connection{};
        }
        continue;
      }
      Connection& connection = connections[fd];
      const ssize_t got = read(fd, buffer, sizeof buffer);
      if (got <= 0) {
        if (got < 0 && errno == EAGAIN) continue;
        close(fd);
        connections.erase(fd);
        continue;
      }
      std::string answers;
      size_t at = 0;
      while (at < size_t(got)) {
        if (connection.body_left > 0) {
          const size_t skipped = std::min(connection.body_left, size_t(got) - at);
          connection.body_left -= skipped;
          at += skipped;
        } else {
          const size_t before = connection.head.size();
          connection.head.append(buffer + at, size_t(got) - at);
          const size_t end = connection.head.find("\r\n\r\n");
          if (end == std::string::npos) break;
          at += end + 4 - before;
          connection.body_left = content_length(connection.head);
          connection.head.clear();
        }
        if (connection.body_left == 0 && connection.head.empty()) {
          answers += answer;
          if (++requests == 1) {
            first = unix_seconds();
            std::printf("{\"first\": %.6f}\n", first);
            std::fflush(stdout);
          }
          if (requests == count) {
            std::printf("{\"first\": %.6f, \"last\": %.6f, \"requests\": %lu}\n", first,
                        unix_seconds(), requests);
            std::fflush(stdout);
          }
        }
      }
      // A 204 is 27 bytes: a socket that cannot take them whole at once is given up.
      if (!answers.empty() &&
          write(fd, answers.data(), answers.size()) != ssize_t(answers.size())) {
        close(fd);
        connections.erase(fd);
      }
    }
  }
}
