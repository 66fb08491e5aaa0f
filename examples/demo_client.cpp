// The AMQP client on its own: connect, declare, publish with confirms, consume, ack, close.
//
//   demo_client --url amqp://guest:guest@127.0.0.1:5672/ [--count N]

#include <uv.h>
#include <retryloop/client/connection.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace retryloop;
using namespace retryloop::client;

namespace {

void check(const Error& error, const char* what) {
  if (!error) return;
  std::fprintf(stderr, "demo_client: %s failed: %s\n", what, error.message().c_str());
  std::exit(1);
}

struct Demo {
  std::shared_ptr<Connection> connection;
  std::shared_ptr<Channel> channel;
  std::string queue = "retryloop.demo.client";
  int count = 5;
  int confirmed = 0;
  int received = 0;
  std::string consumer_tag;

  void start() {
    std::printf("connected to %s (frame_max %u, heartbeat %us)\n",
                connection->uri().redacted().c_str(), connection->tuning().frame_max,
                connection->tuning().heartbeat_seconds);
    check(connection->open_channel([this](const Error& e, std::shared_ptr<Channel> c) {
      check(e, "channel.open");
      channel = std::move(c);
      declare();
    }),
          "channel.open");
  }

  void declare() {
    QueueOptions options;
    options.durable = false;
    options.auto_delete = true;
    check(channel->queue_declare(queue, options,
                                 [this](const Error& e, const QueueInfo& info) {
                                   check(e, "queue.declare");
                                   std::printf("declared queue %s (%u messages waiting)\n",
                                               info.name.c_str(), info.message_count);
                                   consume();
                                 }),
          "queue.declare");
  }

  void consume() {
    check(channel->qos(50, {}), "basic.qos");
    check(channel->consume(
              queue, {},
              [this](Delivery&& delivery) {
                std::printf("received #%llu: %s\n",
                            static_cast<unsigned long long>(delivery.delivery_tag),
                            delivery.message.body.c_str());
                check(channel->ack(delivery.delivery_tag), "basic.ack");
                if (++received == count) finish();
              },
              [this](const Error& e, const std::string& tag) {
                check(e, "basic.consume");
                consumer_tag = tag;
                std::printf("consuming as %s\n", tag.c_str());
                publish();
              }),
          "basic.consume");
  }

  void publish() {
    check(channel->confirm_select([](const Error& e) { check(e, "confirm.select"); }),
          "confirm.select");
    for (int i = 1; i <= count; ++i) {
      amqp::BasicProperties properties;
      properties.content_type = "text/plain";
      properties.delivery_mode = 2;
      properties.message_id = "demo-" + std::to_string(i);
      std::string body = "message " + std::to_string(i) + " of " + std::to_string(count);
      check(channel->publish("", queue, properties, body, Mandatory::yes,
                             [this, i](const PublishOutcome& outcome) {
                               std::printf(
                                   "publish %d confirmed: %s\n", i,
                                   outcome.ok() ? "acked" : outcome.error.message().c_str());
                               ++confirmed;
                             }),
            "basic.publish");
    }
  }

  void finish() {
    Error error = channel->cancel(consumer_tag, [this](const Error& e) {
      check(e, "basic.cancel");
      connection->close([this](const Error&) {
        std::printf("closed: %d published and confirmed, %d received and acked\n", confirmed,
                    received);
      });
    });
    check(error, "basic.cancel");
  }
};

}  // namespace

int main(int argc, char** argv) {
  const char* url = std::getenv("RETRYLOOP_URL");
  Demo demo;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
      url = argv[++i];
    } else if (std::strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
      demo.count = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: demo_client --url amqp://user:pass@host:port/vhost [--count N]\n");
      return 1;
    }
  }
  if (url == nullptr) {
    std::fprintf(stderr, "demo_client: give --url or set RETRYLOOP_URL\n");
    return 1;
  }
  uv_loop_t* loop = uv_default_loop();
  ConnectionOptions options;
  try {
    options.uri = parse_uri(url);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "demo_client: bad URL: %s\n", e.what());
    return 1;
  }
  demo.connection = Connection::create(loop, options);
  check(demo.connection->connect([&demo](const Error& e) {
    check(e, "connect");
    demo.start();
  }),
        "connect");
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return demo.received == demo.count && demo.confirmed == demo.count ? 0 : 1;
}
