// The bounded HTTP server and the operations endpoint over a loopback socket: what a client that
// sends `Expect: 100-continue` gets back, and the endpoint's refusal of a request body.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <thread>

#include "retryloop/http/bounded_server.hpp"
#include "retryloop/operations/http_endpoint.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// A blocking connection to 127.0.0.1:`port`; closed by the destructor.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : sock_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(sock_ >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(sock_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  ~RawClient() { ::close(sock_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(const std::string& bytes) {
    REQUIRE(::send(sock_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
  }
  /// Reads until what came so far contains `until` (empty: until the server closes), or 10 s
  /// pass; everything read so far.
  const std::string& read(const std::string& until = "") {
    const auto deadline = Clock::now() + 10s;
    while (until.empty() || received_.find(until) == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd readable{sock_, POLLIN, 0};
      if (left <= 0 || ::poll(&readable, 1, int(left)) <= 0) break;
      char buffer[4096];
      const ssize_t got = ::recv(sock_, buffer, sizeof buffer, 0);
      if (got <= 0) break;
      received_.append(buffer, size_t(got));
    }
    return received_;
  }

 private:
  int sock_;
  std::string received_;
};

size_t count(const std::string& text, const std::string& what) {
  size_t found = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++found;
  return found;
}

/// A BoundedServer with an echo route, listening on a free loopback port until destroyed.
class EchoServer {
 public:
  EchoServer() {
    server_.Post("/echo", [](const httplib::Request& request, httplib::Response& response) {
      response.set_content("echo " + request.body, "text/plain");
    });
    port_ = server_.bind("127.0.0.1", 0);
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 5000 && !server_.is_running(); ++i)
      std::this_thread::sleep_for(1ms);
    REQUIRE(server_.is_running());
  }
  ~EchoServer() {
    server_.stop();
    thread_.join();
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  uint16_t port() const { return uint16_t(port_); }
  http::BoundedServer& server() { return server_; }

 private:
  http::BoundedServer server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST_CASE("A client that sends Expect: 100-continue and waits is told to go on once, then answered",
          "[http]") {
  EchoServer echo;
  RawClient client(echo.port());
  client.send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  // The client sends its body only once told to.
  CHECK(client.read("\r\n\r\n") == "HTTP/1.1 100 Continue\r\n\r\n");
  client.send("hello");
  const std::string answer = client.read();
  INFO(answer);
  CHECK(count(answer, "100 Continue") == 1);
  CHECK(count(answer, "HTTP/1.1 200 OK\r\n") == 1);
  const std::string body = "\r\n\r\necho hello";
  CHECK(answer.compare(answer.size() - body.size(), body.size(), body) == 0);
}

TEST_CASE("A request that comes whole with Expect: 100-continue gets its answer alone", "[http]") {
  EchoServer echo;
  const std::string request =
      "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello";
  const std::string answer = echo.server().answer(request);
  INFO(answer);
  CHECK(answer.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(count(answer, "HTTP/1.1 ") == 1);

  RawClient client(echo.port());
  client.send(request);
  const std::string sent_whole = client.read();
  INFO(sent_whole);
  CHECK(count(sent_whole, "100 Continue") <= 1);
  CHECK(count(sent_whole, "HTTP/1.1 200 OK\r\n") == 1);
}

namespace {

/// A libuv loop for the operations endpoint, run while a client waits for its answer.
class EndpointLoop {
 public:
  EndpointLoop() { REQUIRE(uv_loop_init(&loop_) == 0); }
  ~EndpointLoop() {
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
  EndpointLoop(const EndpointLoop&) = delete;
  EndpointLoop& operator=(const EndpointLoop&) = delete;

  uv_loop_t* get() { return &loop_; }
  /// Runs the loop until `done()` or 20 s pass; whether `done()`.
  template <typename Done>
  bool run_until(Done done) {
    const auto deadline = Clock::now() + 20s;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      uv_run(&loop_, UV_RUN_NOWAIT);
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

 private:
  uv_loop_t loop_{};
};

/// What the endpoint answers `request`, sent at once; the loop runs meanwhile.
std::string answer_to(EndpointLoop& loop, uint16_t port, const std::string& request) {
  auto answer = std::async(std::launch::async, [port, request] {
    RawClient client(port);
    client.send(request);
    return client.read();
  });
  REQUIRE(loop.run_until([&] { return answer.wait_for(0s) == std::future_status::ready; }));
  return answer.get();
}

}  // namespace

TEST_CASE("The operations endpoint serves GET only: a request with a body is refused with 413",
          "[http]") {
  EndpointLoop loop;
  operations::HttpEndpointOptions options;
  options.listen.port = 0;
  auto endpoint = operations::HttpEndpoint::create(loop.get(), options);
  REQUIRE_FALSE(endpoint->start());
  const uint16_t port = endpoint->port();

  CHECK(answer_to(loop, port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(answer_to(loop, port, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  for (const std::string request : {
           "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
           "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
           "GET /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
           "chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
       }) {
    const std::string answer = answer_to(loop, port, request);
    INFO(request << "\n---\n" << answer);
    CHECK(answer.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0) == 0);
  }

  bool closed = false;
  endpoint->close([&closed] { closed = true; });
  CHECK(loop.run_until([&] { return closed; }));
}
