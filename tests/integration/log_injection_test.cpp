// Values a publisher chooses (a message id, the text of a handler's error built from the message)
// reach the consumer's log lines escaped: they cannot end a line, start a forged one, or send a
// terminal escape sequence.

#include <catch2/catch.hpp>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>
#include <string>

#include "retryloop/consumer/consumer.hpp"
#include "support/consumer_fixture.hpp"
#include "support/harness.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using consumer::Outcome;

TEST_CASE("A message id or handler error holding line breaks and escapes cannot forge a log line",
          "[consumer][integration]") {
  test::TestLoop loop;
  test::Broker broker(loop);
  const auto service =
      test::make_service(test::unique_name("loginject"),
                         R"("mode": "reject", "delays": ["100ms"], "max_attempts": 2)");
  std::ostringstream log_text;
  auto options = test::options_for(service);
  options.logger = std::make_shared<spdlog::logger>(
      "inject", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  options.logger->set_level(spdlog::level::debug);
  auto c = test::start(loop, options, [](const consumer::Message& message) {
    return Outcome::retry("cannot handle " + std::string(message.message_id()) + "\x1b[2J");
  });
  const std::string forged = "x\n01:45:00.000 info service=svc FAKE LOG LINE all good\r";
  broker.publish(service.input.exchange, "key", forged, "{}");
  REQUIRE(loop.run_until([&] { return c->metrics().parked_exhausted == 1; }, 20s));
  test::stop(loop, c);

  const std::string text = log_text.str();
  INFO(text);
  CHECK(text.find("\n01:45:00.000") == std::string::npos);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\x1b') == std::string::npos);
  const std::string escaped = "x\\n01:45:00.000 info service=svc FAKE LOG LINE all good\\r";
  CHECK_THAT(text, Catch::Contains("message_id=" + escaped + " attempt=1"));
  CHECK_THAT(text, Catch::Contains("error=\"cannot handle " + escaped + "\\x1B[2J\""));
}
