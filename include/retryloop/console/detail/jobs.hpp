#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "retryloop/parking/parking.hpp"

namespace retryloop::console::detail {

/// One read or action on the parking queue. They run one at a time: two walks over one queue
/// would each see only what the other does not hold.
struct Job {
  enum class Kind {
    scan,    ///< counts and the first messages (parking::stats)
    replay,  ///< parking::replay
    purge,   ///< parking::purge
    count,   ///< parking::purge without executing: how many match
    edit,    ///< parking::edit: one message, edited and sent on
  };
  /// A job stopped before it started ends `done` with `interrupted`, as a replay stopped halfway.
  enum class State { queued, running, done, failed };

  uint64_t id = 0;
  Kind kind = Kind::scan;
  parking::Filter filter;
  /// The filter as the request gave it, to show back.
  nlohmann::json filter_json;
  /// A scan started by the console itself, not by a request.
  bool automatic = false;
  /// Who asked for it: the caller's name and address.
  std::string who;
  /// How many messages the caller was shown and confirmed, when the request said.
  std::optional<uint64_t> asked;
  /// The id of its records in the audit trail.
  std::string audit_id;
  parking::EditOptions edit;
  parking::EditResult edit_result;
  State state = State::queued;
  bool stop_requested = false;
  bool interrupted = false;
  parking::Progress progress;
  std::string error;
  /// Loop time (ms) and wall-clock time (s).
  uint64_t started_ms = 0;
  uint64_t finished_ms = 0;
  uint64_t started_at = 0;
  uint64_t finished_at = 0;
  std::shared_ptr<parking::Replay> replay;
  std::shared_ptr<parking::Edit> edit_run;
  /// A scan's counts and kept messages. Of its error groups only the most frequent ones the page
  /// shows are kept; `error_groups_dropped` counts the others.
  parking::Stats stats;
  uint64_t error_groups_dropped = 0;
};

/// The jobs waiting to run, in the order they will: actions first, then at most one scan. Loop
/// thread only.
class JobQueue {
 public:
  /// A new job with the next id, not queued.
  std::shared_ptr<Job> make(Job::Kind kind, parking::Filter filter, nlohmann::json filter_json);
  /// Queues a scan with this filter. A scan that waits already takes the filter instead: the
  /// latest one asked for wins.
  void request_scan(parking::Filter filter, nlohmann::json filter_json, bool automatic);
  /// Queues a scan with this filter to count again after an action, unless a scan waits
  /// already: that one keeps its own filter, which was asked for later than the one shown.
  void refresh(const parking::Filter& filter, const nlohmann::json& filter_json);
  /// Queues an action ahead of any waiting scan: it is what the user waits for.
  void push_action(std::shared_ptr<Job> job);
  /// The next job to run, taken out of the queue; nullptr when none waits.
  std::shared_ptr<Job> pop();
  /// Takes the waiting action out of the queue and ends it, stopped before it started (`done`,
  /// `interrupted`); nullptr when no action waits.
  std::shared_ptr<Job> stop_waiting_action();
  const Job* waiting_action() const;
  const Job* waiting_scan() const;
  bool empty() const { return jobs_.empty(); }
  void clear() { jobs_.clear(); }

 private:
  Job* find_scan() const;

  uint64_t next_id_ = 1;
  std::deque<std::shared_ptr<Job>> jobs_;
};

}  // namespace retryloop::console::detail
