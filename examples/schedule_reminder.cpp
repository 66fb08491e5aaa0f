// Scheduled delivery from C++: a reminder due in a few seconds, through the delay levels of a
// topology file (its top-level delay_levels; `retryloop topology apply FILE` declares them).
//
//   schedule_reminder --url amqp://guest:guest@127.0.0.1:5672/ -t topology/scheduled.json
//                     [--queue reminders] [--in 90s] [BODY]

#include <uv.h>
#include <CLI/CLI.hpp>
#include <retryloop/client/connection.hpp>
#include <retryloop/schedule/scheduler.hpp>
#include <retryloop/topology/duration.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <cstdio>
#include <memory>
#include <string>

using namespace retryloop;

int main(int argc, char** argv) {
  CLI::App app{"Schedules one message for a queue, through a topology file's delay levels"};
  std::string url = "amqp://guest:guest@127.0.0.1:5672/";
  std::string file = "topology/scheduled.json";
  std::string queue = "reminders";
  std::string in = "10s";
  std::string body = R"({"remind": "the invoice is due"})";
  app.add_option("--url", url, "Broker URL");
  app.add_option("-t,--topology", file, "Topology file with a top-level delay_levels");
  app.add_option("--queue", queue, "The queue that receives the message");
  app.add_option("--in", in, "When it is due: a duration such as 90s");
  app.add_option("body", body, "The message body");
  CLI11_PARSE(app, argc, argv);

  auto parsed = topology::load_topology(file);
  if (!parsed.ok() || !parsed.topology->schedule) {
    for (const auto& line : parsed.messages())
      std::fprintf(stderr, "%s\n", line.c_str());
    std::fprintf(stderr, "schedule_reminder: %s has no delay_levels\n", file.c_str());
    return 2;
  }
  std::string why;
  const auto delay = topology::parse_duration(in, &why);
  if (!delay) {
    std::fprintf(stderr, "schedule_reminder: --in '%s' %s\n", in.c_str(), why.c_str());
    return 1;
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  client::ConnectionOptions options;
  options.uri = client::parse_uri(url);
  auto connection = client::Connection::create(&loop, options);
  std::shared_ptr<client::Channel> channel;
  std::unique_ptr<schedule::Scheduler> scheduler;
  int status = 1;
  auto fail = [&](const char* what, const client::Error& error) {
    std::fprintf(stderr, "schedule_reminder: %s: %s\n", what, error.message().c_str());
    connection->close();
  };
  client::Error error = connection->connect([&](const client::Error& connected) {
    if (connected) return fail("connect", connected);
    client::Error opened = connection->open_channel([&](const client::Error& e,
                                                        std::shared_ptr<client::Channel> c) {
      if (e) return fail("channel", e);
      channel = std::move(c);
      // Confirms: the broker holds the message once the result says ok().
      client::Error selected = channel->confirm_select([&](const client::Error& e2) {
        if (e2) return fail("confirm.select", e2);
        scheduler = std::make_unique<schedule::Scheduler>(*channel, *parsed.topology->schedule);
        amqp::BasicProperties properties;
        properties.content_type = "application/json";
        client::Error refused = scheduler->schedule_in(
            queue, properties, body, *delay, [&](const schedule::ScheduleResult& result) {
              if (result.ok()) {
                std::printf("message %s is due in %lld ms (at %lld ms since the epoch)\n",
                            result.message_id.c_str(), static_cast<long long>(result.delay.count()),
                            static_cast<long long>(result.due_at_ms));
                status = 0;
              } else {
                std::fprintf(stderr, "schedule_reminder: not scheduled: %s\n",
                             result.publish.error.message().c_str());
              }
              connection->close();
            });
        if (refused) fail("schedule", refused);
      });
      if (selected) fail("confirm.select", selected);
    });
    if (opened) fail("channel", opened);
  });
  if (error) {
    std::fprintf(stderr, "schedule_reminder: connect: %s\n", error.message().c_str());
    return 1;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return status;
}
