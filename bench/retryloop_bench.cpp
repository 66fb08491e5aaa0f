// retryloop's side of the benchmarks, and the queue tools every peer shares.
//
//   bench_retryloop reset   --url URL --queue Q [--type classic|quorum] [--exchange FANOUT]
//                           [--ttl MS --dead-letter-to Q2] [--delete-only]
//   bench_retryloop fill    --url URL (--queue Q | --exchange FANOUT) --count N [--size BYTES]
//                           [--fresh] [--parked [--rare-every K]] [--unique-ids] [--ballast]
//                           [--json]
//   bench_retryloop consume --url URL --queue Q --count N --prefetch P [--ack-delay MS] [--json]
//   bench_retryloop handle  --url URL --topology FILE --service S --count N --prefetch P
//                           --concurrency C [--on-loop]
//   bench_retryloop publish --url URL --queue Q --count N --window W [--rate MSG_PER_S]
//                           [--mandatory] [--outbox-headers]
//   bench_retryloop retry   --url URL --topology FILE --service S --count N --fail K [--lateness]
//                           [--ack-delay MS]
//   bench_retryloop ttl     --url URL --queue Q --count N --delay-ms D
//   bench_retryloop schedule --url URL --topology FILE --queue Q --count N --min-ms A --max-ms B
//                           [--window W]
//   bench_retryloop delays  --url URL --topology FILE --service S --count N --min-ms A --max-ms B
//   bench_retryloop hold    --url URL --topology FILE --service S --count N --prefetch P
//   bench_retryloop handlers --url URL --topology FILE --service S --count N --concurrency C
//                           --sleep-ms MS [--prefetch P]
//   bench_retryloop outbox-fill    --db DB --queue Q --count N [--size BYTES] [--keys K]
//   bench_retryloop outbox-naive   --db DB --url URL --count N
//   bench_retryloop outbox-latency --db DB --url URL --queue Q --count N --rate ROWS_PER_S
//   bench_retryloop inbox-reset --db DB
//   bench_retryloop inbox   --db DB --url URL --topology FILE --service S --count N
//                           [--inbox] [--concurrency C]
//   bench_retryloop failover --url CLUSTER_URL --topology FILE --service S --count KILLS
//
// `reset` deletes Q and (unless --delete-only) declares it again, durable, of the given type (a TTL
// queue that dead-letters to Q2 through the default exchange with --ttl; bound to the fanout
// exchange FANOUT with --exchange, so that one fill fills every client's queue). `fill` publishes N
// persistent messages with the shared header table (an x-death array as after two trips through a
// retry loop; --fresh leaves out the x- headers, as before a first failure; --parked adds the
// headers of a parked message, and with --rare-every K every Kth an error of its own, "certificate
// expired", for a filter that takes 1/K of them; --unique-ids gives each message a message-id of
// its own, for the inbox; --ballast marks each with a `bench-ballast` header, which `retry` acks
// without counting; --json makes each body a JSON order of BYTES, as bench/peers parse it),
// pipelined with confirms; it is how every queue is filled, outside the timed window. The other
// modes print one JSON line:
//
//   consume  N deliveries acked one by one, no-op handler (--json: the handler parses the body):
//            time from the first delivery to the last ack, and the process's CPU time over the
//            same window.
//   handle   the retry consumer on a service of FILE, C handlers at once on its worker threads (or
//            on the loop with --on-loop), each parsing the JSON body and acking: time and CPU
//            from the first delivery to the Nth ack; and `parse_us`, the CPU one parse of the
//            body costs alone (the handler's own work), measured before connecting.
//   publish  N messages with confirms, at most W unconfirmed (1: one at a time); --rate paces
//            them and stamps each with the time it was sent (for `ttl`). --mandatory and
//            --outbox-headers publish as the outbox relay does: with mandatory, and with the
//            headers and the message-id length of the benchmark's outbox rows.
//   retry    the retry consumer on a service of FILE, handler on the loop: each message fails K
//            times, then is acked; completed messages per second from the first delivery.
//            --lateness: the time from each failure to the next delivery, minus the delay.
//   schedule scheduled delivery through the delay levels of FILE (its top-level delay_levels):
//            N messages of 1 KB published to Q directly with confirms (the undelayed rate, the
//            comparison), then N scheduled for Q with the Scheduler, delays spread on a log scale
//            from A to B ms by sequence number, at most W unconfirmed; a consumer on Q records
//            when each arrives. Reports both publish rates and the client's CPU per scheduled
//            message, then, once every scheduled message arrived (or B ms plus two minutes
//            passed), how many arrived, early (before retryloop-due-at: must be none), lost and
//            duplicated, and the lateness (arrival minus due) by delay range.
//   ttl      the broker's own TTL precision: consumes what a TTL queue dead-lettered, and
//            reports arrival minus the sent stamp minus the delay.
//   delays   the delay levels' accuracy: the retry consumer on a service of FILE with delay
//            levels fails each message once with Outcome::retry_after(d), d spread evenly on a
//            log scale from A to B ms by the message's bench-seq; reports the error, |actual -
//            d| where actual is the time from the failure to the next delivery, its lateness
//            (actual minus d rounded up to the base), and how many stayed within one base step plus
//            10 ms per level passed.
//   hold     the retry consumer with a slow handler (500 ms a message) until N deliveries have
//            arrived, nearly all of them held unacked; then the peak RSS of the process.
//   handlers the retry consumer with C handlers at once on its worker threads, each sleeping MS
//            (a handler waiting on I/O): messages acked per second from the first delivery to the
//            Nth ack, and the peak RSS of the process.
//   failover on a cluster (RETRYLOOP_TEST_NODE_DIRS, as scripts/with-broker --nodes sets it): the
//            node the retry consumer is on is killed with SIGKILL KILLS times, restarted after
//            each; the milliseconds from each kill to consuming on another node.
//
// The outbox and inbox modes take a database URL (store::Database::open) whose retryloop tables
// exist (`retryloop outbox init`):
//
//   outbox-fill     empties retryloop_outbox, then enqueues N rows for queue Q (default exchange)
//                   in transactions of 500, as an application would (outbox::enqueue): a body of
//                   BYTES, a few headers, every other row with one of K ordering keys; on
//                   PostgreSQL it ends with VACUUM ANALYZE. Not timed for the relay.
//   outbox-naive    the loop a user would write without the relay, with the same client and
//                   store layer: one transaction per row (select the oldest pending row, FOR
//                   UPDATE SKIP LOCKED on PostgreSQL; publish it with mandatory; wait for its
//                   confirm; delete it; commit) until N rows are done.
//   outbox-latency  commit-to-publish latency: a thread commits one row per transaction at
//                   ROWS_PER_S (each row's commit time is taken when COMMIT returns), while the
//                   loop consumes Q; a relay runs in another process. Latency is the time from
//                   a row's commit to its delivery to this consumer.
//   inbox-reset     empties the inbox's table and the handler's (made if missing), before a run.
//   inbox           the retry consumer whose handler writes one row in a transaction to DB (one
//                   connection per worker thread), with --inbox through inbox::Inbox (the row and
//                   the message id in one transaction), without it in a plain transaction;
//                   handled messages per second from the first delivery to the last completion.

#include <signal.h>
#include <sys/resource.h>
#include <uv.h>
#include <retryloop/client/connection.hpp>
#include <retryloop/consumer/consumer.hpp>
#include <retryloop/inbox/inbox.hpp>
#include <retryloop/outbox/outbox.hpp>
#include <retryloop/schedule/scheduler.hpp>
#include <retryloop/store/database.hpp>
#include <retryloop/topology/delay_levels.hpp>
#include <retryloop/topology/topology_json.hpp>

#include <nlohmann/json.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
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
  long min_ms = 100;
  long max_ms = 60000;
  int fail = 2;
  int prefetch = 200;
  bool parked = false;
  bool fresh = false;
  bool delete_only = false;
  bool lateness = false;
  long timeout_s = 900;
  long ack_delay_ms = -1;  ///< -1: the library's default
  std::string db;
  long keys = 1000;
  int concurrency = 1;
  bool inbox = false;
  bool unique_ids = false;
  bool mandatory = false;
  bool outbox_headers = false;
  long rare_every = 0;
  bool ballast = false;
  long sleep_ms = 20;
  bool json = false;
  bool on_loop = false;
};

// Exits at once: from the timeout's thread, or with worker threads running a handler, std::exit
// would run destructors under their feet, and can hang.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_retryloop: %s\n", what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
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

/// The headers of the benchmark's outbox rows, as an application might set them.
amqp::FieldTable outbox_headers(long seq) {
  amqp::FieldTable headers;
  headers.append("event-type", "order.created");
  headers.append("schema-version", int64_t{3});
  headers.append("tenant", "acme-" + std::to_string(seq % 17));
  headers.append("trace-id", "4bf92f3577b34da6a3ce929d0e0e4736");
  headers.append("bench-seq", int64_t{seq});
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

/// A JSON order of about `size` bytes (at least its fixed part): what the consumer benchmark's
/// handlers parse. bench/peers build none: they parse what `fill --json` published.
std::string json_body(long size) {
  std::string body =
      R"({"order_id": "ord-2024-118842", "customer": {"id": 48213, "name": "Acme GmbH", )"
      R"("country": "DE"}, "currency": "EUR", "total": 1234.5, "paid": true, "lines": [)";
  for (int line = 0; body.size() + 200 < static_cast<size_t>(size); ++line) {
    body += (line == 0 ? "" : ", ");
    body += R"({"sku": "SKU-)" + std::to_string(10000 + line) + R"(", "quantity": )" +
            std::to_string(1 + line % 7) + R"(, "price": )" + std::to_string(9.5 + line) +
            R"(, "tags": ["retail", "eu"]})";
  }
  body += R"(], "note": ")";
  while (body.size() + 2 < static_cast<size_t>(size))
    body += 'x';
  body += R"("})";
  return body;
}

/// The handler work every consumer of the consumer benchmark does: parse the body, read a field.
bool handle_json(std::string_view body) {
  const auto order = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  return !order.is_discarded() && order.contains("order_id");
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
  const std::string body =
      args.json ? json_body(args.size) : std::string(static_cast<size_t>(args.size), 'x');
  amqp::BasicProperties properties = message_properties(args.fresh, args.parked);
  properties.headers->append("bench-seq", int64_t{0});
  if (stamp) properties.headers->append("bench-sent-us", int64_t{0});
  if (args.ballast) properties.headers->append("bench-ballast", true);
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
      if (args.parked && args.rare_every > 0) {
        *properties.headers->find("retryloop-error") =
            published % args.rare_every == 0 ? "certificate expired"
                                             : "upstream returned 503 Service Unavailable";
      }
      if (args.unique_ids) properties.message_id = "bench-" + std::to_string(published);
      if (args.outbox_headers) {
        properties.headers = outbox_headers(published);
        char uuid[40];  // as long as the outbox's random message ids
        std::snprintf(uuid, sizeof uuid, "5f1c2b9e-8a64-4c7e-9d0b-%012ld", published);
        properties.message_id = uuid;
      }
      if (stamp) *properties.headers->find("bench-sent-us") = wall_us();
      ++published;
      check(chan->publish(args.exchange, args.exchange.empty() ? args.queue : "", properties, body,
                          args.mandatory ? Mandatory::yes : Mandatory::no,
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
                if (args.json && !handle_json(delivery.message.body)) die("not a JSON order");
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

/// CPU microseconds of one handle_json of a body of `size`, alone.
double parse_cost_us(long size) {
  const std::string body = json_body(size);
  const int rounds = 20000;
  const double cpu0 = cpu_seconds();
  for (int k = 0; k < rounds; ++k) {
    if (!handle_json(body)) die("json_body is not a JSON order");
  }
  return (cpu_seconds() - cpu0) / rounds * 1e6;
}

void handle(uv_loop_t* loop, const Args& args) {
  const double parse_us = parse_cost_us(args.size);
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  options.concurrency = static_cast<uint32_t>(args.concurrency);
  options.handler_on_loop = args.on_loop;
  std::atomic<long> started{0};
  struct State {
    std::shared_ptr<consumer::Consumer> consumer;
    const Args* args;
    PublishResult r;
    double cpu0 = 0;
    std::atomic<long>* started;
  } state{nullptr, &args, {}, 0, &started};
  state.consumer = consumer::Consumer::create(
      loop, options, consumer::Handler([&started](const consumer::Message& message) {
        started.fetch_add(1, std::memory_order_relaxed);
        if (!handle_json(message.body)) return consumer::Outcome::poison("not a JSON order");
        return consumer::Outcome::ack();
      }));
  uv_timer_t poll{};
  uv_timer_init(loop, &poll);
  poll.data = &state;
  // A 1 ms poll starts the clock at the first handler call and stops it at the Nth ack.
  uv_timer_start(
      &poll,
      [](uv_timer_t* t) {
        auto* s = static_cast<State*>(t->data);
        if (s->r.t0 == 0 && s->started->load() > 0) {
          s->r.t0 = wall_seconds();
          s->cpu0 = cpu_seconds();
        }
        if (static_cast<long>(s->consumer->metrics().acked) < s->args->count) return;
        s->r.t1 = wall_seconds();
        s->r.cpu = cpu_seconds() - s->cpu0;
        s->consumer->stop(std::chrono::seconds(10));
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
      },
      1, 1);
  check(state.consumer->start(), "consumer start");
  uv_run(loop, UV_RUN_DEFAULT);
  const auto metrics = state.consumer->metrics();
  state.consumer.reset();
  if (static_cast<long>(metrics.acked) < args.count) die("consumer stopped early");
  const double seconds = state.r.t1 - state.r.t0;
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"handle\", \"messages\": %ld, "
      "\"concurrency\": %d, \"on_loop\": %s, \"prefetch\": %d, \"seconds\": %.4f, "
      "\"rate\": %.1f, \"cpu_seconds\": %.4f, \"parse_us\": %.3f, \"t0\": %.6f, "
      "\"t1\": %.6f}\n",
      args.count, args.concurrency, args.on_loop ? "true" : "false", args.prefetch, seconds,
      args.count / seconds, state.r.cpu, parse_us, state.r.t0, state.r.t1);
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

/// A retry consumer run on the loop until its handler calls finish(), which stops it gracefully
/// (from the handler, so the loop goes on until the last ack is sent).
class ConsumerRun {
 public:
  explicit ConsumerRun(uv_loop_t* loop) : loop_(loop) {
    uv_timer_init(loop, &stopper_);
    stopper_.data = &consumer_;
  }

  void finish() {
    uv_timer_start(
        &stopper_,
        [](uv_timer_t* t) {
          (*static_cast<std::shared_ptr<consumer::Consumer>*>(t->data))
              ->stop(std::chrono::seconds(10));
          uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
        },
        0, 0);
  }

  void run(const consumer::ConsumerOptions& options, consumer::Handler handler) {
    consumer_ = consumer::Consumer::create(loop_, options, std::move(handler));
    consumer_->set_stopped_handler([](const Error& e) { check(e, "consumer"); });
    check(consumer_->start(), "consumer start");
    uv_run(loop_, UV_RUN_DEFAULT);
  }

 private:
  uv_loop_t* loop_;
  uv_timer_t stopper_{};
  std::shared_ptr<consumer::Consumer> consumer_;
};

void retry_benchmark(uv_loop_t* loop, const Args& args) {
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
  ConsumerRun consumer_run(loop);

  auto handler = [&](const consumer::Message& message) -> consumer::Outcome {
    auto now = std::chrono::steady_clock::now();
    if (message.headers().find("bench-ballast") != nullptr) return consumer::Outcome::ack();
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
      consumer_run.finish();
    }
    return consumer::Outcome::ack();
  };
  consumer_run.run(options, handler);
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

/// The delay the `delays` mode asks of message `seq`: spread over [min, max] on a log scale, in
/// an order that mixes long and short ones.
std::chrono::milliseconds requested_delay(int64_t seq, const Args& args) {
  const double spread = std::fmod(static_cast<double>(seq) * 0.6180339887498949, 1.0);
  const double low = std::log(static_cast<double>(args.min_ms));
  const double high = std::log(static_cast<double>(args.max_ms));
  return std::chrono::milliseconds(std::llround(std::exp(low + (high - low) * spread)));
}

void delays(uv_loop_t* loop, const Args& args) {
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  if (!options.service.retry.delay_levels) die("the service has no delay levels");
  options.connection.uri = parse_uri(args.url);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  options.handler_on_loop = true;
  const auto base = options.service.retry.delay_levels->base;
  struct Failure {
    std::chrono::steady_clock::time_point at;
    topology::DelayRoute route;
  };
  std::unordered_map<int64_t, Failure> failed;
  std::vector<double> error_ms, late_ms, late_per_hop_ms;
  long within = 0;
  int most_hops = 0;
  long completed = 0;
  ConsumerRun consumer_run(loop);
  auto handler = [&](const consumer::Message& message) -> consumer::Outcome {
    const auto now = std::chrono::steady_clock::now();
    const int64_t seq = header_int(message.properties, "bench-seq");
    if (message.attempt == 1) {
      const auto asked = requested_delay(seq, args);
      failed[seq] = {now, topology::delay_route(options.service, asked)};
      return consumer::Outcome::retry_after(asked, "bench failure");
    }
    auto it = failed.find(seq);
    if (it != failed.end()) {
      const auto& route = it->second.route;
      const double actual = std::chrono::duration<double, std::milli>(now - it->second.at).count();
      const double error = std::abs(actual - static_cast<double>(route.requested.count()));
      error_ms.push_back(error);
      late_ms.push_back(actual - static_cast<double>(route.delay.count()));
      if (route.hops > 0) late_per_hop_ms.push_back(late_ms.back() / route.hops);
      const double bound = static_cast<double>(base.count()) + 10.0 * route.hops;
      if (error <= bound) ++within;
      most_hops = std::max(most_hops, route.hops);
      failed.erase(it);
    }
    if (++completed == args.count) {
      consumer_run.finish();
    }
    return consumer::Outcome::ack();
  };
  consumer_run.run(options, handler);
  if (completed != args.count) die("delays consumer stopped early");
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"delays\", \"messages\": %ld, \"base_ms\": %lld, "
      "\"levels\": %d, \"min_ms\": %ld, \"max_ms\": %ld, \"most_hops\": %d, \"within_bound\": %ld, "
      "\"error_ms\": %s, \"late_ms\": %s, \"late_per_hop_ms\": %s}\n",
      completed, static_cast<long long>(base.count()), options.service.retry.delay_levels->levels,
      args.min_ms, args.max_ms, most_hops, within, percentiles_json(error_ms).c_str(),
      percentiles_json(late_ms).c_str(), percentiles_json(late_per_hop_ms).c_str());
}

/// The delay range a scheduled delay falls in, for the report.
const char* delay_range(std::chrono::milliseconds delay) {
  if (delay < std::chrono::seconds(10)) return "1-10 s";
  if (delay < std::chrono::minutes(1)) return "10-60 s";
  if (delay < std::chrono::minutes(10)) return "1-10 min";
  return "10-60 min";
}

void schedule_bench(uv_loop_t* loop, const Args& args) {
  auto parsed = topology::load_topology(args.topology);
  if (!parsed.ok() || !parsed.topology->schedule) die("the topology file has no delay_levels");
  const topology::Schedule plan = *parsed.topology->schedule;
  const std::string body(static_cast<size_t>(args.size), 'x');
  struct Sent {
    int64_t due_ms;
    std::chrono::milliseconds asked;
  };
  std::vector<Sent> sent(static_cast<size_t>(args.count), Sent{0, {}});
  std::vector<int> arrivals(static_cast<size_t>(args.count), 0);
  std::map<std::string, std::vector<double>> late_by_range;
  std::vector<double> late_all;
  long arrived = 0, early = 0, duplicates = 0, plain_received = 0;
  double plain_t0 = 0, plain_t1 = 0, schedule_t0 = 0, schedule_t1 = 0, schedule_cpu = 0;
  long published = 0, confirmed = 0;
  std::unique_ptr<schedule::Scheduler> scheduler;
  std::shared_ptr<Connection> conn;
  std::shared_ptr<Channel> publisher;
  uv_timer_t deadline{};

  bool finished = false;
  std::function<void()> finish = [&] {
    if (finished) return;
    finished = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&deadline), nullptr);
    conn->close();
  };
  std::function<void()> schedule_more;
  std::function<void()> publish_plain = [&] {
    while (published < args.count && published - confirmed < args.window) {
      amqp::BasicProperties properties;
      properties.delivery_mode = 2;
      properties.message_id = "plain-" + std::to_string(published);
      ++published;
      check(publisher->publish("", args.queue, properties, body, Mandatory::yes,
                               [&](const PublishOutcome& outcome) {
                                 if (!outcome.ok()) die("publish: " + outcome.error.message());
                                 if (++confirmed < args.count) return publish_plain();
                                 plain_t1 = wall_seconds();
                                 published = confirmed = 0;
                                 schedule_t0 = wall_seconds();
                                 schedule_cpu = cpu_seconds();
                                 schedule_more();
                               }),
            "publish");
    }
  };
  schedule_more = [&] {
    while (published < args.count && published - confirmed < args.window) {
      const long seq = published++;
      const auto asked = requested_delay(seq, args);
      amqp::BasicProperties properties;
      properties.message_id = "s-" + std::to_string(seq);
      check(scheduler->schedule_in(args.queue, std::move(properties), body, asked,
                                   [&, seq, asked](const schedule::ScheduleResult& result) {
                                     if (!result.ok())
                                       die("schedule: " + result.publish.error.message());
                                     sent[static_cast<size_t>(seq)] = {result.due_at_ms, asked};
                                     if (++confirmed < args.count) return schedule_more();
                                     schedule_t1 = wall_seconds();
                                     schedule_cpu = cpu_seconds() - schedule_cpu;
                                   }),
            "schedule");
    }
  };
  with_channel(loop, args, [&](auto connection, auto channel) {
    conn = connection;
    check(channel->qos(1000, {}), "qos");
    ConsumeOptions options;
    options.no_ack = true;
    check(channel->consume(
              args.queue, options,
              [&](Delivery&& delivery) {
                const std::string& id = delivery.message.properties.message_id.value_or("");
                if (id.rfind("plain-", 0) == 0) {
                  ++plain_received;
                  return;
                }
                const int64_t now = wall_us() / 1000;
                const long seq = std::strtol(id.c_str() + 2, nullptr, 10);
                if (seq < 0 || seq >= args.count) return;
                if (arrivals[static_cast<size_t>(seq)]++ > 0) {
                  ++duplicates;
                  return;
                }
                ++arrived;
                const int64_t due = header_int(delivery.message.properties,
                                               std::string(schedule::header::due_at).c_str());
                if (now < due) ++early;
                const double late = static_cast<double>(now - due);
                late_all.push_back(late);
                late_by_range[delay_range(sent[static_cast<size_t>(seq)].asked)].push_back(late);
                if (arrived == args.count) finish();
              },
              [](const Error& e, const std::string&) { check(e, "consume"); }),
          "consume");
    check(conn->open_channel([&](const Error& e, std::shared_ptr<Channel> c) {
      check(e, "channel");
      publisher = std::move(c);
      check(publisher->confirm_select([&](const Error& e2) {
        check(e2, "confirm.select");
        scheduler = std::make_unique<schedule::Scheduler>(*publisher, plan);
        plain_t0 = wall_seconds();
        publish_plain();
      }),
            "confirm.select");
    }),
          "channel");
    uv_timer_init(loop, &deadline);
    deadline.data = &finish;
    uv_timer_start(
        &deadline,
        [](uv_timer_t* t) {
          auto* done = static_cast<std::function<void()>*>(t->data);
          (*done)();
        },
        static_cast<uint64_t>(args.max_ms) + 120000 + static_cast<uint64_t>(args.count) / 50, 0);
  });
  std::string ranges;
  for (const auto& [range, values] : late_by_range) {
    ranges += (ranges.empty() ? "" : ", ") + ("\"" + range + "\": ") + percentiles_json(values);
  }
  const double plain_seconds = plain_t1 - plain_t0;
  const double schedule_seconds = schedule_t1 - schedule_t0;
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"schedule\", \"messages\": %ld, \"window\": "
      "%ld, \"min_ms\": %ld, \"max_ms\": %ld, \"base_ms\": %lld, \"levels\": %d, "
      "\"plain_rate\": %.1f, \"rate\": %.1f, \"cpu_us_per_message\": %.2f, \"arrived\": %ld, "
      "\"early\": %ld, \"lost\": %ld, \"duplicates\": %ld, \"late_ms\": %s, "
      "\"late_ms_by_range\": {%s}, \"t0\": %.6f, \"t1\": %.6f}\n",
      args.count, args.window, args.min_ms, args.max_ms,
      static_cast<long long>(plan.levels.base.count()), plan.levels.levels,
      args.count / plain_seconds, args.count / schedule_seconds,
      schedule_cpu * 1e6 / static_cast<double>(args.count), arrived, early, args.count - arrived,
      duplicates, late_all.empty() ? "null" : percentiles_json(late_all).c_str(), ranges.c_str(),
      schedule_t0, schedule_t1);
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

void handlers(uv_loop_t* loop, const Args& args) {
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  options.concurrency = static_cast<uint32_t>(args.concurrency);
  std::atomic<long> started{0};
  PublishResult r;
  double cpu0 = 0;
  auto service_consumer = consumer::Consumer::create(
      loop, options, consumer::Handler([&](const consumer::Message&) {
        started.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(args.sleep_ms));
        return consumer::Outcome::ack();
      }));
  uv_timer_t poll{};
  uv_timer_init(loop, &poll);
  struct State {
    std::shared_ptr<consumer::Consumer> consumer;
    const Args* args;
    PublishResult* r;
    double* cpu0;
    std::atomic<long>* started;
  } state{service_consumer, &args, &r, &cpu0, &started};
  poll.data = &state;
  uv_timer_start(
      &poll,
      [](uv_timer_t* t) {
        auto* s = static_cast<State*>(t->data);
        if (s->r->t0 == 0 && s->started->load() > 0) {
          s->r->t0 = wall_seconds();
          *s->cpu0 = cpu_seconds();
        }
        if (static_cast<long>(s->consumer->metrics().acked) < s->args->count) return;
        s->r->t1 = wall_seconds();
        s->r->cpu = cpu_seconds() - *s->cpu0;
        s->consumer->stop(std::chrono::seconds(10));
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
      },
      1, 1);
  check(service_consumer->start(), "consumer start");
  service_consumer.reset();
  uv_run(loop, UV_RUN_DEFAULT);
  state.consumer.reset();
  const double seconds = r.t1 - r.t0;
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"handlers\", \"messages\": %ld, "
      "\"concurrency\": %d, \"prefetch\": %d, \"sleep_ms\": %ld, \"seconds\": %.4f, "
      "\"rate\": %.1f, \"cpu_seconds\": %.4f, \"peak_rss_kb\": %ld}\n",
      args.count, args.concurrency, args.prefetch, args.sleep_ms, seconds, args.count / seconds,
      r.cpu, status_kb("VmHWM:"));
}

// ---- the outbox and the inbox ----

std::unique_ptr<store::Database> open_database(const Args& args) {
  if (args.db.empty()) die("--db is required");
  try {
    return store::Database::open(args.db, false);
  } catch (const store::StoreError& e) {
    die(std::string("database: ") + e.what());
  }
}

bool postgres(const store::Database& database) {
  return database.dialect() == store::Dialect::postgresql;
}

/// An outbox message as an application writes one: the body, a few headers, and (every other
/// row) one of `keys` ordering keys.
outbox::OutboxMessage outbox_message(const Args& args, long seq, const std::string& body) {
  outbox::OutboxMessage message;
  message.routing_key = args.queue;
  message.body = body;
  message.properties.content_type = "application/json";
  message.properties.headers = outbox_headers(seq);
  if (seq % 2 == 0 && args.keys > 0) {
    message.ordering_key = "order-" + std::to_string((seq / 2) % args.keys);
  }
  return message;
}

void outbox_fill(const Args& args) {
  auto database = open_database(args);
  const std::string body(static_cast<size_t>(args.size), 'x');
  const double t0 = wall_seconds();
  const char* method = "enqueue";
  const char* columns =
      "exchange, routing_key, message_id, properties, headers, body, ordering_key";
  try {
    database->execute("DELETE FROM retryloop_outbox");
    database->execute_script(
        "CREATE TABLE IF NOT EXISTS bench_outbox_copy AS SELECT * FROM retryloop_outbox WHERE "
        "1 = 0");
    auto copied = database->execute("SELECT count(*) FROM bench_outbox_copy").rows[0].integer(0);
    if (args.count == 0) {
      method = "none";
    } else if (copied >= args.count) {
      // The rows of an earlier fill, copied back in id order (new ids, in the same order).
      method = "copy";
      store::Transaction transaction(*database);
      database->execute(std::string("INSERT INTO retryloop_outbox (") + columns + ") SELECT " +
                            columns + " FROM bench_outbox_copy ORDER BY id LIMIT $1",
                        {int64_t{args.count}});
      transaction.commit();
    } else {
      constexpr long per_transaction = 500;
      for (long first = 0; first < args.count; first += per_transaction) {
        store::Transaction transaction(*database);
        for (long seq = first; seq < std::min(args.count, first + per_transaction); ++seq) {
          outbox::enqueue(*database, outbox_message(args, seq, body));
        }
        transaction.commit();
      }
    }
  } catch (const store::StoreError& e) {
    die(std::string("outbox-fill: ") + e.what());
  }
  const double seconds = wall_seconds() - t0;
  try {
    if (std::string(method) == "enqueue") {
      store::Transaction transaction(*database);
      database->execute("DELETE FROM bench_outbox_copy");
      database->execute("INSERT INTO bench_outbox_copy SELECT * FROM retryloop_outbox");
      transaction.commit();
    }
    // The relay starts on a table without dead rows and with fresh statistics.
    if (postgres(*database)) database->execute_script("VACUUM ANALYZE retryloop_outbox");
  } catch (const store::StoreError& e) {
    die(std::string("outbox-fill: ") + e.what());
  }
  std::printf(
      "{\"bench\": \"outbox-fill\", \"rows\": %ld, \"method\": \"%s\", \"seconds\": %.3f, "
      "\"rate\": %.1f}\n",
      args.count, method, seconds, seconds > 0 ? args.count / seconds : 0.0);
}

/// What a user would write without the relay: one row per transaction, each published and
/// confirmed before it is deleted and the transaction commits.
void outbox_naive(uv_loop_t* loop, const Args& args) {
  auto database = open_database(args);
  const bool pg = postgres(*database);
  const std::string select =
      std::string(
          "SELECT id, exchange, routing_key, message_id, properties, headers, body "
          "FROM retryloop_outbox WHERE state = 'pending' ORDER BY id LIMIT 1") +
      (pg ? " FOR UPDATE SKIP LOCKED" : "");
  long done = 0;
  PublishResult r;
  double cpu0 = 0;
  std::shared_ptr<Connection> conn;
  std::shared_ptr<Channel> chan;
  std::function<void()> next = [&] {
    try {
      if (done == args.count) {
        r.t1 = wall_seconds();
        r.cpu = cpu_seconds() - cpu0;
        return conn->close();
      }
      database->begin();
      auto result = database->execute(select);
      if (result.rows.empty()) die("outbox-naive: the table ran out of rows");
      const store::Row& row = result.rows[0];
      const int64_t id = row.integer(0);
      amqp::BasicProperties properties;
      auto stored = nlohmann::json::parse(row.text(4).value_or("{}"));
      if (stored.contains("content_type")) {
        properties.content_type = stored["content_type"].get<std::string>();
      }
      properties.delivery_mode = 2;
      properties.message_id = row.text(3).value_or("");
      properties.headers = outbox::headers_from_json(row.text(5).value_or("{}"));
      check(chan->publish(row.text(1).value_or(""), row.text(2).value_or(""), properties,
                          row.text(6).value_or(""), Mandatory::yes,
                          [&, id](const PublishOutcome& outcome) {
                            if (!outcome.ok()) die("publish: " + outcome.error.message());
                            try {
                              database->execute("DELETE FROM retryloop_outbox WHERE id = $1", {id});
                              database->commit();
                            } catch (const store::StoreError& e) {
                              die(std::string("outbox-naive: ") + e.what());
                            }
                            ++done;
                            next();
                          }),
            "publish");
    } catch (const store::StoreError& e) {
      die(std::string("outbox-naive: ") + e.what());
    }
  };
  with_channel(loop, args, [&](auto connection, auto channel) {
    conn = connection;
    chan = channel;
    check(channel->confirm_select([&](const Error& e) {
      check(e, "confirm.select");
      r.t0 = wall_seconds();
      cpu0 = cpu_seconds();
      next();
    }),
          "confirm.select");
  });
  if (done != args.count) die("outbox-naive did not finish");
  std::printf(
      "{\"client\": \"naive-loop\", \"bench\": \"outbox-naive\", \"messages\": %ld, "
      "\"seconds\": %.4f, \"rate\": %.1f, \"cpu_seconds\": %.4f, \"t0\": %.6f, \"t1\": %.6f}\n",
      done, r.t1 - r.t0, done / (r.t1 - r.t0), r.cpu, r.t0, r.t1);
}

/// Commit-to-delivery latency through a relay that runs in another process.
void outbox_latency(uv_loop_t* loop, const Args& args) {
  auto database = open_database(args);
  const size_t count = static_cast<size_t>(args.count);
  std::vector<std::atomic<int64_t>> committed_us(count);
  std::vector<int64_t> received_us(count, 0);
  long received = 0;
  std::atomic<bool> producer_failed{false};
  std::thread producer;
  const std::string body(static_cast<size_t>(args.size), 'x');
  double t0 = 0, t1 = 0;

  uv_timer_t giveup{};
  uv_timer_init(loop, &giveup);
  with_channel(loop, args, [&](auto connection, auto channel) {
    check(channel->qos(static_cast<uint16_t>(args.prefetch), {}), "qos");
    giveup.data = connection.get();
    check(
        channel->consume(
            args.queue, {},
            [&, connection, channel](Delivery&& delivery) {
              const int64_t now = wall_us();
              const int64_t seq = header_int(delivery.message.properties, "bench-seq");
              (void)channel->ack(delivery.delivery_tag);
              if (seq < 0 || seq >= args.count || received_us[seq] != 0) return;
              received_us[seq] = now;
              if (++received == args.count) {
                t1 = wall_seconds();
                uv_timer_stop(&giveup);
                uv_close(reinterpret_cast<uv_handle_t*>(&giveup), nullptr);
                connection->close();
              }
            },
            [&](const Error& e, const std::string&) {
              check(e, "basic.consume");
              // Consuming: start committing rows.
              t0 = wall_seconds();
              producer = std::thread([&] {
                try {
                  const auto start = std::chrono::steady_clock::now();
                  for (size_t seq = 0; seq < count; ++seq) {
                    std::this_thread::sleep_until(start +
                                                  std::chrono::microseconds(static_cast<int64_t>(
                                                      seq * 1e6 / static_cast<double>(args.rate))));
                    store::Transaction transaction(*database);
                    outbox::enqueue(*database, outbox_message(args, static_cast<long>(seq), body));
                    transaction.commit();
                    committed_us[seq] = wall_us();
                  }
                } catch (const store::StoreError& e) {
                  std::fprintf(stderr, "bench_retryloop: producer: %s\n", e.what());
                  producer_failed = true;
                }
              });
              // Rows that never arrive end the run 30 s after the last one was due.
              uv_timer_start(
                  &giveup,
                  [](uv_timer_t* t) {
                    static_cast<Connection*>(t->data)->close();
                    uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
                  },
                  static_cast<uint64_t>(args.count * 1000 / args.rate + 30000), 0);
            }),
        "consume");
  });
  if (producer.joinable()) producer.join();
  if (producer_failed) die("the producer failed");
  if (received != args.count) {
    die("outbox-latency: " + std::to_string(received) + " of " + std::to_string(args.count) +
        " rows arrived");
  }
  std::vector<double> latency_ms;
  latency_ms.reserve(count);
  for (size_t i = 0; i < count; ++i)
    latency_ms.push_back((received_us[i] - committed_us[i].load()) / 1000.0);
  std::printf(
      "{\"bench\": \"outbox-latency\", \"messages\": %ld, \"rate\": %ld, \"seconds\": %.3f, "
      "\"latency_ms\": %s, \"t0\": %.6f, \"t1\": %.6f}\n",
      args.count, args.rate, t1 - t0, percentiles_json(latency_ms).c_str(), t0, t1);
}

/// A pool of database connections, one per worker thread at a time.
class Connections {
 public:
  explicit Connections(std::string url) : url_(std::move(url)) {}
  std::unique_ptr<store::Database> take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        auto database = std::move(idle_.back());
        idle_.pop_back();
        return database;
      }
    }
    return store::Database::open(url_, false);
  }
  void give(std::unique_ptr<store::Database> database) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(database));
  }

 private:
  std::string url_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<store::Database>> idle_;
};

/// Every inbox run starts from empty tables: the message ids repeat from run to run.
void inbox_reset(const Args& args) {
  auto database = open_database(args);
  try {
    database->execute_script(
        "CREATE TABLE IF NOT EXISTS bench_effects (message_id text NOT NULL, bytes bigint NOT "
        "NULL, received_at bigint NOT NULL)");
    database->execute("DELETE FROM bench_effects");
    database->execute("DELETE FROM retryloop_inbox");
    if (postgres(*database)) {
      database->execute_script("VACUUM ANALYZE bench_effects, retryloop_inbox");
    }
  } catch (const store::StoreError& e) {
    die(std::string("inbox-reset: ") + e.what());
  }
}

void inbox_bench(uv_loop_t* loop, const Args& args) {
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  options.prefetch = static_cast<uint16_t>(args.prefetch);
  options.concurrency = static_cast<uint32_t>(args.concurrency);
  std::atomic<long> completed{0};
  std::atomic<bool> started{false};
  std::atomic<double> t0{0}, t1{0}, cpu0{0}, cpu1{0};
  auto begin = [&] {
    bool expected = false;
    if (started.compare_exchange_strong(expected, true)) {
      t0 = wall_seconds();
      cpu0 = cpu_seconds();
    }
  };
  auto end = [&] {
    if (++completed == args.count) {
      t1 = wall_seconds();
      cpu1 = cpu_seconds();
    }
  };
  // The business write: one row per message.
  auto write = [](const consumer::Message& message, store::Database& db) {
    db.execute("INSERT INTO bench_effects (message_id, bytes, received_at) VALUES ($1, $2, $3)",
               {std::string(message.message_id()), static_cast<int64_t>(message.body.size()),
                outbox::now_ms()});
  };
  consumer::Handler handler;
  std::shared_ptr<inbox::Inbox> box;
  Connections connections(args.db);
  if (args.inbox) {
    inbox::InboxOptions inbox_options;
    inbox_options.database = args.db;
    inbox_options.consumer = "bench";
    try {
      box = inbox::Inbox::create(inbox_options);
    } catch (const store::StoreError& e) {
      die(std::string("inbox: ") + e.what());
    }
    auto wrapped = box->wrap([&](const consumer::Message& message, store::Database& db) {
      write(message, db);
      return consumer::Outcome::ack();
    });
    handler = [&, wrapped](const consumer::Message& message) {
      begin();
      auto outcome = wrapped(message);
      end();
      return outcome;
    };
  } else {
    handler = [&](const consumer::Message& message) {
      begin();
      auto db = connections.take();
      {
        store::Transaction transaction(*db);
        write(message, *db);
        transaction.commit();
      }
      connections.give(std::move(db));
      end();
      return consumer::Outcome::ack();
    };
  }
  auto service_consumer = consumer::Consumer::create(loop, options, handler);
  service_consumer->set_stopped_handler([](const Error& e) { check(e, "consumer"); });
  uv_timer_t poll{};
  uv_timer_init(loop, &poll);
  struct State {
    std::shared_ptr<consumer::Consumer> consumer;
    std::atomic<long>* completed;
    long count;
  } state{service_consumer, &completed, args.count};
  poll.data = &state;
  uv_timer_start(
      &poll,
      [](uv_timer_t* t) {
        auto* s = static_cast<State*>(t->data);
        if (s->completed->load() < s->count) return;
        auto metrics = s->consumer->metrics();
        if (metrics.acked < static_cast<uint64_t>(s->count)) return;
        s->consumer->stop(std::chrono::seconds(10));
        uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
      },
      5, 5);
  check(service_consumer->start(), "consumer start");
  service_consumer.reset();
  uv_run(loop, UV_RUN_DEFAULT);
  state.consumer.reset();
  if (completed != args.count) die("inbox consumer stopped early");
  const double seconds = t1 - t0;
  const auto stats = box ? box->stats() : inbox::InboxStats{};
  std::printf(
      "{\"client\": \"%s\", \"bench\": \"inbox\", \"messages\": %ld, \"concurrency\": %d, "
      "\"seconds\": %.4f, \"rate\": %.1f, \"cpu_seconds\": %.4f, \"t0\": %.6f, \"t1\": %.6f, "
      "\"duplicates\": %llu}\n",
      args.inbox ? "inbox" : "plain", completed.load(), args.concurrency, seconds,
      completed.load() / seconds, cpu1 - cpu0, t0.load(), t1.load(),
      static_cast<unsigned long long>(stats.duplicates));
}

// ---- failover: the consumer's node killed, again and again ----

/// The AMQP port of each node of the cluster under test (RETRYLOOP_TEST_NODE_DIRS): port -> dir.
std::unordered_map<uint16_t, std::string> node_dirs_by_port() {
  const char* dirs = std::getenv("RETRYLOOP_TEST_NODE_DIRS");
  if (dirs == nullptr) die("failover needs RETRYLOOP_TEST_NODE_DIRS (scripts/with-broker --nodes)");
  std::unordered_map<uint16_t, std::string> out;
  std::istringstream all(dirs);
  const std::string key = "export RETRYLOOP_TEST_AMQP_PORT=";
  for (std::string dir; all >> dir;) {
    std::ifstream env(dir + "/broker.env");
    for (std::string line; std::getline(env, line);) {
      if (line.rfind(key, 0) == 0) {
        out[static_cast<uint16_t>(std::stoi(line.substr(key.size())))] = dir;
      }
    }
  }
  if (out.empty()) die("no node of RETRYLOOP_TEST_NODE_DIRS has a broker.env");
  return out;
}

/// The pid of the Erlang VM of the node in `dir` (its beam.smp runs with -home DIR/home).
pid_t node_pid(const std::string& dir) {
  const std::string home = dir + "/home";
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> words;
    for (size_t start = 0; start < cmdline.size();) {
      size_t end = cmdline.find('\0', start);
      if (end == std::string::npos) end = cmdline.size();
      words.push_back(cmdline.substr(start, end - start));
      start = end + 1;
    }
    if (words.empty() || words[0].find("beam.smp") == std::string::npos) continue;
    for (size_t i = 0; i + 1 < words.size(); ++i) {
      if (words[i] == "-home" && words[i + 1] == home) return static_cast<pid_t>(std::stol(name));
    }
  }
  die("no beam.smp runs with -home " + home);
}

/// Runs the loop until `done`, or dies after `seconds`.
void run_until(uv_loop_t* loop, const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) die("failover: timed out");
    uv_run(loop, UV_RUN_NOWAIT);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

/// The consumer's node is killed with SIGKILL COUNT times, and started again after each: the
/// milliseconds from the kill to the consumer consuming on another node.
void failover(uv_loop_t* loop, const Args& args) {
  const auto nodes = node_dirs_by_port();
  const char* source = std::getenv("RETRYLOOP_SOURCE_DIR");
  const std::string broker = std::string(source != nullptr ? source : ".") + "/scripts/broker";
  consumer::ConsumerOptions options;
  options.service = load_service(args);
  options.connection.uri = parse_uri(args.url);
  options.handler_on_loop = true;
  auto service_consumer = consumer::Consumer::create(
      loop, options,
      consumer::Handler([](const consumer::Message&) { return consumer::Outcome::ack(); }));
  check(service_consumer->start(), "consumer start");
  run_until(
      loop, [&] { return service_consumer->consuming_from().has_value(); }, 60);
  std::vector<double> consuming_again_ms;
  for (long k = 0; k < args.count; ++k) {
    const uint16_t port = service_consumer->consuming_from()->port;
    const auto node = nodes.find(port);
    if (node == nodes.end()) die("the consumer is on port " + std::to_string(port) + ": no node");
    const pid_t pid = node_pid(node->second);
    const auto killed = std::chrono::steady_clock::now();
    if (::kill(pid, SIGKILL) != 0) die("kill failed");
    run_until(
        loop,
        [&] {
          auto on = service_consumer->consuming_from();
          return on && on->port != port;
        },
        120);
    consuming_again_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
            .count());
    std::fprintf(stderr, "failover %ld: %.0f ms\n", k + 1, consuming_again_ms.back());
    // The node comes back (its restart runs beside the loop, which keeps the consumer going).
    std::atomic<int> status{-1};
    std::thread restart([&] {
      status = std::system((broker + " restart '" + node->second + "' >/dev/null 2>&1").c_str());
    });
    run_until(
        loop, [&] { return status.load() != -1; }, 180);
    restart.join();
    if (status != 0) die("scripts/broker restart " + node->second + " failed");
  }
  bool stopped = false;
  service_consumer->set_stopped_handler([&](const Error&) { stopped = true; });
  service_consumer->stop(std::chrono::seconds(10));
  run_until(
      loop, [&] { return stopped; }, 30);
  std::printf(
      "{\"client\": \"retryloop\", \"bench\": \"failover\", \"kills\": %ld, "
      "\"consuming_again_ms\": %s}\n",
      args.count, percentiles_json(consuming_again_ms).c_str());
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
    if (flag == "--ballast") {
      args.ballast = true;
      continue;
    }
    if (flag == "--json") {
      args.json = true;
      continue;
    }
    if (flag == "--on-loop") {
      args.on_loop = true;
      continue;
    }
    if (flag == "--inbox") {
      args.inbox = true;
      continue;
    }
    if (flag == "--unique-ids") {
      args.unique_ids = true;
      continue;
    }
    if (flag == "--mandatory") {
      args.mandatory = true;
      continue;
    }
    if (flag == "--outbox-headers") {
      args.outbox_headers = true;
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
    } else if (flag == "--rare-every") {
      args.rare_every = std::atol(value);
    } else if (flag == "--sleep-ms") {
      args.sleep_ms = std::atol(value);
    } else if (flag == "--min-ms") {
      args.min_ms = std::atol(value);
    } else if (flag == "--max-ms") {
      args.max_ms = std::atol(value);
    } else if (flag == "--delay-ms") {
      args.delay_ms = std::atol(value);
    } else if (flag == "--fail") {
      args.fail = std::atoi(value);
    } else if (flag == "--prefetch") {
      args.prefetch = std::atoi(value);
    } else if (flag == "--ack-delay") {
      args.ack_delay_ms = std::atol(value);
    } else if (flag == "--db") {
      args.db = value;
    } else if (flag == "--keys") {
      args.keys = std::atol(value);
    } else if (flag == "--concurrency") {
      args.concurrency = std::atoi(value);
    } else if (flag == "--timeout") {
      args.timeout_s = std::atol(value);
    } else {
      die("unknown flag " + flag);
    }
  }
  if (args.url.empty() && args.mode != "outbox-fill" && args.mode != "inbox-reset") {
    die("--url is required");
  }
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
    retry_benchmark(loop, args);
  } else if (args.mode == "handlers") {
    handlers(loop, args);
  } else if (args.mode == "handle") {
    handle(loop, args);
  } else if (args.mode == "delays") {
    delays(loop, args);
  } else if (args.mode == "schedule") {
    schedule_bench(loop, args);
  } else if (args.mode == "ttl") {
    ttl(loop, args);
  } else if (args.mode == "hold") {
    hold(loop, args);
  } else if (args.mode == "outbox-fill") {
    outbox_fill(args);
  } else if (args.mode == "outbox-naive") {
    outbox_naive(loop, args);
  } else if (args.mode == "outbox-latency") {
    outbox_latency(loop, args);
  } else if (args.mode == "inbox-reset") {
    inbox_reset(args);
  } else if (args.mode == "inbox") {
    inbox_bench(loop, args);
  } else if (args.mode == "failover") {
    failover(loop, args);
  } else {
    die("unknown mode " + args.mode);
  }
  uv_loop_close(loop);
  return 0;
}
