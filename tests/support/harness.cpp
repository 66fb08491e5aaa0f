#include "support/harness.hpp"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "retryloop/client/timer.hpp"

namespace retryloop::test {

std::string broker_url() {
  const char* url = std::getenv("RETRYLOOP_TEST_URL");
  if (url == nullptr || *url == '\0') {
    FAIL(
        "RETRYLOOP_TEST_URL is not set: run the broker tests through scripts/test or "
        "scripts/with-broker");
  }
  return url;
}

uint16_t broker_port() {
  return client::parse_uri(broker_url()).port;
}

std::string broker_dir() {
  const char* dir = std::getenv("RETRYLOOP_TEST_BROKER_DIR");
  if (dir == nullptr || *dir == '\0') {
    FAIL("RETRYLOOP_TEST_BROKER_DIR is not set: run the broker tests through scripts/with-broker");
  }
  return dir;
}

std::string broker_version() {
  const char* version = std::getenv("RETRYLOOP_TEST_RABBITMQ");
  return version != nullptr && *version != '\0' ? version : "3.10";
}

bool broker_is_4x() {
  return broker_version().rfind("3.", 0) != 0;
}

int broker_ctl(const std::string& args, std::string* output) {
  const char* ctl = std::getenv("RETRYLOOP_TEST_CTL");
  if (ctl == nullptr || *ctl == '\0') {
    FAIL("RETRYLOOP_TEST_CTL is not set: run the broker tests through scripts/with-broker");
  }
  std::string command = std::string(ctl) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  std::string text;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    text.append(buffer.data(), n);
  int status = pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string unique_name(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return "test." + prefix + "." + std::to_string(getpid()) + "." + std::to_string(++counter);
}

TestLoop::TestLoop() {
  uv_loop_init(&loop_);
}

TestLoop::~TestLoop() {
  client::close_timers(&loop_);
  uv_walk(
      &loop_,
      [](uv_handle_t* handle, void*) {
        if (!uv_is_closing(handle)) uv_close(handle, nullptr);
      },
      nullptr);
  uv_run(&loop_, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&loop_);
  CHECK(rc == 0);
}

bool TestLoop::run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  if (done()) return true;
  // The loop's clock stands still while a test blocks outside it (a rabbitmqctl run, a command
  // it waits for); on a loaded machine that is longer than the timeout, which would then have
  // passed before the loop ran at all.
  uv_update_time(&loop_);
  struct State {
    const std::function<bool()>* done;
    uint64_t deadline;
    bool finished = false;
  } state{&done, uv_now(&loop_) + static_cast<uint64_t>(timeout.count())};
  uv_timer_t ticker;
  uv_timer_init(&loop_, &ticker);
  ticker.data = &state;
  uv_timer_start(
      &ticker,
      [](uv_timer_t* timer) {
        auto* s = static_cast<State*>(timer->data);
        if ((*s->done)() || uv_now(timer->loop) >= s->deadline) uv_stop(timer->loop);
      },
      5, 5);
  uv_check_t check;
  uv_check_init(&loop_, &check);
  check.data = &state;
  uv_check_start(&check, [](uv_check_t* c) {
    auto* s = static_cast<State*>(c->data);
    if ((*s->done)()) uv_stop(c->loop);
  });
  uv_run(&loop_, UV_RUN_DEFAULT);
  uv_close(reinterpret_cast<uv_handle_t*>(&ticker), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&check), nullptr);
  uv_run(&loop_, UV_RUN_NOWAIT);
  return done();
}

void TestLoop::run_for(std::chrono::milliseconds duration) {
  run_until([] { return false; }, duration);
}

bool TestLoop::drain(std::chrono::milliseconds timeout) {
  uv_update_time(&loop_);
  uint64_t deadline = uv_now(&loop_) + static_cast<uint64_t>(timeout.count());
  while (uv_loop_alive(&loop_)) {
    if (uv_now(&loop_) >= deadline) return false;
    run_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool eventually(TestLoop& loop, const std::function<bool()>& condition,
                std::chrono::milliseconds timeout, std::chrono::milliseconds interval) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    loop.run_for(interval);
  }
}

client::Error try_connect(TestLoop& loop, client::ConnectionOptions options,
                          std::shared_ptr<client::Connection>& out) {
  out = client::Connection::create(loop.get(), std::move(options));
  bool done = false;
  client::Error result;
  client::Error immediate = out->connect([&](const client::Error& error) {
    result = error;
    done = true;
  });
  if (immediate) return immediate;
  REQUIRE(loop.run_until([&] { return done; }));
  return result;
}

std::shared_ptr<client::Connection> connect(TestLoop& loop, client::ConnectionOptions options) {
  std::shared_ptr<client::Connection> connection;
  client::Error error = try_connect(loop, std::move(options), connection);
  INFO(error.message());
  REQUIRE_FALSE(error);
  return connection;
}

std::shared_ptr<client::Connection> connect(TestLoop& loop, const std::string& url) {
  client::ConnectionOptions options;
  options.uri = client::parse_uri(url);
  return connect(loop, std::move(options));
}

std::shared_ptr<client::Channel> open_channel(TestLoop& loop, client::Connection& connection) {
  std::shared_ptr<client::Channel> channel;
  client::Error result;
  bool done = false;
  client::Error immediate =
      connection.open_channel([&](const client::Error& error, std::shared_ptr<client::Channel> c) {
        result = error;
        channel = std::move(c);
        done = true;
      });
  INFO(immediate.message());
  REQUIRE_FALSE(immediate);
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(result.message());
  REQUIRE_FALSE(result);
  REQUIRE(channel);
  return channel;
}

client::Error wait(TestLoop& loop,
                   const std::function<client::Error(client::CompletionCallback)>& start) {
  bool done = false;
  client::Error result;
  client::Error immediate = start([&](const client::Error& error) {
    result = error;
    done = true;
  });
  if (immediate) return immediate;
  REQUIRE(loop.run_until([&] { return done; }));
  return result;
}

void close(TestLoop& loop, const std::shared_ptr<client::Connection>& connection) {
  bool closed = false;
  connection->close([&](const client::Error&) { closed = true; });
  REQUIRE(loop.run_until([&] { return closed; }));
}

void declare_queue(TestLoop& loop, client::Channel& channel, const std::string& name,
                   client::QueueOptions options) {
  bool done = false;
  client::Error result;
  client::Error immediate = channel.queue_declare(
      name, options, [&](const client::Error& error, const client::QueueInfo&) {
        result = error;
        done = true;
      });
  INFO(immediate.message());
  REQUIRE_FALSE(immediate);
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(result.message());
  REQUIRE_FALSE(result);
}

client::QueueInfo queue_info(TestLoop& loop, client::Connection& connection,
                             const std::string& queue) {
  auto channel = open_channel(loop, connection);
  client::QueueOptions options;
  options.passive = true;
  bool done = false;
  client::Error result;
  client::QueueInfo out;
  REQUIRE_FALSE(channel->queue_declare(
      queue, options, [&](const client::Error& error, const client::QueueInfo& info) {
        result = error;
        out = info;
        done = true;
      }));
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(result.message());
  REQUIRE_FALSE(result);
  (void)channel->close();
  return out;
}

uint32_t queue_depth(TestLoop& loop, client::Connection& connection, const std::string& queue) {
  return queue_info(loop, connection, queue).message_count;
}

void publish_confirmed(TestLoop& loop, client::Channel& channel, const std::string& exchange,
                       const std::string& routing_key, const amqp::BasicProperties& properties,
                       const std::string& body) {
  bool done = false;
  client::PublishOutcome result;
  client::Error immediate =
      channel.publish(exchange, routing_key, properties, body, client::Mandatory::yes,
                      [&](const client::PublishOutcome& outcome) {
                        result = outcome;
                        done = true;
                      });
  INFO(immediate.message());
  REQUIRE_FALSE(immediate);
  REQUIRE(loop.run_until([&] { return done; }));
  INFO(result.error.message());
  REQUIRE(result.ok());
}

void publish_numbered(TestLoop& loop, client::Channel& channel, const std::string& exchange,
                      const std::string& routing_key, int count, const std::string& id_prefix) {
  int confirmed = 0;
  int refused = 0;
  for (int i = 0; i < count; ++i) {
    amqp::BasicProperties properties;
    properties.message_id = id_prefix + std::to_string(i);
    properties.delivery_mode = 2;
    REQUIRE_FALSE(channel.publish(
        exchange, routing_key, properties, "{\"n\": " + std::to_string(i) + "}",
        client::Mandatory::yes,
        [&](const client::PublishOutcome& outcome) { ++(outcome.ok() ? confirmed : refused); }));
    if (channel.unconfirmed_count() >= 1000) {
      REQUIRE(loop.run_until([&] { return channel.unconfirmed_count() < 500; },
                             std::chrono::seconds(60)));
    }
  }
  REQUIRE(loop.run_until([&] { return confirmed + refused == count; }, std::chrono::seconds(60)));
  REQUIRE(refused == 0);
}

IdCounts count_ids(const std::map<std::string, int>& copies, const std::string& prefix, int count) {
  IdCounts counts;
  for (int i = 0; i < count; ++i) {
    const auto found = copies.find(prefix + std::to_string(i));
    if (found == copies.end()) {
      ++counts.missing;
      continue;
    }
    if (found->second > 1) ++counts.repeated;
    if (found->second > 2) ++counts.more_than_twice;
    counts.extra_copies += found->second - 1;
  }
  return counts;
}

std::vector<client::GetResult> drain_queue(TestLoop& loop, client::Connection& connection,
                                           const std::string& queue) {
  auto channel = open_channel(loop, connection);
  std::vector<client::GetResult> messages;
  for (;;) {
    bool done = false;
    client::Error result;
    std::optional<client::GetResult> got;
    REQUIRE_FALSE(channel->get(
        queue, false, [&](const client::Error& error, std::optional<client::GetResult>&& r) {
          result = error;
          got = std::move(r);
          done = true;
        }));
    REQUIRE(loop.run_until([&] { return done; }));
    INFO(result.message());
    REQUIRE_FALSE(result);
    if (!got) break;
    REQUIRE_FALSE(channel->ack(got->delivery_tag));
    messages.push_back(std::move(*got));
  }
  (void)channel->close();
  return messages;
}

const amqp::FieldValue* header(const client::GetResult& message, const std::string& name) {
  if (!message.message.properties.headers) return nullptr;
  return message.message.properties.headers->find(name);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

QueueUnderTest::QueueUnderTest(TestLoop& l, const std::string& prefix)
    : loop(l),
      connection(connect(loop, broker_url())),
      channel(open_channel(loop, *connection)),
      queue(unique_name(prefix)) {
  declare_queue(loop, *channel, queue);
}

QueueUnderTest::~QueueUnderTest() {
  channel.reset();
  bool closed = false;
  connection->close([&](const client::Error&) { closed = true; });
  loop.run_until([&] { return closed; }, std::chrono::seconds(10));
}

}  // namespace retryloop::test
