#pragma once

// HTTP clients that misbehave, for the tests of the HTTP endpoints' limits: connections that send
// nothing, connections that send a request head a byte at a time, and a raw exchange.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace retryloop::test {

/// `count` connections to 127.0.0.1:`port` that send nothing; closed by the destructor.
class IdleClients {
 public:
  IdleClients(uint16_t port, size_t count);
  ~IdleClients();
  IdleClients(const IdleClients&) = delete;
  IdleClients& operator=(const IdleClients&) = delete;

  /// The connections the server has neither closed nor answered.
  size_t still_open() const;

 private:
  std::vector<int> sockets_;
};

/// `count` connections to 127.0.0.1:`port` that each send one byte of a request head (one that
/// never ends) every `interval`, from a thread of their own, until the server closes them.
class SlowClients {
 public:
  SlowClients(uint16_t port, size_t count, std::chrono::milliseconds interval);
  ~SlowClients();
  SlowClients(const SlowClients&) = delete;
  SlowClients& operator=(const SlowClients&) = delete;

  /// Bytes sent so far, by all of them.
  size_t bytes_sent() const { return bytes_sent_; }
  /// The connections the server has closed (or answered).
  size_t closed_by_server() const { return closed_; }
  /// The first line of what the server answered the first one it closed; empty before.
  std::string first_answer() const;

 private:
  void run(std::chrono::milliseconds interval);

  std::vector<int> sockets_;
  std::atomic<size_t> bytes_sent_{0};
  std::atomic<size_t> closed_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::string first_answer_;
  std::thread thread_;
};

/// Sends `request` to 127.0.0.1:`port` as it is and returns what comes back until the server
/// closes the connection (or `timeout` passes: then what came so far). The request is sent in
/// pieces while the server reads; sending stops when the server answers or closes.
std::string http_exchange(uint16_t port, const std::string& request,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// The status of a raw HTTP answer (0 when there is none).
int http_status(const std::string& answer);
/// The body of a raw HTTP answer (after the empty line).
std::string http_body(const std::string& answer);

}  // namespace retryloop::test
