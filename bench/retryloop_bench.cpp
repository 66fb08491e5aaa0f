// retryloop's side of the benchmarks, and the queue tools every peer shares.
//
//   bench_retryloop reset   --url URL --queue Q [--type classic|quorum] [--exchange FANOUT]
//                           [--ttl MS --dead-letter-to Q2] [--delete-only]
//   bench_retryloop fill    --url URL (--queue Q | --exchange FANOUT) --count N [--size BYTES]
//                           [--fresh] [--parked]
//   bench_retryloop consume --url URL --queue Q --count N --prefetch P [--ack-delay MS]
//   bench_retryloop publish --url URL --queue Q --count N --window W [--rate MSG_PER_S]
//   bench_retryloop retry   --url URL --topology FILE --service S --count N --fail K [--lateness]
//                           [--ack-delay MS]
//   bench_retryloop ttl     --url URL --queue Q --count N --delay-ms D
//   bench_retryloop hold    --url URL --topology FILE --service S --count N --prefetch P
//
// `reset` deletes Q and (unless --delete-only) declares it again, durable, of the given type (a TTL
// queue that dead-letters to Q2 through the default exchange with --ttl; bound to the fanout
// exchange FANOUT with --exchange, so that one fill fills every client's queue). `fill` publishes N
// persistent messages with the shared header table (an x-death array as after two trips through a
// retry loop; --fresh leaves out the x- headers, as before a first failure; --parked adds the
// headers of a parked message), pipelined with confirms; it is how every queue is filled, outside
// the timed window. The other modes print one JSON line:
//
//   consume  N deliveries acked one by one, no-op handler: time from the first delivery to the last
//            ack, and the process's CPU time over the same window.
//   publish  N messages with confirms, at most W unconfirmed (1: one at a time); --rate paces
//            them and stamps each with the time it was sent (for `ttl`).
//   retry    the retry consumer on a service of FILE, handler on the loop: each message fails K
//            times, then is acked; completed messages per second from the first delivery.
//            --lateness: the time from each failure to the next delivery, minus the delay.
//   ttl      the broker's own TTL precision: consumes what a TTL queue dead-lettered, and
//            reports arrival minus the sent stamp minus the delay.
//   hold     the retry consumer with a slow handler (500 ms a message) until N deliveries have
//            arrived, nearly all of them held unacked; then the peak RSS of the process.

#include <sys/resource.h>
#include <uv.h>
#include <retryloop/client/connection.hpp>
#include <retryloop/consumer/consumer.hpp>
#include <retryloop/topology/topology_json.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

using namespace retryloop;
using namespace retryloop::client;

namespace {

struct Args {
  std::string mode;
  std::string url;
  std::string queue;
  std::string type = "classic";
  std::string dead_letter_to;
  std::string exchange;
  std::string topology;
  std::string service;
  long count = 0;
  long size = 1024;
  long window = 1000;
  long rate = 0;
  long ttl = 0;
  long delay_ms = 0;
  int fail = 2;
  int prefetch = 200;
  bool parked = false;
  bool fresh = false;
  bool delete_only = false;
  bool lateness = false;
  long timeout_s = 900;
  long ack_delay_ms = -1;  ///< -1: the library's default
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_retryloop: %s\n", what.c_str());
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

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Headers as a message has them after two trips through a retry loop.
amqp::FieldTable realistic_headers() {
  auto death = [](const char* queue, const char* reason) {
    amqp::FieldTable entry;
    entry.append("count", int64_t{2});
    entry.append("reason", reason);
    entry.append("queue", queue);
    entry.append("time", amqp::Timestamp{1700000000});
    entry.append("exchange", "orders.in");
    entry.append("routing-keys", amqp::FieldArray{std::string("order.created")});
    return entry;
  };
  amqp::FieldTable headers;
  headers.append("x-death", amqp::FieldArray{death("orders.wait.30s", "expired"),
                                             death("orders", "rejected")});
  headers.append("x-first-death-exchange", "orders.in");
  headers.append("x-first-death-queue", "orders");
  headers.append("x-first-death-reason", "rejected");
  headers.append("trace-id", "4bf92f3577b34da6a3ce929d0e0e4736");
  return headers;
}

/// The shared properties: persistent, the realistic headers (`fresh`: only those a publisher
/// sets, as a message has before its first failure; `parked`: plus the parking headers).
amqp::BasicProperties message_properties(bool fresh, bool parked) {
  amqp::BasicProperties properties;
  properties.delivery_mode = 2;
  properties.content_type = "application/json";
  properties.message_id = "bench";
  properties.headers = realistic_headers();
  if (fresh)
    properties.headers->erase_if([](const std::string& name) { return name.rfind("x-", 0) == 0; });
  if (parked) {
    auto& h = *properties.headers;
    h.append("retryloop-attempts", int64_t{5});
    h.append("retryloop-reason", "exhausted");
    h.append("retryloop-error", "upstream returned 503 Service Unavailable");
    h.append("retryloop-queue", "orders");
    h.append("retryloop-original-exchange", "orders.in");
    h.append("retryloop-original-routing-key", "order.created");
    h.append("retryloop-first-failure", amqp::Timestamp{1700000000});
    h.append("retryloop-parked-at", amqp::Timestamp{1700000100});
    h.append("retryloop-consumer", "bench:1");
  }
  return properties;
}

int64_t header_int(const amqp::BasicProperties& properties, const char* name) {
  if (!properties.headers) return -1;
  const amqp::FieldValue* value = properties.headers->find(name);
  if (!value) return -1;
  return value->as_int64().value_or(-1);
}

/// Runs `body` once the connection and a channel are open, then the loop until it ends.
void with_channel(
    uv_loop_t* loop, const Args& args,
    const std::function<void(std::shared_ptr<Connection>, std::shared_ptr<Channel>)>& body) {
  ConnectionOptions options;
  options.uri = parse_uri(args.url);
  if (args.ack_delay_ms >= 0) options.ack_delay = std::chrono::milliseconds(args.ack_delay_ms);
  auto connection = Connection::create(loop, options);
  connection->set_lost_handler([](const Error& e) { die("connection lost: " + e.message()); });
  check(connection->connect([connection, &body](const Error& e) {
    check(e, "connect");
    check(
        connection->open_channel([connection, &body](const Error& e2, std::shared_ptr<Channel> c) {
          check(e2, "channel");
          c->set_close_handler([](const Error& e3) {
            if (e3 && e3.code != ClientError::closed_by_client) {
              die("channel closed: " + e3.message());
            }
          });
          body(connection, std::move(c));
        }),
        "channel");
  }),
        "connect");
  uv_run(loop, UV_RUN_DEFAULT);
}

void reset(uv_loop_t* loop, const Args& args) {
  with_channel(loop, args, [&](auto connection, auto channel) {
    check(channel->queue_delete(
              args.queue, false, false,
              [&, connection, channel](const Error& e, uint32_t) {
                check(e, "queue.delete");
                if (args.delete_only) return connection->close();
                QueueOptions options;
                // Classic queues as retryloop declares them (version 2), or the version 1 that
                // RabbitMQ 3.x makes by default, to show the difference.
                if (args.type == "quorum") {
                  options.arguments.append("x-queue-type", "quorum");
                } else {
                  options.arguments.append("x-queue-version",
                                           int64_t{args.type == "classic-v1" ? 1 : 2});
                }
                if (args.ttl > 0) {
                  options.arguments.append("x-message-ttl", int64_t{args.ttl});
                  options.arguments.append("x-dead-letter-exchange", "");
                  options.arguments.append("x-dead-letter-routing-key", args.dead_letter_to);
                }
                check(channel->queue_declare(
                          args.queue, options,
                          [&, connection, channel](const Error& e2, const QueueInfo&) {
                            check(e2, "queue.declare");
                            if (args.exchange.empty()) return connection->close();
                            check(channel->exchange_declare(
                                      args.exchange, "fanout", {},
                                      [&, connection, channel](const Error& e3) {
                                        check(e3, "exchange.declare");
                                        check(channel->queue_bind(args.queue, args.exchange, "", {},
                                                                  [connection](const Error& e4) {
                                                                    check(e4, "queue.bind");
                                                                    connection->close();
                                                                  }),
                                              "queue.bind");
                                      }),
                                  "exchange.declare");
                          }),
                      "queue.declare");
              }),
          "queue.delete");
  });
}

/// Publishes `count` messages with confirms, at most `window` unconfirmed, paced to `rate`
/// messages per second when it is above 0. Returns the time from the first publish to the last
/// confirm, and the CPU time of that window.
struct PublishResult {
  double t0 = 0, t1 = 0, cpu = 0;
};

PublishResult publish(uv_loop_t* loop, const Args& args, bool stamp) {
  PublishResult result;
  long published = 0, confirmed = 0;
  std::string body(static_cast<size_t>(args.size), 'x');
  amqp::BasicProperties properties = message_properties(args.fresh, args.parked);
  properties.headers->append("bench-seq", int64_t{0});
  if (stamp) properties.headers->append("bench-sent-us", int64_t{0});
  double cpu0 = 0;
  uv_timer_t pacer{};
  std::chrono::steady_clock::time_point started;
  std::shared_ptr<Connection> conn;
  std::shared_ptr<Channel> chan;

  std::function<void()> publish_more = [&] {
    long allowed = args.count;
    if (args.rate > 0) {
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      allowed = std::min<long>(args.count, static_cast<long>(elapsed * args.rate) + 1);
    }
    while (published < allowed && published - confirmed < args.window) {
      *properties.headers->find("bench-seq") = int64_t{published};
      if (stamp) *properties.headers->find("bench-sent-us") = wall_us();
      ++published;
      check(chan->publish(args.exchange, args.exchange.empty() ? args.queue : "", properties, body,
                          Mandatory::no,
                          [&](const PublishOutcome& outcome) {
                            if (!outcome.ok()) die("publish: " + outcome.error.message());
                            if (++confirmed == args.count) {
                              result.t1 = wall_seconds();
                              result.cpu = cpu_seconds() - cpu0;
                              if (args.rate > 0)
                                uv_close(reinterpret_cast<uv_handle_t*>(&pacer), nullptr);
                              conn->close();
                            } else {
                              publish_more();
                            }
                          }),
            "publish");
    }
  };
  with_channel(loop, args, [&](auto connection, auto channel) {
    conn = connection;
    chan = channel;
    check(channel->confirm_select([&](const Error& e) {
      check(e, "confirm.select");
      result.t0 = wall_seconds();
      cpu0 = cpu_seconds();
      started = std::chrono::steady_clock::now();
      if (args.rate > 0) {
        uv_timer_init(loop, &pacer);
        pacer.data = &publish_more;
        uv_timer_start(
            &pacer, [](uv_timer_t* t) { (*static_cast<std::function<void()>*>(t->data))(); }, 5, 5);
      }
      publish_more();
    }),
          "confirm.select");
  });
  if (confirmed != args.count) die("publish did not finish");
  return result;
}

void print_rate(const char* what, long messages, const PublishResult& r, const Args& args) {
  double seconds = r.t1 - r.t0;
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"%s\", \"messages\": %ld, \"prefetch\": %d, "
      "\"window\": %ld, \"seconds\": %.4f, \"rate\": %.1f, \"cpu_seconds\": %.4f, \"t0\": %.6f, "
      "\"t1\": %.6f}\n",
      what, messages, args.prefetch, args.window, seconds, messages / seconds, r.cpu, r.t0, r.t1);
}

void consume(uv_loop_t* loop, const Args& args) {
  long received = 0;
  PublishResult r;
  double cpu0 = 0;
  with_channel(loop, args, [&](auto connection, auto channel) {
    check(channel->qos(static_cast<uint16_t>(args.prefetch), {}), "qos");
    check(channel->consume(
              args.queue, {},
              [&, connection, channel](Delivery&& delivery) {
                if (received == 0) {
                  CALLGRIND_ZERO_STATS;
                  r.t0 = wall_seconds();
                  cpu0 = cpu_seconds();
                }
                (void)channel->ack(delivery.delivery_tag);
                if (++received == args.count) {
                  CALLGRIND_DUMP_STATS;
                  r.t1 = wall_seconds();
                  r.cpu = cpu_seconds() - cpu0;
                  connection->close();
                }
              },
              [](const Error& e, const std::string&) { check(e, "basic.consume"); }),
          "consume");
  });
  if (received != args.count) die("consumer stopped early");
  print_rate("consume", received, r, args);
}

topology::Service load_service(const Args& args) {
  topology::ParseResult parsed = topology::load_topology(args.topology);
  if (!parsed.ok()) die("topology: " + parsed.messages().front());
  return topology::select_services(*parsed.topology, {args.service}).services.at(0);
}

std::string percentiles_json(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
  };
  char text[200];
  std::snprintf(text, sizeof text,
                "{\"p50\": %.2f, \"p99\": %.2f, \"max\": %.2f, \"samples\": %zu}", at(0.5),
                at(0.99), values.back(), values.size());
  return text;
}

void retry(uv_loop_t* loop, const Args& args) {
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  if (args.ack_delay_ms >= 0)
    options.connection.ack_delay = std::chrono::milliseconds(args.ack_delay_ms);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  options.handler_on_loop = true;
  const double delay_ms =
      static_cast<double>(topology::delay_after_attempt(options.service, 1).count());
  long completed = 0;
  PublishResult r;
  double cpu0 = 0;
  std::unordered_map<int64_t, std::chrono::steady_clock::time_point> failed_at;
  std::vector<double> late_ms;
  std::shared_ptr<consumer::Consumer> service_consumer;
  uv_timer_t stopper{};
  uv_timer_init(loop, &stopper);
  stopper.data = &service_consumer;

  auto handler = [&](const consumer::Message& message) -> consumer::Outcome {
    auto now = std::chrono::steady_clock::now();
    if (r.t0 == 0) {
      r.t0 = wall_seconds();
      cpu0 = cpu_seconds();
    }
    int64_t seq = header_int(message.properties, "bench-seq");
    if (args.lateness && message.attempt > 1) {
      auto it = failed_at.find(seq);
      if (it != failed_at.end()) {
        late_ms.push_back(std::chrono::duration<double, std::milli>(now - it->second).count() -
                          delay_ms);
        failed_at.erase(it);
      }
    }
    if (message.attempt <= args.fail) {
      if (args.lateness) failed_at[seq] = now;
      return consumer::Outcome::retry("bench failure");
    }
    if (++completed == args.count) {
      r.t1 = wall_seconds();
      r.cpu = cpu_seconds() - cpu0;
      uv_timer_start(
          &stopper,
          [](uv_timer_t* t) {
            (*static_cast<std::shared_ptr<consumer::Consumer>*>(t->data))
                ->stop(std::chrono::seconds(10));
            uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
          },
          0, 0);
    }
    return consumer::Outcome::ack();
  };
  service_consumer = consumer::Consumer::create(loop, options, consumer::Handler(handler));
  service_consumer->set_stopped_handler([](const Error& e) { check(e, "consumer"); });
  check(service_consumer->start(), "consumer start");
  uv_run(loop, UV_RUN_DEFAULT);
  if (completed != args.count) die("retry consumer stopped early");
  double seconds = r.t1 - r.t0;
  std::printf(
      "{\"client\": \"retryloop-%s\", \"bench\": \"%s\", \"messages\": %ld, \"fail\": %d, "
      "\"seconds\": %.4f, \"rate\": %.1f, \"cpu_seconds\": %.4f, \"t0\": %.6f, \"t1\": %.6f",
      topology::to_string(options.service.retry.mode), args.lateness ? "lateness" : "retry",
      completed, args.fail, seconds, completed / seconds, r.cpu, r.t0, r.t1);
  if (args.lateness) std::printf(", \"late_ms\": %s", percentiles_json(late_ms).c_str());
  std::printf("}\n");
}

void ttl(uv_loop_t* loop, const Args& args) {
  long received = 0;
  std::vector<double> late_ms;
  with_channel(loop, args, [&](auto connection, auto channel) {
    check(channel->qos(static_cast<uint16_t>(args.prefetch), {}), "qos");
    check(channel->consume(
              args.queue, {},
              [&, connection, channel](Delivery&& delivery) {
                int64_t sent = header_int(delivery.message.properties, "bench-sent-us");
                late_ms.push_back((wall_us() - sent) / 1000.0 - static_cast<double>(args.delay_ms));
                (void)channel->ack(delivery.delivery_tag);
                if (++received == args.count) connection->close();
              },
              [](const Error& e, const std::string&) { check(e, "basic.consume"); }),
          "consume");
  });
  std::printf(
      "{\"client\": \"broker-ttl\", \"bench\": \"lateness\", \"messages\": %ld, "
      "\"late_ms\": %s}\n",
      received, percentiles_json(late_ms).c_str());
}

long status_kb(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field));
  }
  return -1;
}

void hold(uv_loop_t* loop, const Args& args) {
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  long rss_start = status_kb("VmRSS:");
  auto service_consumer =
      consumer::Consumer::create(loop, options, consumer::Handler([](const consumer::Message&) {
                                   std::this_thread::sleep_for(std::chrono::milliseconds(500));
                                   return consumer::Outcome::ack();
                                 }));
  long held = 0, peak = 0;
  uv_timer_t poll{};
  uv_timer_init(loop, &poll);
  struct State {
    std::shared_ptr<consumer::Consumer> consumer;
    long* held;
    long* peak;
    long count;
  } state{service_consumer, &held, &peak, args.count};
  poll.data = &state;
  uv_timer_start(
      &poll,
      [](uv_timer_t* t) {
        auto* s = static_cast<State*>(t->data);
        if (static_cast<long>(s->consumer->metrics().delivered) < s->count) return;
        *s->held = static_cast<long>(s->consumer->in_flight());
        *s->peak = status_kb("VmHWM:");
        s->consumer->stop_now();
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
      },
      10, 10);
  check(service_consumer->start(), "consumer start");
  service_consumer.reset();
  uv_run(loop, UV_RUN_DEFAULT);
  state.consumer.reset();
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"memory\", \"held\": %ld, \"prefetch\": %d, "
      "\"size\": %ld, \"rss_start_kb\": %ld, \"peak_rss_kb\": %ld}\n",
      held, args.prefetch, args.size, rss_start, peak);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (argc < 2) die("usage: bench_retryloop MODE --url URL ... (see the source)");
  args.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--parked") {
      args.parked = true;
      continue;
    }
    if (flag == "--delete-only") {
      args.delete_only = true;
      continue;
    }
    if (flag == "--fresh") {
      args.fresh = true;
      continue;
    }
    if (flag == "--lateness") {
      args.lateness = true;
      continue;
    }
    if (i + 1 >= argc) die(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--url") {
      args.url = value;
    } else if (flag == "--queue") {
      args.queue = value;
    } else if (flag == "--type") {
      args.type = value;
    } else if (flag == "--exchange") {
      args.exchange = value;
    } else if (flag == "--dead-letter-to") {
      args.dead_letter_to = value;
    } else if (flag == "--topology") {
      args.topology = value;
    } else if (flag == "--service") {
      args.service = value;
    } else if (flag == "--count") {
      args.count = std::atol(value);
    } else if (flag == "--size") {
      args.size = std::atol(value);
    } else if (flag == "--window") {
      args.window = std::atol(value);
    } else if (flag == "--rate") {
      args.rate = std::atol(value);
    } else if (flag == "--ttl") {
      args.ttl = std::atol(value);
    } else if (flag == "--delay-ms") {
      args.delay_ms = std::atol(value);
    } else if (flag == "--fail") {
      args.fail = std::atoi(value);
    } else if (flag == "--prefetch") {
      args.prefetch = std::atoi(value);
    } else if (flag == "--ack-delay") {
      args.ack_delay_ms = std::atol(value);
    } else if (flag == "--timeout") {
      args.timeout_s = std::atol(value);
    } else {
      die("unknown flag " + flag);
    }
  }
  if (args.url.empty()) die("--url is required");
  // A benchmark that hangs (a broker that stopped sending) fails instead of holding the run.
  std::thread([timeout = args.timeout_s] {
    std::this_thread::sleep_for(std::chrono::seconds(timeout));
    die("timed out");
  }).detach();
  uv_loop_t* loop = uv_default_loop();
  if (args.mode == "reset") {
    reset(loop, args);
  } else if (args.mode == "fill") {
    args.window = 1000;
    args.rate = 0;
    publish(loop, args, false);
  } else if (args.mode == "publish") {
    print_rate("publish", args.count, publish(loop, args, args.rate > 0), args);
  } else if (args.mode == "consume") {
    consume(loop, args);
  } else if (args.mode == "retry") {
    retry(loop, args);
  } else if (args.mode == "ttl") {
    ttl(loop, args);
  } else if (args.mode == "hold") {
    hold(loop, args);
  } else {
    die("unknown mode " + args.mode);
  }
  uv_loop_close(loop);
  return 0;
}
