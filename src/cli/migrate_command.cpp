// retryloop topology migrate: output and exit codes only; the plan is the migrate layer's, the
// work the migrator's (docs/migrate.md).

#include "migrate_command.hpp"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "retryloop/migrate/driver.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/topology_json.hpp"
#include "schedule_command.hpp"

namespace retryloop::cli {
namespace {

struct MigrateArgs {
  std::string file;
  std::vector<std::string> services;
  /// The file the services were applied from, to find the delay levels FILE removes.
  std::string from;
  bool dry_run = false;
  bool json = false;
  ConnectionArgs connection;
};

/// What a dry run and a run estimate with: the moves of a migration on one broker node moved 7,000
/// to 23,000 messages a second (docs/migrate.md has the measured figures).
constexpr double assumed_rate = 7000;

const char* const migrate_exit_codes_help =
    "Exit codes:\n"
    "  0  migrated (or nothing differed); with --dry-run, the plan was printed\n"
    "  1  usage error (unknown option, missing argument, bad URL, a service the file does not "
    "have)\n"
    "  2  the topology file is unreadable or invalid\n"
    "  3  a change was refused (the reason and the manual steps are printed), another migrate of "
    "the service is running, or a step failed: run it again to finish\n"
    "  4  could not connect to the broker, or the connection failed midway: run it again to "
    "finish";

std::vector<std::chrono::milliseconds> old_delays(const MigrateArgs& args,
                                                  const std::string& service) {
  std::vector<std::chrono::milliseconds> delays;
  if (args.from.empty()) return delays;
  const topology::Topology old = load_topology_or_fail(args.from, {});
  for (const topology::Service& s : old.services) {
    if (s.name != service) continue;
    for (std::chrono::milliseconds delay : s.retry.delays)
      delays.push_back(delay);
  }
  return delays;
}

void print_refusals(const migrate::MigrationPlan& plan) {
  for (const migrate::Refusal& refusal : plan.refused) {
    std::cout << "refused: " << refusal.object << ": " << refusal.reason << "\n"
              << "  instead: " << refusal.manual_steps << "\n";
  }
}

/// The estimate as a person reads one: whole seconds rounded up ("about 3s", not "about 2169ms"),
/// whole minutes from ten minutes on.
std::string estimate_text(const migrate::MigrationPlan& plan) {
  using std::chrono::milliseconds;
  const int64_t ms = migrate::estimate(plan, assumed_rate).count();
  const int64_t unit = ms >= 600'000 ? 60'000 : 1000;
  return topology::duration_label(
      milliseconds(std::max<int64_t>(1, (ms + unit - 1) / unit) * unit));
}

void print_plan(const migrate::MigrationPlan& plan, bool resumed, size_t next_step) {
  if (plan.empty() && plan.refused.empty()) {
    std::cout << "service " << plan.service << ": the broker has what the file wants; nothing to "
              << "migrate\n";
    return;
  }
  print_refusals(plan);
  if (!plan.refused.empty()) return;
  std::cout << "service " << plan.service << ": " << plural(plan.steps.size(), "step") << ", "
            << plan.messages_to_move << " messages to move, about " << estimate_text(plan)
            << (resumed
                    ? " (an unfinished migration, from step " + std::to_string(next_step + 1) + ")"
                    : std::string())
            << "\n";
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const migrate::Step& step = plan.steps[i];
    std::cout << (i < next_step ? "  done " : "       ") << i + 1 << ". " << describe(step) << "  ("
              << step.why << ")\n";
  }
}

nlohmann::json plan_json(const migrate::MigrationPlan& plan, bool resumed, size_t next_step) {
  nlohmann::json out = migrate::to_json(plan);
  out["resumed"] = resumed;
  out["next_step"] = next_step;
  out["estimate"] = estimate_text(plan);
  return out;
}

/// --dry-run: the survey, or the unfinished migration's record, and its plan; nothing changes.
int dry_run(const MigrateArgs& args, const topology::Service& service, nlohmann::json& out) {
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    client::Error error = migrate::read_record(
        connection, service.name,
        [&, connection, done](const client::Error& error,
                              const std::optional<migrate::Record>& record) {
          if (error) return done(error_exit(error, "reading " + service.name + "'s migration"));
          if (record && !record->finished) {
            const migrate::MigrationPlan plan =
                migrate::make_migration_plan(service, record->survey);
            if (args.json) {
              out.push_back(plan_json(plan, true, record->next_step));
            } else {
              print_plan(plan, true, record->next_step);
            }
            return done(exit_ok);
          }
          client::Error surveyed = migrate::survey(
              connection, service, old_delays(args, service.name),
              [&, done](const client::Error& error, const migrate::Survey& survey) {
                if (error) return done(error_exit(error, "looking at " + service.name));
                const migrate::MigrationPlan plan = migrate::make_migration_plan(service, survey);
                if (args.json) {
                  out.push_back(plan_json(plan, false, 0));
                } else {
                  print_plan(plan, false, 0);
                }
                done(plan.refused.empty() ? exit_ok : exit_broker_refused);
              });
          if (surveyed) done(error_exit(surveyed, "looking at " + service.name));
        });
    if (error) done(error_exit(error, "reading " + service.name + "'s migration"));
  });
}

/// A progress line per step; on a terminal, the current step's line is rewritten as it goes.
class StepPrinter {
 public:
  explicit StepPrinter(bool quiet) : quiet_(quiet), terminal_(isatty(STDOUT_FILENO) == 1) {}

  void started(const migrate::Migration& migration, const migrate::Step& step) {
    if (quiet_) return;
    line(migration, step, "...");
  }
  /// On a terminal, the move's line with a bar, redrawn at most 10 times a second.
  void moving(const migrate::Migration& migration, const migrate::Step& step, uint64_t moved,
              uint64_t total) {
    if (quiet_ || !terminal_) return;
    const int64_t now = now_ms();
    if (now - last_drawn_ms_ < 100 && moved < total) return;
    last_drawn_ms_ = now;
    line(migration, step, progress_bar(moved, total, 30));
  }
  void moved(const migrate::Migration& migration, const migrate::Step& step, uint64_t moved) {
    if (quiet_) return;
    line(migration, step, "moved " + std::to_string(moved));
    if (terminal_) std::cout << "\n";
  }
  void waiting(const migrate::Migration& migration, const migrate::Step& step, uint64_t messages,
               uint32_t consumers) {
    if (quiet_) return;
    const auto waited = migration.draining_for(now_ms()) / std::chrono::seconds(10);
    if (!terminal_ && waited == last_waited_) return;  // a line per 10 s when not a terminal
    last_waited_ = waited;
    line(migration, step,
         "waiting: " + std::to_string(messages) + " messages, " + std::to_string(consumers) +
             " consumers, for " + topology::duration_label(migration.draining_for(now_ms())));
  }
  void done(const migrate::Migration& migration, const migrate::Step& step) {
    if (quiet_) return;
    line(migration, step, "done");
    if (terminal_) std::cout << "\n";
    last_waited_ = -1;
  }

 private:
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void line(const migrate::Migration& migration, const migrate::Step& step,
            const std::string& state) {
    const size_t index = &step - migration.plan().steps.data();
    const std::string text = "[" + std::to_string(index + 1) + "/" +
                             std::to_string(migration.plan().steps.size()) + "] " + describe(step) +
                             ": " + state;
    if (terminal_) {
      std::cout << "\r\033[K" << text << std::flush;
    } else {
      std::cout << text << std::endl;  // a line as each step goes, through a pipe too
    }
  }

  bool quiet_;
  bool terminal_;
  int64_t last_waited_ = -1;
  int64_t last_drawn_ms_ = 0;
};

int run(const MigrateArgs& args, const topology::Service& service, nlohmann::json& out) {
  StepPrinter printer(args.json);
  migrate::DriverOptions options;
  options.old_delays = old_delays(args, service.name);
  migrate::DriverEvents events;
  events.planned = [&](const migrate::Migration& migration, bool resumed) {
    if (!args.json) print_plan(migration.plan(), resumed, migration.current_index());
  };
  events.step_started = [&](const auto& migration, const auto& step) {
    printer.started(migration, step);
  };
  events.step_done = [&](const auto& migration, const auto& step) {
    printer.done(migration, step);
  };
  events.moved = [&](const auto& migration, const auto& step, uint64_t moved) {
    printer.moved(migration, step, moved);
  };
  events.moving = [&](const auto& migration, const auto& step, uint64_t moved, uint64_t total) {
    printer.moving(migration, step, moved, total);
  };
  events.waiting = [&](const auto& migration, const auto& step, uint64_t messages,
                       uint32_t consumers) {
    printer.waiting(migration, step, messages, consumers);
  };
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    migrate::Driver::start(
        connection, service, std::move(options), std::move(events),
        [&, done](const client::Error& error, const migrate::Migration* migration, bool refused) {
          nlohmann::json result = {{"service", service.name}};
          if (migration != nullptr) {
            result["plan"] = plan_json(migration->plan(), false, migration->current_index());
            result["steps_done"] = migration->current_index();
            result["moved"] = migration->record().moved;
          }
          if (refused) {
            if (args.json) {
              result["result"] = "refused";
              out.push_back(result);
            } else if (migration != nullptr) {
              print_refusals(migration->plan());
            }
            return done(exit_broker_refused);
          }
          if (error) {
            result["result"] = "unfinished";
            result["error"] = error.message();
            if (args.json) out.push_back(result);
            return done(
                error_exit(error, "migrating " + service.name +
                                      " (run `retryloop topology migrate` again to finish)"));
          }
          result["result"] =
              migration != nullptr && !migration->plan().empty() ? "migrated" : "nothing to do";
          if (args.json) {
            out.push_back(result);
          } else if (migration != nullptr && !migration->plan().empty()) {
            std::cout << "service " << service.name << " migrated: " << migration->record().moved
                      << " messages moved\n";
          }
          done(exit_ok);
        });
  });
}

int run_migrate(const MigrateArgs& args) {
  return run_per_service(args.file, args.services, args.json,
                         [&args](const topology::Service& service, nlohmann::json& out) {
                           return args.dry_run ? dry_run(args, service, out)
                                               : run(args, service, out);
                         });
}

}  // namespace

void add_migrate_command(CLI::App& topology_group, int& exit_code) {
  auto args = std::make_shared<MigrateArgs>();
  CLI::App* command = topology_group.add_subcommand(
      "migrate", "Change what apply refuses to change, with the service handling (live)");
  command->footer(
      wrap("Compares the broker with FILE and changes each service's objects to what the file "
           "says: a service or parking queue's type and arguments through a holding queue, "
           "delay levels added, changed or removed (their retries come back at their due "
           "times). Each step is recorded on the broker, so a migrate that was killed finishes "
           "when run again; a second migrate of the same service is refused while one runs. "
           "See docs/migrate.md.") +
      "\n\n" + migrate_exit_codes_help);
  command->add_option("FILE", args->file, "Topology file (JSON; see docs/topology.md)")
      ->required()
      ->type_name("");
  command
      ->add_option("--service", args->services,
                   "Only this service (repeat for several); default: every service in FILE")
      ->type_name("NAME")
      ->allow_extra_args(false);
  command
      ->add_option("--from", args->from,
                   "The file the services were applied from: its delay levels that FILE no "
                   "longer has are retired")
      ->type_name("OLDFILE");
  command->add_flag("--dry-run", args->dry_run,
                    "Print each step, the objects it touches, the messages it moves and how long "
                    "it should take; change nothing");
  command->add_flag("--json", args->json, "Print the plan or the result as JSON");
  add_connection_option(*command, args->connection);
  command->callback([args, &exit_code] { exit_code = run_migrate(*args); });
}

namespace {

/// Reads the services' records one after another.
struct UnfinishedReader : std::enable_shared_from_this<UnfinishedReader> {
  std::shared_ptr<client::Connection> connection;
  std::vector<std::string> services;
  std::map<std::string, migrate::Record> unfinished;
  UnfinishedCallback done;
  size_t next = 0;

  void read_next() {
    if (next == services.size()) {
      UnfinishedCallback finished = std::move(done);
      return finished(std::move(unfinished));
    }
    const std::string service = services[next++];
    const client::Error error = migrate::read_record(
        connection, service,
        [self = shared_from_this(), service](const client::Error& error,
                                             const std::optional<migrate::Record>& record) {
          if (!error && record && !record->finished) self->unfinished[service] = *record;
          self->read_next();
        });
    if (error) read_next();
  }
};

}  // namespace

void read_unfinished_migrations(const std::shared_ptr<client::Connection>& connection,
                                std::vector<std::string> services, UnfinishedCallback done) {
  auto reader = std::make_shared<UnfinishedReader>();
  reader->connection = connection;
  reader->services = std::move(services);
  reader->done = std::move(done);
  reader->read_next();
}

std::string progress_bar(uint64_t done, uint64_t total, int width) {
  width = std::max(width, 1);
  const uint64_t shown = total == 0 ? 0 : std::min(done, total);
  const int filled = total == 0 ? 0 : int(shown * uint64_t(width) / total);
  const int percent = total == 0 ? 0 : int(shown * 100 / total);
  std::string bar = "[" + std::string(size_t(filled), '#') +
                    std::string(size_t(width - filled), '.') + "] " + std::to_string(percent) +
                    "% " + std::to_string(done) + " of " + std::to_string(total);
  return bar;
}

std::string unfinished_text(const migrate::Record& record, const std::string& file) {
  std::string text = "migration " + record.id + " of " + record.service + ", at step " +
                     std::to_string(record.next_step + 1) + ", begun " +
                     iso_time_ms(record.started_at_ms);
  if (!record.holding.empty()) text += ", the instances consuming " + record.holding;
  return text + ": run `retryloop topology migrate " + file + " --service " + record.service +
         "` to finish it";
}

nlohmann::json unfinished_json(const migrate::Record& record) {
  return {{"id", record.id},
          {"next_step", record.next_step},
          {"started_at", iso_time_ms(record.started_at_ms)},
          {"updated_at", iso_time_ms(record.updated_at_ms)},
          {"moved", record.moved},
          {"holding",
           record.holding.empty() ? nlohmann::json(nullptr) : nlohmann::json(record.holding)}};
}

}  // namespace retryloop::cli
