#include "transfer_command.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "common.hpp"
#include "migrate_command.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::cli {
namespace {

struct TransferArgs {
  std::string file;
  std::vector<std::string> services;
  /// Scheduled queues no service declares.
  std::vector<std::string> queues;
  ConnectionArgs connection;
  ConnectionArgs to;
  bool follow = false;
  std::string settle = "10s";
  std::string precision = "100ms";
  bool dry_run = false;
  bool json = false;
};

/// What the run's transfers (and dry runs) report: each one's JSON entry, and whether Ctrl-C ended
/// one, after which no other starts.
struct Results {
  nlohmann::json services = nlohmann::json::array();
  nlohmann::json queues = nlohmann::json::array();
  bool interrupted = false;
  /// The entries of the targets of `kind`: "service" or "queue".
  nlohmann::json& of(const std::string& kind) { return kind == "queue" ? queues : services; }
};

const char* kind_text(transfer::Source::Kind kind) {
  switch (kind) {
    case transfer::Source::Kind::service_queue:
      return "service queue";
    case transfer::Source::Kind::wait_queue:
      return "wait queue";
    case transfer::Source::Kind::delay_level:
      return "delay level";
    case transfer::Source::Kind::unrouted:
      return "unrouted retries";
    case transfer::Source::Kind::parking:
      return "parking queue";
    case transfer::Source::Kind::scheduled_queue:
      return "scheduled queue";
  }
  return "queue";
}

nlohmann::json read_json(const transfer::SourceResult& read, int pass) {
  return {{"queue", read.source.queue},
          {"kind", kind_text(read.source.kind)},
          {"pass", pass},
          {"read", read.progress.scanned},
          {"moved", read.progress.moved},
          {"to_queue", read.to_queue},
          {"to_levels", read.to_levels},
          {"due_unknown", read.due_unknown},
          {"left", read.left},
          {"others", read.others},
          {"failed", read.progress.failed},
          {"undecodable", read.undecodable},
          {"longest_delay_ms", read.longest_delay.count()}};
}

/// Connects a second connection, to the new broker, on the loop of the first; runs `work` with
/// both, then closes it.
void with_new_broker(const std::shared_ptr<client::Connection>& old_broker, const client::Uri& uri,
                     std::function<void(int)> done,
                     std::function<void(const std::shared_ptr<client::Connection>& new_broker,
                                        std::function<void(int)> done)>
                         work) {
  client::ConnectionOptions options;
  options.uri = uri;
  options.connection_name = "retryloop command line (transfer target)";
  options.connect_timeout = uri.connect_timeout.value_or(std::chrono::seconds(10));
  auto connection = client::Connection::create(old_broker->loop(), options);
  client::Error error =
      connection->connect([connection, uri, done, work](const client::Error& error) {
        if (error) {
          std::cerr << "retryloop: cannot connect to the new broker " << uri.redacted() << ": "
                    << error.message() << "\n";
          return done(exit_connection);
        }
        work(connection, [connection, done](int code) {
          connection->close();
          done(code);
        });
      });
  if (error) {
    std::cerr << "retryloop: cannot connect to the new broker " << uri.redacted() << ": "
              << error.message() << "\n";
    done(exit_connection);
  }
}

/// `topology apply` of `one` (a service, or a scheduled queue's schedule) on the new broker;
/// drift refuses the transfer, with `hint`, and so does a missing object, with `missing_hint`.
void apply_on_new(const std::shared_ptr<client::Connection>& connection,
                  const topology::Topology& one, const std::string& what, const std::string& hint,
                  const std::string& missing_hint, std::function<void(int)> refused,
                  std::function<void()> applied) {
  client::Error error = topology::apply(
      connection, topology::make_plan(one),
      [what, hint, missing_hint, refused, applied](const topology::Report& report) {
        if (report.connection_error) {
          return refused(
              error_exit(report.connection_error, "applying " + what + " on the new broker"));
        }
        if (report.ok()) return applied();
        std::cerr << "retryloop: the new broker cannot take " << what
                  << " as FILE has it; nothing was moved:\n";
        bool missing = false;
        for (const auto& result : report.results) {
          if (result.outcome == topology::Outcome::drifted ||
              result.outcome == topology::Outcome::failed ||
              result.outcome == topology::Outcome::missing) {
            missing = missing || result.outcome == topology::Outcome::missing;
            std::cerr << "  " << result.action.name << ": "
                      << (result.error ? result.error.message() : std::string("differs")) << "\n";
          }
        }
        std::cerr << "retryloop: " << (missing && !missing_hint.empty() ? missing_hint : hint)
                  << "\n";
        refused(exit_broker_refused);
      });
  if (error) refused(error_exit(error, "applying " + what + " on the new broker"));
}

/// apply_on_new of a service, with the part of the file's schedule that delivers to its queue
/// (transfer::service_schedule).
void apply_service_on_new(const std::shared_ptr<client::Connection>& connection,
                          const topology::Service& service,
                          const std::optional<topology::Schedule>& schedule,
                          const std::string& file, std::function<void(int)> refused,
                          std::function<void()> applied) {
  topology::Topology one;
  one.services = {service};
  one.schedule = transfer::service_schedule(service, schedule);
  apply_on_new(connection, one, service.name,
               "to change objects that exist with other arguments, run `retryloop topology "
               "migrate " +
                   file + " --service " + service.name + "` against the new broker first",
               "", std::move(refused), std::move(applied));
}

/// Runs `go` unless `service` has an unfinished migration on the broker of `connection` (`which`:
/// "old" or "new"), which refuses the transfer (exit 3): its queues are half changed, and the
/// messages in its holding queue would not be moved.
void unless_migrating(const std::shared_ptr<client::Connection>& connection, const char* which,
                      const topology::Service& service, const std::string& file,
                      std::function<void(int)> refused, std::function<void()> go) {
  read_unfinished_migrations(
      connection, {service.name},
      [which, file, refused, go](std::map<std::string, migrate::Record> unfinished) {
        if (unfinished.empty()) return go();
        std::cerr << "retryloop: the " << which << " broker has an unfinished "
                  << unfinished_text(unfinished.begin()->second, file)
                  << (std::string(which) == "new" ? " (with --url the new broker's)" : "")
                  << "; nothing was moved\n";
        refused(exit_broker_refused);
      });
}

/// The dry run: looks each old queue up, one after another, and prints its depth.
struct DryRun : std::enable_shared_from_this<DryRun> {
  std::shared_ptr<client::Connection> connection;
  std::vector<transfer::Source> sources;
  bool json = false;
  /// "service" or "queue", and its name: the heading of the lines.
  std::string kind;
  std::string name;
  nlohmann::json queues = nlohmann::json::array();
  std::function<void(int)> done;
  size_t next = 0;

  void look_up_next() {
    if (next == 0 && !json) std::cout << kind << " " << name << ":\n";
    if (next == sources.size()) return done(exit_ok);
    const transfer::Source source = sources[next++];
    client::look_up_queue(
        connection, source.queue,
        [self = shared_from_this(), source](const client::Error& error,
                                            const client::QueueInfo& info) {
          if (error && error.reply_code != 404) {
            return self->done(
                error_exit(error, "looking " + source.queue + " up on the old broker"));
          }
          self->found(source, error ? std::nullopt : std::optional<uint64_t>(info.message_count));
        });
  }

  void found(const transfer::Source& source, std::optional<uint64_t> depth) {
    // A delay level and its set's unrouted queue are shared: only those of their messages
    // routed to the service move.
    const bool shared = source.kind == transfer::Source::Kind::delay_level ||
                        source.kind == transfer::Source::Kind::unrouted;
    queues.push_back({{"queue", source.queue},
                      {"kind", kind_text(source.kind)},
                      {"messages", depth.value_or(0)},
                      {"shared", shared},
                      {"exists", depth.has_value()}});
    if (!json) {
      std::cout << "  " << source.queue << " (" << kind_text(source.kind) << "): ";
      if (!depth) {
        std::cout << "not on the old broker";
      } else if (shared) {
        std::cout << plural(*depth, "message") << ", of which those for this " << kind << " move";
      } else {
        std::cout << plural(*depth, "message") << " to move";
      }
      std::cout << "\n";
    }
    look_up_next();
  }
};

/// Starts the dry run of a service or a scheduled queue (`kind`), which adds its entry to `out`.
void start_dry_run(const std::shared_ptr<client::Connection>& connection,
                   std::vector<transfer::Source> sources, bool json, const std::string& kind,
                   const std::string& name, Results& results, std::function<void(int)> done) {
  auto dry_run = std::make_shared<DryRun>();
  dry_run->connection = connection;
  dry_run->sources = std::move(sources);
  dry_run->json = json;
  dry_run->kind = kind;
  dry_run->name = name;
  dry_run->done = [dry_run = dry_run.get(), &results, done](int code) {
    results.of(dry_run->kind)
        .push_back({{dry_run->kind, dry_run->name}, {"queues", dry_run->queues}});
    done(code);
  };
  dry_run->look_up_next();
}

/// Starts a transfer (transfer::transfer_service or transfer_scheduled_queue) with these events
/// and callback.
using TransferStarter =
    std::function<client::Error(transfer::TransferEvents events, transfer::TransferCallback done,
                                std::shared_ptr<transfer::Transfer>* handle)>;

/// What one transfer of the command moves: a service, or a scheduled queue no service declares.
struct Target {
  /// "service" or "queue": the key of its JSON entry, and the word its lines use.
  std::string kind;
  std::string name;
  TransferStarter start;
};

/// The transfer proper, once both brokers are connected and the target applied on the new one.
void start_transfer(const TransferArgs& args, const Target& target, Results& results,
                    const std::shared_ptr<client::Connection>& old_broker,
                    const std::shared_ptr<client::Connection>& new_broker,
                    std::function<void(int)> finish) {
  auto handle = std::make_shared<std::shared_ptr<transfer::Transfer>>();
  auto interrupts = settle_on_interrupt(
      old_broker->loop(),
      [handle] {
        if (*handle) (*handle)->stop();
      },
      [old_broker, new_broker] {
        old_broker->close();
        new_broker->close();
      });
  auto reads = std::make_shared<nlohmann::json>(nlohmann::json::array());
  transfer::TransferEvents events;
  events.read = [&args, reads](const transfer::SourceResult& read, int pass) {
    reads->push_back(read_json(read, pass));
    if (!args.json && (pass == 1 || read.progress.scanned > 0)) {
      std::cout << (pass > 1 ? "pass " + std::to_string(pass) + ": " : std::string())
                << read_text(read) << std::endl;
    }
  };
  events.idle = [&args](std::chrono::milliseconds empty_for) {
    if (!args.json && empty_for.count() == 0) {
      std::cout << "every old queue is empty; following until they have been for " << args.settle
                << std::endl;
    }
  };
  const std::string what = target.kind + " " + target.name;
  client::Error error = target.start(
      std::move(events),
      [&args, &results, target, what, finish, interrupts, reads](
          const client::Error& error, const transfer::TransferResult& result) {
        interrupts->close();
        nlohmann::json entry = {
            {target.kind, target.name},          {"id", result.id},     {"passes", result.passes},
            {"moved", result.moved()},           {"left", result.left}, {"stuck", result.stuck},
            {"interrupted", result.interrupted}, {"reads", *reads}};
        if (error || result.stuck > 0) {
          entry["result"] = "unfinished";
          if (error) entry["error"] = error.message();
          if (args.json) results.of(target.kind).push_back(entry);
          if (error) {
            return finish(error_exit(
                error,
                "transferring " + what + " (run `retryloop topology transfer` again to finish)"));
          }
          std::cerr << "retryloop: transferring " << what << ": " << plural(result.stuck, "message")
                    << " stayed on the old broker: the new broker refused their copies, or "
                       "their properties could not be read (see each queue's line)\n";
          return finish(exit_broker_refused);
        }
        entry["result"] = result.interrupted ? "interrupted" : "transferred";
        if (result.interrupted) results.interrupted = true;
        if (args.json) {
          results.of(target.kind).push_back(entry);
        } else {
          std::cout << what << (result.interrupted ? " interrupted: " : " transferred: ")
                    << plural(result.moved(), "message") << " moved";
          if (result.left > 0) {
            std::cout << ", " << plural(result.left, "retry", "retries")
                      << " left on the old broker to come due there (run again, or "
                         "with --follow, to move them then)";
          }
          std::cout << std::endl;
        }
        finish(exit_ok);
      },
      handle.get());
  if (error) {
    interrupts->close();
    finish(error_exit(error, "transferring " + what));
  }
}

transfer::TransferOptions transfer_options(const TransferArgs& args,
                                           const std::optional<topology::Schedule>& schedule) {
  transfer::TransferOptions options;
  options.schedule = schedule;
  options.follow = args.follow;
  options.settle = duration_or_fail("--settle", args.settle);
  options.precision = duration_or_fail("--precision", args.precision);
  if (options.precision.count() <= 0) throw Failure(exit_usage, "--precision must be above 0");
  return options;
}

int run_service(const TransferArgs& args, const topology::Service& service,
                const std::optional<topology::Schedule>& schedule, Results& results) {
  const client::Uri new_uri = parse_url(args.to);
  const transfer::TransferOptions options = transfer_options(args, schedule);
  return with_connection(parse_url(args.connection), [&](const auto& old_broker, auto done) {
    unless_migrating(old_broker, "old", service, args.file, done, [&, old_broker, done] {
      if (args.dry_run) {
        return start_dry_run(
            old_broker,
            transfer::transfer_sources(service, transfer::level_ladders(service, schedule)),
            args.json, "service", service.name, results, done);
      }
      with_new_broker(
          old_broker, new_uri, done, [&, old_broker](const auto& new_broker, auto finish) {
            unless_migrating(
                new_broker, "new", service, args.file, finish, [&, old_broker, new_broker, finish] {
                  apply_service_on_new(
                      new_broker, service, schedule, args.file, finish,
                      [&, old_broker, new_broker, finish] {
                        Target target{
                            "service", service.name,
                            [&, old_broker, new_broker](auto events, auto done, auto handle) {
                              return transfer::transfer_service(old_broker, new_broker, service,
                                                                options, std::move(events),
                                                                std::move(done), handle);
                            }};
                        start_transfer(args, target, results, old_broker, new_broker, finish);
                      });
                });
          });
    });
  });
}

/// A scheduled queue no service declares: its messages, and what the levels hold for it.
int run_queue(const TransferArgs& args, const std::string& queue,
              const std::optional<topology::Schedule>& schedule, Results& results) {
  const client::Uri new_uri = parse_url(args.to);
  const transfer::TransferOptions options = transfer_options(args, schedule);
  return with_connection(parse_url(args.connection), [&](const auto& old_broker, auto done) {
    if (args.dry_run) {
      return start_dry_run(
          old_broker,
          transfer::scheduled_queue_sources(queue, transfer::queue_level_ladders(queue, schedule)),
          args.json, "queue", queue, results, done);
    }
    with_new_broker(
        old_broker, new_uri, done, [&, old_broker](const auto& new_broker, auto finish) {
          topology::Topology one;
          one.schedule = transfer::queue_schedule(queue, schedule);
          apply_on_new(new_broker, one, "queue " + queue,
                       "the levels exist on the new broker with other arguments: make them "
                       "match FILE's delay_levels there first",
                       queue +
                           " must exist on the new broker before its messages can move: "
                           "FILE's delay_levels names it and no service of FILE declares "
                           "it, so its owner declares it there (--service moves only the "
                           "services)",
                       finish, [&, old_broker, new_broker, finish] {
                         Target target{
                             "queue", queue,
                             [&, old_broker, new_broker](auto events, auto done, auto handle) {
                               return transfer::transfer_scheduled_queue(
                                   old_broker, new_broker, queue, options, std::move(events),
                                   std::move(done), handle);
                             }};
                         start_transfer(args, target, results, old_broker, new_broker, finish);
                       });
        });
  });
}

/// The scheduled queues no service declares that the run moves: those of --queue (each must be
/// one), or every one when neither --service nor --queue is given.
std::vector<std::string> queues_to_move(const TransferArgs& args,
                                        const topology::Topology& topology) {
  const std::vector<std::string> unowned = transfer::unowned_scheduled_queues(topology);
  if (args.queues.empty()) return args.services.empty() ? unowned : std::vector<std::string>{};
  for (const std::string& queue : args.queues) {
    if (std::find(unowned.begin(), unowned.end(), queue) != unowned.end()) continue;
    for (const topology::Service& service : topology.services) {
      if (topology::input_queue_name(service) == queue) {
        throw Failure(exit_usage, "--queue " + queue + ": service " + service.name +
                                      " of FILE declares it; use --service " + service.name);
      }
    }
    throw Failure(exit_usage,
                  "--queue " + queue + ": FILE's delay_levels does not name it (its `queues`)");
  }
  return args.queues;
}

int run_transfer(const TransferArgs& args) {
  const topology::Topology whole = load_topology_or_fail(args.file, {});
  const std::vector<std::string> queues = queues_to_move(args, whole);
  // --queue alone moves no service.
  const std::vector<topology::Service> services =
      args.services.empty() && !args.queues.empty()
          ? std::vector<topology::Service>{}
          : select_services_or_fail(whole, args.services).services;
  Results results;
  int code = exit_ok;
  for (size_t i = 0; code == exit_ok && !results.interrupted && i < services.size(); ++i)
    code = run_service(args, services[i], whole.schedule, results);
  for (size_t i = 0; code == exit_ok && !results.interrupted && i < queues.size(); ++i)
    code = run_queue(args, queues[i], whole.schedule, results);
  if (args.json) {
    std::cout << dump(nlohmann::json{{"services", results.services}, {"queues", results.queues}})
              << "\n";
  }
  return code;
}

}  // namespace

std::string read_text(const transfer::SourceResult& read) {
  std::string text = read.source.queue + ": " + plural(read.progress.moved, "message") + " moved";
  const bool waiting = read.source.kind == transfer::Source::Kind::wait_queue ||
                       read.source.kind == transfer::Source::Kind::delay_level;
  if (waiting && read.progress.moved > 0) {
    text += " (" + std::to_string(read.to_queue) + " due already, " +
            std::to_string(read.to_levels) + " through the levels";
    if (read.to_levels > 0) {
      text += ", the longest " + topology::duration_label(read.longest_delay);
    }
    if (read.due_unknown > 0) {
      text += "; " + std::to_string(read.due_unknown) +
              " did not say when they were due and wait " +
              (read.source.kind == transfer::Source::Kind::wait_queue
                   ? "their whole delay again"
                   : "the longest they could still have waited");
    }
    text += ")";
  }
  if (read.left > 0) {
    text += ", " + std::to_string(read.left) + " left to come due there";
  }
  if (read.others > 0) {
    text += ", " + plural(read.others, "message") + " of other queues left in place";
  }
  if (read.progress.failed > 0) {
    text += ", " + std::to_string(read.progress.failed) +
            " refused by the new broker (left where they were)";
  }
  if (read.undecodable > 0) {
    text += ", " + std::to_string(read.undecodable) +
            " whose properties could not be read (left where they were)";
  }
  return text;
}

void add_transfer_command(CLI::App& topology_group, int& exit_code) {
  auto args = std::make_shared<TransferArgs>();
  CLI::App* command = topology_group.add_subcommand(
      "transfer", "Move services' messages to another broker, with their retries' timing kept");
  command->footer(wrap(
      "Applies each service of FILE on the new broker (--to), then moves its messages there from "
      "the old one (--url): the service queue's in order, each waiting retry and each message "
      "scheduled for it through delay levels for what is left of its delay (never less), and "
      "the parking queue's as they are; then each queue of FILE's delay_levels that no service "
      "declares, with what the levels hold for it. "
      "Each copy is confirmed on the new broker before its original is acked on the old one. "
      "With --follow it keeps moving what still arrives on the old broker until its queues have "
      "been empty for --settle, or Ctrl-C. A second transfer of a service is refused while one "
      "runs. See docs/transfer.md."));
  command->add_option("FILE", args->file, "Topology file (JSON; see docs/topology.md)")
      ->required()
      ->type_name("");
  command->add_option("--to", args->to.url, "The new broker's URL (as --url)")
      ->required()
      ->type_name("URL");
  command
      ->add_option("--service", args->services,
                   "Only this service (repeat for several); default: every service in FILE, "
                   "or none when --queue is given")
      ->type_name("NAME")
      ->allow_extra_args(false);
  command
      ->add_option("--queue", args->queues,
                   "Only this scheduled queue that no service of FILE declares (one its "
                   "delay_levels names; repeat for several): its messages and those the levels "
                   "hold for it; default, without --service: every such queue")
      ->type_name("QUEUE")
      ->allow_extra_args(false);
  command->add_flag("--follow", args->follow,
                    "Keep moving what arrives on the old broker (publishers not yet switched, "
                    "retries coming due there) until its queues have been empty for --settle");
  command
      ->add_option("--settle", args->settle,
                   "With --follow: how long the old queues must stay "
                   "empty before it ends (default 10s)")
      ->type_name("DURATION");
  command
      ->add_option("--precision", args->precision,
                   "The base of the levels moved retries wait in on the new broker (default "
                   "100ms): a retry comes back at most this much after it was due, plus the "
                   "broker's few milliseconds per level")
      ->type_name("DURATION");
  command->add_flag("--dry-run", args->dry_run,
                    "Print each old queue and how many messages it would move; change nothing");
  command->add_flag("--json", args->json, "Print the result as JSON");
  add_connection_option(*command, args->connection);
  command->callback([args, &exit_code] { exit_code = run_transfer(*args); });
}

}  // namespace retryloop::cli
