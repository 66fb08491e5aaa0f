// SIGPIPE: a write to a socket the broker has reset must end the connection, not the process.

#include <signal.h>
#include <uv.h>
#include <catch2/catch.hpp>

#include <memory>

#include "retryloop/client/connection.hpp"

using namespace retryloop;

namespace {

/// Sets SIGPIPE's disposition for one test and puts the previous one back.
class SigpipeDisposition {
 public:
  explicit SigpipeDisposition(void (*handler)(int)) {
    struct sigaction action {};
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPIPE, &action, &saved_);
  }
  ~SigpipeDisposition() { sigaction(SIGPIPE, &saved_, nullptr); }
  static void (*current())(int) {
    struct sigaction now {};
    sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler;
  }

 private:
  struct sigaction saved_ {};
};

void application_handler(int) {}

/// Starts a connection to a closed loopback port and lets it fail.
void connect_once() {
  uv_loop_t loop;
  uv_loop_init(&loop);
  client::ConnectionOptions options;
  options.uri = client::parse_uri("amqp://127.0.0.1:1/");
  auto connection = client::Connection::create(&loop, options);
  bool done = false;
  REQUIRE_FALSE(connection->connect([&done](const client::Error&) { done = true; }));
  connection.reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(done);
  CHECK(uv_loop_close(&loop) == 0);
}

}  // namespace

TEST_CASE("Connecting ignores SIGPIPE when it has its default action, which would kill the process",
          "[client]") {
  SigpipeDisposition disposition(SIG_DFL);
  connect_once();
  CHECK(SigpipeDisposition::current() == SIG_IGN);
}

TEST_CASE("Connecting leaves a SIGPIPE handler the application installed alone", "[client]") {
  SigpipeDisposition disposition(application_handler);
  connect_once();
  CHECK(SigpipeDisposition::current() == &application_handler);
}
