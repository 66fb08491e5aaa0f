#include "retryloop/transfer/transfer.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "retryloop/client/timer.hpp"
#include "retryloop/move/error.hpp"
#include "retryloop/move/stamp.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/plan.hpp"

namespace retryloop::transfer {
namespace {

using client::Error;
using std::chrono::milliseconds;

/// RabbitMQ's reply to a declare of an exclusive queue another connection holds.
constexpr uint16_t resource_locked = 405;

int64_t system_now_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// What one transfer moves: a service's queues, or a scheduled queue's that no service declares.
struct Unit {
  /// What the errors name: "orders", or "queue mail".
  std::string what;
  std::string lock;
  /// The queue the moved messages are for.
  std::string queue;
  /// The ladders whose messages the old broker's delay levels hold for `queue`.
  std::vector<topology::Service> ladders;
  std::vector<Source> sources;
  /// The levels moved retries wait in, declared on the new broker by the transfer.
  std::optional<topology::Schedule> schedule;
  /// The ladder the wait queues' retries go back through (a service's; a queue has none).
  topology::Service ladder;
};

Unit service_unit(const topology::Service& service, const TransferOptions& options) {
  Unit unit;
  unit.what = service.name;
  unit.lock = lock_queue_name(service.name);
  unit.queue = topology::input_queue_name(service);
  unit.ladders = level_ladders(service, options.schedule);
  unit.sources = transfer_sources(service, unit.ladders);
  unit.schedule = transfer_schedule(service, options.precision);
  unit.ladder = ladder_service(service, options.precision);
  return unit;
}

Unit queue_unit(const std::string& queue, const TransferOptions& options) {
  Unit unit;
  unit.what = "queue " + queue;
  unit.lock = lock_queue_name(queue);
  unit.queue = queue;
  unit.ladders = queue_level_ladders(queue, options.schedule);
  unit.sources = scheduled_queue_sources(queue, unit.ladders);
  return unit;
}

class TransferImpl : public Transfer, public std::enable_shared_from_this<TransferImpl> {
 public:
  TransferImpl(std::shared_ptr<client::Connection> from, std::shared_ptr<client::Connection> to,
               Unit unit, TransferOptions options, TransferEvents events, TransferCallback done)
      : from_(std::move(from)),
        to_(std::move(to)),
        options_(std::move(options)),
        events_(std::move(events)),
        done_(std::move(done)),
        unit_(std::move(unit)),
        stayed_(unit_.sources.size()) {
    if (!options_.now_ms) options_.now_ms = system_now_ms;
    result_.id = options_.id;
  }

  template <class Next>
  auto guarded(Next next) {
    return [weak = weak_from_this(), next](auto&&... args) {
      auto self = weak.lock();
      if (!self || self->ended_) return;
      next(*self, std::forward<decltype(args)>(args)...);
    };
  }

  void begin(std::shared_ptr<TransferImpl> self) {
    self_ = std::move(self);
    client::take_queue_lock(
        from_, unit_.lock, options_.lock_wait, guarded([](TransferImpl& self, const Error& error) {
          if (error.reply_code == resource_locked) {
            return self.finish(Error(client::ClientError::channel_closed,
                                     "another `retryloop topology transfer` of " + self.unit_.what +
                                         " is running (it holds " + self.unit_.lock + ")"));
          }
          if (error) return self.finish(error);
          self.declare_levels();
        }));
  }

  void stop() override {
    stopping_ = true;
    if (walker_) walker_->stop();
  }

 private:
  /// The levels moved retries wait in, on the new broker (the service's own are declared with
  /// its topology).
  void declare_levels() {
    if (!unit_.schedule) return start_pass();
    topology::Topology levels;
    levels.schedule = unit_.schedule;
    Error error = topology::apply(
        to_, topology::make_plan(levels),
        guarded([](TransferImpl& self, const topology::Report& report) {
          if (report.connection_error) return self.finish(report.connection_error);
          if (!report.ok()) {
            std::string problem;
            for (const auto& result : report.results) {
              if (result.error) {
                problem = result.action.name + ": " + result.error.message();
                break;
              }
            }
            return self.finish(Error(client::ClientError::invalid_argument,
                                     "the levels moved retries wait in could not be declared on "
                                     "the new broker (" +
                                         problem + ")"));
          }
          self.start_pass();
        }));
    if (error) finish(error);
  }

  void start_pass() {
    // The first pass, and a pass that would end --follow, check a count of 0 with a basic.get (a
    // quorum queue without a reachable leader counts 0; see WalkOptions::empty_answers); the
    // passes between them trust the count, since the next pass reads the queues again half a
    // second later, and take nothing off a queue that publishers not yet switched still feed.
    careful_ = result_.passes == 0 || confirming_;
    ++result_.passes;
    next_ = 0;
    pass_moved_ = 0;
    read_next();
  }

  void read_next() {
    if (stopping_) {
      result_.interrupted = true;
      return finish(Error{});
    }
    if (next_ == unit_.sources.size()) return end_pass();
    read(unit_.sources[next_]);
  }

  void read(const Source& source) {
    if (events_.reading) events_.reading(source, result_.passes);
    auto current = std::make_shared<SourceResult>();
    current->source = source;
    move::WalkOptions walk;
    walk.queue = source.queue;
    walk.window = options_.window;
    walk.publish_connection = to_;
    walk.readers = "a transfer's reads";
    if (!careful_) walk.empty_answers = 1;
    std::weak_ptr<TransferImpl> weak = weak_from_this();
    auto visitor = [weak, current](move::WalkedMessage& message) {
      auto self = weak.lock();
      if (!self) return move::Decision{};
      return self->decide(message, *current);
    };
    Error error = move::QueueWalker::start(
        from_, std::move(walk), std::move(visitor),
        guarded([current](TransferImpl& self, const Error& error, const move::Progress& progress,
                          bool interrupted) {
          self.walker_.reset();
          current->progress = progress;
          // A queue the old broker lacks (a delay it never had) has nothing to move.
          if (error && error.code != make_error_code(move::MoveError::queue_missing)) {
            self.result_.reads.push_back(*current);
            return self.finish(error);
          }
          self.pass_moved_ += progress.moved;
          self.stayed_[self.next_] = {current->left, progress.failed + current->undecodable};
          self.result_.reads.push_back(*current);
          if (self.events_.read) self.events_.read(*current, self.result_.passes);
          if (interrupted) self.stopping_ = true;
          ++self.next_;
          self.read_next();
        }),
        &walker_);
    if (error) finish(error);
  }

  move::Decision decide(move::WalkedMessage& message, SourceResult& current) {
    move::Decision decision;
    const client::Delivery& delivery = message.delivery;
    if (delivery.message.properties_error) {
      ++current.undecodable;  // kept where it is
      return decision;
    }
    const Source& source = current.source;
    const int64_t now = options_.now_ms();
    int64_t due = 0;
    if (source.kind == Source::Kind::wait_queue || source.kind == Source::Kind::delay_level) {
      // A wait queue's retries go back through the ladder of the service (or of the transfer);
      // a level's messages through the ladder they were routed for, on the new broker.
      const topology::Service* ladder = &unit_.ladder;
      milliseconds whole_delay = source.delay;
      if (source.kind == Source::Kind::delay_level) {
        ladder = ladder_of(unit_.ladders, source, delivery.routing_key);
        if (ladder == nullptr) {
          ++current.others;  // another queue's: it stays
          return decision;
        }
        whole_delay = level_wait_bound(*ladder, source, delivery.routing_key);
      }
      const Placement placement = place(due_time(delivery.message.properties, source, unit_.queue),
                                        whole_delay, now, options_.follow);
      if (placement.kind == Placement::Kind::leave) {
        ++current.left;
        return decision;
      }
      due = placement.due_ms;
      if (placement.kind == Placement::Kind::levels) {
        const topology::DelayRoute route = topology::delay_route(*ladder, placement.delay);
        decision.exchange = route.exchange;
        decision.routing_key = route.routing_key;
        ++current.to_levels;
        current.longest_delay = std::max(current.longest_delay, route.delay);
        if (!placement.due_known) ++current.due_unknown;
      } else {
        decision.routing_key = unit_.queue;
        ++current.to_queue;
      }
    } else {
      if (source.kind == Source::Kind::unrouted &&
          ladder_of(unit_.ladders, source, delivery.routing_key) == nullptr) {
        ++current.others;  // another queue's: it stays
        return decision;
      }
      decision.routing_key = source.kind == Source::Kind::parking ? source.queue : unit_.queue;
      ++current.to_queue;
    }
    decision.kind = move::Decision::Kind::move;
    decision.properties =
        transfer_copy(delivery.message.properties, source, unit_.queue, delivery.exchange,
                      delivery.routing_key, static_cast<uint64_t>(now / 1000), due);
    stamp(decision.properties, delivery.message);
    return decision;
  }

  /// Stamps `copy` unless it has a stamp: "<service queue>:<stable stamp>" for an original with a
  /// message id, the same in a rerun and from every old queue, "<run id>:<n>" for one without.
  void stamp(amqp::BasicProperties& copy, const client::Message& original) {
    if (!copy.headers) copy.headers = amqp::FieldTable{};
    if (copy.headers->find(stamp_header) != nullptr) return;
    const std::string stable = move::stable_stamp(original.properties, original.body, stamp_header);
    copy.headers->set(std::string(stamp_header), stable.empty()
                                                     ? result_.id + ":" + std::to_string(++stamps_)
                                                     : unit_.queue + ":" + stable);
  }

  void end_pass() {
    if (!options_.follow) return finish(Error{});
    const int64_t now = options_.now_ms();
    // Quiet: nothing moved, and no retry left to come due (what cannot move does not count).
    uint64_t left = 0;
    for (const auto& [waiting, stuck] : stayed_)
      left += waiting;
    if (pass_moved_ == 0 && left == 0) {
      if (!empty_since_) empty_since_ = now;
      const milliseconds empty_for(now - *empty_since_);
      if (events_.idle) events_.idle(empty_for);
      if (empty_for >= options_.settle) {
        if (careful_) return finish(Error{});
        confirming_ = true;
      }
    } else {
      empty_since_.reset();
      confirming_ = false;
    }
    client::run_after(from_->loop(), options_.pass_interval,
                      guarded([](TransferImpl& self) { self.read_next_pass(); }));
  }

  void read_next_pass() {
    if (stopping_) {
      result_.interrupted = true;
      return finish(Error{});
    }
    start_pass();
  }

  void finish(const Error& error) {
    if (ended_) return;
    ended_ = true;
    for (const auto& [waiting, stuck] : stayed_) {
      result_.left += waiting;
      result_.stuck += stuck;
    }
    TransferCallback done = std::move(done_);
    std::shared_ptr<TransferImpl> keep = std::move(self_);
    if (done) done(error, result_);
  }

  std::shared_ptr<client::Connection> from_;
  std::shared_ptr<client::Connection> to_;
  TransferOptions options_;
  TransferEvents events_;
  TransferCallback done_;
  Unit unit_;
  std::shared_ptr<move::QueueWalker> walker_;
  size_t next_ = 0;
  /// Messages moved in this pass.
  uint64_t pass_moved_ = 0;
  /// Per source, as its last read found: retries left to come due there, and messages that could
  /// not move (refused by the new broker, or undecodable).
  std::vector<std::pair<uint64_t, uint64_t>> stayed_;
  std::optional<int64_t> empty_since_;
  /// Whether this pass checks a count of 0 (see start_pass), and whether the next must, to end
  /// --follow.
  bool careful_ = true;
  bool confirming_ = false;
  uint64_t stamps_ = 0;
  bool stopping_ = false;
  bool ended_ = false;
  TransferResult result_;
  std::shared_ptr<TransferImpl> self_;
};

}  // namespace

std::string lock_queue_name(std::string_view name) {
  return std::string(name) + ".transfer.lock";
}

uint64_t TransferResult::moved() const {
  uint64_t total = 0;
  for (const SourceResult& read : reads)
    total += read.progress.moved;
  return total;
}

namespace {

Error start_transfer(const std::shared_ptr<client::Connection>& from,
                     const std::shared_ptr<client::Connection>& to, Unit unit,
                     TransferOptions options, TransferEvents events, TransferCallback done,
                     std::shared_ptr<Transfer>* handle) {
  if (!from || !from->is_open()) return Error(client::ClientError::not_open, "the old broker");
  if (!to || !to->is_open()) return Error(client::ClientError::not_open, "the new broker");
  if (options.id.empty()) {
    std::error_code random_error;
    options.id = random::random_id(random_error);
    if (random_error) return Error(random_error, "no random id for the transfer's stamps");
  }
  auto transfer = std::make_shared<TransferImpl>(from, to, std::move(unit), std::move(options),
                                                 std::move(events), std::move(done));
  if (handle != nullptr) *handle = transfer;
  transfer->begin(transfer);
  return {};
}

}  // namespace

Error transfer_service(const std::shared_ptr<client::Connection>& from,
                       const std::shared_ptr<client::Connection>& to,
                       const topology::Service& service, TransferOptions options,
                       TransferEvents events, TransferCallback done,
                       std::shared_ptr<Transfer>* handle) {
  Unit unit = service_unit(service, options);
  return start_transfer(from, to, std::move(unit), std::move(options), std::move(events),
                        std::move(done), handle);
}

Error transfer_scheduled_queue(const std::shared_ptr<client::Connection>& from,
                               const std::shared_ptr<client::Connection>& to,
                               const std::string& queue, TransferOptions options,
                               TransferEvents events, TransferCallback done,
                               std::shared_ptr<Transfer>* handle) {
  if (!queue_schedule(queue, options.schedule)) {
    return Error(client::ClientError::invalid_argument,
                 "the schedule does not deliver to " + queue + ": nothing of it to transfer");
  }
  Unit unit = queue_unit(queue, options);
  return start_transfer(from, to, std::move(unit), std::move(options), std::move(events),
                        std::move(done), handle);
}

}  // namespace retryloop::transfer
