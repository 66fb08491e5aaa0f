#include "retryloop/console/detail/audit_trail.hpp"

#include <algorithm>
#include <chrono>
#include <map>

#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/headers.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::console::detail {

namespace {

/// How far back a new reader starts.
constexpr uint64_t kReadBackMs = 30ull * 24 * 3600 * 1000;

std::string key_of(const parking::AuditRecord& record) {
  return record.id + "." + record.state;
}

}  // namespace

AuditTrail::AuditTrail(bool on_broker, std::shared_ptr<spdlog::logger> logger, size_t kept)
    : on_broker_(on_broker), logger_(std::move(logger)), kept_(kept) {}

void AuditTrail::attach(const std::shared_ptr<client::Connection>& connection) {
  if (!on_broker_) return;
  detach();
  error_.clear();
  std::weak_ptr<AuditTrail> weak = weak_from_this();
  const uint64_t now = retry::unix_milliseconds();
  reader_ = parking::AuditReader::start(
      connection, now > kReadBackMs ? now - kReadBackMs : 0, last_offset_,
      [weak](parking::AuditRecord&& record) {
        if (auto self = weak.lock()) {
          if (record.offset) self->last_offset_ = record.offset;
          self->keep(std::move(record));
        }
      },
      [weak](const client::Error& error) {
        if (auto self = weak.lock()) self->failed(error.message());
      });
}

void AuditTrail::detach() {
  if (reader_) {
    if (reader_->last_offset()) last_offset_ = reader_->last_offset();
    reader_->stop();
    reader_.reset();
  }
}

void AuditTrail::failed(std::string why) {
  error_ = std::move(why);
  if (logger_) logger_->warn("console: audit trail: {}", error_);
}

void AuditTrail::append(parking::AuditRecord record, parking::AuditWriter* writer, Done done) {
  if (record.id.empty()) {
    std::error_code no_id;
    record.id = random::random_id(no_id);
    if (no_id) return done("cannot draw the audit record's id (getrandom): " + no_id.message());
  }
  if (record.at_ms == 0) record.at_ms = retry::unix_milliseconds();
  if (record.via.empty()) record.via = "console";
  if (!on_broker_) {
    keep(std::move(record));
    return done("");
  }
  if (writer == nullptr) return done("not connected to the broker");
  std::weak_ptr<AuditTrail> weak = weak_from_this();
  writer->append(record, [weak, record, done](const client::Error& error) {
    if (error) return done(error.message());
    if (auto self = weak.lock()) self->keep(record);
    done("");
  });
}

void AuditTrail::keep(parking::AuditRecord record) {
  const std::string key = key_of(record);
  if (held_.count(key) != 0) return;
  held_.insert(key);
  // In order of time: a record read back from the stream may be older than one appended here.
  auto at = std::upper_bound(
      records_.begin(), records_.end(), record.at_ms,
      [](uint64_t at_ms, const parking::AuditRecord& other) { return at_ms < other.at_ms; });
  records_.insert(at, std::move(record));
  while (records_.size() > kept_) {
    held_.erase(key_of(records_.front()));
    records_.pop_front();
  }
}

nlohmann::json AuditTrail::json(size_t limit) const {
  nlohmann::json out;
  out["kept_on"] = on_broker_ ? nlohmann::json(topology::audit_stream_name()) : nullptr;
  out["connected"] = !on_broker_ || reader_ != nullptr;
  out["error"] = error_.empty() ? nullptr : nlohmann::json(error_);
  nlohmann::json records = nlohmann::json::array();
  for (auto it = records_.rbegin(); it != records_.rend() && records.size() < limit; ++it)
    records.push_back(parking::audit_json(*it));
  out["records"] = std::move(records);
  return out;
}

nlohmann::json AuditTrail::notes(const std::string& service) const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& record : records_) {  // oldest first: the newest note wins
    if (record.action == "note" && record.service == service) {
      out[record.group] = parking::audit_json(record);
    }
  }
  return out;
}

}  // namespace retryloop::console::detail
