#include "retryloop/migrate/migration.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

#include "retryloop/topology/topology.hpp"

namespace retryloop::migrate {
namespace {

constexpr std::chrono::milliseconds shortest_look = std::chrono::milliseconds(100);
constexpr std::chrono::milliseconds longest_look = std::chrono::seconds(1);
/// How much longer than its delay a wait queue may take to empty before it is overdue.
constexpr std::chrono::milliseconds level_slack = std::chrono::seconds(10);

template <class T>
bool read(const nlohmann::json& json, const char* key, T& out, std::string& error) {
  const auto it = json.find(key);
  if (it == json.end()) {
    error = std::string("the record has no \"") + key + "\"";
    return false;
  }
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    error = std::string("\"") + key + "\" has the wrong type";
    return false;
  }
  return true;
}

}  // namespace

std::string record_queue_name(std::string_view service_name) {
  return topology::migration_record_name(service_name);
}

std::string lock_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".migration.lock";
}

std::string settling_queue_name(std::string_view service_name) {
  return topology::migration_settling_queue_name(service_name);
}

std::string encode_record(const Record& record) {
  nlohmann::json out = {{"service", record.service},
                        {"id", record.id},
                        {"digest", record.digest},
                        {"survey", to_json(record.survey)},
                        {"next_step", record.next_step},
                        {"started_at_ms", record.started_at_ms},
                        {"updated_at_ms", record.updated_at_ms},
                        {"moved", record.moved},
                        {"holding", record.holding},
                        {"finished", record.finished}};
  if (record.draining_since_ms) out["draining_since_ms"] = *record.draining_since_ms;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<Record> decode_record(std::string_view body, std::string& error) {
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    error = "the record is not a JSON object";
    return std::nullopt;
  }
  Record record;
  if (!read(json, "service", record.service, error) || !read(json, "id", record.id, error) ||
      !read(json, "digest", record.digest, error) ||
      !read(json, "next_step", record.next_step, error) ||
      !read(json, "started_at_ms", record.started_at_ms, error) ||
      !read(json, "updated_at_ms", record.updated_at_ms, error) ||
      !read(json, "moved", record.moved, error) ||
      !read(json, "finished", record.finished, error)) {
    return std::nullopt;
  }
  const auto survey = json.find("survey");
  if (survey == json.end()) {
    error = "the record has no \"survey\"";
    return std::nullopt;
  }
  auto parsed = survey_from_json(*survey, error);
  if (!parsed) return std::nullopt;
  record.survey = std::move(*parsed);
  if (auto holding = json.find("holding"); holding != json.end() && holding->is_string()) {
    record.holding = holding->get<std::string>();
  }
  if (auto since = json.find("draining_since_ms");
      since != json.end() && since->is_number_integer()) {
    record.draining_since_ms = since->get<int64_t>();
  }
  return record;
}

Migration::Migration(MigrationPlan plan, std::string id, Survey survey, int64_t wall_ms)
    : plan_(std::move(plan)) {
  record_.service = plan_.service;
  record_.id = std::move(id);
  record_.survey = std::move(survey);
  record_.digest = digest(plan_);
  record_.started_at_ms = wall_ms;
  record_.updated_at_ms = wall_ms;
  record_.finished = plan_.steps.empty();
}

Migration::Migration(MigrationPlan plan, Record record)
    : plan_(std::move(plan)), record_(std::move(record)) {}

std::optional<Migration> Migration::resume(MigrationPlan plan, Record record, std::string& error) {
  if (record.service != plan.service) {
    error = "the record is of service " + record.service + ", not " + plan.service;
    return std::nullopt;
  }
  if (record.digest != digest(plan)) {
    error = "the unfinished migration of " + record.service + " (begun at step " +
            std::to_string(record.next_step) +
            ") was made from another file: run `retryloop topology migrate` with the file it was "
            "begun with, to finish it";
    return std::nullopt;
  }
  if (record.next_step > plan.steps.size()) {
    error = "the record's step " + std::to_string(record.next_step) + " is past the plan's " +
            std::to_string(plan.steps.size()) + " steps";
    return std::nullopt;
  }
  record.finished = record.next_step == plan.steps.size();
  return Migration(std::move(plan), std::move(record));
}

const Step* Migration::current() const {
  if (record_.next_step >= plan_.steps.size()) return nullptr;
  return &plan_.steps[record_.next_step];
}

void Migration::done(int64_t wall_ms) {
  if (record_.next_step >= plan_.steps.size()) return;
  const Step& step = plan_.steps[record_.next_step];
  if (step.kind == StepKind::announce) record_.holding = step.queue;
  ++record_.next_step;
  record_.updated_at_ms = wall_ms;
  record_.draining_since_ms.reset();
  record_.finished = record_.next_step == plan_.steps.size();
  wake_at_.reset();
}

void Migration::not_yet(std::chrono::milliseconds now, int64_t wall_ms) {
  const Step* step = current();
  if (step == nullptr) return;
  if (!record_.draining_since_ms) record_.draining_since_ms = wall_ms;
  record_.updated_at_ms = wall_ms;
  const std::chrono::milliseconds look = std::clamp(step->delay / 10, shortest_look, longest_look);
  wake_at_ = now + look;
}

std::chrono::milliseconds Migration::draining_for(int64_t wall_ms) const {
  if (!record_.draining_since_ms) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::max<int64_t>(0, wall_ms - *record_.draining_since_ms));
}

bool Migration::overdue(int64_t wall_ms, std::chrono::milliseconds consumers_grace) const {
  const Step* step = current();
  if (step == nullptr || step->kind != StepKind::drain || !record_.draining_since_ms) return false;
  const std::chrono::milliseconds limit =
      step->delay.count() > 0 ? step->delay + level_slack : consumers_grace;
  return draining_for(wall_ms) > limit;
}

}  // namespace retryloop::migrate
