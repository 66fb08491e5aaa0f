// retryloop send and retryloop schedule stats|cancel: scheduled delivery through a topology
// file's delay levels (docs/scheduling.md).

#include "schedule_command.hpp"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "retryloop/client/channel.hpp"
#include "retryloop/inbox/inbox.hpp"
#include "retryloop/outbox/schema.hpp"
#include "retryloop/parking/parked_message.hpp"
#include "retryloop/parking/parking.hpp"
#include "retryloop/schedule/scheduler.hpp"
#include "retryloop/schedule/stats.hpp"
#include "retryloop/store/database.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::cli {

namespace {

const char* const schedule_exit_codes_help =
    "Exit codes:\n"
    "  0  success\n"
    "  1  usage error (unknown option, missing argument, bad URL, a queue the file does not "
    "schedule for, a body over 128 MiB, a message id or header name over 255 bytes)\n"
    "  2  the topology file is unreadable or invalid, or has no top-level delay_levels\n"
    "  3  the broker refused a message: returned or nacked it, or closed the channel for it (a "
    "body over its max_message_size, levels not applied) while no other message awaited its "
    "confirm; the database has no retryloop tables (cancel)\n"
    "  4  cannot connect, or the channel or the connection ended before every message was "
    "confirmed: those not confirmed may or may not be held (named on standard error)\n"
    "  6  standard output could not be written (a closed pipe, a full disk)";

struct SendArgs {
  std::string topology_file;
  std::string queue;
  std::string delay;
  std::string at;
  std::string message_id;
  std::vector<std::string> headers;
  std::string content_type;
  std::string body;
  std::string file;
  bool lines = false;
  bool json = false;
  size_t window = 1000;
  ConnectionArgs connection;
};

struct StatsArgs {
  std::string topology_file;
  bool json = false;
  bool no_peek = false;
  ConnectionArgs connection;
};

struct RedeliverArgs {
  std::string topology_file;
  std::vector<std::string> queues;
  bool dry_run = false;
  ConnectionArgs connection;
};

struct CancelArgs {
  std::string topology_file;
  std::string database;
  std::string queue;
  std::vector<std::string> ids;
};

const topology::Schedule& schedule_of(const topology::Topology& topology, const std::string& file) {
  if (!topology.schedule) {
    throw Failure(exit_invalid_file,
                  file +
                      ": has no top-level \"delay_levels\" (the delay levels and the queues "
                      "that receive scheduled messages; docs/scheduling.md)");
  }
  return *topology.schedule;
}

topology::Schedule load_schedule(const std::string& file) {
  return schedule_of(load_topology_or_fail(file, {}), file);
}

/// The largest body send publishes: RabbitMQ 3.x's default max_message_size (4.x's is 16 MiB; a
/// broker that refuses a smaller body is reported as refusing it).
constexpr size_t max_body_bytes = size_t(128) << 20;

std::string too_large(const std::string& what, const std::string& size) {
  return what + " is " + size + " bytes; send publishes at most " + std::to_string(max_body_bytes) +
         " bytes (128 MiB) in one message, the most RabbitMQ accepts by default";
}

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The whole input of one message; refuses one over max_body_bytes as soon as it is read.
std::string read_body(std::istream& in, const std::string& what) {
  std::string text;
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_body_bytes)
      throw Failure(exit_usage, too_large(what, "over " + std::to_string(max_body_bytes)));
  }
  return text;
}

/// The message bodies a send names: BODY, `-` (standard input) or --file, whole or by line.
std::vector<std::string> bodies(const SendArgs& args) {
  std::string text;
  if (!args.file.empty()) {
    if (!args.body.empty()) throw Failure(exit_usage, "give BODY or --file, not both");
    std::error_code error;
    const auto size = std::filesystem::file_size(args.file, error);
    if (!error && !args.lines && size > max_body_bytes) {
      throw Failure(exit_usage, too_large("--file " + args.file, std::to_string(size)));
    }
    std::ifstream in(args.file, std::ios::binary);
    if (!in) throw Failure(exit_usage, "cannot read --file " + args.file);
    text = args.lines ? read_all(in) : read_body(in, "--file " + args.file);
  } else if (args.body == "-" || (args.body.empty() && !isatty(STDIN_FILENO))) {
    text = args.lines ? read_all(std::cin) : read_body(std::cin, "standard input");
    if (args.body.empty() && text.empty()) {
      throw Failure(exit_usage, "no message: give BODY, - (standard input) or --file FILE");
    }
  } else if (args.body.empty()) {
    throw Failure(exit_usage, "no message: give BODY, - (standard input) or --file FILE");
  } else {
    text = args.body;
  }
  if (!args.lines) {
    if (text.size() > max_body_bytes)
      throw Failure(exit_usage, too_large("BODY", std::to_string(text.size())));
    return {text};
  }
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > max_body_bytes) {
      throw Failure(exit_usage,
                    too_large("line " + std::to_string(out.size() + 1) + " of the input",
                              std::to_string(line.size())));
    }
    if (!line.empty()) out.push_back(line);
  }
  if (out.empty()) throw Failure(exit_usage, "--lines: the input has no non-empty line");
  return out;
}

/// AMQP carries property values and header names as short strings: at most 255 bytes.
void check_short_string(const std::string& what, const std::string& value) {
  if (value.size() > 255) {
    throw Failure(exit_usage, what + " '" + preview(value, 40) + "' is " +
                                  std::to_string(value.size()) +
                                  " bytes long; AMQP allows at most 255");
  }
}

amqp::BasicProperties base_properties(const SendArgs& args) {
  amqp::BasicProperties properties;
  check_short_string("--content-type", args.content_type);
  if (!args.content_type.empty()) properties.content_type = args.content_type;
  for (const auto& header : args.headers) {
    const size_t equals = header.find('=');
    if (equals == std::string::npos || equals == 0) {
      throw Failure(exit_usage, "--header '" + header + "' is not NAME=VALUE");
    }
    const std::string name = header.substr(0, equals);
    check_short_string("--header name", name);
    if (name.rfind("x-", 0) == 0 || name.rfind("retryloop-", 0) == 0) {
      throw Failure(exit_usage, "--header '" + name +
                                    "': headers beginning with x- or retryloop- belong to "
                                    "RabbitMQ and retryloop");
    }
    if (!properties.headers) properties.headers.emplace();
    properties.headers->set(name, header.substr(equals + 1));
  }
  return properties;
}

std::string in_text(int64_t milliseconds) {
  if (milliseconds < 1000) return std::to_string(milliseconds) + "ms";
  return age_text(static_cast<uint64_t>(milliseconds / 1000));
}

/// Sends the messages with a window of unconfirmed publishes; prints each result.
class Sender : public std::enable_shared_from_this<Sender> {
 public:
  /// Each message due `delay` from when it is published, or at `at_ms` when --at was given.
  Sender(const SendArgs& args, topology::Schedule schedule, std::vector<std::string> bodies,
         std::chrono::milliseconds delay, int64_t at_ms, std::function<void(int)> done)
      : args_(args),
        delay_(delay),
        at_ms_(at_ms),
        schedule_(std::move(schedule)),
        bodies_(std::move(bodies)),
        properties_(base_properties(args)),
        done_(std::move(done)),
        started_(std::chrono::steady_clock::now()),
        last_progress_(started_) {}

  void start(const std::shared_ptr<client::Connection>& connection) {
    auto self = shared_from_this();
    client::Error error = connection->open_channel(
        [self](const client::Error& error, std::shared_ptr<client::Channel> channel) {
          if (error) return self->finish(error_exit(error, "send"));
          self->channel_ = std::move(channel);
          client::Error confirm = self->channel_->confirm_select([self](const client::Error& e) {
            if (e) return self->finish(error_exit(e, "send"));
            self->scheduler_ =
                std::make_unique<schedule::Scheduler>(*self->channel_, self->schedule_);
            self->pump();
          });
          if (confirm) self->finish(error_exit(confirm, "send"));
        });
    if (error) finish(error_exit(error, "send"));
  }

 private:
  void pump() {
    while (!stopped_ && next_ < bodies_.size() && next_ - settled_ < args_.window) {
      const size_t index = next_++;
      amqp::BasicProperties properties = properties_;
      if (!args_.message_id.empty()) {
        properties.message_id = bodies_.size() == 1
                                    ? args_.message_id
                                    : args_.message_id + "-" + std::to_string(index + 1);
      }
      auto self = shared_from_this();
      auto on_result = [self](const schedule::ScheduleResult& result) { self->settled(result); };
      client::Error error;
      if (!args_.at.empty()) {
        error = scheduler_->schedule_at(
            args_.queue, std::move(properties), bodies_[index],
            std::chrono::system_clock::time_point(std::chrono::milliseconds(at_ms_)), on_result);
      } else {
        error = scheduler_->schedule_in(args_.queue, std::move(properties), bodies_[index], delay_,
                                        on_result);
      }
      if (error) {
        // Not published (its callback is never called); those awaiting their confirms are still
        // reported, each with its outcome, before send ends.
        --next_;
        stopped_ = true;
        worst_ = std::max(worst_, error_exit(error, "send"));
      }
    }
    if (stopped_ && settled_ == next_) end();
  }

  void settled(const schedule::ScheduleResult& result) {
    const bool ended = result.publish.status == client::PublishStatus::failed;
    // The channel ended: every publish still awaiting its confirm fails now, one after another.
    if (ended && awaiting_at_end_ == 0) awaiting_at_end_ = next_ - settled_;
    ++settled_;
    switch (send_outcome(result.publish, awaiting_at_end_)) {
      case SendOutcome::scheduled:
        ++scheduled_;
        print(result);
        break;
      case SendOutcome::refused:
        ++refused_;
        std::cerr << "retryloop: send: message " << result.message_id << " was not scheduled: "
                  << (result.publish.status == client::PublishStatus::returned
                          ? "returned by the broker (" + result.publish.error.message() +
                                "): queue " + args_.queue + " does not exist"
                      : result.publish.status == client::PublishStatus::nacked
                          ? std::string("nacked by the broker")
                          : "refused by the broker (" + result.publish.error.message() + ")")
                  << "\n";
        worst_ = std::max(worst_, int(exit_broker_refused));
        break;
      case SendOutcome::unknown:
        ++unknown_;
        if (!end_reason_) end_reason_ = result.publish.error;
        std::cerr << "retryloop: send: message " << result.message_id
                  << " may or may not be held: " << ended_text(result.publish.error)
                  << " before it was confirmed\n";
        worst_ = std::max(worst_, int(exit_connection));
        break;
    }
    if (ended) stopped_ = true;  // nothing more can be published on the channel
    progress(false);
    if (settled_ == next_ && (stopped_ || next_ == bodies_.size())) return end();
    pump();
  }

  static std::string ended_text(const client::Error& error) {
    return error.code == client::make_error_code(client::ClientError::channel_closed)
               ? "the broker closed the channel"
               : "the connection ended";
  }

  /// The last progress line; with more than one message, how many were scheduled, refused,
  /// unknown and not sent; and for those unknown, what to do before sending them again.
  void end() {
    progress(true);
    const size_t not_sent = bodies_.size() - next_;
    if (bodies_.size() > 1 && scheduled_ < bodies_.size()) {
      std::cerr << "retryloop: send: " << scheduled_ << " scheduled, " << refused_ << " refused, "
                << unknown_ << " unknown, " << not_sent << " not sent, of "
                << plural(bodies_.size(), "message") << "\n";
    }
    if (unknown_ > 0) {
      const bool one = unknown_ == 1;
      const std::string them = one ? "it" : "them";
      std::cerr << "retryloop: send: " << plural(unknown_, "message")
                << " (named above) may or may not be held: " << end_reason_.message() << ", before "
                << (one ? "it was" : "they were")
                << " confirmed. A message that is held and sent again is scheduled twice: check "
                   "by message id whether "
                << (one ? "it reaches its queue" : "they reach their queue")
                << " when due before sending " << them << " again, or send " << them
                << " again with the same message " << (one ? "id" : "ids")
                << ", which a consumer running through an inbox handles once\n";
    }
    if (not_sent > 0 && bodies_.size() > 1) {
      std::cerr << "retryloop: send: the last " << plural(not_sent, "line") << " of the input "
                << (not_sent == 1 ? "was" : "were") << " not sent: nothing of "
                << (not_sent == 1 ? "it" : "them") << " reached the broker\n";
    }
    finish(worst_);
  }

  void print(const schedule::ScheduleResult& result) {
    if (args_.json) {
      nlohmann::json out{{"message_id", result.message_id},
                         {"queue", args_.queue},
                         {"due_at", iso_time_ms(result.due_at_ms)},
                         {"due_at_ms", result.due_at_ms},
                         {"delay_ms", result.delay.count()}};
      std::cout << dump(out) << "\n";
      return;
    }
    std::cout << result.message_id << "  due " << iso_time_ms(result.due_at_ms) << " (in "
              << in_text(result.delay.count()) << ")\n";
  }

  void progress(bool last) {
    if (bodies_.size() < 2) return;
    const auto now = std::chrono::steady_clock::now();
    if (!last && now - last_progress_ < std::chrono::seconds(1)) return;
    last_progress_ = now;
    const double seconds = std::chrono::duration<double>(now - started_).count();
    std::fprintf(stderr, "send: %zu of %zu scheduled, %.0f msg/s\n", scheduled_, bodies_.size(),
                 seconds > 0 ? double(settled_) / seconds : 0.0);
  }

  void finish(int code) {
    if (!done_) return;
    auto done = std::move(done_);
    done_ = nullptr;
    done(code);
  }

 private:
  const SendArgs& args_;
  std::chrono::milliseconds delay_{0};
  int64_t at_ms_ = 0;
  topology::Schedule schedule_;
  std::vector<std::string> bodies_;
  amqp::BasicProperties properties_;
  std::function<void(int)> done_;
  std::shared_ptr<client::Channel> channel_;
  std::unique_ptr<schedule::Scheduler> scheduler_;
  size_t next_ = 0;
  size_t settled_ = 0;
  size_t scheduled_ = 0;
  size_t refused_ = 0;
  size_t unknown_ = 0;
  /// How many publishes awaited their confirms when the channel ended, and why it ended.
  size_t awaiting_at_end_ = 0;
  client::Error end_reason_;
  bool stopped_ = false;
  int worst_ = exit_ok;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_progress_;
};

int run_send(const SendArgs& args) {
  const topology::Schedule schedule = load_schedule(args.topology_file);
  if (args.delay.empty() == args.at.empty()) {
    throw Failure(exit_usage, "give --delay DURATION or --at TIME (one of them)");
  }
  std::chrono::milliseconds delay{0};
  int64_t at_ms = 0;
  if (!args.delay.empty()) {
    delay = duration_or_fail("--delay", args.delay);
  } else {
    auto at = parse_time(args.at);
    if (!at) {
      throw Failure(exit_usage, "--at '" + args.at +
                                    "' is not a time such as 2026-11-27T10:15:00Z or "
                                    "2026-11-27T12:15:00+02:00");
    }
    at_ms = *at;
    delay = std::chrono::milliseconds(at_ms - schedule::now_ms());
  }
  try {
    (void)schedule::make_scheduled_copy(schedule, args.queue, {}, delay, 0);
  } catch (const std::invalid_argument& e) {
    throw Failure(exit_usage, e.what());
  }
  std::vector<std::string> messages = bodies(args);
  (void)base_properties(args);
  check_short_string("--message-id", messages.size() == 1
                                         ? args.message_id
                                         : args.message_id + "-" + std::to_string(messages.size()));
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    std::make_shared<Sender>(args, schedule, std::move(messages), delay, at_ms, done)
        ->start(connection);
  });
}

int run_stats(const StatsArgs& args) {
  const topology::Schedule schedule = load_schedule(args.topology_file);
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    client::Error error = schedule::stats(
        connection, schedule, !args.no_peek,
        [&args, &schedule, done](const client::Error& error, const schedule::ScheduleStats& s) {
          if (error) {
            if (error.reply_code == 404) {
              std::cerr << "retryloop: schedule stats: " << error.reply_text
                        << "; apply the topology file first (retryloop topology apply)\n";
              return done(exit_broker_refused);
            }
            return done(error_exit(error, "schedule stats"));
          }
          const int64_t now = schedule::now_ms();
          if (args.json) {
            nlohmann::json out;
            out["set"] = s.set;
            out["base_ms"] = schedule.levels.base.count();
            out["waiting"] = s.waiting;
            out["unrouted"] = s.unrouted;
            out["heads_read"] = s.heads_read;
            out["earliest_head_due_at"] =
                s.earliest_head_due_at_ms ? nlohmann::json(iso_time_ms(*s.earliest_head_due_at_ms))
                                          : nullptr;
            out["earliest_head_due_at_ms"] =
                s.earliest_head_due_at_ms ? nlohmann::json(*s.earliest_head_due_at_ms) : nullptr;
            out["levels"] = nlohmann::json::array();
            for (const auto& level : s.levels) {
              out["levels"].push_back(
                  {{"level", level.level},
                   {"queue", level.queue},
                   {"holds_ms", level.holds.count()},
                   {"messages", level.messages},
                   {"head_due_at", level.head_due_at_ms
                                       ? nlohmann::json(iso_time_ms(*level.head_due_at_ms))
                                       : nullptr}});
            }
            out["queues"] = nlohmann::json::object();
            for (const auto& [queue, count] : s.queues)
              out["queues"][queue] = count;
            out["queues_not_counted"] = nlohmann::json::object();
            for (const auto& [queue, why] : s.queues_not_counted)
              out["queues_not_counted"][queue] = why;
            std::cout << dump(out) << "\n";
            return done(exit_ok);
          }
          std::cout << "delay levels " << s.set << ": " << plural(s.waiting, "message")
                    << " waiting";
          if (s.earliest_head_due_at_ms) {
            const int64_t in = *s.earliest_head_due_at_ms - now;
            std::cout << "; earliest due at a level's head "
                      << iso_time_ms(*s.earliest_head_due_at_ms)
                      << (in > 0 ? " (in " + in_text(in) + ")" : " (now)");
          }
          std::cout << "\n";
          Table levels;
          levels.add({"level", "holds", "messages", "head due"});
          for (const auto& level : s.levels) {
            levels.add({level.queue, topology::duration_label(level.holds),
                        std::to_string(level.messages),
                        level.head_due_at_ms ? iso_time_ms(*level.head_due_at_ms) : ""});
          }
          levels.print(std::cout);
          if (!s.heads_read && !args.no_peek) {
            std::cout << "head due: not read, as the levels are quorum queues, which may count "
                         "each read toward their delivery limit (docs/scheduling.md)\n";
          }
          std::cout << "unrouted (their queue was gone when due): " << s.unrouted << "\n";
          for (const auto& [queue, count] : s.queues) {
            std::cout << "queue " << queue << ": " << plural(count, "message") << " ready\n";
          }
          for (const auto& [queue, why] : s.queues_not_counted) {
            std::cout << "queue " << queue << ": not counted (" << why << ")\n";
          }
          done(exit_ok);
        });
    if (error) done(error_exit(error, "schedule stats"));
  });
}

/// Replays each queue's messages from the levels' unrouted queue, one queue after the other.
class Redeliverer : public std::enable_shared_from_this<Redeliverer> {
 public:
  Redeliverer(const RedeliverArgs& args, topology::Schedule schedule,
              std::vector<std::string> queues, std::function<void(int)> done)
      : args_(args),
        schedule_(std::move(schedule)),
        queues_(std::move(queues)),
        done_(std::move(done)) {}

  void next(const std::shared_ptr<client::Connection>& connection) {
    if (index_ == queues_.size()) return done_(code_);
    const std::string queue = queues_[index_++];
    const topology::Service target = topology::schedule_target(schedule_, queue);
    parking::ReplayOptions options;
    options.unrouted_retries = true;
    options.dry_run = args_.dry_run;
    options.note.by = parking::command_line_user();
    options.on_would_move = [](parking::ParkedMessage&) {};
    auto self = shared_from_this();
    client::Error error = parking::replay(
        connection, target, options,
        [self, connection, queue, target](const parking::ReplayResult& result) {
          const parking::Progress& p = result.progress;
          if (result.error) {
            self->code_ = error_exit(result.error, "schedule redeliver " + queue);
          } else {
            std::cout << queue << ": " << p.moved << (self->args_.dry_run ? " would be" : "")
                      << " redelivered from " << topology::delay_unrouted_name(target);
            if (p.failed > 0) std::cout << ", " << p.failed << " failed (kept there)";
            std::cout << "\n";
            if (p.failed > 0) self->code_ = exit_broker_refused;
          }
          self->next(connection);
        });
    if (error) {
      code_ = error_exit(error, "schedule redeliver " + queue);
      next(connection);
    }
  }

 private:
  const RedeliverArgs& args_;
  topology::Schedule schedule_;
  std::vector<std::string> queues_;
  std::function<void(int)> done_;
  size_t index_ = 0;
  int code_ = exit_ok;
};

int run_redeliver(const RedeliverArgs& args) {
  const topology::Schedule schedule = load_schedule(args.topology_file);
  std::vector<std::string> queues = args.queues.empty() ? schedule.queues : args.queues;
  for (const auto& queue : queues) {
    if (std::find(schedule.queues.begin(), schedule.queues.end(), queue) == schedule.queues.end())
      throw Failure(exit_usage, "the schedule of " + args.topology_file + " has no queue " + queue);
  }
  return with_connection(parse_url(args.connection), [&](const auto& connection, auto done) {
    std::make_shared<Redeliverer>(args, schedule, queues, done)->next(connection);
  });
}

/// The queue whose messages a cancel names: --queue (a scheduled queue, or a service of the file
/// whose input queue is one), or the schedule's only queue.
std::string cancel_queue(const CancelArgs& args, const topology::Topology& topology) {
  const topology::Schedule& schedule = schedule_of(topology, args.topology_file);
  const auto scheduled = [&](const std::string& queue) {
    return std::find(schedule.queues.begin(), schedule.queues.end(), queue) !=
           schedule.queues.end();
  };
  if (args.queue.empty()) {
    if (schedule.queues.size() == 1) return schedule.queues.front();
    throw Failure(exit_usage,
                  "name the queue the messages were scheduled for with --queue: the "
                  "schedule of " +
                      args.topology_file + " sends to " + join(schedule.queues) +
                      ", and one id may be scheduled for several of them");
  }
  if (scheduled(args.queue)) return args.queue;
  for (const auto& service : topology.services) {
    if (service.name == args.queue && scheduled(topology::input_queue_name(service))) {
      return topology::input_queue_name(service);
    }
  }
  throw Failure(exit_usage, "--queue " + args.queue + ": the schedule of " + args.topology_file +
                                " sends to " + join(schedule.queues) +
                                ", and no service of the file by that name has its queue there");
}

int run_cancel(const CancelArgs& args) {
  const topology::Topology topology = load_topology_or_fail(args.topology_file, {});
  const std::string queue = cancel_queue(args, topology);
  const auto longest = schedule::longest_schedule_delay(schedule_of(topology, args.topology_file));
  try {
    auto database = store::Database::open(args.database, false);
    outbox::require_schema(*database);
    const int64_t keep_until = schedule::now_ms() + longest.count();
    int code = exit_ok;
    for (const auto& id : args.ids) {
      inbox::CancelResult result = inbox::cancel_scheduled(*database, queue, id, keep_until);
      std::cout << id << ": " << (result.recorded ? "cancelled" : "cancelled already");
      if (!result.handled_by.empty()) {
        std::cout << "; but consumer " << join(result.handled_by)
                  << " received it already: too late there";
        code = exit_broker_refused;
      }
      std::cout << "\n";
    }
    return code;
  } catch (const store::StoreError& error) {
    std::cerr << "retryloop: schedule cancel: " << error.what() << "\n";
    return error.kind() == store::ErrorKind::connection ? exit_connection : exit_broker_refused;
  }
}

void add_topology_option(CLI::App& command, std::string& file) {
  command.add_option("-t,--topology", file, "Topology file with a top-level delay_levels")
      ->envname("RETRYLOOP_TOPOLOGY")
      ->required()
      ->type_name("FILE");
}

}  // namespace

std::optional<int64_t> parse_time(const std::string& text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  char separator = 0;
  int used = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d%n", &year, &month, &day, &separator,
                  &hour, &minute, &second, &used) != 7 ||
      (separator != 'T' && separator != ' ') || used != 19) {
    return std::nullopt;
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return std::nullopt;
  }
  std::string rest = text.substr(19);
  int64_t millis = 0;
  if (!rest.empty() && rest[0] == '.') {
    size_t digits = 1;
    while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits])))
      ++digits;
    if (digits == 1) return std::nullopt;
    std::string fraction = rest.substr(1, digits - 1);
    fraction.resize(3, '0');
    millis = std::stoll(fraction.substr(0, 3));
    rest = rest.substr(digits);
  }
  int64_t offset_minutes = 0;
  if (rest == "Z" || rest == "z") {
    offset_minutes = 0;
  } else if (rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':' &&
             std::isdigit(static_cast<unsigned char>(rest[1])) &&
             std::isdigit(static_cast<unsigned char>(rest[2])) &&
             std::isdigit(static_cast<unsigned char>(rest[4])) &&
             std::isdigit(static_cast<unsigned char>(rest[5]))) {
    const int offset_hours = std::stoi(rest.substr(1, 2));
    const int offset_rest = std::stoi(rest.substr(4, 2));
    if (offset_hours > 23 || offset_rest > 59) return std::nullopt;  // as RFC 3339 allows
    offset_minutes = offset_hours * 60 + offset_rest;
    if (rest[0] == '-') offset_minutes = -offset_minutes;
  } else {
    return std::nullopt;  // no zone: a time without one means something else on every machine
  }
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  const time_t seconds = timegm(&tm);
  if (tm.tm_mday != day) return std::nullopt;  // 31 April and the like were normalized
  return (int64_t(seconds) - offset_minutes * 60) * 1000 + millis;
}

std::string iso_time_ms(int64_t milliseconds) {
  const int64_t seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000;
  std::string text = iso_time(static_cast<uint64_t>(std::max<int64_t>(seconds, 0)));
  char fraction[8];
  std::snprintf(fraction, sizeof fraction, ".%03d", int(milliseconds - seconds * 1000));
  if (!text.empty() && text.back() == 'Z') text.insert(text.size() - 1, fraction);
  return text;
}

SendOutcome send_outcome(const client::PublishOutcome& publish, size_t awaiting) {
  switch (publish.status) {
    case client::PublishStatus::acked:
      return SendOutcome::scheduled;
    case client::PublishStatus::returned:
    case client::PublishStatus::nacked:
      return SendOutcome::refused;
    case client::PublishStatus::failed:
      break;
  }
  // The broker closes the channel with 403 to 406 for what a publish asked (404: no such
  // exchange; 406: a body over its max_message_size), and with nothing else on send's channel.
  const client::Error& error = publish.error;
  const bool closed_for_a_publish =
      error.code == client::make_error_code(client::ClientError::channel_closed) &&
      error.reply_code >= 403 && error.reply_code <= 406;
  return closed_for_a_publish && awaiting == 1 ? SendOutcome::refused : SendOutcome::unknown;
}

void add_schedule_commands(CLI::App& app, int& exit_code) {
  auto send_args = std::make_shared<SendArgs>();
  CLI::App* send = app.add_subcommand(
      "send", "Schedule a message for a queue after a delay or at a time, without a plugin");
  send->footer(wrap("Publishes the message into the topology file's delay levels (its top-level "
                    "delay_levels), from where the broker hands it to QUEUE when it is due: "
                    "never earlier, the delay rounded up to the levels' base. Each message is "
                    "confirmed by the broker before its id is printed, with its due time. With "
                    "--lines each line of the input is a message (bulk scheduling, with a "
                    "progress line on standard error). Cancel one with `retryloop schedule "
                    "cancel` before it is due.") +
               "\n\n" + schedule_exit_codes_help);
  add_topology_option(*send, send_args->topology_file);
  send->add_option("--queue", send_args->queue, "The queue that receives the message")
      ->required()
      ->type_name("QUEUE");
  send->add_option("--delay", send_args->delay, "Due after this long (90s, 15m, 2h, 7d)")
      ->type_name("DURATION");
  send->add_option("--at", send_args->at, "Due at this time (2026-11-27T10:15:00Z, or +02:00)")
      ->type_name("TIME");
  send->add_option("--message-id", send_args->message_id,
                   "The message id (default: 32 random hex digits); with --lines, ID-1, ID-2, ...")
      ->type_name("ID");
  send->add_option("--header", send_args->headers, "A header NAME=VALUE (repeatable)")
      ->type_name("NAME=VALUE");
  send->add_option("--content-type", send_args->content_type, "The content-type property")
      ->type_name("TYPE");
  send->add_option("--file", send_args->file, "Read the message from this file")->type_name("FILE");
  send->add_flag("--lines", send_args->lines, "Each non-empty line of the input is a message");
  send->add_flag("--json", send_args->json, "One JSON object per scheduled message");
  send->add_option("--window", send_args->window, "Messages awaiting confirms at once (1000)")
      ->check(whole_number(1, 65535))
      ->type_name("N");
  send->add_option("body", send_args->body, "The message body; - reads standard input")
      ->type_name("BODY");
  add_connection_option(*send, send_args->connection);
  send->callback([args = send_args, &exit_code] { exit_code = run_send(*args); });

  CLI::App* group = app.add_subcommand(
      "schedule", "See what the delay levels hold, and cancel scheduled messages");
  group->footer(schedule_exit_codes_help);
  group->require_subcommand(1);

  auto stats_args = std::make_shared<StatsArgs>();
  CLI::App* stats = group->add_subcommand(
      "stats", "Messages waiting in each delay level, and when the next ones are due");
  stats->footer(wrap("Counts the messages in each level queue of the topology file's delay "
                     "levels, in its unrouted queue and in each scheduled queue. On classic levels "
                     "it reads the message at the head of each level for its due time (basic.get, "
                     "then handed back with a nack: it keeps its place and its expiry); quorum "
                     "levels are only counted, as a quorum queue may count each read toward its "
                     "delivery limit. --no-peek only counts.") +
                "\n\n" + schedule_exit_codes_help);
  add_topology_option(*stats, stats_args->topology_file);
  stats->add_flag("--json", stats_args->json, "Print one JSON object");
  stats->add_flag("--no-peek", stats_args->no_peek, "Count only; read no message");
  add_connection_option(*stats, stats_args->connection);
  stats->callback([args = stats_args, &exit_code] { exit_code = run_stats(*args); });

  auto redeliver_args = std::make_shared<RedeliverArgs>();
  CLI::App* redeliver = group->add_subcommand(
      "redeliver", "Send the scheduled messages that found no queue when due to their queues");
  redeliver->footer(
      wrap("A scheduled message whose queue did not exist, or was not yet bound, when it was due "
           "is kept in the levels' unrouted queue (counted by `schedule stats`). Once the "
           "queue is there, this sends each such message to it (confirmed before the kept copy "
           "is acked) and leaves the other queues' messages in place. RabbitMQ 3.10 can route "
           "messages that fall due while it starts there (docs/scheduling.md, \"Failures\").") +
      "\n\n" + schedule_exit_codes_help);
  add_topology_option(*redeliver, redeliver_args->topology_file);
  redeliver->add_option("--queue", redeliver_args->queues, "Only this queue (repeatable)")
      ->type_name("QUEUE");
  redeliver->add_flag("--dry-run", redeliver_args->dry_run, "Count what would be sent; send none");
  add_connection_option(*redeliver, redeliver_args->connection);
  redeliver->callback([args = redeliver_args, &exit_code] { exit_code = run_redeliver(*args); });

  auto cancel_args = std::make_shared<CancelArgs>();
  CLI::App* cancel = group->add_subcommand(
      "cancel", "Cancel scheduled messages of a queue by message id, until they are due");
  cancel->footer(
      wrap("Records the queue and the ids in the database's retryloop_cancelled table. A "
           "consumer of that queue that runs its handler through an inbox on this database "
           "(inbox::Inbox) drops a scheduled message whose id it finds there, without running "
           "the handler; a message with the same id scheduled for another queue is not "
           "cancelled. --queue may be left out when the schedule has one queue. The broker "
           "keeps the message until it is due (nothing searches the levels), and a consumer "
           "without that inbox handles it as usual. Says when an inbox consumer received the "
           "message already (exit 3), also when it arrives while the cancel runs.") +
      "\n\n" + schedule_exit_codes_help);
  add_topology_option(*cancel, cancel_args->topology_file);
  cancel
      ->add_option("--db", cancel_args->database,
                   "Database URL: sqlite:PATH or postgresql://USER@HOST:PORT/DBNAME")
      ->envname("RETRYLOOP_DB")
      ->required()
      ->type_name("URL");
  cancel
      ->add_option("--queue", cancel_args->queue,
                   "The queue the messages were scheduled for, or its service (default: the "
                   "schedule's only queue)")
      ->type_name("QUEUE");
  cancel->add_option("id", cancel_args->ids, "Message ids")->required()->type_name("ID");
  cancel->callback([args = cancel_args, &exit_code] { exit_code = run_cancel(*args); });
}

}  // namespace retryloop::cli
