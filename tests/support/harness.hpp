#pragma once

#include <uv.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"

namespace retryloop::test {

/// The broker URL from RETRYLOOP_TEST_URL; fails the test when it is not set.
std::string broker_url();

/// The port of the test broker's URL.
uint16_t broker_port();

/// The test broker's directory (RETRYLOOP_TEST_BROKER_DIR); its tools can read files put there,
/// also when they run in a root of their own (RabbitMQ 4.0).
std::string broker_dir();

/// The test broker's RabbitMQ version as scripts/broker names it: "3.10" or "4.0".
std::string broker_version();

/// Whether the test broker is RabbitMQ 4.0 or later.
bool broker_is_4x();

/// Runs `rabbitmqctl -n <test node> ARGS` through RETRYLOOP_TEST_CTL and returns its exit code;
/// stdout and stderr go to `output` when given.
int broker_ctl(const std::string& args, std::string* output = nullptr);

/// A unique name for queues and exchanges, so tests can share one broker.
std::string unique_name(const std::string& prefix);

/// A libuv loop for one test. The destructor closes whatever handles remain, runs the loop until
/// they are closed, and checks that the loop then closes cleanly.
class TestLoop {
 public:
  TestLoop();
  ~TestLoop();
  TestLoop(const TestLoop&) = delete;
  TestLoop& operator=(const TestLoop&) = delete;

  uv_loop_t* get() { return &loop_; }

  /// Runs the loop until `done()` is true (checked after every loop iteration, and at least every
  /// 5 ms) or `timeout` passes; returns whether `done()` became true.
  bool run_until(const std::function<bool()>& done,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// Runs the loop for `duration`.
  void run_for(std::chrono::milliseconds duration);

  /// Runs the loop until it has nothing left to do, or `timeout` passes; returns whether it
  /// ran dry.
  bool drain(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  uv_loop_t loop_{};
};

/// Checks `condition` at the top level, running the loop for `interval` between checks, until it
/// holds or `timeout` passes (by the steady clock); returns whether it held. Unlike
/// TestLoop::run_until, `condition` may run the loop itself (queue_depth, a passive declare).
/// For what a loaded machine may make slow: the timeout is a bound on a hang, not on speed.
bool eventually(TestLoop& loop, const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(30),
                std::chrono::milliseconds interval = std::chrono::milliseconds(50));

/// Connects and waits; fails the test on error.
std::shared_ptr<client::Connection> connect(TestLoop& loop, client::ConnectionOptions options);
std::shared_ptr<client::Connection> connect(TestLoop& loop, const std::string& url);

/// Connects and waits; returns the error (empty on success) and the connection.
client::Error try_connect(TestLoop& loop, client::ConnectionOptions options,
                          std::shared_ptr<client::Connection>& out);

/// Opens a channel and waits; fails the test on error.
std::shared_ptr<client::Channel> open_channel(TestLoop& loop, client::Connection& connection);

/// Starts an operation that reports through a CompletionCallback and waits for it.
client::Error wait(TestLoop& loop,
                   const std::function<client::Error(client::CompletionCallback)>& start);

/// Closes the connection and waits until it is closed.
void close(TestLoop& loop, const std::shared_ptr<client::Connection>& connection);

/// Declares a queue and waits; fails the test on error.
void declare_queue(TestLoop& loop, client::Channel& channel, const std::string& name,
                   client::QueueOptions options = {});

/// Messages ready in `queue` and its consumers, by passive declare on a fresh channel.
client::QueueInfo queue_info(TestLoop& loop, client::Connection& connection,
                             const std::string& queue);

/// Messages ready in `queue`, by passive declare on a fresh channel.
uint32_t queue_depth(TestLoop& loop, client::Connection& connection, const std::string& queue);

/// Publishes `count` persistent messages with mandatory on a confirm-mode channel, at most 1,000
/// unconfirmed at once, and waits for every confirm; fails the test unless each is confirmed and
/// routed. Message i has the id `id_prefix` + i and the body {"n": i}.
void publish_numbered(TestLoop& loop, client::Channel& channel, const std::string& exchange,
                      const std::string& routing_key, int count, const std::string& id_prefix);

/// How the ids `prefix` + 0 .. `prefix` + (count - 1) appear among `copies` (message id -> how
/// many times it was read): ids missing, ids read more than once and more than twice, and the
/// copies beyond the first of each.
struct IdCounts {
  int missing = 0;
  int repeated = 0;
  int more_than_twice = 0;
  int extra_copies = 0;
};
IdCounts count_ids(const std::map<std::string, int>& copies, const std::string& prefix, int count);

/// Publishes one message with mandatory on a confirm-mode channel and waits; fails the test
/// unless it is confirmed and routed.
void publish_confirmed(TestLoop& loop, client::Channel& channel, const std::string& exchange,
                       const std::string& routing_key, const amqp::BasicProperties& properties,
                       const std::string& body);

/// Takes every message out of `queue` (basic.get and ack, on a fresh channel), in queue order.
std::vector<client::GetResult> drain_queue(TestLoop& loop, client::Connection& connection,
                                           const std::string& queue);

/// The header `name` of a message taken with basic.get; null when it has no such header.
const amqp::FieldValue* header(const client::GetResult& message, const std::string& name);

/// Whether `text` contains `part`.
bool contains(const std::string& text, const std::string& part);

/// A connection, a channel and a fresh durable queue with a unique name, for a test that reads
/// what something published to the queue. The destructor closes the connection.
struct QueueUnderTest {
  TestLoop& loop;
  std::shared_ptr<client::Connection> connection;
  std::shared_ptr<client::Channel> channel;
  std::string queue;
  QueueUnderTest(TestLoop& loop, const std::string& prefix);
  ~QueueUnderTest();
  QueueUnderTest(const QueueUnderTest&) = delete;
  QueueUnderTest& operator=(const QueueUnderTest&) = delete;
};

}  // namespace retryloop::test
