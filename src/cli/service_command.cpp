// retryloop service pause|resume|status: every instance of a service paused and resumed by
// hand through its shared breaker, and what that breaker says now (docs/outage.md).

#include "service_command.hpp"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "migrate_command.hpp"
#include "retryloop/amqp/printable.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/consumer/shared_breaker.hpp"
#include "retryloop/outage/coordinator.hpp"
#include "retryloop/retry/headers.hpp"
#include "schedule_command.hpp"

namespace retryloop::cli {
namespace {

struct ServiceArgs {
  std::string topology_file;
  std::string service;
  std::string reason;
  bool json = false;
  ConnectionArgs connection;
};

std::string operator_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string("operator@") + (host[0] != '\0' ? host : "unknown-host");
}

/// Opens a channel in confirm mode and declares the service's breaker objects, then `next`.
void with_breaker_channel(const std::shared_ptr<client::Connection>& connection,
                          const std::string& service, const std::function<void(int)>& done,
                          std::function<void(std::shared_ptr<client::Channel>)> next) {
  client::Error error = connection->open_channel(
      [service, done, next](const client::Error& error, std::shared_ptr<client::Channel> channel) {
        if (error) return done(error_exit(error, "opening a channel"));
        client::Error selected = channel->confirm_select([=](const client::Error& error) {
          if (error) return done(error_exit(error, "confirm mode"));
          consumer::declare_shared_breaker(channel, service, [=](const client::Error& error) {
            if (error) return done(error_exit(error, "declaring " + service + "'s breaker"));
            next(channel);
          });
        });
        if (selected) done(error_exit(selected, "confirm mode"));
      });
  if (error) done(error_exit(error, "opening a channel"));
}

/// Publishes `signal` (and, for a resume, its token), waits for the confirms, says what it did.
void publish_operator_signal(const ServiceArgs& args,
                             const std::shared_ptr<client::Channel>& channel,
                             const outage::Signal& signal, const std::function<void(int)>& done) {
  auto confirmed = [&args, channel, signal, done](const client::PublishOutcome& outcome) {
    if (!outcome.ok()) {
      return done(error_exit(outcome.error, std::string("publishing the ") +
                                                outage::to_string(signal.kind) + " signal"));
    }
    auto finish = [&args, kind = signal.kind, done] {
      if (kind == outage::SignalKind::paused) {
        std::cout << "service " << args.service
                  << " paused: every running instance stops taking deliveries within a "
                     "second, holds what it has, and stays paused, across restarts of "
                     "instances and of the broker, until `retryloop service resume`\n";
      } else {
        std::cout << "service " << args.service
                  << " resumed: one instance probes with one call now, then every instance "
                     "ramps up\n";
      }
      done(exit_ok);
    };
    if (signal.kind != outage::SignalKind::resumed) return finish();
    consumer::publish_probe_token(
        *channel, args.service, outage::Token{signal.outage, true},
        [finish, done](const client::PublishOutcome& outcome) {
          if (!outcome.ok()) {
            return done(error_exit(outcome.error, "publishing a probe token"));
          }
          finish();
        });
  };
  consumer::publish_breaker_signal(*channel, args.service, signal, confirmed);
}

/// Reads the service's state, then publishes the operator's signal (and, for resume, a probe
/// token) and waits for the confirms. A resume of a service that is not paused publishes nothing:
/// its token would stop an instance that is handling, for a probe nobody needs.
int send_signal(const ServiceArgs& args, outage::SignalKind kind) {
  load_topology_or_fail(args.topology_file, {args.service});
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    with_breaker_channel(connection, args.service, done, [&, connection, done](auto channel) {
      consumer::read_shared_breaker_state(
          channel, connection->loop(), args.service,
          [&, channel, done](const client::Error& error,
                             const std::optional<outage::Signal>& last) {
            if (error) return done(error_exit(error, "reading the breaker's state"));
            const bool paused = last && last->kind == outage::SignalKind::paused;
            if (kind == outage::SignalKind::resumed && !paused) {
              std::cout << "service " << args.service << " is not paused (it is "
                        << consumer::shared_breaker_state(last)
                        << "): nothing to resume, nothing sent\n";
              return done(exit_ok);
            }
            const int64_t wall = int64_t(retry::unix_milliseconds());
            const int64_t known = last ? last->outage : 0;
            // A resume begins an outage of its own, which the probe's `recovered` ends; a pause
            // names the last one it knew of.
            const int64_t outage =
                kind == outage::SignalKind::resumed ? outage::outage_id(wall, known) : known;
            publish_operator_signal(
                args, channel, outage::Signal{kind, wall, operator_name(), args.reason, outage},
                done);
          });
    });
  });
}

void print_status(const ServiceArgs& args, const consumer::SharedBreakerStatus& status,
                  const std::optional<migrate::Record>& migration);

int run_status(const ServiceArgs& args) {
  load_topology_or_fail(args.topology_file, {args.service});
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    with_breaker_channel(connection, args.service, done, [&, connection, done](auto channel) {
      consumer::read_shared_breaker_status(
          channel, connection->loop(), args.service,
          [&args, channel, connection, done](const client::Error& error,
                                             const consumer::SharedBreakerStatus& status) {
            if (error) return done(error_exit(error, "reading the breaker's state"));
            read_unfinished_migrations(
                connection, {args.service},
                [&args, status, done](std::map<std::string, migrate::Record> unfinished) {
                  print_status(args, status,
                               unfinished.empty() ? std::nullopt
                                                  : std::optional(unfinished.begin()->second));
                  done(exit_ok);
                });
          });
    });
  });
}

void print_status(const ServiceArgs& args, const consumer::SharedBreakerStatus& status,
                  const std::optional<migrate::Record>& migration) {
  const std::string state = consumer::shared_breaker_state(status.last);
  const std::optional<outage::Signal>& last = status.last;
  if (args.json) {
    nlohmann::json out = {
        {"service", args.service},       {"state", state},
        {"instances", status.instances}, {"tokens_waiting", status.tokens_waiting},
        {"last_signal", nullptr},        {"migrating", migration.has_value()},
        {"migration", nullptr}};
    if (migration) out["migration"] = unfinished_json(*migration);
    if (last) {
      out["last_signal"] = {{"signal", outage::to_string(last->kind)},
                            {"at", iso_time_ms(last->at_ms)},
                            {"at_ms", last->at_ms},
                            {"sender", last->sender},
                            {"reason", last->reason}};
    }
    std::cout << dump(out) << "\n";
    return;
  }
  std::cout << "service " << args.service << ": " << state;
  if (last) {
    const int64_t age_ms = std::max<int64_t>(0, int64_t(retry::unix_milliseconds()) - last->at_ms);
    std::cout << " since " << iso_time_ms(last->at_ms) << " (" << age_text(uint64_t(age_ms / 1000))
              << " ago), " << outage::to_string(last->kind) << " from "
              << amqp::printable(last->sender);
    if (!last->reason.empty()) std::cout << ": " << amqp::printable(last->reason);
  }
  std::cout << "\n  instances connected: " << status.instances
            << "\n  probe tokens waiting: " << status.tokens_waiting << "\n";
  if (migration) {
    std::cout << "  migrating: " << unfinished_text(*migration, args.topology_file) << "\n";
  }
}

const char* const service_exit_codes_help =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage error (unknown option, missing argument, bad URL, a service the file does not "
    "have)\n"
    "  2  the topology file is unreadable or invalid\n"
    "  3  the broker refused (permissions, an object with other arguments)\n"
    "  4  could not connect to the broker, or the connection failed midway";

void add_common(CLI::App& command, ServiceArgs& args) {
  command.add_option("-t,--topology", args.topology_file, "Topology file that has the service")
      ->envname("RETRYLOOP_TOPOLOGY")
      ->required()
      ->type_name("FILE");
  command.add_option("service", args.service, "The service's name")->required()->type_name("NAME");
  add_connection_option(command, args.connection);
}

}  // namespace

void add_service_commands(CLI::App& app, int& exit_code) {
  CLI::App* group = app.add_subcommand(
      "service", "Pause and resume every instance of a service, and see its breaker's state");
  group->footer(wrap("The instances of a service share one breaker through the broker "
                     "(docs/outage.md). These commands speak to it: a pause stops every "
                     "instance within a second and holds across restarts of instances and of "
                     "the broker until resumed; a resume starts with one call, then the ramp.") +
                "\n\n" + service_exit_codes_help);
  group->require_subcommand(1);

  auto pause_args = std::make_shared<ServiceArgs>();
  CLI::App* pause =
      group->add_subcommand("pause", "Stop every instance of a service until resumed");
  pause->footer(service_exit_codes_help);
  add_common(*pause, *pause_args);
  pause->add_option("--reason", pause_args->reason, "Why, for `service status` and the logs")
      ->type_name("TEXT");
  pause->callback([args = pause_args, &exit_code] {
    exit_code = send_signal(*args, outage::SignalKind::paused);
  });

  auto resume_args = std::make_shared<ServiceArgs>();
  CLI::App* resume = group->add_subcommand("resume", "Let a paused service run again, slowly");
  resume->footer(service_exit_codes_help);
  add_common(*resume, *resume_args);
  resume->add_option("--reason", resume_args->reason, "Why, for `service status` and the logs")
      ->type_name("TEXT");
  resume->callback([args = resume_args, &exit_code] {
    exit_code = send_signal(*args, outage::SignalKind::resumed);
  });

  auto status_args = std::make_shared<ServiceArgs>();
  CLI::App* status =
      group->add_subcommand("status", "The service's breaker: closed, open, paused; its instances");
  status->footer(service_exit_codes_help);
  add_common(*status, *status_args);
  status->add_flag("--json", status_args->json, "Print one JSON object");
  status->callback([args = status_args, &exit_code] { exit_code = run_status(*args); });
}

}  // namespace retryloop::cli
