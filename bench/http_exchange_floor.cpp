// The floor under any dispatcher that makes one HTTP exchange per message: the CPU a client spends
// on nothing but keep-alive HTTP/1.1 exchanges over loopback, at a concurrency of its own, on one
// thread with epoll. Each exchange writes a POST of the size retryloop dispatch sends (its header
// block and a body) and reads the answer up to its blank line; nothing is parsed beyond that. Run
// against bench_http_204, it prints {"exchanges", "seconds", "cpu_seconds", "cpu_us_per_exchange"}:
// what the kernel's loopback TCP and the two system calls an exchange needs cost by themselves.
//
//   bench_http_exchange_floor PORT COUNT [CONCURRENCY] [BODY_BYTES]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

/// A request as retryloop dispatch writes one: its CloudEvents and retryloop fields, a traceparent
/// and a Retryloop-Headers object, then the body.
std::string make_request(size_t body_bytes) {
  std::string body(body_bytes, 'x');
  return "POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n"
         "Content-Type: application/json\r\nce-specversion: 1.0\r\n"
         "ce-id: 6b1f0c0e-5a7d-4f43-9d6e-0d0c7b1e5a11\r\nce-source: /retryloop/orders\r\n"
         "ce-type: order.created\r\nce-time: 2026-12-05T21:30:08Z\r\nRetryloop-Attempt: 1\r\n"
         "Retryloop-Max-Attempts: 5\r\nRetryloop-Redelivered: false\r\n"
         "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
         "Retryloop-Headers: {\"tenant\":\"s:acme\"}\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct Exchange {
  int fd = -1;
  std::string answer;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PORT COUNT [CONCURRENCY] [BODY_BYTES]\n", argv[0]);
    return 2;
  }
  const int port = std::atoi(argv[1]);
  const long count = std::atol(argv[2]);
  const int concurrency = argc > 3 ? std::atoi(argv[3]) : 64;
  const size_t body_bytes = argc > 4 ? size_t(std::atol(argv[4])) : 1024;
  if (port <= 0 || port > 65535 || count <= 0 || concurrency <= 0) {
    std::fprintf(stderr, "bench_http_exchange_floor: PORT, COUNT and CONCURRENCY must be > 0\n");
    return 2;
  }
  const std::string request = make_request(body_bytes);
  const int poller = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Exchange> exchanges(static_cast<size_t>(concurrency));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  long started = 0;
  for (size_t i = 0; i < exchanges.size(); ++i) {
    Exchange& exchange = exchanges[i];
    exchange.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    setsockopt(exchange.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    if (connect(exchange.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      std::perror("bench_http_exchange_floor: connect");
      return 1;
    }
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = i;
    epoll_ctl(poller, EPOLL_CTL_ADD, exchange.fd, &event);
  }
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (Exchange& exchange : exchanges) {
    if (started == count) break;
    if (write(exchange.fd, request.data(), request.size()) != ssize_t(request.size())) return 1;
    ++started;
  }
  long finished = 0;
  std::vector<epoll_event> events(exchanges.size());
  char buffer[4096];
  while (finished < count) {
    const int ready = epoll_wait(poller, events.data(), int(events.size()), 10000);
    if (ready <= 0) {
      std::fprintf(stderr, "bench_http_exchange_floor: no answer for 10 s\n");
      return 1;
    }
    for (int k = 0; k < ready; ++k) {
      Exchange& exchange = exchanges[events[size_t(k)].data.u64];
      const ssize_t n = read(exchange.fd, buffer, sizeof buffer);
      if (n <= 0) {
        std::fprintf(stderr, "bench_http_exchange_floor: the server closed a connection\n");
        return 1;
      }
      exchange.answer.append(buffer, size_t(n));
      if (exchange.answer.find("\r\n\r\n") == std::string::npos) continue;
      exchange.answer.clear();
      ++finished;
      if (started < count) {
        if (write(exchange.fd, request.data(), request.size()) != ssize_t(request.size())) return 1;
        ++started;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - cpu0;
  std::printf(
      "{\"exchanges\": %ld, \"concurrency\": %d, \"seconds\": %.3f, \"cpu_seconds\": %.3f, "
      "\"cpu_us_per_exchange\": %.1f}\n",
      finished, concurrency, seconds, cpu, cpu * 1e6 / double(finished));
  return 0;
}
