// W3C trace context through the retry loop on a real broker: traceparent and tracestate survive
// two retries, a park and a replay, in reject mode (the broker moves the message) and republish
// mode (the consumer publishes copies); the handler and the span hook see them, the log lines
// carry the trace id, and a message without one never gets one.

#include <catch2/catch.hpp>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "retryloop/consumer/consumer.hpp"
#include "retryloop/parking/parking.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;
using consumer::Settlement;
using test::Broker;
using test::TestLoop;

namespace {

const std::string traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const std::string trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// What the handler and the span hook saw of one message, in order.
struct Seen {
  std::vector<int64_t> attempts;
  std::vector<std::optional<std::string>> handler_trace_ids;
  std::vector<std::optional<std::string>> span_parents;
  std::vector<Settlement> span_ends;
};

std::optional<std::string> header_text(const amqp::BasicProperties& properties,
                                       const std::string& name) {
  if (!properties.headers) return std::nullopt;
  const amqp::FieldValue* value = properties.headers->find(name);
  if (value == nullptr || !value->as_string()) return std::nullopt;
  return std::string(*value->as_string());
}

}  // namespace

TEST_CASE(
    "A trace id survives two retries, a park and a replay, reaches the handler, the span hook and "
    "the log lines, and is never made up",
    "[trace][integration]") {
  const std::string mode = GENERATE(std::string("reject"), std::string("republish"));
  INFO(mode);
  TestLoop loop;
  Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("trace"),
                         R"("mode": ")" + mode + R"(", "delays": ["100ms"], "max_attempts": 3)");
  std::ostringstream log_text;
  auto options = test::options_for(service);
  options.handler_on_loop = false;  // spans start on the worker thread that runs the handler
  options.logger = std::make_shared<spdlog::logger>(
      "trace", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  options.logger->set_level(spdlog::level::debug);

  std::mutex mutex;
  std::map<std::string, Seen> seen;
  options.start_span =
      [&](const consumer::Message& message,
          const std::optional<consumer::TraceContext>& parent) -> consumer::SpanEnd {
    const std::string id(message.message_id());
    {
      std::lock_guard<std::mutex> lock(mutex);
      seen[id].span_parents.push_back(parent ? std::optional(parent->trace_id) : std::nullopt);
    }
    return [&seen, &mutex, id](const consumer::SpanResult& result) {  // on the loop thread
      std::lock_guard<std::mutex> lock(mutex);
      seen[id].span_ends.push_back(result.settlement);
    };
  };
  std::atomic<bool> acking{false};
  auto c = test::start(loop, options, [&](const consumer::Message& message) {
    const auto trace = message.trace_context();
    {
      std::lock_guard<std::mutex> lock(mutex);
      Seen& s = seen[std::string(message.message_id())];
      s.attempts.push_back(message.attempt);
      s.handler_trace_ids.push_back(trace ? std::optional(trace->trace_id) : std::nullopt);
    }
    return acking ? Outcome::ack() : Outcome::retry("downstream timeout");
  });

  amqp::BasicProperties traced;
  traced.headers.emplace();
  traced.headers->append("traceparent", traceparent);
  traced.headers->append("tracestate", tracestate);
  amqp::BasicProperties invalid;  // uppercase hex: not a trace context, passed on as it is
  invalid.headers.emplace();
  invalid.headers->append("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01");
  broker.publish(service.input.exchange, "key", "traced", "{}", traced);
  broker.publish(service.input.exchange, "key", "untraced", "{}");
  broker.publish(service.input.exchange, "key", "invalid", "{}", invalid);
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 3; }, 20s));

  // Parked with both headers byte for byte; nothing added to the others.
  const auto parked = test::list_parked(loop, broker.connection, service);
  REQUIRE(parked.size() == 3);
  for (const auto& p : parked) {
    INFO(p.message_id);
    const auto& properties = p.message.properties;
    if (p.message_id == "traced") {
      CHECK(header_text(properties, "traceparent") == traceparent);
      CHECK(header_text(properties, "tracestate") == tracestate);
    } else if (p.message_id == "untraced") {
      CHECK_FALSE(header_text(properties, "traceparent"));
      CHECK_FALSE(header_text(properties, "tracestate"));
    } else {
      CHECK(header_text(properties, "traceparent") ==
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01");
    }
  }

  // Replayed once the cause is fixed: it comes back with the same trace.
  acking = true;
  bool replay_done = false;
  REQUIRE_FALSE(
      parking::replay(broker.connection, service, {}, [&](const parking::ReplayResult& result) {
        CHECK_FALSE(result.error);
        CHECK(result.progress.moved == 3);
        replay_done = true;
      }));
  REQUIRE(loop.run_until([&] { return replay_done && c->metrics().acked == 3; }, 20s));
  test::stop(loop, c);

  std::lock_guard<std::mutex> lock(mutex);
  const Seen& t = seen["traced"];
  CHECK(t.attempts == std::vector<int64_t>{1, 2, 3, 1});
  CHECK(t.handler_trace_ids == std::vector<std::optional<std::string>>(4, trace_id));
  CHECK(t.span_parents == std::vector<std::optional<std::string>>(4, trace_id));
  CHECK(t.span_ends == std::vector<Settlement>{Settlement::retried, Settlement::retried,
                                               Settlement::parked, Settlement::acked});
  for (const char* id : {"untraced", "invalid"}) {
    INFO(id);
    const Seen& u = seen[id];
    CHECK(u.attempts == std::vector<int64_t>{1, 2, 3, 1});
    CHECK(u.handler_trace_ids == std::vector<std::optional<std::string>>(4, std::nullopt));
    CHECK(u.span_parents == std::vector<std::optional<std::string>>(4, std::nullopt));
    CHECK(u.span_ends.size() == 4);
  }

  // Every line about "traced" names its trace, and no other line names one.
  std::istringstream lines(log_text.str());
  int traced_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    if (line.find("message_id=traced ") != std::string::npos) {
      CHECK(line.find(" trace_id=" + trace_id) != std::string::npos);
      ++traced_lines;
    } else {
      CHECK(line.find("trace_id=") == std::string::npos);
    }
  }
  CHECK(traced_lines == 4);  // retry, retry, parked, acked
}
