#include "retryloop/console/detail/audit_trail.hpp"

#include <algorithm>
#include <chrono>

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

AuditTrail::AuditTrail(bool on_broker, std::shared_ptr<spdlog::logger> logger, std::string key,
                       size_t max_bytes)
    : on_broker_(on_broker),
      logger_(std::move(logger)),
      key_(std::move(key)),
      max_bytes_(max_bytes) {}

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
      },
      key_,
      [weak](const std::string& why, std::optional<int64_t> offset) {
        if (auto self = weak.lock()) self->skipped(why, offset);
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

void AuditTrail::skipped(const std::string& why, std::optional<int64_t> offset) {
  if (offset) last_offset_ = offset;
  skipped_last_ = why + (offset ? " (offset " + std::to_string(*offset) + ")" : std::string());
  // One line, not one per record: the count is in /api/audit and /metrics.
  if (skipped_++ == 0 && logger_) {
    logger_->warn(
        "console: audit trail: skipped a record of the stream that cannot be read: {}; further "
        "ones are only counted",
        skipped_last_);
  }
}

void AuditTrail::append(parking::AuditRecord record, parking::AuditWriter* writer, Done done) {
  if (record.id.empty()) {
    std::error_code no_id;
    record.id = random::random_id(no_id);
    if (no_id) return done("cannot draw the audit record's id (getrandom): " + no_id.message());
  }
  if (record.at_ms == 0) record.at_ms = retry::unix_milliseconds();
  if (record.via.empty()) record.via = "console";
  parking::bound_audit_record(record);
  // Written here: signed when there is a key, or never out of this process.
  record.verified = !on_broker_ || !key_.empty();
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

size_t AuditTrail::record_bytes(const parking::AuditRecord& record) {
  // The record, its key in held_, and a node of the containers.
  size_t bytes = sizeof(parking::AuditRecord) + 2 * record.id.size() + record.state.size() + 64;
  for (const std::string* text :
       {&record.who, &record.via, &record.action, &record.state, &record.service, &record.error,
        &record.note, &record.group, &record.message_id, &record.new_message_id}) {
    bytes += text->size();
  }
  // A filter is bounded (audit_filter) and small; nlohmann keeps it in several times its text.
  if (!record.filter.is_null()) {
    bytes +=
        4 * record.filter.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
  }
  return bytes;
}

void AuditTrail::keep(parking::AuditRecord record) {
  const std::string key = key_of(record);
  if (held_.count(key) != 0) return;
  parking::bound_audit_record(record);
  if (record.action == "note") {
    auto [note, added] = notes_.try_emplace({record.service, record.group}, record);
    if (added) {
      bytes_ += record_bytes(record);
    } else if (note->second.at_ms <= record.at_ms) {
      bytes_ -= record_bytes(note->second);
      note->second = record;
      bytes_ += record_bytes(record);
    }
  }
  held_.insert(key);
  bytes_ += record_bytes(record);
  // In order of time: a record read back from the stream may be older than one appended here.
  auto at = std::upper_bound(
      records_.begin(), records_.end(), record.at_ms,
      [](uint64_t at_ms, const parking::AuditRecord& other) { return at_ms < other.at_ms; });
  records_.insert(at, std::move(record));
  evict();
}

void AuditTrail::evict() {
  while (bytes_ > max_bytes_ && !records_.empty()) {
    bytes_ -= record_bytes(records_.front());
    held_.erase(key_of(records_.front()));
    records_.pop_front();
  }
  // Only notes left, and still too many: the oldest go.
  while (bytes_ > max_bytes_ && !notes_.empty()) {
    auto oldest = std::min_element(notes_.begin(), notes_.end(), [](const auto& a, const auto& b) {
      return a.second.at_ms < b.second.at_ms;
    });
    bytes_ -= record_bytes(oldest->second);
    notes_.erase(oldest);
  }
}

nlohmann::json AuditTrail::json(size_t limit) const {
  nlohmann::json out;
  out["kept_on"] = on_broker_ ? nlohmann::json(topology::audit_stream_name()) : nullptr;
  out["connected"] = !on_broker_ || reader_ != nullptr;
  out["error"] = error_.empty() ? nullptr : nlohmann::json(error_);
  out["skipped"] = skipped_;
  out["skipped_last"] = skipped_last_.empty() ? nullptr : nlohmann::json(skipped_last_);
  out["signed"] = !key_.empty();
  nlohmann::json records = nlohmann::json::array();
  for (auto it = records_.rbegin(); it != records_.rend() && records.size() < limit; ++it)
    records.push_back(parking::audit_json(*it));
  out["records"] = std::move(records);
  return out;
}

nlohmann::json AuditTrail::notes(const std::string& service) const {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = notes_.lower_bound({service, ""});
       it != notes_.end() && it->first.first == service; ++it) {
    out[it->first.second] = parking::audit_json(it->second);
  }
  return out;
}

std::string AuditTrail::metrics() const {
  return "# HELP retryloop_console_audit_skipped_total Records of the audit stream the console "
         "skipped: too large, nested too deep, or not an audit record.\n"
         "# TYPE retryloop_console_audit_skipped_total counter\n"
         "retryloop_console_audit_skipped_total " +
         std::to_string(skipped_) + "\n";
}

}  // namespace retryloop::console::detail
