#include "retryloop/console/detail/jobs.hpp"

#include <utility>

namespace retryloop::console::detail {

std::shared_ptr<Job> JobQueue::make(Job::Kind kind, parking::Filter filter,
                                    nlohmann::json filter_json) {
  auto job = std::make_shared<Job>();
  job->id = next_id_++;
  job->kind = kind;
  job->filter = std::move(filter);
  job->filter_json = std::move(filter_json);
  return job;
}

Job* JobQueue::find_scan() const {
  for (const auto& job : jobs_) {
    if (job->kind == Job::Kind::scan) return job.get();
  }
  return nullptr;
}

void JobQueue::request_scan(parking::Filter filter, nlohmann::json filter_json, bool automatic) {
  if (Job* waiting = find_scan()) {
    waiting->filter = std::move(filter);
    waiting->filter_json = std::move(filter_json);
    waiting->automatic = waiting->automatic && automatic;
    return;
  }
  auto job = make(Job::Kind::scan, std::move(filter), std::move(filter_json));
  job->automatic = automatic;
  jobs_.push_back(std::move(job));
}

void JobQueue::refresh(const parking::Filter& filter, const nlohmann::json& filter_json) {
  if (Job* waiting = find_scan()) {
    waiting->automatic = false;
    return;
  }
  jobs_.push_back(make(Job::Kind::scan, filter, filter_json));
}

void JobQueue::push_action(std::shared_ptr<Job> job) {
  auto first_scan = jobs_.begin();
  while (first_scan != jobs_.end() && (*first_scan)->kind != Job::Kind::scan)
    ++first_scan;
  jobs_.insert(first_scan, std::move(job));
}

std::shared_ptr<Job> JobQueue::pop() {
  if (jobs_.empty()) return nullptr;
  std::shared_ptr<Job> job = std::move(jobs_.front());
  jobs_.pop_front();
  return job;
}

std::shared_ptr<Job> JobQueue::stop_waiting_action() {
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if ((*it)->kind == Job::Kind::scan) continue;
    std::shared_ptr<Job> job = std::move(*it);
    jobs_.erase(it);
    job->state = Job::State::done;
    job->interrupted = true;
    job->stop_requested = true;
    return job;
  }
  return nullptr;
}

const Job* JobQueue::waiting_action() const {
  for (const auto& job : jobs_) {
    if (job->kind != Job::Kind::scan) return job.get();
  }
  return nullptr;
}

const Job* JobQueue::waiting_scan() const {
  return find_scan();
}

}  // namespace retryloop::console::detail
