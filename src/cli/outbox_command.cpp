// retryloop outbox init|relay|list|stats|retry|purge: output and exit codes only; the work is
// done by retryloop::outbox.

#include "outbox_command.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <uv.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "retryloop/operations/http_endpoint.hpp"
#include "retryloop/outbox/outbox.hpp"
#include "retryloop/outbox/relay.hpp"
#include "retryloop/outbox/schema.hpp"
#include "retryloop/store/database.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::cli {

namespace {

constexpr int exit_schema = 3;

const char* const outbox_exit_codes_help =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage error (unknown option, missing argument, bad URL, purge without --yes)\n"
    "  3  the database has no retryloop tables, or another version of them (run init)\n"
    "  4  cannot connect to the database or the broker, or the connection failed\n"
    "  6  standard output could not be written (a closed pipe, a full disk)";

struct OutboxArgs {
  std::string database;
  ConnectionArgs connection;
  std::string state = "failed";
  size_t limit = 100;
  bool json = false;
  std::vector<int64_t> ids;
  bool all = false;
  bool yes = false;
  size_t batch = 500;
  size_t in_flight = 2;
  bool verbose = false;
  std::string poll_interval;
  bool no_notify = false;
  std::string retain = "0s";
  std::string confirm_timeout = "30s";
  bool until_idle = false;
  std::string topology_file;
  std::string metrics_listen;
};

int exit_code_for(const store::StoreError& error) {
  switch (error.kind()) {
    case store::ErrorKind::connection:
      return exit_connection;
    case store::ErrorKind::schema:
      return exit_schema;
    default:
      return exit_usage;
  }
}

// Runs `work` on an open database; a StoreError becomes a message and an exit code.
template <class Work>
int with_database(const OutboxArgs& args, bool need_schema, Work work) {
  try {
    auto database = store::Database::open(args.database, !need_schema);
    if (need_schema) outbox::require_schema(*database);
    return work(*database);
  } catch (const store::StoreError& error) {
    throw Failure(exit_code_for(error), error.what());
  }
}

std::string state_of(const outbox::OutboxRow& row) {
  return outbox::to_string(row.state);
}

nlohmann::json row_json(const outbox::OutboxRow& row) {
  nlohmann::json out;
  out["id"] = row.id;
  out["state"] = state_of(row);
  out["exchange"] = row.exchange;
  out["routing_key"] = row.routing_key;
  out["message_id"] = row.message_id;
  out["ordering_key"] = row.ordering_key ? nlohmann::json(*row.ordering_key) : nullptr;
  out["created_at"] = iso_time(static_cast<uint64_t>(row.created_at_ms / 1000));
  out["attempts"] = row.attempts;
  out["last_error"] = row.last_error ? nlohmann::json(*row.last_error) : nullptr;
  out["body_bytes"] = row.body.size();
  out["body"] = row.body;
  return out;
}

int run_init(const OutboxArgs& args) {
  return with_database(args, false, [&](store::Database& database) {
    auto migration = outbox::migrate(database);
    if (migration.from == migration.to) {
      std::cout << "outbox: schema version " << migration.to << " is in place; nothing to do\n";
    } else if (migration.from == 0) {
      std::cout << "outbox: created retryloop_outbox and retryloop_inbox (schema version "
                << migration.to << ") in " << store::to_string(database.dialect()) << "\n";
    } else {
      std::cout << "outbox: migrated the schema from version " << migration.from << " to "
                << migration.to << "\n";
    }
    return exit_ok;
  });
}

int run_list(const OutboxArgs& args) {
  std::optional<outbox::RowState> state;
  if (args.state != "all") {
    state = outbox::row_state_from(args.state);
    if (!state) {
      throw Failure(exit_usage,
                    "--state '" + args.state + "' is not one of pending, failed, published, all");
    }
  }
  return with_database(args, true, [&](store::Database& database) {
    auto rows = outbox::list_rows(database, state, args.limit);
    if (args.json) {
      for (const auto& row : rows)
        std::cout << dump(row_json(row)) << "\n";
      return exit_ok;
    }
    if (rows.empty()) {
      std::cout << "no " << (state ? args.state + " " : std::string()) << "rows\n";
      return exit_ok;
    }
    Table table;
    table.add({"ID", "STATE", "AGE", "EXCHANGE", "ROUTING KEY", "KEY", "MESSAGE ID", "ERROR"});
    const int64_t now = outbox::now_ms();
    for (const auto& row : rows) {
      table.add(
          {std::to_string(row.id), state_of(row),
           age_text(static_cast<uint64_t>(std::max<int64_t>(0, now - row.created_at_ms)) / 1000),
           preview(row.exchange, 30), preview(row.routing_key, 30),
           row.ordering_key ? preview(*row.ordering_key, 20) : "-", preview(row.message_id, 36),
           row.last_error ? preview(*row.last_error, 80) : ""});
    }
    table.print(std::cout, "");
    return exit_ok;
  });
}

int run_stats(const OutboxArgs& args) {
  return with_database(args, true, [&](store::Database& database) {
    auto counts = outbox::stats(database);
    const int64_t now = outbox::now_ms();
    std::optional<uint64_t> oldest;
    if (counts.oldest_pending_ms) {
      oldest = static_cast<uint64_t>(std::max<int64_t>(0, now - *counts.oldest_pending_ms));
    }
    if (args.json) {
      nlohmann::json out;
      out["pending"] = counts.pending;
      out["failed"] = counts.failed;
      out["published"] = counts.published;
      out["oldest_pending_ms"] = oldest ? nlohmann::json(*oldest) : nullptr;
      std::cout << dump(out) << "\n";
      return exit_ok;
    }
    std::cout << "pending " << counts.pending << ", failed " << counts.failed << ", published "
              << counts.published;
    if (oldest) std::cout << "; oldest pending " << age_text(*oldest / 1000) << " old";
    std::cout << "\n";
    return exit_ok;
  });
}

void require_selection(const OutboxArgs& args, const char* command) {
  if (args.ids.empty() == !args.all) {
    throw Failure(exit_usage, std::string(command) + ": give --id N (repeatable) or --all");
  }
}

int run_retry(const OutboxArgs& args) {
  require_selection(args, "retry");
  return with_database(args, true, [&](store::Database& database) {
    auto changed = outbox::retry_failed(database, args.ids);
    std::cout << "outbox: " << plural(changed, "failed row") << " back to pending\n";
    return exit_ok;
  });
}

int run_purge(const OutboxArgs& args) {
  require_selection(args, "purge");
  if (!args.yes) throw Failure(exit_usage, "purge deletes failed rows for good: add --yes");
  return with_database(args, true, [&](store::Database& database) {
    auto deleted = outbox::purge_failed(database, args.ids);
    std::cout << "outbox: deleted " << plural(deleted, "failed row") << "\n";
    return exit_ok;
  });
}

int run_relay(const OutboxArgs& args) {
  outbox::RelayOptions options;
  options.database = args.database;
  options.connection.uri = parse_url(args.connection);
  options.connection.connection_name = "retryloop outbox relay";
  options.batch_size = args.batch;
  if (options.batch_size == 0) throw Failure(exit_usage, "--batch must be at least 1");
  options.batches_in_flight = args.in_flight;
  if (options.batches_in_flight == 0) throw Failure(exit_usage, "--in-flight must be at least 1");
  options.notifications = !args.no_notify;
  if (!args.poll_interval.empty()) {
    options.poll_interval = duration_or_fail("--poll-interval", args.poll_interval);
  }
  options.retain_published = duration_or_fail("--retain", args.retain);
  options.confirm_timeout = duration_or_fail("--confirm-timeout", args.confirm_timeout);
  if (!args.topology_file.empty()) {
    const topology::Topology topology = load_topology_or_fail(args.topology_file, {});
    if (!topology.schedule) {
      throw Failure(exit_invalid_file, args.topology_file +
                                           ": has no top-level \"delay_levels\"; rows due later "
                                           "need the schedule's delay levels");
    }
    options.schedule = topology.schedule;
  }
  options.stop_on_signals = true;
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  options.logger = std::make_shared<spdlog::logger>("outbox", sink);
  options.logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  options.logger->set_level(args.verbose ? spdlog::level::debug : spdlog::level::info);

  uv_loop_t loop;
  uv_loop_init(&loop);
  auto relay = outbox::Relay::create(&loop, options);
  // --until-idle: stop once a look at the table found nothing to publish.
  uv_timer_t idle_timer;
  uv_timer_init(&loop, &idle_timer);
  idle_timer.data = relay.get();
  auto close_timer = [&idle_timer] {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&idle_timer))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&idle_timer), nullptr);
    }
  };
  // --metrics-listen: the relay's counters, and the table's state sampled at most every 5 s.
  std::shared_ptr<operations::HttpEndpoint> endpoint;
  if (!args.metrics_listen.empty()) {
    operations::HttpEndpointOptions endpoint_options;
    try {
      endpoint_options.listen = operations::parse_listen_address(args.metrics_listen);
    } catch (const std::invalid_argument& e) {
      throw Failure(exit_usage, std::string("--metrics-listen: ") + e.what());
    }
    endpoint_options.logger = options.logger;
    endpoint = operations::HttpEndpoint::create(&loop, endpoint_options);
    struct Sample {
      std::unique_ptr<store::Database> database;
      std::optional<outbox::OutboxStats> table;
      int64_t at_ms = 0;
    };
    auto sample = std::make_shared<Sample>();
    endpoint->add_metrics([relay, sample, url = args.database] {
      const int64_t now = outbox::now_ms();
      if (now - sample->at_ms >= 5000) {
        sample->at_ms = now;
        try {
          if (!sample->database || !sample->database->usable()) {
            sample->database = store::Database::open(url, false);
          }
          sample->table = outbox::stats(*sample->database);
        } catch (const store::StoreError&) {
          sample->table.reset();  // the counters still answer; the table's state is left out
        }
      }
      return outbox::prometheus_text(relay->stats(), sample->table, now);
    });
  }
  std::string failure;
  relay->set_stopped_handler([&failure, &close_timer, &endpoint](const std::string& error) {
    failure = error;
    close_timer();
    if (endpoint) endpoint->close();
  });
  std::string error = relay->start();
  if (error.empty() && endpoint) {
    if (client::Error listen = endpoint->start()) error = listen.message();
    if (!error.empty()) relay->stop_now();
  }
  if (!error.empty()) {
    close_timer();
    if (endpoint) endpoint->close();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    throw Failure(
        error.find("schema") != std::string::npos || error.find("outbox init") != std::string::npos
            ? exit_schema
            : exit_usage,
        error);
  }
  if (args.until_idle) {
    uv_timer_start(
        &idle_timer,
        [](uv_timer_t* timer) {
          auto* relay = static_cast<outbox::Relay*>(timer->data);
          if (relay->idle()) {
            uv_timer_stop(timer);
            relay->stop();
          }
        },
        50, 50);
  }
  options.logger->info("outbox relay: relaying from {} to {}", store::redact(args.database),
                       hide_passwords(args.connection.url));
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  auto stats = relay->stats();
  options.logger->info(
      "outbox relay: stopped; published {}, failed {}, left pending {}, in {} batches",
      stats.published, stats.failed, stats.unsettled, stats.batches);
  if (!failure.empty()) throw Failure(exit_schema, failure);
  return exit_ok;
}

CLI::App* add_command(CLI::App& group, const char* name, const char* summary,
                      const std::shared_ptr<OutboxArgs>& args) {
  CLI::App* command = group.add_subcommand(name, summary);
  command->footer(outbox_exit_codes_help);
  command
      ->add_option("--db", args->database,
                   "Database URL: sqlite:PATH or postgresql://USER@HOST:PORT/DBNAME")
      ->envname("RETRYLOOP_DB")
      ->required()
      ->type_name("URL");
  return command;
}

}  // namespace

void add_outbox_commands(CLI::App& app, int& exit_code) {
  CLI::App* group = app.add_subcommand(
      "outbox", "Create the outbox tables, relay outbox rows to the broker, handle failed rows");
  group->footer(outbox_exit_codes_help);
  group->require_subcommand(1);

  auto init_args = std::make_shared<OutboxArgs>();
  add_command(*group, "init", "Create the outbox and inbox tables, or migrate them", init_args)
      ->callback([args = init_args, &exit_code] { exit_code = run_init(*args); });

  auto relay_args = std::make_shared<OutboxArgs>();
  CLI::App* relay = add_command(
      *group, "relay", "Publish outbox rows to the broker with confirms until stopped", relay_args);
  add_connection_option(*relay, relay_args->connection);
  relay->add_option("--batch", relay_args->batch, "Rows per batch (default 500)")->type_name("N");
  relay
      ->add_option("--in-flight", relay_args->in_flight,
                   "Batches out at once, each in a transaction and a database connection of its "
                   "own (PostgreSQL; default 2)")
      ->type_name("N");
  relay
      ->add_option("--poll-interval", relay_args->poll_interval,
                   "Look for rows this often when nothing woke the relay (default: 5s with "
                   "PostgreSQL notifications, 100ms otherwise)")
      ->type_name("DURATION");
  relay->add_flag("--no-notify", relay_args->no_notify,
                  "Do not LISTEN for PostgreSQL notifications: poll only");
  relay->add_flag("--verbose", relay_args->verbose,
                  "Log every batch: its rows' ids, each ordering key's first and last message id, "
                  "and how the batch settled");
  relay
      ->add_option("--retain", relay_args->retain,
                   "Keep published rows this long before deleting them (default 0s: delete at "
                   "once)")
      ->type_name("DURATION");
  relay
      ->add_option("--confirm-timeout", relay_args->confirm_timeout,
                   "Reconnect when a batch is not confirmed within this time (default 30s)")
      ->type_name("DURATION");
  relay
      ->add_option("--metrics-listen", relay_args->metrics_listen,
                   "Serve the relay's counters and the table's state for Prometheus at "
                   "http://HOST:PORT/metrics (the table looked at most every 5 s)")
      ->type_name("HOST:PORT");
  relay
      ->add_option("-t,--topology", relay_args->topology_file,
                   "Topology file whose delay_levels hold the rows that are due later")
      ->envname("RETRYLOOP_TOPOLOGY")
      ->type_name("FILE");
  relay->add_flag("--until-idle", relay_args->until_idle,
                  "Stop once no row is left to publish (instead of running until a signal)");
  relay->callback([args = relay_args, &exit_code] { exit_code = run_relay(*args); });

  auto list_args = std::make_shared<OutboxArgs>();
  CLI::App* list =
      add_command(*group, "list", "List outbox rows (failed ones by default)", list_args);
  list->add_option("--state", list_args->state, "pending, failed (default), published or all")
      ->type_name("STATE");
  list->add_option("--limit", list_args->limit, "Show at most N rows (default 100)")
      ->type_name("N");
  list->add_flag("--json", list_args->json, "One JSON object per line");
  list->callback([args = list_args, &exit_code] { exit_code = run_list(*args); });

  auto stats_args = std::make_shared<OutboxArgs>();
  CLI::App* stats = add_command(*group, "stats", "Count rows by state", stats_args);
  stats->add_flag("--json", stats_args->json, "Print one JSON object");
  stats->callback([args = stats_args, &exit_code] { exit_code = run_stats(*args); });

  auto retry_args = std::make_shared<OutboxArgs>();
  CLI::App* retry = add_command(
      *group, "retry", "Put failed rows back to pending, to be published again", retry_args);
  retry->add_option("--id", retry_args->ids, "A failed row's id (repeatable)")->type_name("N");
  retry->add_flag("--all", retry_args->all, "Every failed row");
  retry->callback([args = retry_args, &exit_code] { exit_code = run_retry(*args); });

  auto purge_args = std::make_shared<OutboxArgs>();
  CLI::App* purge = add_command(*group, "purge", "Delete failed rows", purge_args);
  purge->add_option("--id", purge_args->ids, "A failed row's id (repeatable)")->type_name("N");
  purge->add_flag("--all", purge_args->all, "Every failed row");
  purge->add_flag("--yes", purge_args->yes, "Really delete");
  purge->callback([args = purge_args, &exit_code] { exit_code = run_purge(*args); });
}

}  // namespace retryloop::cli
