#include "retryloop/parking/parked_message.hpp"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "retryloop/retry/headers.hpp"
#include "retryloop/retry/history.hpp"

namespace retryloop::parking {
namespace header = retry::header;

namespace {

std::string string_header(const amqp::FieldTable& headers, std::string_view name) {
  const amqp::FieldValue* value = headers.find(name);
  if (value == nullptr) return {};
  auto text = value->as_string();
  return text ? std::string(*text) : std::string();
}

bool is_parking_header(std::string_view name) {
  return name == header::attempts || name == header::reason || name == header::error ||
         name == header::queue || name == header::first_failure || name == header::parked_at ||
         name == header::consumer || name == header::retries;
}

}  // namespace

std::optional<std::string> header_text(const amqp::FieldValue& value) {
  if (auto text = value.as_string()) return std::string(*text);
  if (auto number = value.as_int64()) return std::to_string(*number);
  if (const auto* flag = value.get_if<bool>()) return std::string(*flag ? "true" : "false");
  if (const auto* time = value.get_if<amqp::Timestamp>()) return std::to_string(time->seconds);
  if (const auto* number = value.get_if<double>()) return std::to_string(*number);
  if (const auto* number = value.get_if<float>()) return std::to_string(*number);
  return std::nullopt;
}

ParkedMessage read_parked(client::Message message, uint64_t position) {
  ParkedMessage parked;
  parked.position = position;
  parked.message_id = message.properties.message_id.value_or("");
  if (message.properties.headers) {
    const amqp::FieldTable& headers = *message.properties.headers;
    if (const amqp::FieldValue* at = headers.find(header::parked_at)) {
      if (const auto* time = at->get_if<amqp::Timestamp>()) {
        parked.parked_at = time->seconds;
      } else if (auto n = at->as_int64(); n && *n >= 0) {
        parked.parked_at = uint64_t(*n);
      }
    }
    parked.reason = string_header(headers, header::reason);
    if (parked.reason.empty() && headers.find("x-death") != nullptr) {
      parked.reason = unrouted_reason;
    }
    if (const amqp::FieldValue* attempts = headers.find(header::attempts)) {
      parked.attempts = attempts->as_int64();
    }
    parked.error = string_header(headers, header::error);
    parked.queue = string_header(headers, header::queue);
    parked.original_exchange = string_header(headers, header::original_exchange);
    parked.original_routing_key = string_header(headers, header::original_routing_key);
    if (const amqp::FieldValue* replays = headers.find(header::replays)) {
      parked.replays = replays->as_int64().value_or(0);
    }
  }
  parked.body_size = message.body.size();
  parked.message = std::move(message);
  return parked;
}

std::string first_line(std::string_view text) {
  return std::string(text.substr(0, text.find('\n')));
}

namespace {

bool contains_ignoring_case(std::string_view text, std::string_view wanted) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
  return std::search(text.begin(), text.end(), wanted.begin(), wanted.end(),
                     [&](char a, char b) { return lower(a) == lower(b); }) != text.end();
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_word(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/// `count` characters of `text` from `at` that `accept`.
bool run_of(std::string_view text, size_t at, size_t count, bool (*accept)(char)) {
  if (at + count > text.size()) return false;
  for (size_t k = 0; k < count; ++k) {
    if (!accept(text[at + k])) return false;
  }
  return true;
}

/// 8-4-4-4-12 hex digits at `at`, not part of a longer word.
bool uuid_at(std::string_view text, size_t at) {
  if (at + 36 > text.size()) return false;
  size_t p = at;
  for (size_t group : {8, 4, 4, 4, 12}) {
    if (!run_of(text, p, group, is_hex)) return false;
    p += group;
    if (group != 12) {
      if (text[p] != '-') return false;
      ++p;
    }
  }
  return p == text.size() || !is_word(text[p]);
}

/// A date (2026-11-27), with a time (T or space, 10:15, :00, .250) and a zone (Z, +01:00), at
/// `at`: its length, or 0.
size_t time_at(std::string_view text, size_t at) {
  if (!run_of(text, at, 4, is_digit) || at + 10 > text.size() || text[at + 4] != '-' ||
      !run_of(text, at + 5, 2, is_digit) || text[at + 7] != '-' ||
      !run_of(text, at + 8, 2, is_digit)) {
    return 0;
  }
  size_t p = at + 10;
  if (p + 6 <= text.size() && (text[p] == 'T' || text[p] == ' ') &&
      run_of(text, p + 1, 2, is_digit) && text[p + 3] == ':' && run_of(text, p + 4, 2, is_digit)) {
    p += 6;
    if (p + 3 <= text.size() && text[p] == ':' && run_of(text, p + 1, 2, is_digit)) p += 3;
    if (p + 1 < text.size() && (text[p] == '.' || text[p] == ',') && is_digit(text[p + 1])) {
      ++p;
      while (p < text.size() && is_digit(text[p]))
        ++p;
    }
    if (p < text.size() && text[p] == 'Z') {
      ++p;
    } else if (p + 6 <= text.size() && (text[p] == '+' || text[p] == '-') &&
               run_of(text, p + 1, 2, is_digit) && text[p + 3] == ':' &&
               run_of(text, p + 4, 2, is_digit)) {
      p += 6;
    }
  }
  return p < text.size() && is_word(text[p]) ? 0 : p - at;
}

}  // namespace

std::string error_fingerprint(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  size_t i = 0;
  while (i < line.size()) {
    const char c = line[i];
    if (c == '"' || c == '\'' || c == '`') {
      const size_t close = line.find(c, i + 1);
      // An apostrophe inside a word ("don't") opens no quote.
      const bool opens = c != '\'' || i == 0 || !is_word(line[i - 1]);
      if (opens && close != std::string_view::npos) {
        out += c;
        out += "<value>";
        out += c;
        i = close + 1;
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    if (!is_word(c) || (i > 0 && is_word(line[i - 1]))) {
      out += c;
      ++i;
      continue;
    }
    if (uuid_at(line, i)) {
      out += "<uuid>";
      i += 36;
      continue;
    }
    if (size_t length = time_at(line, i)) {
      out += "<time>";
      i += length;
      continue;
    }
    if (c == '0' && i + 2 < line.size() && (line[i + 1] == 'x' || line[i + 1] == 'X') &&
        is_hex(line[i + 2])) {
      size_t end = i + 2;
      while (end < line.size() && is_hex(line[end]))
        ++end;
      if (end == line.size() || !is_word(line[end])) {
        out += "<hex>";
        i = end;
        continue;
      }
    }
    size_t end = i;
    bool digit = false, letter = false, hex = true;
    while (end < line.size() && is_word(line[end])) {
      digit = digit || is_digit(line[end]);
      letter = letter || !is_digit(line[end]);
      hex = hex && is_hex(line[end]);
      ++end;
    }
    if (!digit) {
      out.append(line.substr(i, end - i));
    } else if (!letter) {
      // A decimal fraction is one number.
      if (end + 1 < line.size() && line[end] == '.' && is_digit(line[end + 1])) {
        end += 1;
        while (end < line.size() && is_digit(line[end]))
          ++end;
      }
      out += "<n>";
    } else if (hex && end - i >= 8) {
      out += "<hex>";
    } else {
      out += "<id>";
    }
    i = end;
  }
  return out;
}

bool Filter::matches(const ParkedMessage& parked, uint64_t now_seconds) const {
  if (!message_ids.empty() && message_ids.count(parked.message_id) == 0) return false;
  if (parked_from || parked_until) {
    if (!parked.parked_at) return false;
    if (parked_from && *parked.parked_at < *parked_from) return false;
    if (parked_until && *parked.parked_at > *parked_until) return false;
  }
  if (original_routing_key && parked.original_routing_key != *original_routing_key) return false;
  if (error_first_line && first_line(parked.error) != *error_first_line) return false;
  if (error_fingerprint &&
      parking::error_fingerprint(first_line(parked.error)) != *error_fingerprint) {
    return false;
  }
  if (!error_contains.empty() && !contains_ignoring_case(parked.error, error_contains)) {
    return false;
  }
  if (older_than) {
    if (!parked.parked_at || *parked.parked_at > now_seconds) return false;
    const uint64_t age_seconds = now_seconds - *parked.parked_at;
    const uint64_t wanted_ms = uint64_t(std::max<int64_t>(older_than->count(), 0));
    if (age_seconds < wanted_ms / 1000 + (wanted_ms % 1000 != 0)) return false;
  }
  if (!reasons.empty() &&
      std::find(reasons.begin(), reasons.end(), parked.reason) == reasons.end()) {
    return false;
  }
  if (where.empty()) return true;
  if (!parked.message.properties.headers) return false;
  for (const auto& [name, wanted] : where) {
    const amqp::FieldValue* value = parked.message.properties.headers->find(name);
    if (value == nullptr) return false;
    auto text = header_text(*value);
    if (!text || *text != wanted) return false;
  }
  return true;
}

std::pair<std::string, std::string> parse_where(const std::string& text) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos) {
    throw std::invalid_argument("--where \"" + text + "\": write HEADER=VALUE");
  }
  if (equals == 0)
    throw std::invalid_argument("--where \"" + text + "\": the header name is empty");
  return {text.substr(0, equals), text.substr(equals + 1)};
}

std::string command_line_user() {
  std::string user;
  passwd entry{};
  passwd* found = nullptr;
  char buffer[1024];
  if (getpwuid_r(geteuid(), &entry, buffer, sizeof buffer, &found) == 0 && found != nullptr) {
    user = found->pw_name;
  } else if (const char* name = std::getenv("USER")) {
    user = name;
  } else {
    user = "uid " + std::to_string(geteuid());
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') user += std::string("@") + host;
  return user;
}

amqp::BasicProperties make_replay_copy(const amqp::BasicProperties& properties,
                                       const ActionNote& note) {
  amqp::BasicProperties copy = properties;
  amqp::FieldTable& headers = copy.headers ? *copy.headers : copy.headers.emplace();
  int64_t replays = 0;
  if (const amqp::FieldValue* previous = headers.find(header::replays)) {
    replays = previous->as_int64().value_or(0);
  }
  retry::HistoryEntry entry;
  if (const amqp::FieldValue* attempts = headers.find(header::attempts)) {
    entry.attempt = std::max<int64_t>(attempts->as_int64().value_or(0), 0);
  }
  entry.at = note.now_seconds != 0 ? note.now_seconds : retry::unix_seconds();
  entry.outcome =
      note.outcome.empty() ? std::string(retry::history_outcome::replayed) : note.outcome;
  entry.via = note.via;
  entry.by = note.by;
  retry::record_history(copy, std::move(entry));
  headers.erase_if([](const std::string& name) {
    return retry::is_broker_header(name) || is_parking_header(name);
  });
  const int64_t next = replays < 0                                      ? 1
                       : replays == std::numeric_limits<int64_t>::max() ? replays
                                                                        : replays + 1;
  headers.set(std::string(header::replays), next);
  // Not restored: a TTL that ran from the first publish would expire the replayed message
  // anywhere (and silently in a queue that dead-letters nowhere). The header keeps the value.
  if (copy.expiration) {
    if (headers.find(header::original_expiration) == nullptr) {
      headers.set(std::string(header::original_expiration), *copy.expiration);
    }
    copy.expiration.reset();
  }
  return copy;
}

}  // namespace retryloop::parking
