// retryloop parking list|stats|replay|purge: output and exit codes only; the work is done by
// retryloop::parking.

#include "parking_command.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <uv.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "retryloop/console/console.hpp"
#include "retryloop/parking/audit.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::cli {

namespace {

/// Exit codes of the parking commands beyond the shared ones.
constexpr int exit_above_threshold = 5;
constexpr int exit_interrupted = 130;

const char* const parking_exit_codes_help =
    "Exit codes:\n"
    "  0    success\n"
    "  1    usage error (unknown option, missing argument, bad --url, purge without --yes)\n"
    "  2    the topology file is unreadable or invalid\n"
    "  3    the broker refused (no parking queue, no target queue), or copies failed (replay),\n"
    "       or serve: the parking queue lacks retryloop's delivery limit\n"
    "  4    cannot connect to the broker, or the connection failed\n"
    "  5    stats --fail-above: the parking depth is above the threshold\n"
    "  6    standard output could not be written (a closed pipe, a full disk): the command\n"
    "       ran, its output is incomplete\n"
    "  130  replay or purge interrupted (Ctrl-C); what was confirmed stays moved";

struct ParkingArgs {
  std::string topology_file;
  std::string service;
  ConnectionArgs connection;
  size_t limit = 0;
  bool json = false;
  int64_t fail_above = -1;
  std::vector<std::string> where;
  std::string older_than;
  std::vector<std::string> reasons;
  std::string cause;
  bool exact = false;
  std::string to_queue;
  bool dry_run = false;
  bool unrouted_retries = false;
  bool yes = false;
  uint16_t window = parking::default_window;
  std::string listen = "127.0.0.1:8080";
  std::string token;
  std::string token_file;
  std::string tokens_file;
  std::string audit_key_file;
  bool allow_counted_reads = false;
  std::string rescan_after = "30s";
};

/// Prints parked messages as they are read: JSON lines, or a table whose column widths the first
/// rows set, so that a listing of any length takes the same memory.
class MessagePrinter {
 public:
  explicit MessagePrinter(bool json) : json_(json) {
    head_.add({"#", "MESSAGE ID", "PARKED (UTC)", "AGE", "REASON", "ATTEMPTS", "ERROR", "FROM",
               "SIZE", "BODY"});
  }

  void add(const parking::ParkedMessage& parked) {
    ++count_;
    if (json_) {
      std::cout << dump(parking::message_json(parked, now_)) << "\n";
      return;
    }
    std::vector<std::string> row = cells(parked);
    if (widths_.empty()) {
      head_.add(std::move(row));
      if (count_ == rows_that_set_widths) flush();
    } else {
      Table::print_row(std::cout, row, widths_, "");
    }
  }

  /// Prints the rows still held; call once all are added.
  void finish() {
    if (!json_ && widths_.empty() && count_ > 0) flush();
  }
  size_t count() const { return count_; }

 private:
  static constexpr size_t rows_that_set_widths = 1000;

  void flush() {
    widths_ = head_.widths();
    head_.print(std::cout, "");
    head_ = Table();
  }

  std::vector<std::string> cells(const parking::ParkedMessage& parked) const {
    const bool dated = parked.parked_at && *parked.parked_at <= now_;
    return {
        std::to_string(parked.position + 1),
        preview(parked.message_id, 36),
        parked.parked_at ? iso_time(*parked.parked_at) : "-",
        dated ? age_text(now_ - *parked.parked_at) : "-",
        parked.reason.empty() ? "-" : parked.reason,
        parked.attempts ? std::to_string(*parked.attempts) : "-",
        parked.error.empty() ? "-" : preview(parked.error, 40),
        parked.original_exchange.empty() && parked.original_routing_key.empty()
            ? "-"
            : preview((parked.original_exchange.empty() ? "(default)" : parked.original_exchange) +
                          " / " + parked.original_routing_key,
                      40),
        std::to_string(parked.message.body.size()),
        preview(parked.message.body, 40)};
  }

  bool json_;
  uint64_t now_ = retry::unix_seconds();
  size_t count_ = 0;
  Table head_;
  std::vector<size_t> widths_;
};

// ---- commands ----------------------------------------------------------------------------

/// Whether the topology file declares the audit stream (a top-level `audit`).
bool audit_declared(const ParkingArgs& args) {
  return load_topology_or_fail(args.topology_file, {}).audit.has_value();
}

/// The command line's filter as the audit trail records it.
nlohmann::json filter_json(const ParkingArgs& args) {
  nlohmann::json out = nlohmann::json::object();
  if (!args.where.empty()) out["where"] = args.where;
  if (!args.older_than.empty()) out["older_than"] = args.older_than;
  if (!args.reasons.empty()) out["reasons"] = args.reasons;
  if (!args.cause.empty()) out[args.exact ? "error_first_line" : "error_cause"] = args.cause;
  if (args.limit != 0) out["limit"] = args.limit;
  if (args.unrouted_retries) out["unrouted_retries"] = true;
  if (!args.to_queue.empty()) out["to_queue"] = args.to_queue;
  return out;
}

/// A replay or purge of the command line in the audit trail: a `started` record before it
/// touches a message (on a confirm channel of its own), and one with its counts at the end.
class CliAudit {
 public:
  using Then = std::function<void(const std::string& error)>;

  CliAudit(std::string action, std::string service, nlohmann::json filter, std::string key)
      : key_(std::move(key)) {
    record_.who = parking::command_line_user();
    record_.via = "cli";
    record_.action = std::move(action);
    record_.service = std::move(service);
    record_.filter = std::move(filter);
  }

  /// Records `started`; `then` gets "" once the broker confirmed it.
  void begin(const std::shared_ptr<client::Connection>& connection, Then then) {
    record_.id = random::random_id();
    writer_ = parking::AuditWriter::open(connection, {}, key_);
    append("started", std::move(then));
  }

  /// Records how it ended; `then` gets "" once confirmed.
  void end(const char* state, const parking::Progress& progress, const client::Error& failure,
           Then then) {
    record_.done = progress.moved;
    record_.failed = progress.failed;
    record_.error = failure ? failure.message() : std::string();
    append(state, std::move(then));
  }

 private:
  void append(const char* state, Then then) {
    record_.state = state;
    record_.at_ms = retry::unix_milliseconds();
    writer_->append(record_, [then = std::move(then)](const client::Error& error) {
      then(error ? error.message() : std::string());
    });
  }

  parking::AuditRecord record_;
  std::shared_ptr<parking::AuditWriter> writer_;
  std::string key_;
};

/// The audit key of --audit-key, or "" without it.
std::string audit_key(const ParkingArgs& args) {
  if (args.audit_key_file.empty()) return {};
  try {
    return parking::read_audit_key(args.audit_key_file);
  } catch (const std::invalid_argument& e) {
    throw Failure(exit_usage, std::string("--audit-key: ") + e.what());
  }
}

void add_audit_key_option(CLI::App& command, ParkingArgs& args, const char* what) {
  command
      .add_option("--audit-key", args.audit_key_file,
                  std::string("Sign the audit records ") + what +
                      " with the key in FILE (HMAC-SHA256; at least 32 bytes, e.g. `openssl rand "
                      "-hex 32`), which only the consoles and on-call users may read")
      ->envname("RETRYLOOP_AUDIT_KEY_FILE")
      ->type_name("FILE");
}

/// Runs `action` after recording it in the audit trail when the file declares one (otherwise at
/// once); `action` gets a recorder for its end, or nullptr.
void audited(const std::shared_ptr<client::Connection>& connection, bool declared,
             std::shared_ptr<CliAudit> audit, std::function<void(int)> done,
             std::function<void(std::shared_ptr<CliAudit>)> action) {
  if (!declared) return action(nullptr);
  audit->begin(connection, [audit, done, action](const std::string& error) {
    if (!error.empty()) {
      std::cerr << "retryloop: not recorded in the audit trail (" << error
                << "); nothing was done\n";
      return done(exit_broker_refused);
    }
    action(audit);
  });
}

/// Records the end of an audited action (when there is a recorder), then exits with `code`.
void finish_audited(const std::shared_ptr<CliAudit>& audit, const char* state,
                    const parking::Progress& progress, const client::Error& error, int code,
                    const std::function<void(int)>& done) {
  if (!audit) return done(code);
  audit->end(state, progress, error, [code, done](const std::string& failure) {
    if (!failure.empty()) {
      std::cerr << "retryloop: the end was not recorded in the audit trail: " << failure << "\n";
    }
    done(code);
  });
}

topology::Service load_service(const ParkingArgs& args) {
  if (args.topology_file.empty()) {
    throw Failure(exit_usage, "give the topology file with -t FILE or RETRYLOOP_TOPOLOGY");
  }
  return load_topology_or_fail(args.topology_file, {args.service}).services.at(0);
}

parking::Filter make_filter(const ParkingArgs& args) {
  parking::Filter filter;
  for (const auto& where : args.where) {
    try {
      filter.where.push_back(parking::parse_where(where));
    } catch (const std::invalid_argument& e) {
      throw Failure(exit_usage, e.what());
    }
  }
  if (!args.older_than.empty()) {
    std::string why;
    auto duration = topology::parse_duration(args.older_than, &why);
    if (!duration) throw Failure(exit_usage, "--older-than \"" + args.older_than + "\" " + why);
    filter.older_than = duration;
  }
  for (const auto& reason : args.reasons) {
    const std::vector<std::string> known = {
        retry::to_string(retry::ParkReason::exhausted),
        retry::to_string(retry::ParkReason::permanent), retry::to_string(retry::ParkReason::poison),
        retry::to_string(retry::ParkReason::delivery_limit), parking::unrouted_reason};
    if (std::find(known.begin(), known.end(), reason) == known.end()) {
      throw Failure(exit_usage, "--reason \"" + reason + "\" is not one of " + join(known));
    }
  }
  filter.reasons = args.reasons;
  if (!args.cause.empty()) filter.error_fingerprint = args.cause == "(none)" ? "" : args.cause;
  return filter;
}

/// Exit code for an operation's error: a connection failure is 4, the rest 3.
int run_list(const ParkingArgs& args) {
  const topology::Service service = load_service(args);
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    auto printer = std::make_shared<MessagePrinter>(args.json);
    parking::ListOptions options;
    options.limit = args.limit;
    options.on_message = [printer](parking::ParkedMessage& parked) { printer->add(parked); };
    client::Error error =
        parking::list(connection, service, options,
                      [&args, &service, done, printer](const client::Error& error,
                                                       std::vector<parking::ParkedMessage>) {
                        printer->finish();
                        if (error) return done(error_exit(error, "parking list " + service.name));
                        if (printer->count() == 0 && !args.json) {
                          std::cout << "parking queue "
                                    << topology::parking_queue_name(service.name) << " is empty\n";
                        }
                        done(exit_ok);
                      });
    if (error) done(error_exit(error, "parking list"));
  });
}

int run_stats(const ParkingArgs& args) {
  const topology::Service service = load_service(args);
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    client::Error error = parking::stats(
        connection, service,
        [&args, &service, done](const client::Error& error, const parking::Stats& stats) {
          if (error) return done(error_exit(error, "parking stats " + service.name));
          const uint64_t now = retry::unix_seconds();
          const std::string queue = topology::parking_queue_name(service.name);
          std::optional<uint64_t> age;
          if (stats.oldest_parked_at && *stats.oldest_parked_at <= now) {
            age = now - *stats.oldest_parked_at;
          }
          if (args.json) {
            nlohmann::json out;
            out["service"] = service.name;
            out["queue"] = queue;
            out["depth"] = stats.depth;
            out["scanned"] = stats.scanned;
            out["oldest_parked_at"] = stats.oldest_parked_at
                                          ? nlohmann::json(iso_time(*stats.oldest_parked_at))
                                          : nullptr;
            out["oldest_age_seconds"] = age ? nlohmann::json(*age) : nullptr;
            out["by_reason"] = stats.by_reason;
            out["by_error"] = nlohmann::json::array();
            for (const auto& [text, count] : stats.by_error) {
              out["by_error"].push_back({{"error", text}, {"count", count}});
            }
            out["by_cause"] = nlohmann::json::array();
            for (const auto& cause : stats.by_cause) {
              out["by_cause"].push_back({{"cause", cause.fingerprint},
                                         {"count", cause.count},
                                         {"distinct", cause.distinct},
                                         {"example", cause.example}});
            }
            out["loop_depths"] = stats.loop_depths;
            out["loop_not_permitted"] = stats.loop_not_permitted;
            std::cout << dump(out) << "\n";
          } else {
            std::cout << "parking queue " << queue << ": " << plural(stats.depth, "message");
            if (age) {
              std::cout << ", oldest parked " << age_text(*age) << " ago ("
                        << iso_time(*stats.oldest_parked_at) << ")";
            }
            std::cout << "\n";
            if (!stats.by_reason.empty()) {
              Table reasons;
              for (const auto& [reason, count] : stats.by_reason) {
                reasons.add({reason, std::to_string(count)});
              }
              std::cout << "by reason:\n";
              reasons.print(std::cout);
            }
            if (args.exact && !stats.by_error.empty()) {
              Table errors;
              for (const auto& [text, count] : stats.by_error) {
                errors.add({std::to_string(count), preview(text, 100)});
              }
              std::cout << "by error (first line, exactly):\n";
              errors.print(std::cout);
            } else if (!stats.by_cause.empty()) {
              Table causes;
              causes.add({"COUNT", "DISTINCT", "CAUSE", "EXAMPLE"});
              for (const auto& cause : stats.by_cause) {
                causes.add({std::to_string(cause.count), std::to_string(cause.distinct),
                            preview(cause.fingerprint, 70),
                            cause.distinct > 1 ? preview(cause.example, 70) : ""});
              }
              std::cout << "by cause (the error's first line, numbers, ids and quoted values "
                           "masked; --exact for the lines as they are):\n";
              causes.print(std::cout);
            }
            if (!stats.loop_depths.empty()) {
              Table depths;
              for (const auto& [name, depth] : stats.loop_depths) {
                depths.add({name, std::to_string(depth)});
              }
              std::cout << "the service's queues (ready messages):\n";
              depths.print(std::cout);
            }
            if (!stats.loop_not_permitted.empty()) {
              std::cout << "not counted, no permission to look at them (RabbitMQ 4.3 asks for "
                           "any one, read will do):";
              for (const auto& name : stats.loop_not_permitted)
                std::cout << " " << name;
              std::cout << "\n";
            }
          }
          if (args.fail_above >= 0 && int64_t(stats.depth) > args.fail_above) {
            std::cerr << "retryloop: parking depth " << stats.depth << " is above "
                      << args.fail_above << "\n";
            return done(exit_above_threshold);
          }
          done(exit_ok);
        });
    if (error) done(error_exit(error, "parking stats"));
  });
}

/// Shows how a long run goes: a bar on a terminal, a line every 5 s otherwise (on stderr).
class ProgressReporter {
 public:
  ProgressReporter(uv_loop_t* loop, std::string verb) : verb_(std::move(verb)), tty_(isatty(2)) {
    started_ = uv_hrtime();
    uv_timer_init(loop, &timer_);
    timer_.data = this;
    const uint64_t every = tty_ ? 200 : 5000;
    uv_timer_start(
        &timer_, [](uv_timer_t* t) { static_cast<ProgressReporter*>(t->data)->show(false); }, every,
        every);
  }
  void update(const parking::Progress& progress) { progress_ = progress; }
  double seconds() const { return double(uv_hrtime() - started_) / 1e9; }
  void close() {
    if (tty_ && shown_) std::cerr << "\r\033[K";
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  }

 private:
  void show(bool) {
    const double elapsed = seconds();
    const double rate = elapsed > 0 ? double(progress_.scanned) / elapsed : 0;
    char line[256];
    if (tty_) {
      const double fraction =
          progress_.total == 0 ? 1.0 : double(progress_.scanned) / double(progress_.total);
      const int filled = int(fraction * 30);
      std::string bar = std::string(size_t(filled), '#') + std::string(size_t(30 - filled), '.');
      const double eta = rate > 0 ? double(progress_.total - progress_.scanned) / rate : 0;
      std::snprintf(line, sizeof line,
                    "\r[%s] %llu/%llu read, %llu %s, %llu skipped, %llu failed, %.0f msg/s, ETA "
                    "%.0fs\033[K",
                    bar.c_str(), (unsigned long long)progress_.scanned,
                    (unsigned long long)progress_.total, (unsigned long long)progress_.moved,
                    verb_.c_str(), (unsigned long long)progress_.skipped,
                    (unsigned long long)progress_.failed, rate, eta);
      std::cerr << line << std::flush;
    } else {
      std::snprintf(line, sizeof line,
                    "retryloop: %llu/%llu read, %llu %s, %llu skipped, %llu failed (%.0f msg/s)\n",
                    (unsigned long long)progress_.scanned, (unsigned long long)progress_.total,
                    (unsigned long long)progress_.moved, verb_.c_str(),
                    (unsigned long long)progress_.skipped, (unsigned long long)progress_.failed,
                    rate);
      std::cerr << line << std::flush;
    }
    shown_ = true;
  }

  std::string verb_;
  bool tty_;
  bool shown_ = false;
  uint64_t started_ = 0;
  uv_timer_t timer_{};
  parking::Progress progress_;
};

int run_replay(const ParkingArgs& args) {
  const topology::Service service = load_service(args);
  if (args.unrouted_retries && !service.retry.delay_levels) {
    throw Failure(exit_usage, "--unrouted-retries: service " + service.name +
                                  " has no delay_levels, so no retry of it waits in an unrouted "
                                  "queue");
  }
  const std::string source = args.unrouted_retries ? topology::delay_unrouted_name(service)
                                                   : topology::parking_queue_name(service.name);
  parking::ReplayOptions options;
  options.unrouted_retries = args.unrouted_retries;
  options.limit = args.limit;
  options.filter = make_filter(args);
  options.to_queue = args.to_queue;
  options.dry_run = args.dry_run;
  options.note.by = parking::command_line_user();
  auto printer = std::make_shared<MessagePrinter>(args.json);
  if (args.dry_run) {
    options.on_would_move = [printer](parking::ParkedMessage& parked) { printer->add(parked); };
  }
  options.window = args.window;
  const std::string target =
      args.to_queue.empty() ? topology::input_queue_name(service) : args.to_queue;
  const bool declared = !args.dry_run && audit_declared(args);
  auto audit = std::make_shared<CliAudit>("replay", service.name, filter_json(args),
                                          declared ? audit_key(args) : std::string());
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    audited(connection, declared, audit, done, [&, connection, done](auto recorder) {
      auto handle = std::make_shared<std::shared_ptr<parking::Replay>>();
      auto reporter =
          args.dry_run ? nullptr : std::make_shared<ProgressReporter>(connection->loop(), "moved");
      auto interrupts = settle_on_interrupt(
          connection->loop(),
          [handle] {
            if (*handle) (*handle)->stop();
          },
          [connection] { connection->close(); });
      client::Error error = parking::replay(
          connection, service, options,
          [&args, &service, &source, &target, done, reporter, interrupts, printer,
           recorder](const parking::ReplayResult& result) {
            interrupts->close();
            const double seconds = reporter ? reporter->seconds() : 0;
            if (reporter) reporter->close();
            const parking::Progress& p = result.progress;
            if (args.dry_run && !result.error) {
              printer->finish();
              std::cerr << "dry run: " << plural(p.moved, "message") << " would move from "
                        << source << " to queue " << target << ", " << p.skipped
                        << " would stay; nothing was moved\n";
              return done(exit_ok);
            }
            if (result.error && p.scanned == 0) {
              return finish_audited(recorder, "failed", p, result.error,
                                    error_exit(result.error, "parking replay " + service.name),
                                    done);
            }
            char rate[64] = "";
            if (seconds > 0)
              std::snprintf(rate, sizeof rate, " in %.1f s, %.0f msg/s", seconds,
                            double(p.moved) / seconds);
            std::cerr << "replay " << source << " -> queue " << target << ": moved " << p.moved
                      << ", skipped " << p.skipped << ", failed " << p.failed << rate
                      << (result.interrupted ? " (interrupted)" : "") << "\n";
            if (result.error) {
              return finish_audited(recorder, "failed", p, result.error,
                                    error_exit(result.error, "parking replay " + service.name),
                                    done);
            }
            if (result.interrupted) {
              return finish_audited(recorder, "stopped", p, {}, exit_interrupted, done);
            }
            finish_audited(recorder, "done", p, {}, p.failed == 0 ? exit_ok : exit_broker_refused,
                           done);
          },
          handle.get(),
          [reporter](const parking::Progress& progress) {
            if (reporter) reporter->update(progress);
          });
      if (error) {
        interrupts->close();
        if (reporter) reporter->close();
        finish_audited(recorder, "failed", {}, error, error_exit(error, "parking replay"), done);
      }
    });
  });
}

int run_purge(const ParkingArgs& args) {
  const topology::Service service = load_service(args);
  parking::PurgeOptions options;
  options.filter = make_filter(args);
  options.execute = args.yes;
  // A purge is recorded; counting what it would delete is not.
  const bool declared = args.yes && audit_declared(args);
  auto audit = std::make_shared<CliAudit>("purge", service.name, filter_json(args),
                                          declared ? audit_key(args) : std::string());
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    audited(connection, declared, audit, done, [&, connection, done](auto recorder) {
      client::Error error = parking::purge(
          connection, service, options,
          [&args, &service, done, recorder](const client::Error& error,
                                            const parking::Progress& p) {
            const std::string queue = topology::parking_queue_name(service.name);
            if (error) {
              return finish_audited(recorder, "failed", p, error,
                                    error_exit(error, "parking purge " + service.name), done);
            }
            if (!args.yes) {
              std::cerr << "retryloop: would delete " << plural(p.moved, "message") << " of "
                        << p.scanned << " in " << queue
                        << "; nothing was deleted. Add --yes to delete them.\n";
              return done(exit_usage);
            }
            std::cout << "deleted " << plural(p.moved, "message") << " from " << queue << ", "
                      << p.skipped << " kept\n";
            finish_audited(recorder, "done", p, {}, exit_ok, done);
          });
      if (error)
        finish_audited(recorder, "failed", {}, error, error_exit(error, "parking purge"), done);
    });
  });
}

/// `HOST:PORT` (an IPv6 host in brackets) of --listen.
std::pair<std::string, uint16_t> parse_listen(const std::string& text) {
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? std::string() : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? std::string() : text.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == std::string::npos;
  if (host.empty() || !digits || std::stoul(port) > 65535) {
    throw Failure(exit_usage,
                  "--listen \"" + text + "\": write HOST:PORT, e.g. 127.0.0.1:8080 (port 0: any)");
  }
  return {host, uint16_t(std::stoul(port))};
}

/// The token of --token, --token-file or RETRYLOOP_CONSOLE_TOKEN; empty for a random one.
std::string console_token(const ParkingArgs& args) {
  if (!args.token.empty() && !args.token_file.empty()) {
    throw Failure(exit_usage,
                  "give the token one way: --token-file, --token or RETRYLOOP_CONSOLE_TOKEN");
  }
  std::string token = args.token;
  std::string source = "--token (or RETRYLOOP_CONSOLE_TOKEN)";
  if (!args.token_file.empty()) {
    try {
      token = console::read_token_file(args.token_file);
    } catch (const std::invalid_argument& e) {
      throw Failure(exit_usage, std::string("--token-file: ") + e.what());
    }
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) {
      token.pop_back();
    }
    source = "--token-file " + args.token_file;
    if (token.empty()) throw Failure(exit_usage, source + ": the file is empty");
  }
  if (token.empty()) return token;
  const bool printable =
      std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 127; });
  if (token.size() < 16 || !printable) {
    throw Failure(exit_usage, source +
                                  ": give at least 16 printable ASCII characters without "
                                  "spaces, or leave it out for a random one");
  }
  return token;
}

int run_serve(const ParkingArgs& args) {
  console::Options options;
  if (args.topology_file.empty()) {
    throw Failure(exit_usage, "give the topology file with -t FILE or RETRYLOOP_TOPOLOGY");
  }
  const topology::Topology file =
      load_topology_or_fail(args.topology_file, args.service.empty() ? std::vector<std::string>{}
                                                                     : std::vector{args.service});
  options.services = file.services;
  if (options.services.empty()) {
    throw Failure(exit_usage, args.topology_file + " has no services whose parking to serve");
  }
  options.audit_on_broker = file.audit.has_value();
  options.connection.uri = parse_url(args.connection);
  options.connection.connect_timeout =
      options.connection.uri.connect_timeout.value_or(std::chrono::seconds(10));
  std::tie(options.listen_host, options.listen_port) = parse_listen(args.listen);
  if (!args.tokens_file.empty()) {
    if (!args.token.empty() || !args.token_file.empty()) {
      throw Failure(exit_usage,
                    "give --tokens or a single token (--token-file, --token, "
                    "RETRYLOOP_CONSOLE_TOKEN), not both");
    }
    try {
      options.identities = console::read_identities(args.tokens_file);
    } catch (const std::invalid_argument& e) {
      throw Failure(exit_usage, std::string("--tokens: ") + e.what());
    }
  } else {
    options.token = console_token(args);
  }
  options.allow_counted_reads = args.allow_counted_reads;
  options.audit_key = audit_key(args);
  std::string why;
  auto rescan = topology::parse_duration(args.rescan_after, &why);
  if (!rescan) throw Failure(exit_usage, "--rescan-after \"" + args.rescan_after + "\" " + why);
  options.rescan_after = *rescan;
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  options.logger = std::make_shared<spdlog::logger>("console", sink);
  options.logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");

  std::string served;
  for (const auto& service : options.services) {
    served += (served.empty() ? "" : ", ") + service.name + " (queue " +
              topology::parking_queue_name(service.name) + ")";
  }
  const console::ServeResult result = console::serve(options, [&](const console::ServeInfo& info) {
    std::cout << "retryloop parking console: "
              << (options.services.size() == 1 ? "service " : "services ") << served << ", broker "
              << options.connection.uri.redacted() << "\n"
              << "  audit trail: "
              << (options.audit_on_broker ? "stream " + topology::audit_stream_name()
                                          : std::string("in memory only (declare a top-level "
                                                        "\"audit\" in the topology file to "
                                                        "keep it on the broker)"))
              << (!options.audit_on_broker    ? ""
                  : options.audit_key.empty() ? ", unsigned (without --audit-key every record "
                                                "read back shows as unverified)"
                                              : ", signed")
              << "\n";
    if (info.generated_token) {
      std::cout << "  open  " << info.url << "#token=" << info.token << "\n"
                << "  token " << info.token << " (every request needs it; set your own with "
                << "--token-file or RETRYLOOP_CONSOLE_TOKEN)\n";
    } else if (!options.identities.empty()) {
      std::cout << "  open  " << info.url << " (the page asks for a token of " << args.tokens_file
                << ": " << plural(options.identities.size(), "identity", "identities") << ")\n";
    } else {
      std::cout << "  open  " << info.url << " (the page asks for the token you gave)\n";
    }
    if (!info.loopback) {
      std::cout << "  warning: listening on " << info.host
                << ", not on a loopback address: anyone who can reach this port and has the "
                   "token can read and replay parked messages, over plain HTTP\n";
    }
    std::cout << "Ctrl-C stops (a replay running then finishes the copies in flight).\n"
              << std::flush;
  });
  switch (result.status) {
    case console::ServeResult::Status::stopped:
      return exit_ok;
    case console::ServeResult::Status::cannot_listen:
      throw Failure(exit_usage, result.message);
    case console::ServeResult::Status::cannot_connect:
      std::cerr << "retryloop: cannot connect to " << options.connection.uri.redacted() << ": "
                << result.message << "\n";
      return exit_connection;
    case console::ServeResult::Status::no_queue:
      std::cerr << "retryloop: parking serve: " << result.message << "\n";
      return exit_broker_refused;
    case console::ServeResult::Status::unsafe_delivery_limit:
      std::cerr << "retryloop: parking serve: " << result.message
                << ".\nretryloop: to serve it anyway, each scan counting as a delivery of every "
                   "parked message, add --allow-counted-reads\n";
      return exit_broker_refused;
  }
  return exit_ok;
}

CLI::App* add_command(CLI::App& group, const std::string& name, const std::string& summary,
                      const std::string& description, const std::shared_ptr<ParkingArgs>& args) {
  CLI::App* command = group.add_subcommand(name, summary);
  command->footer(wrap(description) + "\n\n" + parking_exit_codes_help);
  command->add_option("-t,--topology", args->topology_file, "Topology file")
      ->envname("RETRYLOOP_TOPOLOGY")
      ->type_name("FILE");
  command->add_option("service", args->service, "The service (a name in the topology file)")
      ->required()
      ->type_name("SERVICE");
  add_connection_option(*command, args->connection);
  return command;
}

void add_filters(CLI::App& command, ParkingArgs& args, const char* verb) {
  command
      .add_option("--where", args.where,
                  std::string("Only ") + verb +
                      " messages whose header has this value, HEADER=VALUE (repeatable: all "
                      "must hold), e.g. retryloop-reason=poison")
      ->type_name("HEADER=VALUE");
  command
      .add_option(
          "--older-than", args.older_than,
          std::string("Only ") + verb + " messages parked longer ago than this (30s, 5m, 2h, 7d)")
      ->type_name("DURATION");
  command
      .add_option("--reason", args.reasons,
                  std::string("Only ") + verb +
                      " messages parked for this reason (repeatable: any of them): exhausted, "
                      "permanent, poison, delivery_limit, or unrouted (parked by the broker: no "
                      "queue took a retry, as while the service queue was deleted)")
      ->type_name("REASON");
  command
      .add_option("--cause", args.cause,
                  std::string("Only ") + verb +
                      " messages of this cause: the error's first line with numbers, ids and "
                      "quoted values masked, as `parking stats` shows it (e.g. \"customer <n> does "
                      "not exist\")")
      ->type_name("CAUSE");
}

}  // namespace

void add_parking_commands(CLI::App& app, int& exit_code) {
  CLI::App* group =
      app.add_subcommand("parking", "Inspect, count, replay and purge a service's parked messages");
  group->footer(parking_exit_codes_help);
  group->require_subcommand(1);

  auto list_args = std::make_shared<ParkingArgs>();
  CLI::App* list = add_command(
      *group, "list", "Show parked messages without removing or reordering them",
      "Shows the messages in the service's parking queue, head first: message id, when and why "
      "it was parked, attempts, the error, where it was first published, and the body. The "
      "messages are read and handed back, so they stay where they were (the broker marks them "
      "redelivered).",
      list_args);
  list->add_option("--limit", list_args->limit, "Show at most N messages from the head")
      ->type_name("N");
  list->add_flag("--json", list_args->json,
                 "One JSON object per line, with every header and the body (base64 when it is "
                 "not UTF-8)");
  list->callback([args = list_args, &exit_code] { exit_code = run_list(*args); });

  auto stats_args = std::make_shared<ParkingArgs>();
  CLI::App* stats = add_command(
      *group, "stats", "Count parked messages by reason and error, with the loop's queue depths",
      "Shows the parking depth, the oldest message's age, counts by reason and by cause (the first "
      "line "
      "of the error with numbers, ids and quoted values masked; --exact: the line as it is), "
      "and the depths of the service's input and wait queues. With --fail-above N "
      "it exits 5 when more than N messages are parked: a cron job or a monitoring check can "
      "alert on it.",
      stats_args);
  stats->add_flag("--json", stats_args->json, "Print one JSON object");
  stats->add_flag("--exact", stats_args->exact,
                  "Count by the error's first line exactly, instead of by cause");
  stats
      ->add_option("--fail-above", stats_args->fail_above,
                   "Exit 5 when the parking depth is above N")
      ->check(whole_number(0, INT64_MAX))
      ->type_name("N");
  stats->callback([args = stats_args, &exit_code] { exit_code = run_stats(*args); });

  auto replay_args = std::make_shared<ParkingArgs>();
  CLI::App* replay = add_command(
      *group, "replay", "Move parked messages back to the service's queue, safely",
      "Moves parked messages to the service's input queue through the default exchange (so no "
      "other queue on the input exchange gets a copy), or to --to QUEUE. Each copy starts fresh: "
      "x-death, x-first-death-*, x-last-death-*, retryloop-retries and the parking headers are "
      "removed and retryloop-replays goes up by one; the body and the other properties are "
      "unchanged. A parked message is acked only after its copy is confirmed and not returned, "
      "with up to --window copies in flight; messages that do not match the filters stay, in "
      "order. Ctrl-C stops after the copies in flight settle.",
      replay_args);
  replay->add_option("--limit", replay_args->limit, "Move at most N messages")->type_name("N");
  add_filters(*replay, *replay_args, "move");
  replay->add_option("--to", replay_args->to_queue, "Move them to this queue instead")
      ->type_name("QUEUE");
  replay->add_flag("--dry-run", replay_args->dry_run, "List what would move; move nothing");
  replay->add_flag("--json", replay_args->json, "With --dry-run: JSON lines, as list --json");
  replay->add_flag("--unrouted-retries", replay_args->unrouted_retries,
                   "Replay the service's retries that found no queue when their delay levels "
                   "ended (they wait in the levels' unrouted queue), instead of parked messages");
  replay
      ->add_option("--window", replay_args->window,
                   "Copies awaiting confirms at once (default 500)")
      ->check(whole_number(1, 65535))
      ->type_name("N");
  add_audit_key_option(*replay, *replay_args, "of this replay");
  replay->callback([args = replay_args, &exit_code] { exit_code = run_replay(*args); });

  auto purge_args = std::make_shared<ParkingArgs>();
  CLI::App* purge = add_command(
      *group, "purge", "Delete parked messages (needs --yes)",
      "Deletes the parked messages that match the filters (all of them without filters). "
      "Without --yes it deletes nothing and says how many it would delete.",
      purge_args);
  add_filters(*purge, *purge_args, "delete");
  purge->add_flag("--yes", purge_args->yes, "Really delete");
  add_audit_key_option(*purge, *purge_args, "of this purge");
  purge->callback([args = purge_args, &exit_code] { exit_code = run_purge(*args); });

  auto serve_args = std::make_shared<ParkingArgs>();
  CLI::App* serve = add_command(
      *group, "serve", "A console in the browser: groups, filters, messages, replay and purge",
      "Serves a web page for the service's parking queue (without SERVICE: of every service of "
      "the file, with a switcher and a summary by service and reason), on loopback unless "
      "--listen says otherwise: the parked messages counted by reason, by cause and by the first "
      "line of their error, filters (when parked, error text, message id, original routing "
      "key), each message's history, properties, headers and body, and replay or purge of one "
      "message, a selection, a group or everything that matches, each after a confirmation, "
      "with its progress and what it moved, and edit-and-retry of one message. Every action is "
      "recorded in the audit trail: the vhost's stream retryloop.audit when the file declares a "
      "top-level \"audit\", else in memory. "
      "Replays go through the same confirm-then-ack path as `parking replay`. Every request needs "
      "the token, in a header that no other site can make a browser send: a random one printed "
      "on standard output at the start, or your own from --token-file or RETRYLOOP_CONSOLE_TOKEN "
      "(--token shows it to every user of the machine, in the process list). The depth is looked "
      "up every few seconds while a page is open; the counts are read again after each action, "
      "on demand, and by themselves only when the depth changed, at most every --rescan-after. "
      "Each read of a quorum queue counts as a delivery, so for a quorum service the console "
      "first checks that the parking queue has retryloop's delivery limit (exit 3 otherwise, "
      "unless --allow-counted-reads). Runs until Ctrl-C or SIGTERM.",
      serve_args);
  serve->get_option("service")->required(false);
  serve
      ->add_option("--listen", serve_args->listen,
                   "Address and port to listen on (default 127.0.0.1:8080; port 0: any free one)")
      ->type_name("HOST:PORT");
  serve
      ->add_option("--token-file", serve_args->token_file,
                   "Read the token every request must carry from FILE (default: a random one, "
                   "printed)")
      ->type_name("FILE");
  serve
      ->add_option("--token", serve_args->token,
                   "The token itself; other users of the machine can read it in the process "
                   "list: prefer --token-file or RETRYLOOP_CONSOLE_TOKEN")
      ->envname("RETRYLOOP_CONSOLE_TOKEN")
      ->type_name("TOKEN");
  serve
      ->add_option("--tokens", serve_args->tokens_file,
                   "Named tokens with roles, one per line: NAME ROLE TOKEN, ROLE reader (look), "
                   "operator (also replay) or admin (also purge); each call is checked against "
                   "the caller's role, and the page and the log name the caller")
      ->type_name("FILE");
  serve->add_flag("--allow-counted-reads", serve_args->allow_counted_reads,
                  "Serve a quorum parking queue without retryloop's delivery limit (or whose "
                  "arguments could not be compared) anyway: each scan is a delivery of every "
                  "parked message, and past its limit the broker drops a message. For a queue "
                  "whose limit a policy raised, which the console cannot see");
  serve
      ->add_option("--rescan-after", serve_args->rescan_after,
                   "Count again by itself when the depth changed, at most this often (default "
                   "30s; 0s: only on demand and after actions)")
      ->type_name("DURATION");
  add_audit_key_option(*serve, *serve_args,
                       "the console appends, and show the records read back without a valid "
                       "signature as unverified,");
  serve->callback([args = serve_args, &exit_code] { exit_code = run_serve(*args); });
}

}  // namespace retryloop::cli
