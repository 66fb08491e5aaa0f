// Embedding the retry consumer in a service: the topology comes from code instead of a file,
// and the handler is asynchronous (it settles from a timer, as a call to another service would).
//
//   embed_consumer --url amqp://guest:guest@localhost:5672/%2F

#include <uv.h>
#include <retryloop/consumer/consumer.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

/// Pretends to call a payment service that answers after 20 ms and fails for empty bodies.
void charge_later(uv_loop_t* loop, std::string body, consumer::Settle settle) {
  struct Call {
    uv_timer_t timer{};
    std::string body;
    consumer::Settle settle;
  };
  auto* call = new Call{{}, std::move(body), std::move(settle)};
  call->timer.data = call;
  uv_timer_init(loop, &call->timer);
  uv_timer_start(
      &call->timer,
      [](uv_timer_t* timer) {
        auto* call = static_cast<Call*>(timer->data);
        call->settle(call->body.empty() ? consumer::Outcome::retry("payment service said 503")
                                        : consumer::Outcome::ack());
        uv_close(reinterpret_cast<uv_handle_t*>(timer),
                 [](uv_handle_t* handle) { delete static_cast<Call*>(handle->data); });
      },
      20, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const char* url = argc == 3 && std::strcmp(argv[1], "--url") == 0 ? argv[2] : nullptr;
  if (url == nullptr) {
    std::fprintf(stderr, "usage: embed_consumer --url amqp://user:pass@host:port/vhost\n");
    return 1;
  }

  topology::Service payments;
  payments.name = "payments";
  payments.input.exchange = "payments.in";
  payments.input.type = topology::ExchangeType::direct;
  payments.input.bindings.push_back(topology::Binding{"payment.requested", {}, {}});
  payments.retry.mode = topology::RetryMode::republish;
  payments.retry.delays = {1s, 10s, 1min};
  payments.retry.max_attempts = 6;

  consumer::ConsumerOptions options;
  options.service = payments;
  options.connection.uri = client::parse_uri(url);
  options.prefetch = 100;
  options.concurrency = 20;
  options.stop_on_signals = true;
  options.metrics_interval = 10s;
  options.logger = spdlog::stderr_color_mt("payments");
  options.on_parked = [](const consumer::ParkedEvent& event) {
    spdlog::get("payments")
        ->critical("page on-call: {} parked ({}): {}", event.message_id,
                   consumer::to_string(event.reason), event.error);
  };

  uv_loop_t* loop = uv_default_loop();
  auto payments_consumer = consumer::Consumer::create(
      loop, options, [loop](const consumer::Message& message, consumer::Settle settle) {
        charge_later(loop, message.body, std::move(settle));
      });
  if (client::Error error = payments_consumer->start()) {
    std::fprintf(stderr, "embed_consumer: %s\n", error.message().c_str());
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  return payments_consumer->metrics().handler_errors == 0 ? 0 : 1;
}
