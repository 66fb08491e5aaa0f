/* The rabbitmq-c peer (Debian's librabbitmq-dev): the blocking API as its examples use it.
 *
 *   bench_rabbitmq_c consume URL QUEUE COUNT PREFETCH   ack each delivery, no-op handler
 *   bench_rabbitmq_c handle URL QUEUE COUNT PREFETCH    parse each body with json-c (Debian's
 *                                                       libjson-c-dev), read a field, ack
 *   bench_rabbitmq_c publish URL QUEUE COUNT WINDOW     confirms, at most WINDOW unconfirmed
 *
 * Prints one JSON line: the time from the first delivery (or publish) to the last ack (or
 * confirm), and the process's CPU time over the same window. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>

#ifdef BENCH_HAVE_JSON_C
#include <json-c/json.h>
#endif

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS
#endif

static void die(const char* what) {
  fprintf(stderr, "bench_rabbitmq_c: %s\n", what);
  exit(1);
}

static void check_reply(amqp_rpc_reply_t reply, const char* what) {
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) die(what);
}

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static double wall_seconds(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return tv.tv_sec + tv.tv_usec / 1e6;
}

/* Headers as a message has them after two trips through a retry loop. */
static amqp_field_value_t death_entries[2];
static amqp_table_entry_t death_fields[2][6];
static amqp_field_value_t routing_key_value;
static amqp_table_entry_t header_entries[5];

static amqp_table_t realistic_headers(void) {
  static const char* queues[2] = {"orders.wait.30s", "orders"};
  static const char* reasons[2] = {"expired", "rejected"};
  routing_key_value.kind = AMQP_FIELD_KIND_UTF8;
  routing_key_value.value.bytes = amqp_cstring_bytes("order.created");
  for (int i = 0; i < 2; ++i) {
    amqp_table_entry_t* f = death_fields[i];
    f[0].key = amqp_cstring_bytes("count");
    f[0].value.kind = AMQP_FIELD_KIND_I64;
    f[0].value.value.i64 = 2;
    f[1].key = amqp_cstring_bytes("reason");
    f[1].value.kind = AMQP_FIELD_KIND_UTF8;
    f[1].value.value.bytes = amqp_cstring_bytes(reasons[i]);
    f[2].key = amqp_cstring_bytes("queue");
    f[2].value.kind = AMQP_FIELD_KIND_UTF8;
    f[2].value.value.bytes = amqp_cstring_bytes(queues[i]);
    f[3].key = amqp_cstring_bytes("time");
    f[3].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
    f[3].value.value.u64 = 1700000000;
    f[4].key = amqp_cstring_bytes("exchange");
    f[4].value.kind = AMQP_FIELD_KIND_UTF8;
    f[4].value.value.bytes = amqp_cstring_bytes("orders.in");
    f[5].key = amqp_cstring_bytes("routing-keys");
    f[5].value.kind = AMQP_FIELD_KIND_ARRAY;
    f[5].value.value.array.num_entries = 1;
    f[5].value.value.array.entries = &routing_key_value;
    death_entries[i].kind = AMQP_FIELD_KIND_TABLE;
    death_entries[i].value.table.num_entries = 6;
    death_entries[i].value.table.entries = f;
  }
  static const char* names[5] = {"x-death", "x-first-death-exchange", "x-first-death-queue",
                                 "x-first-death-reason", "trace-id"};
  static const char* values[5] = {NULL, "orders.in", "orders", "rejected",
                                  "4bf92f3577b34da6a3ce929d0e0e4736"};
  for (int i = 0; i < 5; ++i) {
    header_entries[i].key = amqp_cstring_bytes(names[i]);
    header_entries[i].value.kind = AMQP_FIELD_KIND_UTF8;
    if (values[i]) header_entries[i].value.value.bytes = amqp_cstring_bytes(values[i]);
  }
  header_entries[0].value.kind = AMQP_FIELD_KIND_ARRAY;
  header_entries[0].value.value.array.num_entries = 2;
  header_entries[0].value.value.array.entries = death_entries;
  amqp_table_t table = {5, header_entries};
  return table;
}

static amqp_connection_state_t open_connection(const char* url_text) {
  struct amqp_connection_info info;
  char* url = strdup(url_text);
  if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) die("bad URL");
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn);
  if (!socket || amqp_socket_open(socket, info.host, info.port) != AMQP_STATUS_OK) die("connect");
  check_reply(amqp_login(conn, info.vhost[0] ? info.vhost : "/", 0, 131072, 0,
                         AMQP_SASL_METHOD_PLAIN, info.user, info.password),
              "login");
  amqp_channel_open(conn, 1);
  check_reply(amqp_get_rpc_reply(conn), "channel.open");
  return conn;
}

static void report(const char* bench, long count, long setting, double t0, double t1, double cpu) {
  printf(
      "{\"client\": \"rabbitmq-c\", \"bench\": \"%s\", \"messages\": %ld, \"%s\": %ld, "
      "\"seconds\": %.4f, \"rate\": %.1f, \"cpu_seconds\": %.4f, \"t0\": %.6f, \"t1\": %.6f}\n",
      bench, count, strcmp(bench, "publish") != 0 ? "prefetch" : "window", setting, t1 - t0,
      count / (t1 - t0), cpu, t0, t1);
}

/* The consumer benchmark's handler work: parse the JSON body, read a field. */
static int handle_json(amqp_bytes_t body) {
#ifdef BENCH_HAVE_JSON_C
  struct json_tokener* tokener = json_tokener_new();
  struct json_object* order = json_tokener_parse_ex(tokener, body.bytes, (int)body.len);
  int ok = order != NULL && json_object_object_get_ex(order, "order_id", NULL);
  json_object_put(order);
  json_tokener_free(tokener);
  return ok;
#else
  (void)body;
  die("built without json-c (libjson-c-dev)");
  return 0;
#endif
}

static void consume(amqp_connection_state_t conn, const char* queue, long count, long prefetch,
                    int parse) {
  amqp_basic_qos(conn, 1, 0, (uint16_t)prefetch, 0);
  check_reply(amqp_get_rpc_reply(conn), "basic.qos");
  amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  check_reply(amqp_get_rpc_reply(conn), "basic.consume");
  double t0 = 0, cpu0 = 0;
  for (long received = 0; received < count; ++received) {
    amqp_envelope_t envelope;
    amqp_maybe_release_buffers(conn);
    check_reply(amqp_consume_message(conn, &envelope, NULL, 0), "consume");
    if (received == 0) {
      CALLGRIND_ZERO_STATS;
      t0 = wall_seconds();
      cpu0 = cpu_seconds();
    }
    if (parse && !handle_json(envelope.message.body)) die("not a JSON order");
    if (amqp_basic_ack(conn, 1, envelope.delivery_tag, 0) != AMQP_STATUS_OK) die("basic.ack");
    amqp_destroy_envelope(&envelope);
  }
  CALLGRIND_DUMP_STATS;
  report(parse ? "handle" : "consume", count, prefetch, t0, wall_seconds(), cpu_seconds() - cpu0);
}

static void publish(amqp_connection_state_t conn, const char* queue, long count, long window) {
  amqp_confirm_select(conn, 1);
  check_reply(amqp_get_rpc_reply(conn), "confirm.select");
  char body[1024];
  memset(body, 'x', sizeof body);
  amqp_basic_properties_t props;
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                 AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
  props.content_type = amqp_cstring_bytes("application/json");
  props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  props.message_id = amqp_cstring_bytes("bench");
  props.headers = realistic_headers();
  amqp_bytes_t body_bytes = {sizeof body, body};
  double t0 = wall_seconds(), cpu0 = cpu_seconds();
  long published = 0, confirmed = 0;
  while (confirmed < count) {
    while (published < count && published - confirmed < window) {
      if (amqp_basic_publish(conn, 1, amqp_empty_bytes, amqp_cstring_bytes(queue), 0, 0, &props,
                             body_bytes) != AMQP_STATUS_OK) {
        die("basic.publish");
      }
      ++published;
    }
    amqp_frame_t frame;
    amqp_maybe_release_buffers(conn);
    if (amqp_simple_wait_frame(conn, &frame) != AMQP_STATUS_OK) die("wait for confirm");
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    if (frame.payload.method.id != AMQP_BASIC_ACK_METHOD) die("publish was not acked");
    amqp_basic_ack_t* ack = frame.payload.method.decoded;
    confirmed = ack->multiple ? (long)ack->delivery_tag : confirmed + 1;
  }
  report("publish", count, window, t0, wall_seconds(), cpu_seconds() - cpu0);
}

int main(int argc, char** argv) {
  if (argc != 6) {
    die("usage: bench_rabbitmq_c consume|handle|publish URL QUEUE COUNT PREFETCH|WINDOW");
  }
  amqp_connection_state_t conn = open_connection(argv[2]);
  if (strcmp(argv[1], "consume") == 0 || strcmp(argv[1], "handle") == 0) {
    consume(conn, argv[3], atol(argv[4]), atol(argv[5]), strcmp(argv[1], "handle") == 0);
  } else {
    publish(conn, argv[3], atol(argv[4]), atol(argv[5]));
  }
  amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  return 0;
}
