// Consume-and-ack benchmark for retryloop's client, and the queue filler every peer shares.
//
//   bench_consume_ack fill    --url URL --queue Q --count N [--size BYTES]
//   bench_consume_ack consume --url URL --queue Q --count N [--prefetch P]
//
// `fill` declares Q (durable, classic) and publishes N persistent messages of BYTES bytes with an
// x-death-shaped header table, pipelined with confirms. `consume` takes N deliveries with a
// no-op handler, acking each, and prints one JSON line: the time from the first delivery to the
// last ack, the rate, and the process's CPU time over the same window.

#include <retryloop/client/connection.hpp>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace retryloop;
using namespace retryloop::client;

namespace {

struct Args {
  std::string mode;
  std::string url;
  std::string queue = "bench.consume";
  long count = 100000;
  long size = 1024;
  int prefetch = 200;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_consume_ack: %s\n", what.c_str());
  std::exit(1);
}

void check(const Error& error, const char* what) {
  if (error) die(std::string(what) + ": " + error.message());
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

/// Headers as a message has them after two trips through a retry loop.
amqp::FieldTable realistic_headers() {
  auto death = [](const char* queue, const char* reason, int64_t count) {
    amqp::FieldTable entry;
    entry.append("count", count);
    entry.append("reason", reason);
    entry.append("queue", queue);
    entry.append("time", amqp::Timestamp{1700000000});
    entry.append("exchange", "orders.in");
    entry.append("routing-keys", amqp::FieldArray{std::string("order.created")});
    return entry;
  };
  amqp::FieldTable headers;
  headers.append("x-death", amqp::FieldArray{death("orders.wait.30s", "expired", 2),
                                             death("orders", "rejected", 2)});
  headers.append("x-first-death-exchange", "orders.in");
  headers.append("x-first-death-queue", "orders");
  headers.append("x-first-death-reason", "rejected");
  headers.append("trace-id", "4bf92f3577b34da6a3ce929d0e0e4736");
  return headers;
}

void fill(uv_loop_t* loop, const Args& args) {
  ConnectionOptions options;
  options.uri = parse_uri(args.url);
  auto connection = Connection::create(loop, options);
  std::shared_ptr<Channel> channel;
  long published = 0, confirmed = 0;
  std::string body(static_cast<size_t>(args.size), 'x');
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  properties.content_type = "application/json";
  properties.message_id = "bench";
  properties.headers = realistic_headers();
  constexpr long kWindow = 1000;

  std::function<void()> publish_more = [&] {
    while (published < args.count && published - confirmed < kWindow) {
      ++published;
      check(channel->publish("", args.queue, properties, body, Mandatory::yes,
                             [&](const PublishOutcome& outcome) {
                               if (!outcome.ok()) die("fill publish: " + outcome.error.message());
                               if (++confirmed == args.count) {
                                 connection->close();
                               } else {
                                 publish_more();
                               }
                             }),
            "publish");
    }
  };
  check(connection->connect([&](const Error& e) {
    check(e, "connect");
    check(connection->open_channel([&](const Error& e2, std::shared_ptr<Channel> c) {
      check(e2, "channel");
      channel = std::move(c);
      check(channel->queue_declare(args.queue, {}, [&](const Error& e3, const QueueInfo&) {
        check(e3, "queue.declare");
        check(channel->confirm_select([&](const Error& e4) {
          check(e4, "confirm.select");
          publish_more();
        }),
              "confirm.select");
      }),
            "queue.declare");
    }),
          "channel");
  }),
        "connect");
  uv_run(loop, UV_RUN_DEFAULT);
  if (confirmed != args.count) die("fill did not finish");
}

void consume(uv_loop_t* loop, const Args& args) {
  ConnectionOptions options;
  options.uri = parse_uri(args.url);
  auto connection = Connection::create(loop, options);
  std::shared_ptr<Channel> channel;
  long received = 0;
  std::chrono::steady_clock::time_point first, last;
  double cpu_first = 0, cpu_last = 0;
  check(connection->connect([&](const Error& e) {
    check(e, "connect");
    check(connection->open_channel([&](const Error& e2, std::shared_ptr<Channel> c) {
      check(e2, "channel");
      channel = std::move(c);
      check(channel->qos(static_cast<uint16_t>(args.prefetch), {}), "qos");
      check(channel->consume(
                args.queue, {},
                [&](Delivery&& delivery) {
                  if (received == 0) {
                    first = std::chrono::steady_clock::now();
                    cpu_first = cpu_seconds();
                  }
                  channel->ack(delivery.delivery_tag);
                  if (++received == args.count) {
                    last = std::chrono::steady_clock::now();
                    cpu_last = cpu_seconds();
                    connection->close();
                  }
                },
                [](const Error& e3, const std::string&) { check(e3, "basic.consume"); }),
            "consume");
    }),
          "channel");
  }),
        "connect");
  uv_run(loop, UV_RUN_DEFAULT);
  if (received != args.count) die("consumer stopped early");
  double seconds = std::chrono::duration<double>(last - first).count();
  std::printf(
      "{\"client\": \"retryloop\", \"messages\": %ld, \"prefetch\": %d, \"seconds\": %.4f, "
      "\"rate\": %.1f, \"cpu_seconds\": %.4f}\n",
      received, args.prefetch, seconds, received / seconds, cpu_last - cpu_first);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (argc < 2) die("usage: bench_consume_ack fill|consume --url URL [--queue Q] [--count N]");
  args.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--url") {
      args.url = value;
    } else if (flag == "--queue") {
      args.queue = value;
    } else if (flag == "--count") {
      args.count = std::atol(value);
    } else if (flag == "--size") {
      args.size = std::atol(value);
    } else if (flag == "--prefetch") {
      args.prefetch = std::atoi(value);
    } else {
      die("unknown flag " + flag);
    }
  }
  if (args.url.empty()) die("--url is required");
  uv_loop_t* loop = uv_default_loop();
  if (args.mode == "fill") {
    fill(loop, args);
  } else if (args.mode == "consume") {
    consume(loop, args);
  } else {
    die("mode must be fill or consume");
  }
  uv_loop_close(loop);
  return 0;
}
