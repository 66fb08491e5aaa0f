// The fault suite's idempotent consumer: a retry consumer whose handler goes through
// inbox::Inbox and writes one "business effect" row per run, in the inbox's transaction.
//
//   fault_inbox_consumer --db URL --url AMQP --topology FILE --service NAME
//                        [--crash-after N] [--concurrency N] [--prefetch N]
//
// The effect: INSERT INTO app_effects (message_id, pid), a table without a unique key, so that a
// handler run twice for one message shows as two rows. One line per delivery on stdout, flushed:
//   handled ID      the handler ran and its transaction committed (with the id in the inbox)
//   duplicate ID    the inbox had the id already: acked without running the handler
//   crash ID        --crash-after: the N-th handled message has committed; the process now kills
//                   itself with SIGKILL before the consumer acks it, so the broker redelivers it
// SIGINT or SIGTERM stops it gracefully (exit 0); a fatal consumer error exits 3.

#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <retryloop/consumer/consumer.hpp>
#include <retryloop/inbox/inbox.hpp>
#include <retryloop/store/database.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

std::mutex output_mutex;

void say(const char* what, std::string_view id) {
  std::lock_guard<std::mutex> lock(output_mutex);
  std::printf("%s %.*s\n", what, static_cast<int>(id.size()), id.data());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A retry consumer whose handler writes one effect row per message, through an inbox"};
  std::string db_url;
  std::string url;
  std::string topology_file;
  std::string service_name;
  uint64_t crash_after = 0;
  uint32_t concurrency = 2;
  uint16_t prefetch = 20;
  app.add_option("--db", db_url, "database URL")->required();
  app.add_option("--url", url, "broker URL")->required();
  app.add_option("--topology", topology_file, "topology file")->required();
  app.add_option("--service", service_name, "service in the topology file")->required();
  app.add_option("--crash-after", crash_after,
                 "kill this process (SIGKILL) right after the N-th handled message commits");
  app.add_option("--concurrency", concurrency, "handlers at once")->check(CLI::Range(1u, 64u));
  app.add_option("--prefetch", prefetch, "basic.qos prefetch")->check(CLI::Range(1, 65535));
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("fault_inbox_consumer");
  logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");

  topology::ParseResult parsed = topology::load_topology(topology_file);
  if (!parsed.ok()) {
    for (const auto& line : parsed.messages())
      std::fprintf(stderr, "%s\n", line.c_str());
    return 2;
  }
  consumer::ConsumerOptions options;
  std::shared_ptr<inbox::Inbox> inbox;
  try {
    options.service = topology::select_services(*parsed.topology, {service_name}).services.at(0);
    options.connection.uri = client::parse_uri(url);
    inbox::InboxOptions inbox_options;
    inbox_options.database = db_url;
    inbox_options.consumer = service_name;
    inbox = inbox::Inbox::create(inbox_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_inbox_consumer: %s\n", e.what());
    return 1;
  }
  options.concurrency = concurrency;
  options.prefetch = prefetch;
  options.logger = logger;
  options.stop_on_signals = true;
  options.recovery = consumer::Backoff{100ms, 1000ms, 2.0, 0.1};

  const std::string pid = std::to_string(getpid());
  auto effect = inbox->wrap([pid](const consumer::Message& message, store::Database& db) {
    db.execute("INSERT INTO app_effects (message_id, pid) VALUES ($1, $2)",
               {std::string(message.message_id()), pid});
    return consumer::Outcome::ack();
  });
  std::atomic<uint64_t> handled{0};
  auto handler = [effect, crash_after, &handled](const consumer::Message& message) {
    consumer::Outcome outcome = effect(message);
    if (outcome.kind == consumer::OutcomeKind::drop) {  // the inbox's answer to a duplicate
      say("duplicate", message.message_id());
      return outcome;
    }
    if (outcome.kind != consumer::OutcomeKind::ack) return outcome;
    say("handled", message.message_id());
    if (crash_after != 0 && ++handled == crash_after) {
      // Committed, not yet acked: the crash the inbox exists for.
      say("crash", message.message_id());
      ::kill(::getpid(), SIGKILL);
    }
    return outcome;
  };

  uv_loop_t* loop = uv_default_loop();
  auto service_consumer = consumer::Consumer::create(loop, options, consumer::Handler(handler));
  int exit_code = 0;
  service_consumer->set_stopped_handler([&exit_code](const client::Error& error) {
    if (error) exit_code = 3;
  });
  service_consumer->set_ready_handler([] { say("consuming", ""); });
  if (client::Error error = service_consumer->start()) {
    std::fprintf(stderr, "fault_inbox_consumer: %s\n", error.message().c_str());
    return 1;
  }
  service_consumer.reset();  // it keeps itself alive until it stops
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return exit_code;
}
