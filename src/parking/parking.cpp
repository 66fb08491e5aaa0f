#include "retryloop/parking/parking.hpp"

#include <algorithm>
#include <unordered_map>

#include "retryloop/parking/error.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "walker.hpp"

namespace retryloop::parking {
namespace {

using client::ClientError;
using client::Error;
using detail::Decision;
using detail::Walker;

/// Depths by queue name, and the queues the user may not look at.
using DepthsCallback =
    std::function<void(std::map<std::string, uint32_t> depths, std::vector<std::string> refused)>;

/// Depths of the queues that exist, by passive declare, one channel per queue (a 404 closes
/// the channel). Never fails: missing queues are left out, refused ones (403) listed apart.
void queue_depths(const std::shared_ptr<client::Connection>& connection,
                  std::vector<std::string> queues, DepthsCallback callback) {
  struct State {
    std::shared_ptr<client::Connection> connection;
    std::vector<std::string> queues;
    size_t next = 0;
    std::map<std::string, uint32_t> depths;
    std::vector<std::string> refused;
    DepthsCallback callback;
    std::function<void()> step;
  };
  auto state = std::make_shared<State>();
  state->connection = connection;
  state->queues = std::move(queues);
  state->callback = std::move(callback);
  state->step = [weak = std::weak_ptr<State>(state)] {
    auto state = weak.lock();
    if (!state) return;
    if (state->next == state->queues.size()) {
      auto done = std::move(state->callback);
      auto depths = std::move(state->depths);
      auto refused = std::move(state->refused);
      state->step = nullptr;  // breaks the cycle; `done` may run after this returns
      if (done) done(std::move(depths), std::move(refused));
      return;
    }
    const std::string queue = state->queues[state->next++];
    client::look_up_queue(state->connection, queue,
                          [state, queue](const Error& error, const client::QueueInfo& info) {
                            if (!error) state->depths[queue] = info.message_count;
                            if (error.reply_code == 403) state->refused.push_back(queue);
                            state->step();
                          });
  };
  state->step();
}

/// Cuts `body` to at most `bytes` bytes, backing off up to three bytes so that a UTF-8 text
/// keeps whole characters, and gives back the memory of the rest.
void cut_body(std::string& body, size_t bytes) {
  if (body.size() <= bytes) return;
  size_t end = bytes;
  for (int i = 0; i < 3 && end > 0 && (static_cast<unsigned char>(body[end]) & 0xC0) == 0x80; ++i) {
    --end;
  }
  body = body.substr(0, end);
}

}  // namespace

Error list(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
           ListOptions options, ListCallback callback) {
  auto messages = std::make_shared<std::vector<ParkedMessage>>();
  auto count = std::make_shared<size_t>(0);
  const size_t limit = options.limit;
  return Walker::start(
      connection, topology::parking_queue_name(service.name), options.window,
      [messages, count, limit, on_message = std::move(options.on_message)](ParkedMessage& parked) {
        if (on_message) {
          on_message(parked);
        } else {
          messages->push_back(std::move(parked));
        }
        Decision decision;
        decision.stop_after = limit != 0 && ++*count >= limit;
        return decision;
      },
      [messages, callback = std::move(callback)](const Error& error, const Progress&, bool) {
        if (callback) callback(error, std::move(*messages));
      });
}

Error stats(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
            StatsCallback callback) {
  return stats(connection, service, StatsOptions{}, std::move(callback));
}

std::vector<ErrorCause> causes_of(const std::vector<std::pair<std::string, uint64_t>>& by_error) {
  std::map<std::string, ErrorCause> causes;
  for (const auto& [line, count] : by_error) {  // most frequent first: the first is the example
    const bool kept_as_is = line == "(none)" || line == other_errors_group;
    const std::string fingerprint = kept_as_is ? line : error_fingerprint(line);
    ErrorCause& cause = causes[fingerprint];
    if (cause.distinct++ == 0) {
      cause.fingerprint = fingerprint;
      cause.example = line;
    }
    cause.count += count;
  }
  std::vector<ErrorCause> out;
  out.reserve(causes.size());
  for (auto& entry : causes)
    out.push_back(std::move(entry.second));
  std::stable_sort(out.begin(), out.end(),
                   [](const ErrorCause& a, const ErrorCause& b) { return a.count > b.count; });
  return out;
}

Error stats(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
            StatsOptions options, StatsCallback callback, ProgressHandler on_progress) {
  struct Counts {
    Stats stats;
    std::unordered_map<std::string, uint64_t> by_error;
  };
  auto counts = std::make_shared<Counts>();
  std::vector<std::string> loop_queues;
  if (options.loop_depths) {
    loop_queues.push_back(topology::input_queue_name(service));
    for (auto delay : topology::wait_delays(service)) {
      loop_queues.push_back(topology::wait_queue_name(service.name, delay));
    }
    if (service.retry.delay_levels) {
      for (int k = 0; k < service.retry.delay_levels->levels; ++k) {
        loop_queues.push_back(topology::delay_level_name(service, k));
      }
      loop_queues.push_back(topology::delay_unrouted_name(service));
    }
  }
  const uint64_t now = retry::unix_seconds();
  return Walker::start(
      connection, topology::parking_queue_name(service.name), options.window,
      [counts, filter = std::move(options.filter), keep = options.keep,
       kept_body_bytes = options.kept_body_bytes, now](ParkedMessage& parked) {
        Stats& stats = counts->stats;
        if (!filter.matches(parked, now)) return Decision{};
        ++stats.matched;
        if (parked.parked_at &&
            (!stats.oldest_parked_at || *parked.parked_at < *stats.oldest_parked_at)) {
          stats.oldest_parked_at = parked.parked_at;
        }
        ++stats.by_reason[parked.reason.empty() ? "(none)" : parked.reason];
        std::string line = parked.error.empty() ? "(none)" : first_line(parked.error);
        auto group = counts->by_error.find(line);
        if (group != counts->by_error.end()) {
          ++group->second;
        } else if (counts->by_error.size() < max_error_groups) {
          counts->by_error.emplace(std::move(line), 1);
        } else {
          ++counts->by_error[other_errors_group];
        }
        if (stats.messages.size() < keep) {
          if (kept_body_bytes) cut_body(parked.message.body, *kept_body_bytes);
          stats.messages.push_back(std::move(parked));
        }
        return Decision{};
      },
      [counts, connection, loop_queues, callback = std::move(callback)](
          const Error& error, const Progress& progress, bool) {
        Stats& stats = counts->stats;
        stats.depth = uint32_t(progress.total);
        stats.scanned = progress.scanned;
        stats.by_error.assign(counts->by_error.begin(), counts->by_error.end());
        std::sort(stats.by_error.begin(), stats.by_error.end(), [](const auto& a, const auto& b) {
          return a.second != b.second ? a.second > b.second : a.first < b.first;
        });
        stats.by_cause = causes_of(stats.by_error);
        if (error || !connection->is_open() || loop_queues.empty()) {
          if (callback) callback(error, std::move(stats));
          return;
        }
        queue_depths(connection, loop_queues,
                     [counts, callback](std::map<std::string, uint32_t> depths,
                                        std::vector<std::string> refused) {
                       counts->stats.loop_depths = std::move(depths);
                       counts->stats.loop_not_permitted = std::move(refused);
                       if (callback) callback(Error{}, std::move(counts->stats));
                     });
      },
      std::move(on_progress));
}

namespace {

class ReplayRun : public Replay {
 public:
  ReplayRun(ReplayOptions options, std::string target, const topology::Service& service)
      : options_(std::move(options)), target_(std::move(target)), service_(service) {}

  void stop() override {
    stopped_ = true;
    if (auto walker = walker_.lock()) walker->stop();
  }
  const Progress& progress() const override { return progress_; }

  Decision decide(ParkedMessage& parked) {
    Decision decision;
    const bool under_limit = options_.limit == 0 || taken_ < options_.limit;
    const bool ours =
        !options_.unrouted_retries || topology::is_delay_route_of(service_, parked.routing_key);
    if (!under_limit || !ours || !options_.filter.matches(parked, now_)) {
      ++skipped_;
      return decision;
    }
    ++taken_;
    decision.stop_after = options_.limit != 0 && taken_ >= options_.limit;
    if (options_.dry_run) {
      ++would_move_count_;
      if (options_.on_would_move) {
        options_.on_would_move(parked);
      } else {
        result_.would_move.push_back(std::move(parked));
      }
      return decision;
    }
    decision.kind = Decision::Kind::move;
    decision.routing_key = target_;
    decision.properties = make_replay_copy(parked.message.properties, options_.note);
    return decision;
  }

  /// The walker's counts plus this run's skipped (and, for a dry run, would-move) counts.
  const Progress& merge(const Progress& walked) {
    progress_ = walked;
    progress_.skipped = skipped_;
    if (options_.dry_run) progress_.moved = would_move_count_;
    return progress_;
  }

  ReplayOptions options_;
  std::string target_;
  topology::Service service_;
  uint64_t now_ = retry::unix_seconds();
  uint64_t taken_ = 0;
  uint64_t skipped_ = 0;
  uint64_t would_move_count_ = 0;
  Progress progress_;
  ReplayResult result_;
  std::weak_ptr<Walker> walker_;
  bool stopped_ = false;
};

}  // namespace

Error replay(const std::shared_ptr<client::Connection>& connection,
             const topology::Service& service, ReplayOptions options, ReplayCallback callback,
             std::shared_ptr<Replay>* handle, ProgressHandler on_progress) {
  if (!connection || !connection->is_open()) return Error(ClientError::not_open);
  std::string target =
      options.to_queue.empty() ? topology::input_queue_name(service) : options.to_queue;
  if (options.unrouted_retries && !service.retry.delay_levels) {
    return Error(ParkingError::no_delay_levels,
                 "service " + service.name +
                     " has no delay levels, so none of its retries can wait in their unrouted "
                     "queue");
  }
  const std::string parking = options.unrouted_retries ? topology::delay_unrouted_name(service)
                                                       : topology::parking_queue_name(service.name);
  auto run = std::make_shared<ReplayRun>(std::move(options), target, service);
  if (handle != nullptr) *handle = run;
  // The target must exist: a copy to a missing queue would only come back as a return. A
  // replaying user may hold no permission on it (write on the default exchange is all a replay
  // needs), and RabbitMQ 4.2.6 and 4.3 refuse such a user's look-up (403): then the returns say
  // whether it exists, each returned copy counted as failed and its original left parked.
  client::look_up_queue(
      connection, target,
      [connection, run, parking, target, callback = std::move(callback),
       on_progress = std::move(on_progress)](const Error& look_up,
                                             const client::QueueInfo&) mutable {
        if (run->stopped_) {  // interrupted before it began
          run->result_.interrupted = true;
          if (callback) callback(run->result_);
          return;
        }
        if (look_up && look_up.reply_code != 403) {
          run->result_.error = look_up.reply_code == 404
                                   ? Error(ParkingError::queue_missing,
                                           "the target queue " + target + " does not exist")
                                   : look_up;
          if (callback) callback(run->result_);
          return;
        }
        std::shared_ptr<Walker> walker;
        Error error = Walker::start(
            connection, parking, run->options_.window,
            [run](ParkedMessage& parked) { return run->decide(parked); },
            [run, callback](const Error& error, const Progress& progress, bool interrupted) {
              run->result_.progress = run->merge(progress);
              run->result_.interrupted = interrupted;
              run->result_.error = error;
              if (callback) callback(run->result_);
            },
            [run, on_progress](const Progress& progress) {
              const Progress& merged = run->merge(progress);
              if (on_progress) on_progress(merged);
            },
            &walker);
        if (error) {
          run->result_.error = error;
          if (callback) callback(run->result_);
          return;
        }
        run->walker_ = walker;
      });
  return {};
}

amqp::BasicProperties make_edited_copy(const amqp::BasicProperties& original,
                                       const EditOptions& options, const std::string& new_id) {
  ActionNote note = options.note;
  note.outcome = retry::history_outcome::edited;
  amqp::BasicProperties copy = make_replay_copy(original, note);
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  if (options.headers) {
    headers.erase_if([](const std::string& name) {
      return name.rfind("retryloop-", 0) != 0 || name == edited_from_header;
    });
    for (const auto& entry : *options.headers) {
      if (entry.name.rfind("retryloop-", 0) == 0 || retry::is_death_header(entry.name)) continue;
      headers.set(entry.name, entry.value);
    }
  }
  headers.set(std::string(edited_from_header), original.message_id.value_or(""));
  copy.message_id = new_id;
  return copy;
}

Error edit(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
           EditOptions options, EditCallback callback) {
  if (!connection || !connection->is_open()) return Error(ClientError::not_open);
  if (options.message_id.empty()) {
    return Error(ClientError::invalid_argument, "give the message id of the parked message");
  }
  struct State {
    EditOptions options;
    EditResult result;
    std::string target;
  };
  auto state = std::make_shared<State>();
  state->target = options.to_queue.empty() ? topology::input_queue_name(service) : options.to_queue;
  state->options = std::move(options);
  std::error_code no_id;
  state->result.new_message_id = random::random_id(no_id);
  if (no_id) {
    return Error(no_id, "cannot draw the copy's message id from the operating system (getrandom)");
  }
  return Walker::start(
      connection, topology::parking_queue_name(service.name), 1,
      [state](ParkedMessage& parked) {
        Decision decision;
        const auto& wanted = state->options;
        if (state->result.found || parked.message_id != wanted.message_id ||
            (wanted.parked_at && parked.parked_at != wanted.parked_at)) {
          return decision;
        }
        state->result.found = true;
        decision.kind = state->options.keep_original ? Decision::Kind::copy : Decision::Kind::move;
        decision.routing_key = state->target;
        decision.properties = make_edited_copy(parked.message.properties, state->options,
                                               state->result.new_message_id);
        decision.body = state->options.body;
        decision.stop_after = true;
        return decision;
      },
      [state, callback = std::move(callback)](const Error& error, const Progress& progress, bool) {
        state->result.error = error;
        state->result.sent = progress.moved > 0;
        state->result.original_removed = state->result.sent && !state->options.keep_original;
        if (progress.failed > 0 && !error) {
          state->result.error =
              Error(ClientError::unroutable,
                    "the broker returned or refused the edited copy (does queue " + state->target +
                        " exist?); the original stays parked");
        }
        if (callback) callback(state->result);
      });
}

Error purge(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
            PurgeOptions options, PurgeCallback callback, ProgressHandler on_progress) {
  struct Count {
    uint64_t matched = 0;
    uint64_t skipped = 0;
  };
  auto count = std::make_shared<Count>();
  const uint64_t now = retry::unix_seconds();
  const bool execute = options.execute;
  return Walker::start(
      connection, topology::parking_queue_name(service.name), options.window,
      [count, filter = std::move(options.filter), now, execute](ParkedMessage& parked) {
        Decision decision;
        if (filter.matches(parked, now)) {
          ++count->matched;
          if (execute) decision.kind = Decision::Kind::remove;
        } else {
          ++count->skipped;
        }
        return decision;
      },
      [count, execute, callback = std::move(callback)](const Error& error, const Progress& walked,
                                                       bool) {
        Progress progress = walked;
        progress.skipped = count->skipped;
        if (!execute) progress.moved = count->matched;
        if (callback) callback(error, progress);
      },
      [count, execute, on_progress = std::move(on_progress)](const Progress& walked) {
        if (!on_progress) return;
        Progress progress = walked;
        progress.skipped = count->skipped;
        if (!execute) progress.moved = count->matched;
        on_progress(progress);
      });
}

}  // namespace retryloop::parking
