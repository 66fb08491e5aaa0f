#include "retryloop/parking/parking.hpp"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "retryloop/move/error.hpp"
#include "retryloop/move/queue_walker.hpp"
#include "retryloop/parking/error.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/history.hpp"
#include "retryloop/topology/delay_levels.hpp"

namespace retryloop::parking {
namespace {

using client::ClientError;
using client::Error;
using move::Decision;
using move::QueueWalker;

/// What a parking operation decides for each message, as the parking tools see it.
using ParkedVisitor = std::function<Decision(ParkedMessage& parked)>;

/// Walks `queue` (a parking queue, or the unrouted queue of the delay levels) with the move
/// layer's walker: each message is read as a ParkedMessage, and a queue that does not exist ends
/// the walk with ParkingError::queue_missing, in the words the parking tools use.
Error walk_parked(const std::shared_ptr<client::Connection>& connection, std::string queue,
                  uint16_t window, ParkedVisitor visit, QueueWalker::DoneCallback done,
                  ProgressHandler on_progress = {},
                  std::shared_ptr<QueueWalker>* handle = nullptr) {
  move::WalkOptions options;
  options.queue = std::move(queue);
  options.window = window;
  options.on_progress = std::move(on_progress);
  options.missing_hint = " (run `retryloop topology apply`)";
  options.readers = "parking reads";
  return QueueWalker::start(
      connection, std::move(options),
      [visit = std::move(visit)](move::WalkedMessage& walked) {
        ParkedMessage parked = read_parked(std::move(walked.delivery.message), walked.index);
        parked.routing_key = std::move(walked.delivery.routing_key);
        Decision decision = visit(parked);
        const bool publishes =
            decision.kind == Decision::Kind::move || decision.kind == Decision::Kind::copy;
        if (publishes && !decision.body) {
          walked.delivery.message.body = std::move(parked.message.body);  // what it publishes
        }
        return decision;
      },
      [done = std::move(done)](const Error& error, const Progress& progress, bool interrupted) {
        if (!done) return;
        if (error.code != make_error_code(move::MoveError::queue_missing)) {
          return done(error, progress, interrupted);
        }
        Error missing = error;
        missing.code = make_error_code(ParkingError::queue_missing);
        done(missing, progress, interrupted);
      },
      handle);
}

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
  return walk_parked(
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
  return walk_parked(
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
  std::weak_ptr<QueueWalker> walker_;
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
        std::shared_ptr<QueueWalker> walker;
        Error error = walk_parked(
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

const char* field_type_name(const amqp::FieldValue& value) {
  switch (value.type_letter()) {
    case 't':
      return "boolean";
    case 'b':
      return "int8";
    case 'B':
      return "uint8";
    case 's':
      return "int16";
    case 'u':
      return "uint16";
    case 'I':
      return "int32";
    case 'i':
      return "uint32";
    case 'l':
      return "int64";
    case 'f':
      return "float";
    case 'd':
      return "double";
    case 'D':
      return "decimal";
    case 'S':
      return "long string";
    case 'x':
      return "byte array";
    case 'A':
      return "array";
    case 'T':
      return "timestamp";
    case 'F':
      return "table";
    case 'V':
      return "void";
  }
  return "unknown";
}

bool header_editable(std::string_view name) {
  return name.rfind("retryloop-", 0) != 0 && !retry::is_broker_header(name);
}

bool header_editable_as_text(std::string_view name, const amqp::FieldValue& value) {
  if (!header_editable(name)) return false;
  const char letter = value.type_letter();
  if (letter == 'S') return is_utf8(*value.as_string());
  return std::string_view("tbBsuIilfd").find(letter) != std::string_view::npos;  // scalars
}

namespace {

/// The AMQP field name limit: a field name is a short string.
constexpr size_t kMaxHeaderName = 255;

Error check_header_name(const std::string& name) {
  if (name.empty()) return Error(ClientError::invalid_argument, "a header needs a name");
  if (name.size() > kMaxHeaderName) {
    return Error(ClientError::invalid_argument,
                 "header " + name.substr(0, 40) + "... has a name of " +
                     std::to_string(name.size()) + " bytes; AMQP allows at most 255");
  }
  if (name.rfind("retryloop-", 0) == 0) {
    return Error(ClientError::invalid_argument,
                 "header " + name + " is retryloop's own: an edit keeps it as a replay does");
  }
  if (!header_editable(name)) {
    return Error(ClientError::invalid_argument,
                 "header " + name + " is the broker's: no copy carries it");
  }
  return {};
}

/// `given`, in `original`'s AMQP type when both are of one kind and the value fits in it.
amqp::FieldValue typed_like(const amqp::FieldValue& original, const amqp::FieldValue& given) {
  const auto number = given.as_int64();
  const bool given_integer = number.has_value();
  auto fits = [&](auto sample) -> std::optional<amqp::FieldValue> {
    using T = decltype(sample);
    if (!given_integer) return std::nullopt;
    const int64_t n = *number;
    if (n < int64_t(std::numeric_limits<T>::min())) return std::nullopt;
    if (n > 0 && uint64_t(n) > uint64_t(std::numeric_limits<T>::max())) return std::nullopt;
    return amqp::FieldValue(T(n));
  };
  std::optional<amqp::FieldValue> out;
  switch (original.type_letter()) {
    case 'b':
      out = fits(int8_t{});
      break;
    case 'B':
      out = fits(uint8_t{});
      break;
    case 's':
      out = fits(int16_t{});
      break;
    case 'u':
      out = fits(uint16_t{});
      break;
    case 'I':
      out = fits(int32_t{});
      break;
    case 'i':
      out = fits(uint32_t{});
      break;
    case 'f':
      if (const auto* real = given.get_if<double>()) out = amqp::FieldValue(float(*real));
      if (given_integer) out = amqp::FieldValue(float(*number));
      break;
    case 'd':
      if (given_integer) out = amqp::FieldValue(double(*number));
      break;
    case 'T':
      if (given_integer && *number >= 0) out = amqp::FieldValue(amqp::Timestamp{uint64_t(*number)});
      break;
    case 'x':
      if (const auto* text = given.get_if<std::string>())
        out = amqp::FieldValue(amqp::ByteArray{*text});
      break;
    default:
      break;
  }
  return out ? *out : given;
}

}  // namespace

Error check_edit(const EditOptions& options) {
  for (const auto& entry : options.set_headers) {
    if (Error error = check_header_name(entry.name)) return error;
  }
  for (const auto& name : options.remove_headers) {
    if (Error error = check_header_name(name)) return error;
    if (options.set_headers.find(name) != nullptr) {
      return Error(ClientError::invalid_argument,
                   "header " + name + " is both set and removed: say one");
    }
  }
  return {};
}

amqp::BasicProperties make_edited_copy(const amqp::BasicProperties& original,
                                       const EditOptions& options, const std::string& new_id) {
  ActionNote note = options.note;
  note.outcome = retry::history_outcome::edited;
  amqp::BasicProperties copy = make_replay_copy(original, note);
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  for (const auto& name : options.remove_headers) {
    if (header_editable(name)) headers.erase(name);
  }
  for (const auto& entry : options.set_headers) {
    if (!header_editable(entry.name)) continue;
    const amqp::FieldValue* before = headers.find(entry.name);
    headers.set(entry.name, before ? typed_like(*before, entry.value) : entry.value);
  }
  headers.set(std::string(edited_from_header), original.message_id.value_or(""));
  copy.message_id = new_id;
  return copy;
}

namespace {

class EditRun : public Edit {
 public:
  void stop() override {
    if (auto walker = walker_.lock()) walker->stop();
  }

  EditOptions options_;
  EditResult result_;
  std::string target_;
  std::weak_ptr<QueueWalker> walker_;
};

}  // namespace

Error edit(const std::shared_ptr<client::Connection>& connection, const topology::Service& service,
           EditOptions options, EditCallback callback, std::shared_ptr<Edit>* handle) {
  if (!connection || !connection->is_open()) return Error(ClientError::not_open);
  if (options.message_id.empty()) {
    return Error(ClientError::invalid_argument, "give the message id of the parked message");
  }
  if (Error error = check_edit(options)) return error;
  auto run = std::make_shared<EditRun>();
  run->target_ = options.to_queue.empty() ? topology::input_queue_name(service) : options.to_queue;
  run->options_ = std::move(options);
  std::error_code no_id;
  run->result_.new_message_id = random::random_id(no_id);
  if (no_id) {
    return Error(no_id, "cannot draw the copy's message id from the operating system (getrandom)");
  }
  std::shared_ptr<QueueWalker> walker;
  Error error = walk_parked(
      connection, topology::parking_queue_name(service.name), 1,
      [run](ParkedMessage& parked) {
        Decision decision;
        const auto& wanted = run->options_;
        if (run->result_.found || parked.message_id != wanted.message_id ||
            (wanted.parked_at && parked.parked_at != wanted.parked_at)) {
          return decision;
        }
        run->result_.found = true;
        decision.kind = wanted.keep_original ? Decision::Kind::copy : Decision::Kind::move;
        decision.routing_key = run->target_;
        decision.properties =
            make_edited_copy(parked.message.properties, wanted, run->result_.new_message_id);
        for (const auto& entry : *decision.properties.headers) {
          if (header_editable(entry.name) && entry.name != edited_from_header &&
              !header_editable_as_text(entry.name, entry.value)) {
            run->result_.kept_not_editable.push_back(entry.name);
          }
        }
        decision.body = wanted.body;
        decision.stop_after = true;
        return decision;
      },
      [run, callback = std::move(callback)](const Error& error, const Progress& progress,
                                            bool interrupted) {
        EditResult& result = run->result_;
        result.error = error;
        result.sent = progress.moved > 0;
        result.may_have_been_sent = progress.uncertain > 0;
        result.original_removed = result.sent && !run->options_.keep_original;
        result.interrupted = interrupted && !result.found;
        if (progress.failed > 0 && !error) {
          result.error = Error(ClientError::unroutable,
                               "the broker returned or refused the edited copy (does queue " +
                                   run->target_ + " exist?); the original stays parked");
        }
        if (result.may_have_been_sent) {
          result.error = Error(error ? error.code : make_error_code(ClientError::channel_closed),
                               "the edited copy may have been sent: the channel ended before the "
                               "broker confirmed it (" +
                                   error.message() + "). Look for message " +
                                   result.new_message_id + " in queue " + run->target_ +
                                   " before editing again; the original stays parked");
        }
        if (callback) callback(result);
      },
      {}, &walker);
  if (error) return error;
  run->walker_ = walker;
  if (handle != nullptr) *handle = run;
  return {};
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
  return walk_parked(
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
