// Publishes messages with publisher confirms and mandatory routing, one per body given on the
// command line, or one per line of standard input when none is given:
//
//   publish --url URL --exchange demo.in --routing-key demo '{"id": 1}' '{"id": 2, "fail_times":
//   2}' producer | publish --url URL --exchange demo.in --routing-key demo
//
// Messages are persistent. The message id is --message-id (one body only), else the body's "id"
// when the body is a JSON object that has one, else a generated one. Exits 0 only when every
// message was confirmed and routed; 1 for usage errors; 3 when any was returned, nacked or lost; 4
// for connection errors.

#include <uv.h>
#include <retryloop/client/connection.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

using namespace retryloop;
using namespace retryloop::client;

namespace {

std::string message_id_of(const std::string& body, size_t index) {
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object()) {
    if (auto id = parsed.find("id"); id != parsed.end()) {
      return id->is_string() ? id->get<std::string>() : id->dump();
    }
  }
  return "publish-" + std::to_string(uv_hrtime()) + "-" + std::to_string(index);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Publish messages with confirms (bodies as arguments, or lines of stdin)."};
  std::string url;
  std::string exchange;
  std::string routing_key;
  std::string content_type = "application/json";
  std::vector<std::string> bodies;
  std::string message_id;
  bool quiet = false;
  app.add_option("--url", url, "broker URL")->envname("RETRYLOOP_URL")->required();
  app.add_option("--exchange", exchange, "exchange to publish to (default: the default exchange)");
  app.add_option("--routing-key", routing_key, "routing key");
  app.add_option("--content-type", content_type, "content-type property");
  app.add_option("--message-id", message_id, "message-id property (with exactly one body)");
  app.add_flag("--quiet", quiet, "print only failures");
  app.add_option("bodies", bodies, "message bodies; none: read lines from stdin");
  CLI11_PARSE(app, argc, argv);
  if (bodies.empty()) {
    for (std::string line; std::getline(std::cin, line);) {
      if (!line.empty()) bodies.push_back(line);
    }
  }
  if (!message_id.empty() && bodies.size() != 1) {
    std::fprintf(stderr, "publish: --message-id needs exactly one body\n");
    return 1;
  }

  ConnectionOptions options;
  try {
    options.uri = parse_uri(url);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "publish: %s\n", e.what());
    return 1;
  }
  options.connection_name = "retryloop publish example";
  uv_loop_t* loop = uv_default_loop();
  auto connection = Connection::create(loop, options);
  int exit_code = 0;
  size_t settled = 0;

  auto fail = [&](int code, const std::string& what, const Error& error) {
    std::fprintf(stderr, "publish: %s: %s\n", what.c_str(), error.message().c_str());
    exit_code = code;
    connection->close();
  };
  auto publish_all = [&](std::shared_ptr<Channel> channel) {
    if (bodies.empty()) return connection->close();
    for (size_t i = 0; i < bodies.size(); ++i) {
      amqp::BasicProperties properties;
      properties.content_type = content_type;
      properties.delivery_mode = 2;
      properties.message_id = message_id.empty() ? message_id_of(bodies[i], i) : message_id;
      Error error = channel->publish(
          exchange, routing_key, properties, bodies[i], Mandatory::yes,
          [&, i, id = *properties.message_id](const PublishOutcome& outcome) {
            if (outcome.ok()) {
              if (!quiet) std::printf("published %s: %s\n", id.c_str(), bodies[i].c_str());
            } else {
              const char* status = outcome.status == PublishStatus::returned ? "returned"
                                   : outcome.status == PublishStatus::nacked ? "nacked"
                                                                             : "failed";
              std::fprintf(stderr, "publish: %s %s: %s\n", id.c_str(), status,
                           outcome.error.message().c_str());
              exit_code = 3;
            }
            if (++settled == bodies.size()) connection->close();
          });
      if (error) return fail(3, "basic.publish", error);
    }
  };

  Error error = connection->connect([&](const Error& error) {
    if (error) return fail(4, "connect", error);
    Error e = connection->open_channel([&](const Error& error, std::shared_ptr<Channel> channel) {
      if (error) return fail(3, "channel.open", error);
      Error e = channel->confirm_select([&, channel](const Error& error) {
        if (error) return fail(3, "confirm.select", error);
      });
      if (e) return fail(3, "confirm.select", e);
      publish_all(channel);
    });
    if (e) fail(3, "channel.open", e);
  });
  if (error) {
    std::fprintf(stderr, "publish: connect: %s\n", error.message().c_str());
    return 4;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return exit_code;
}
