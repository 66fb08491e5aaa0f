// retryloop dispatch: the retry consumer of one service, each message handed to an HTTP endpoint;
// options, wiring and exit codes only (the work is the consumer's and dispatch::Dispatcher's).

#include "dispatch_command.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <uv.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "common.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/dispatch/dispatcher.hpp"
#include "retryloop/operations/http_endpoint.hpp"
#include "retryloop/operations/prometheus.hpp"

namespace retryloop::cli {
namespace {

struct DispatchArgs {
  std::string topology_file;
  std::string service;
  std::string to;
  uint32_t concurrency = 16;
  uint32_t pool = 0;
  uint32_t prefetch = 0;
  std::string timeout = "30s";
  std::string connect_timeout = "5s";
  std::string http_version = "auto";
  uint64_t max_answer = 1 << 20;
  std::string ca_file;
  std::string certificate;
  std::string key;
  std::string http;
  std::string shutdown = "30s";
  bool verbose = false;
  ConnectionArgs connection;
};

const char* const dispatch_exit_codes_help =
    "Exit codes:\n"
    "  0  stopped by SIGINT or SIGTERM\n"
    "  1  usage error (unknown option, missing argument, bad URL or target, a service the file "
    "does not have, an address for --http that cannot be bound)\n"
    "  2  the topology file is unreadable or invalid\n"
    "  3  the broker refused (permissions, an object with other arguments): the consumer "
    "stopped";

dispatch::HttpVersion http_version_or_fail(const std::string& text) {
  if (text == "auto") return dispatch::HttpVersion::negotiate;
  if (text == "1.1") return dispatch::HttpVersion::http1;
  if (text == "2") return dispatch::HttpVersion::http2_prior_knowledge;
  throw Failure(exit_usage, "--http-version must be auto, 1.1 or 2, not \"" + text + "\"");
}

int run_dispatch(const DispatchArgs& args) {
  const topology::Topology topology = load_topology_or_fail(args.topology_file, {args.service});
  const topology::Service& service = topology.services.at(0);

  dispatch::DispatcherOptions dispatcher_options;
  dispatcher_options.http.target = args.to;
  dispatcher_options.http.pool_size = args.pool != 0 ? args.pool : args.concurrency;
  dispatcher_options.http.http_version = http_version_or_fail(args.http_version);
  dispatcher_options.http.request_timeout = duration_or_fail("--timeout", args.timeout);
  dispatcher_options.http.connect_timeout =
      duration_or_fail("--connect-timeout", args.connect_timeout);
  dispatcher_options.http.max_body_bytes = size_t(args.max_answer);
  dispatcher_options.http.ca_file = args.ca_file;
  dispatcher_options.http.client_certificate = args.certificate;
  dispatcher_options.http.client_key = args.key;
  dispatcher_options.request.service = service.name;
  dispatcher_options.request.max_attempts = service.retry.max_attempts;

  consumer::ConsumerOptions options;
  options.service = service;
  options.connection.uri = parse_url(args.connection);
  options.connection.connection_name = "retryloop dispatch " + service.name;
  options.concurrency = args.concurrency;
  options.prefetch = uint16_t(args.prefetch != 0 ? args.prefetch
                                                 : std::min<uint32_t>(2 * args.concurrency, 65535));
  options.stop_on_signals = true;
  options.shutdown_deadline = duration_or_fail("--shutdown", args.shutdown);
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  options.logger = std::make_shared<spdlog::logger>("dispatch", sink);
  options.logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  options.logger->set_level(args.verbose ? spdlog::level::debug : spdlog::level::info);

  operations::HttpEndpointOptions endpoint_options;
  if (!args.http.empty()) {
    try {
      endpoint_options.listen = operations::parse_listen_address(args.http);
    } catch (const std::invalid_argument& e) {
      throw Failure(exit_usage, std::string("--http: ") + e.what());
    }
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  std::shared_ptr<dispatch::Dispatcher> dispatcher;
  try {
    dispatcher = dispatch::Dispatcher::create(&loop, dispatcher_options);
  } catch (const std::exception& e) {
    uv_loop_close(&loop);
    throw Failure(exit_usage, "cannot dispatch to " + args.to + ": " + e.what());
  }
  auto service_consumer = consumer::Consumer::create(&loop, options, dispatcher->handler());
  std::shared_ptr<operations::HttpEndpoint> endpoint;
  if (!args.http.empty()) {
    endpoint_options.logger = options.logger;
    endpoint = operations::HttpEndpoint::create(&loop, endpoint_options);
    endpoint->add(service_consumer);
    endpoint->add_metrics([dispatcher, name = service.name] {
      return dispatch::prometheus_text(dispatcher->stats(), name);
    });
  }
  int exit_code = exit_ok;
  service_consumer->set_stopped_handler(
      [&exit_code, &endpoint, dispatcher](const client::Error& error) {
        if (error) exit_code = exit_broker_refused;
        dispatcher->close();
        if (endpoint) endpoint->close();
      });
  client::Error error;
  if (endpoint) error = endpoint->start();
  if (!error) error = service_consumer->start();
  if (error) {
    service_consumer->stop_now();
    dispatcher->close();
    if (endpoint) endpoint->close();
    service_consumer.reset();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    throw Failure(exit_usage, error.message());
  }
  options.logger->info("dispatch: service {} from {} to {}, {} at once{}", service.name,
                       hide_passwords(args.connection.url), args.to, args.concurrency,
                       endpoint ? ", operations on " + endpoint_options.listen.text() : "");
  service_consumer.reset();  // it keeps itself alive until it stops
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  const dispatch::DispatchStats stats = dispatcher->stats();
  options.logger->info("dispatch: stopped after {} requests ({} answered 2xx, {} unanswered)",
                       stats.latency.count(), stats.answers[2],
                       stats.failures[1] + stats.failures[2] + stats.failures[3] +
                           stats.failures[4] + stats.failures[5] + stats.failures[6]);
  return exit_code;
}

}  // namespace

void add_dispatch_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<DispatchArgs>();
  CLI::App* command = app.add_subcommand(
      "dispatch", "Run a service's retry consumer that hands each message to an HTTP endpoint");
  command->footer(
      wrap("Each message is POSTed to the application as a CloudEvent (binary mode: the body as "
           "it is, ce-id, ce-source, ce-type, ce-time, and Retryloop-Attempt, "
           "Retryloop-Max-Attempts, Retryloop-Headers). The answer decides: 2xx acks; 429 is "
           "overloaded (Retry-After kept); 502, 503, 504, a refused connection or a timeout is "
           "the application being unavailable (the breaker counts it; the message is not "
           "charged); 400, 404, 410, 413, 415 and 422 park the message; any other status is a "
           "retry (Retry-After chooses the delay); a Retryloop-Outcome answer header (ack, "
           "retry, permanent, poison, drop) decides instead of the status. See "
           "docs/dispatch.md.") +
      "\n\n" + dispatch_exit_codes_help);
  command->add_option("-t,--topology", args->topology_file, "Topology file that has the service")
      ->envname("RETRYLOOP_TOPOLOGY")
      ->required()
      ->type_name("FILE");
  command->add_option("service", args->service, "The service to consume")
      ->required()
      ->type_name("NAME");
  command
      ->add_option(
          "--to", args->to,
          "The application: http://HOST:PORT/PATH, https://..., or unix:/PATH.sock[:/PATH]")
      ->required()
      ->type_name("URL");
  add_connection_option(*command, args->connection);
  command
      ->add_option("--concurrency", args->concurrency,
                   "Requests at once (the consumer's handlers; default 16)")
      ->check(whole_number(1, 10000))
      ->type_name("N");
  command
      ->add_option("--pool", args->pool,
                   "Connections to the application kept open at most (default: --concurrency)")
      ->check(whole_number(1, 10000))
      ->type_name("N");
  command
      ->add_option("--prefetch", args->prefetch,
                   "Deliveries the broker sends ahead (default: twice --concurrency)")
      ->check(whole_number(1, 65535))
      ->type_name("N");
  command
      ->add_option("--timeout", args->timeout,
                   "Each request's whole exchange; past it the application counts as unavailable "
                   "(default 30s)")
      ->type_name("DURATION");
  command
      ->add_option("--connect-timeout", args->connect_timeout,
                   "Opening a connection, TLS included (default 5s)")
      ->type_name("DURATION");
  command
      ->add_option("--http-version", args->http_version,
                   "auto (HTTP/2 when a TLS server offers it, else 1.1), 1.1, or 2 (also in "
                   "cleartext, with prior knowledge)")
      ->type_name("auto|1.1|2");
  command
      ->add_option("--max-answer", args->max_answer,
                   "Bytes of an answer's body kept; a longer one is cut and the connection "
                   "closed (default 1048576)")
      ->check(whole_number(1024, int64_t(1) << 30))
      ->type_name("BYTES");
  command->add_option("--ca-file", args->ca_file, "HTTPS: the CAs that sign the server (PEM)")
      ->type_name("FILE");
  command
      ->add_option("--cert", args->certificate,
                   "HTTPS: a client certificate (PEM) for a server that asks for one")
      ->type_name("FILE");
  command->add_option("--key", args->key, "HTTPS: the client certificate's key (PEM)")
      ->type_name("FILE");
  command
      ->add_option("--http", args->http,
                   "Serve /metrics, /healthz and /readyz on HOST:PORT (a bare PORT: on 127.0.0.1)")
      ->type_name("HOST:PORT");
  command
      ->add_option("--shutdown", args->shutdown,
                   "On SIGINT or SIGTERM, how long requests in flight may finish (default 30s)")
      ->type_name("DURATION");
  command->add_flag("--verbose", args->verbose, "Log every outcome, acks included");
  command->callback([args, &exit_code] { exit_code = run_dispatch(*args); });
}

}  // namespace retryloop::cli
