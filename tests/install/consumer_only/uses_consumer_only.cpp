// A retry consumer that links the consumer's layers only. It starts against a port where no broker
// listens, keeps trying, and stops on a timer: the connection, recovery and stop paths run.
#include <uv.h>
#include <retryloop/consumer/consumer.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <cstdio>

int main() {
  using namespace retryloop;
  auto parsed = topology::parse_topology(
      R"({"services": [{"name": "orders", "input": {"exchange": "orders.in", "type": "direct",
          "bindings": ["order.created"]}, "retry": {"delays": ["30s"], "max_attempts": 5}}]})");
  if (!parsed.ok()) return 1;
  uv_loop_t loop;
  uv_loop_init(&loop);
  consumer::ConsumerOptions options;
  options.service = parsed.topology->services.at(0);
  options.connection.uri = client::parse_uri("amqp://guest:guest@127.0.0.1:1/%2F");
  auto orders = consumer::Consumer::create(
      &loop, options, [](const consumer::Message&) { return consumer::Outcome::ack(); });
  bool stopped = false;
  orders->set_stopped_handler([&stopped](const client::Error&) { stopped = true; });
  if (client::Error error = orders->start()) {
    std::fprintf(stderr, "start: %s\n", error.message().c_str());
    return 1;
  }
  uv_timer_t timer;
  uv_timer_init(&loop, &timer);
  timer.data = orders.get();
  uv_timer_start(
      &timer,
      [](uv_timer_t* handle) {
        static_cast<consumer::Consumer*>(handle->data)->stop_now();
        uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
      },
      300, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  const bool consuming = orders->is_consuming();
  orders.reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  std::printf("consumer-only program: stopped=%d consuming=%d\n", stopped, consuming);
  return stopped && !consuming ? 0 : 1;
}
