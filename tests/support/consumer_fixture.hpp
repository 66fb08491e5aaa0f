#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/topology/topology.hpp"
#include "support/harness.hpp"

namespace retryloop::test {

/// A service with unique names: input exchange `<name>.in` (direct, key `key`), the retry
/// object's members in `retry`, more service keys in `extra`.
topology::Service make_service(const std::string& name, const std::string& retry,
                               const std::string& extra = "");

/// One handler call, as the handler saw it.
struct Call {
  std::string id;
  int64_t attempt = 0;
  bool redelivered = false;
  std::optional<std::string> expiration;
  /// The queue of the newest x-death entry (the wait queue it came back from); empty if none.
  std::string death_queue;
  /// The queues of every x-death entry, newest first: each queue it expired from on its way back.
  std::vector<std::string> death_queues;
  std::chrono::steady_clock::time_point at;
};

/// Whether `later` reached the handler `delay` or more after `earlier`, as the broker counts it.
/// The broker keeps time in whole milliseconds: a message it holds for 500 ms can come back 499.x
/// ms after the previous call as this process's clock sees it (seen on RabbitMQ 4.3), so up to
/// 1 ms short passes.
bool came_back_after(const Call& earlier, const Call& later, std::chrono::milliseconds delay);

/// Records handler calls; safe from worker threads.
class Recorder {
 public:
  void add(const consumer::Message& message);
  std::vector<Call> calls() const;
  std::vector<Call> of(const std::string& id) const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Call> calls_;
};

/// Holds handlers (on worker threads) until the test opens it, so that a slow handler is still
/// running when the test acts, however long a loaded machine takes to get there. Starts closed.
class Gate {
 public:
  /// Blocks until the gate is open; gives up after `limit`, a bound on a hang when a failing
  /// test never opens it.
  void pass(std::chrono::milliseconds limit = std::chrono::seconds(30));
  void open();

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

/// A test broker session: a publishing connection with a confirm-mode channel.
struct Broker {
  TestLoop& loop;
  std::shared_ptr<client::Connection> connection;
  std::shared_ptr<client::Channel> channel;

  explicit Broker(TestLoop& l);
  ~Broker();

  /// Publishes with message id `id`, persistent unless `properties` say otherwise; confirmed.
  void publish(const std::string& exchange, const std::string& key, const std::string& id,
               const std::string& body = "{}", amqp::BasicProperties properties = {});
  uint32_t depth(const std::string& queue);
  /// Declares the service's topology, as `retryloop topology apply` would.
  void apply(const topology::Service& service);
  /// Deletes the service's objects, messages and all (`topology delete --yes --force`); safe to
  /// call from a destructor, whatever the test left behind.
  void remove(const topology::Service& service);
  std::vector<client::GetResult> drain(const std::string& queue);
};

/// Options for a consumer of `service` on the test broker: handlers on the loop, fast recovery.
consumer::ConsumerOptions options_for(const topology::Service& service);

/// Starts a consumer (with a synchronous or an asynchronous handler) and waits until it consumes.
template <class AnyHandler>
std::shared_ptr<consumer::Consumer> start(TestLoop& loop, const consumer::ConsumerOptions& options,
                                          AnyHandler handler) {
  auto c = consumer::Consumer::create(loop.get(), options, std::move(handler));
  bool ready = false;
  c->set_ready_handler([&ready] { ready = true; });
  REQUIRE_FALSE(c->start());
  REQUIRE(loop.run_until([&] { return ready; }));
  c->set_ready_handler({});
  return c;
}

/// Stops a consumer gracefully and waits until it has stopped.
void stop(TestLoop& loop, const std::shared_ptr<consumer::Consumer>& c);

/// The messages parked for `service`, read with parking::list (they stay parked); the test fails
/// if the listing does.
std::vector<parking::ParkedMessage> list_parked(
    TestLoop& loop, const std::shared_ptr<client::Connection>& connection,
    const topology::Service& service);

}  // namespace retryloop::test
