#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "breaker_link.hpp"
#include "parking_depth.hpp"
#include "retryloop/consumer/consumer.hpp"
#include "retryloop/consumer/detail/worker_pool.hpp"
#include "retryloop/outage/breaker.hpp"
#include "retryloop/outage/coordinator.hpp"
#include "retryloop/process/stop_signals.hpp"
#include "session.hpp"

namespace retryloop::consumer::detail {

// What a Consumer is. Its parts: a Session per connected attempt (session.hpp), the handler
// modes and outcomes (consumer.cpp), copy publishing (copies.cpp), the parking-depth alert
// (parking_depth.hpp) and StopSignals. Ownership as described in session.hpp: it holds itself
// in `self_` while it runs, and every callback it hands out holds a weak_ptr to it.
class ConsumerImpl : public std::enable_shared_from_this<ConsumerImpl> {
 public:
  ConsumerImpl(uv_loop_t* loop, ConsumerOptions options);
  ~ConsumerImpl();

  client::Error start();
  void stop(std::chrono::milliseconds deadline);
  void stop_now();

  std::shared_ptr<const Handler> handler_;
  /// options_.exceptions, shared with handler calls on the worker pool, which may outlive this.
  std::shared_ptr<const ExceptionPolicy> exceptions_;
  /// options_.start_span, shared the same way.
  std::shared_ptr<const SpanStart> start_span_;
  AsyncHandler async_handler_;
  ReadyHandler on_ready_;
  StoppedHandler on_stopped_;
  Metrics metrics_;
  ConsumerOptions options_;

  bool is_consuming() const { return state_ == State::running; }
  ConsumerState state() const;
  bool is_blocked() const { return blocked_; }
  std::optional<client::Endpoint> consuming_from() const;
  size_t in_flight() const;
  size_t handlers_running() const;
  bool wait_for_handlers(std::chrono::milliseconds timeout) const;

  outage::State breaker_state() const { return breaker_.state(); }
  bool breaker_shared() const { return coordinator_.joined(); }
  int breaker_limit() const { return breaker_.limit(); }
  uint32_t parking_alert_threshold() const { return options_.parking_alert_threshold; }
  outage::Stats breaker_stats() const;
  size_t held() const;
  void pause();
  void resume();

 private:
  /// What a delivery gathers from the moment its handler starts. Kept apart so that the many
  /// deliveries waiting for a handler (up to the prefetch) hold only what arrived.
  struct Handling {
    retry::AttemptInfo info;
    uint64_t started_ns = 0;
    /// When a handler on a worker thread returned (uv_hrtime); 0 for the other modes.
    uint64_t finished_ns = 0;
    bool threw = false;
    retry::Decision decision;
    /// The retry or parking copy's properties, built once. Apart, so that the record of a
    /// delivery that is acked stays small enough for malloc's fast path.
    std::unique_ptr<amqp::BasicProperties> copy;
    /// The copy's properties in wire form while the copy awaits its confirm (`copy` is then
    /// empty): a third of their decoded size, decoded again only if the copy must be published
    /// again.
    std::string sent_copy;
    uint32_t publish_tries = 0;
    /// When a nacked or returned copy is published again (uv_now ms); 0: not waiting.
    uint64_t retry_at_ms = 0;
    /// Since when its copy awaits a confirm (uv_now ms); 0: none in flight.
    uint64_t published_at_ms = 0;
    /// Held back while the broker blocks publishing.
    bool paused = false;
    /// The parking copy was made again without the original's headers (it did not fit).
    bool stripped = false;
    /// The outcome of a synchronous handler run on a worker thread.
    Outcome work_outcome;
    /// What the handler said, for the span's end.
    Outcome outcome;
    /// The message's trace context, read once for the span and the log lines.
    std::optional<TraceContext> trace;
    /// Ends the span begun around the handler; called once, then emptied.
    SpanEnd span_end;
  };

  /// A delivery as it arrived, its properties in wire form (client::ConsumeOptions::
  /// raw_properties): a few hundred bytes, where decoded headers take several times that.
  struct Arrived {
    std::string body;
    std::string properties;
    std::string exchange;
    std::string routing_key;
    bool redelivered = false;
  };

  /// One delivery from receipt to settlement. While it waits for a handler it holds only what
  /// arrived; its message is decoded from that when its handler starts.
  struct Pending {
    uint64_t id = 0;
    uint64_t generation = 0;
    /// The consume channel it came from: its tag is acked there or nowhere.
    std::shared_ptr<client::Channel> channel;
    /// Its consumer's mark (Session::mark_of), let go when it is settled.
    std::shared_ptr<void> mark;
    uint64_t delivery_tag = 0;
    /// Moved into `message` when its handler starts.
    Arrived arrived;
    /// Both set when its handler starts (begin_handling).
    std::unique_ptr<Message> message;
    std::unique_ptr<Handling> handling;
    /// What the breaker let start, while its handler runs.
    std::optional<outage::Call> call;
    /// Its unavailable outcomes in a row while the breaker stayed closed (the dependency answered
    /// other deliveries): at the breaker's consecutive_unavailable, the next one is its own
    /// failure and charged as a retry.
    int unavailable_while_closed = 0;
  };

  enum class State { idle, connecting, running, backing_off, stopping, stopped };

  void init_handles();
  void connect_session();
  void session_ready();
  void session_failed(const client::Error& error, bool fatal);
  void fail_fatally(const client::Error& error);
  void close_session(std::function<void()> done = {});
  void schedule_reconnect(bool at_once = false);

  void on_delivery(client::Delivery&& delivery);
  /// The session left a queue (following a migration): what waits from it goes back.
  void give_back(const void* mark);
  /// Makes the delivery's message and handling record. Returns false when its properties cannot
  /// be decoded: then it is parked as poison.
  bool begin_handling(const std::shared_ptr<Pending>& pending);
  std::string over_delivery_limit(const retry::AttemptInfo& info) const;
  void park_undecodable(const std::shared_ptr<Pending>& pending, std::string_view raw_properties,
                        std::error_code error);
  /// How many handlers may be started or handed to the worker pool at once.
  size_t handler_window() const;
  void start_handlers();
  void run_handler(const std::shared_ptr<Pending>& pending, outage::Call call);
  /// Whether a delivery whose handler said `unavailable` is kept to run again, uncharged.
  bool holds_unavailable(Pending& pending) const;
  void hold(const std::shared_ptr<Pending>& pending);
  /// Runs options_.probe as the breaker's probe `call`.
  void run_probe(outage::Call call);
  void probe_done(outage::Call& call, outage::Verdict verdict);
  /// Logs the breaker's changes since the last call, tells options_.on_breaker, and hands them
  /// to the coordinator. The consumer goes on consuming whatever the state: what arrives while
  /// the breaker lets nothing start is held, and the prefetch bounds it (docs/outage.md).
  void after_breaker();
  std::chrono::milliseconds now() const;
  // breaker.cpp: sharing the breaker with the service's other instances (outage::Coordinator)
  void link_breaker();
  void unlink_breaker();
  void breaker_link_failed(const client::Error& error);
  /// Lets the coordinator see the time pass, and links again after a failed link.
  void tick_breaker_link();
  /// Publishes the coordinator's signals and tokens, acks the tokens it is done with.
  void carry_out_coordination();
  /// Takes back the deliveries handed to the worker pool whose handlers have not started; returns
  /// how many.
  size_t withdraw_handlers();
  void handler_withdrawn(const std::shared_ptr<Pending>& pending);
  /// Takes back what was handed to the worker pool ahead of a free worker, to wait again: the
  /// breaker opened, so it may not start, and handing it back would charge it.
  void take_back_unstarted();
  void handler_done(const std::shared_ptr<Pending>& pending, Outcome outcome);
  void carry_out(const std::shared_ptr<Pending>& pending);
  bool is_live(const Pending& pending) const;
  void log_outcome(const Pending& pending, const char* what, const std::string& text) const;
  /// `service=... queue=... message_id=... attempt=...`, and `trace_id=...` when it has one.
  std::string message_fields(const Pending& pending) const;
  void count_retry(const retry::Decision& decision);
  /// Counts an abandoned delivery and ends its span.
  void abandon(const Pending& pending);
  void end_span(const Pending& pending, Settlement settlement);

  // copies.cpp: retry and parking copies, published with confirms before the original is acked
  void publish_copy(const std::shared_ptr<Pending>& pending);
  void copy_settled(const std::shared_ptr<Pending>& pending, const client::PublishOutcome& outcome,
                    const client::Error& ack_error);
  void copy_refused(const std::shared_ptr<Pending>& pending, const client::PublishOutcome& outcome);
  void copy_too_large(const std::shared_ptr<Pending>& pending, const client::Error& error);
  bool reject_uncopyable(const std::shared_ptr<Pending>& pending);
  retry::ParkingNote parking_note(const retry::Decision& decision) const;
  /// Adds this attempt (and the ones before it that no copy recorded) to the copy's history.
  void record_attempt(Handling& handling) const;
  void count_parked(ParkReason reason);
  void check_copies(uint64_t now_ms);
  void on_blocked(bool blocked, const std::string& reason);

  void on_tick();
  void maybe_finish_stop();
  void close_handles();
  void on_handle_closed();

  uv_loop_t* loop_;
  std::unique_ptr<WorkerPool> pool_;
  /// Runs options_.probe when there is no worker pool (an asynchronous handler, handler_on_loop).
  std::unique_ptr<WorkerPool> probe_pool_;
  /// While take_back_unstarted() runs: where the withdrawn deliveries go.
  std::vector<std::shared_ptr<Pending>>* taking_back_ = nullptr;
  State state_ = State::idle;
  std::shared_ptr<Session> session_;
  uint64_t generation_ = 0;
  uint32_t reconnect_attempt_ = 0;
  bool ever_ready_ = false;
  /// The topology drift a migration made was logged (once per process).
  bool drift_logged_ = false;
  bool blocked_ = false;
  bool dispatching_ = false;
  uint64_t next_pending_id_ = 1;
  uint64_t stop_deadline_ms_ = 0;
  client::Error fatal_error_;

  /// Delivered, handler not started yet (concurrency is full).
  std::deque<std::shared_ptr<Pending>> waiting_;
  /// Handlers running now, of any session, and those handed to the worker pool ahead of a free
  /// worker (handler_window).
  size_t running_ = 0;
  /// Outcome known, copy being published or waiting to be published again (by id).
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> settling_;

  uv_timer_t reconnect_timer_{};
  uv_timer_t tick_timer_{};
  std::unique_ptr<process::StopSignals> signals_;
  int open_handles_ = 0;
  bool handles_open_ = false;
  uint64_t last_metrics_log_ms_ = 0;
  ParkingDepthMonitor parking_depth_;
  outage::Breaker breaker_;
  /// The breaker's changes not yet logged and acted on (its listener must not call back into it).
  std::vector<outage::Event> breaker_events_;
  bool in_after_breaker_ = false;
  outage::Coordinator coordinator_;
  std::shared_ptr<BreakerLink> breaker_link_;
  /// After a failed link (permissions, arguments, a queue without a leader): when to try again.
  std::optional<std::chrono::milliseconds> breaker_link_retry_at_;
  bool breaker_link_warned_ = false;
  /// Linked, the service's state not read yet: no handler starts (an instance started during a
  /// pause or an outage must not call the dependency first), until joined, failed, or this time.
  std::optional<std::chrono::milliseconds> awaiting_breaker_state_until_;
  std::shared_ptr<ConsumerImpl> self_;
};

}  // namespace retryloop::consumer::detail
