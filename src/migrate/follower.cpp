#include "retryloop/migrate/follower.hpp"

#include <utility>

namespace retryloop::migrate {
namespace {

/// Whether `record` comes after `newest`: a later step of the same migration, or another
/// migration begun later (the record queue keeps one, so an instance may read an older record
/// after it heard a newer one).
bool newer(const Record& record, const Record& newest) {
  if (record.id == newest.id) {
    if (record.next_step != newest.next_step) return record.next_step > newest.next_step;
    return record.updated_at_ms > newest.updated_at_ms || (record.finished && !newest.finished);
  }
  return record.started_at_ms > newest.started_at_ms;
}

}  // namespace

Follower::Follower(std::string service, std::string service_queue)
    : service_(std::move(service)),
      service_queue_(std::move(service_queue)),
      queue_(service_queue_) {}

bool Follower::heard(const Record& record) {
  if (record.service != service_) return false;
  if (newest_ && !newer(record, *newest_)) return false;
  newest_ = record;
  const std::string& wanted =
      !record.finished && !record.holding.empty() ? record.holding : service_queue_;
  if (wanted == queue_) return false;
  queue_ = wanted;
  return true;
}

std::string Follower::describe() const {
  if (!newest_) return "no migration";
  std::string text = "migration " + newest_->id;
  if (newest_->finished) return text + ": finished";
  return text + ": at step " + std::to_string(newest_->next_step + 1);
}

}  // namespace retryloop::migrate
