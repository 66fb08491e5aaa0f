#include "retryloop/move/queue_mover.hpp"

#include <string>
#include <utility>

#include "retryloop/move/stamp.hpp"

namespace retryloop::move {
namespace {

using client::ClientError;
using client::Error;

/// The AMQP limit on a field name: a short string.
constexpr size_t kMaxHeaderName = 255;

/// One move: the walker's visitor and the counts the walker does not keep.
class QueueMove {
 public:
  explicit QueueMove(MoveOptions options) : options_(std::move(options)) {
    for (const std::string& stamp : options_.copied_before)
      stamps_.insert(stamp);
    options_.copied_before.clear();
  }

  Decision decide(WalkedMessage& walked) {
    Decision decision;
    client::Message& message = walked.delivery.message;
    if (message.properties_error) {
      // Published with the properties it has (none), the copy would lose them: it stays.
      ++undecodable_;
      return decision;
    }
    amqp::BasicProperties& properties = message.properties;
    if (!options_.stamp_header.empty()) {
      const amqp::FieldValue* stamp =
          properties.headers ? properties.headers->find(options_.stamp_header) : nullptr;
      if (stamp != nullptr) {
        const auto text = stamp->as_string();
        if (options_.deduplicate && text && !stamps_.insert(*text)) {
          ++duplicates_;
          decision.kind = Decision::Kind::remove;
          return decision;
        }
        ++copies_;  // kept as it is
        if (text && options_.copied) decision.key = std::string(*text);
      } else {
        std::string value = stamp_of(properties, message.body);
        if (options_.deduplicate && !stamps_.insert(value)) {
          ++duplicates_;  // the same message id and bytes as a message copied before
          decision.kind = Decision::Kind::remove;
          return decision;
        }
        if (options_.copied) decision.key = value;
        amqp::FieldTable& headers =
            properties.headers ? *properties.headers : properties.headers.emplace();
        headers.set(options_.stamp_header, amqp::FieldValue(std::move(value)));
      }
    }
    decision.kind = Decision::Kind::move;
    decision.exchange = options_.exchange;
    decision.routing_key = options_.routing_key;
    decision.properties = std::move(properties);
    decision.shorten_history_to_fit = false;  // the history passes unchanged, or not at all
    return decision;                          // the walker publishes the body as it was read
  }

  /// The stamp of a message that has none yet: the same in every run for one with a message id
  /// (MoveOptions::stable_prefix), else this run's prefix and the count of its copies.
  std::string stamp_of(const amqp::BasicProperties& properties, std::string_view body) {
    ++copies_;
    if (!options_.stable_prefix.empty()) {
      const std::string stable = stable_stamp(properties, body, options_.stamp_header);
      if (!stable.empty()) return options_.stable_prefix + ":" + stable;
    }
    return options_.stamp_prefix + ":" + std::to_string(copies_);
  }

  /// The walker's counts with this move's: a duplicate, which the walker counted as moved (it
  /// was acked), counts as a duplicate; a message that stays undecoded counts as failed.
  const Progress& merge(const Progress& walked) {
    progress_ = walked;
    progress_.moved -= duplicates_;
    progress_.duplicates = duplicates_;
    progress_.failed += undecodable_;
    return progress_;
  }

 private:
  MoveOptions options_;
  /// Copies made so far: the n of the next stamp is one more.
  uint64_t copies_ = 0;
  uint64_t duplicates_ = 0;
  uint64_t undecodable_ = 0;
  /// With deduplicate: the stamps copied so far.
  StampSet stamps_;
  Progress progress_;
};

}  // namespace

Error move_queue(const std::shared_ptr<client::Connection>& connection, MoveOptions options,
                 MoveCallback done, std::shared_ptr<QueueWalker>* handle) {
  if (options.from.empty()) {
    return Error(ClientError::invalid_argument, "a move needs the queue to move messages from");
  }
  if (options.stamp_header.size() > kMaxHeaderName) {
    return Error(ClientError::invalid_argument,
                 "stamp header " + options.stamp_header.substr(0, 40) + "... has a name of " +
                     std::to_string(options.stamp_header.size()) +
                     " bytes; AMQP allows at most 255");
  }
  if (options.deduplicate && options.stamp_header.empty()) {
    return Error(ClientError::invalid_argument,
                 "a move deduplicates by its stamps: give it a stamp header");
  }
  if (!connection || !connection->is_open()) return Error(ClientError::not_open);
  WalkOptions walk;
  walk.queue = options.from;
  walk.window = options.window;
  walk.readers = "a move's reads";
  walk.done_before_grace = options.done_before_grace;
  walk.record_moved = options.copied;
  ProgressHandler on_progress = std::move(options.on_progress);
  auto run = std::make_shared<QueueMove>(std::move(options));
  if (on_progress) {
    walk.on_progress = [run, on_progress = std::move(on_progress)](const Progress& walked) {
      on_progress(run->merge(walked));
    };
  }
  return QueueWalker::start(
      connection, std::move(walk), [run](WalkedMessage& walked) { return run->decide(walked); },
      [run, done = std::move(done)](const Error& error, const Progress& walked, bool interrupted) {
        const Progress& progress = run->merge(walked);
        if (done) done(error, progress, interrupted);
      },
      handle);
}

}  // namespace retryloop::move
