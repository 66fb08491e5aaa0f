#include "retryloop/retry/history.hpp"

#include <algorithm>
#include <limits>

#include "saturating.hpp"

namespace retryloop::retry {
namespace {

using detail::saturating_add;

std::string text_field(const amqp::FieldTable& table, std::string_view name) {
  const amqp::FieldValue* value = table.find(name);
  auto text = value != nullptr ? value->as_string() : std::nullopt;
  return text ? std::string(*text) : std::string();
}

std::optional<int64_t> int_field(const amqp::FieldTable& table, std::string_view name) {
  const amqp::FieldValue* value = table.find(name);
  return value != nullptr ? value->as_int64() : std::nullopt;
}

HistoryEntry read_entry(const amqp::FieldTable& table) {
  HistoryEntry entry;
  entry.attempt = int_field(table, "attempt").value_or(0);
  if (const amqp::FieldValue* at = table.find("at")) {
    if (const auto* time = at->get_if<amqp::Timestamp>()) {
      entry.at = time->seconds;
    } else if (auto seconds = at->as_int64(); seconds && *seconds >= 0) {
      entry.at = uint64_t(*seconds);
    }
  }
  entry.outcome = text_field(table, "outcome");
  entry.error = text_field(table, "error");
  entry.delay_ms = int_field(table, "delay_ms");
  entry.via = text_field(table, "via");
  entry.consumer = text_field(table, "consumer");
  entry.reason = text_field(table, "reason");
  entry.by = text_field(table, "by");
  return entry;
}

amqp::FieldTable entry_table(const HistoryEntry& entry) {
  amqp::FieldTable table;
  table.append("attempt", entry.attempt);
  if (entry.at) table.append("at", amqp::Timestamp{*entry.at});
  table.append("outcome", entry.outcome);
  if (!entry.error.empty()) table.append("error", entry.error);
  if (entry.delay_ms) table.append("delay_ms", *entry.delay_ms);
  if (!entry.via.empty()) table.append("via", entry.via);
  if (!entry.consumer.empty()) table.append("consumer", entry.consumer);
  if (!entry.reason.empty()) table.append("reason", entry.reason);
  if (!entry.by.empty()) table.append("by", entry.by);
  return table;
}

bool starts_a_cycle(const HistoryEntry& entry) {
  return entry.outcome == history_outcome::replayed || entry.outcome == history_outcome::edited;
}

}  // namespace

bool operator==(const HistoryEntry& a, const HistoryEntry& b) {
  return a.attempt == b.attempt && a.at == b.at && a.outcome == b.outcome && a.error == b.error &&
         a.delay_ms == b.delay_ms && a.via == b.via && a.consumer == b.consumer &&
         a.reason == b.reason && a.by == b.by;
}

History read_history(const amqp::FieldTable* headers) {
  History history;
  if (headers == nullptr) return history;
  if (const amqp::FieldValue* older = headers->find(header::history_older)) {
    if (auto n = older->as_int64(); n && *n >= 0) {
      history.older = *n;
    } else {
      history.malformed = std::string(header::history_older) + " is not a non-negative integer";
    }
  }
  const amqp::FieldValue* value = headers->find(header::history);
  if (value == nullptr) return history;
  const auto* entries = value->get_if<amqp::FieldArray>();
  if (entries == nullptr) {
    if (!history.malformed.empty()) history.malformed += "; ";
    history.malformed +=
        std::string(header::history) + " is not an array (type '" + value->type_letter() + "')";
    return history;
  }
  for (size_t i = 0; i < entries->size(); ++i) {
    if (const auto* table = (*entries)[i].get_if<amqp::FieldTable>()) {
      history.entries.push_back(read_entry(*table));
    } else {
      if (!history.malformed.empty()) history.malformed += "; ";
      history.malformed +=
          std::string(header::history) + "[" + std::to_string(i) + "] is not a table";
    }
  }
  return history;
}

void write_history(amqp::FieldTable& headers, History history) {
  if (history.entries.empty() && history.older == 0) {
    headers.erase(header::history);
    headers.erase(header::history_older);
    return;
  }
  if (history.entries.size() > max_history_entries) {
    const size_t dropped = history.entries.size() - max_history_entries;
    history.entries.erase(history.entries.begin(), history.entries.begin() + long(dropped));
    history.older = saturating_add(history.older, int64_t(dropped));
  }
  amqp::FieldArray entries;
  entries.reserve(history.entries.size());
  for (const auto& entry : history.entries)
    entries.emplace_back(entry_table(entry));
  headers.set(std::string(header::history), std::move(entries));
  if (history.older > 0) {
    headers.set(std::string(header::history_older), history.older);
  } else {
    headers.erase(header::history_older);
  }
}

void add_unrecorded_attempts(History& history, int64_t attempt, std::string_view via,
                             std::optional<int64_t> delay_ms,
                             std::optional<uint64_t> first_failure) {
  int64_t recorded = 0;  // the last attempt recorded since the last replay or edit
  for (auto it = history.entries.rbegin(); it != history.entries.rend(); ++it) {
    if (starts_a_cycle(*it)) break;
    recorded = std::max(recorded, it->attempt);
  }
  if (attempt - 1 <= recorded) return;
  // A forged count must not make a huge header: only the last max_history_entries are written.
  const int64_t first =
      std::max<int64_t>(recorded + 1, attempt - 1 - int64_t(max_history_entries) + 1);
  history.older = saturating_add(history.older, first - (recorded + 1));
  for (int64_t k = first; k < attempt; ++k) {
    HistoryEntry entry;
    entry.attempt = k;
    if (k == 1) entry.at = first_failure;
    entry.outcome = history_outcome::retry;
    entry.delay_ms = delay_ms;
    entry.via = via;
    history.entries.push_back(std::move(entry));
  }
}

void record_history(amqp::BasicProperties& copy, HistoryEntry entry,
                    std::string_view unrecorded_via, std::optional<int64_t> unrecorded_delay_ms,
                    std::optional<uint64_t> first_failure) {
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  History history = read_history(&headers);
  if (!unrecorded_via.empty()) {
    add_unrecorded_attempts(history, entry.attempt, unrecorded_via, unrecorded_delay_ms,
                            first_failure);
  }
  entry.error = truncate_utf8(entry.error.substr(0, entry.error.find_first_of("\r\n")),
                              max_history_error_bytes);
  history.entries.push_back(std::move(entry));
  write_history(headers, std::move(history));
}

bool shorten_history(amqp::BasicProperties& copy) {
  if (!copy.headers) return false;
  History history = read_history(&*copy.headers);
  if (history.entries.empty()) return false;
  const size_t dropped = std::max<size_t>(1, history.entries.size() / 2);
  history.entries.erase(history.entries.begin(), history.entries.begin() + long(dropped));
  history.older = saturating_add(history.older, int64_t(dropped));
  write_history(*copy.headers, std::move(history));
  return true;
}

}  // namespace retryloop::retry
