#include "retryloop/parking/parked_json.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <ctime>

#include "retryloop/retry/history.hpp"

namespace retryloop::parking {

namespace {

nlohmann::json table_json(const amqp::FieldTable& table) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& entry : table)
    out[entry.name] = header_json(entry.value);
  return out;
}

}  // namespace

nlohmann::json history_json(const amqp::FieldTable* headers) {
  const retry::History history = retry::read_history(headers);
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& entry : history.entries) {
    nlohmann::json out;
    out["attempt"] = entry.attempt;
    out["at"] = entry.at ? nlohmann::json(iso_time(*entry.at)) : nullptr;
    out["outcome"] = entry.outcome;
    auto put = [&](const char* name, const std::string& value) {
      if (!value.empty()) out[name] = is_utf8(value) ? value : base64(value);
    };
    put("error", entry.error);
    if (entry.delay_ms) out["delay_ms"] = *entry.delay_ms;
    put("via", entry.via);
    put("consumer", entry.consumer);
    put("reason", entry.reason);
    put("by", entry.by);
    entries.push_back(std::move(out));
  }
  nlohmann::json out;
  out["entries"] = std::move(entries);
  out["older"] = history.older;
  if (!history.malformed.empty()) out["malformed"] = history.malformed;
  return out;
}

bool is_utf8(std::string_view text) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (n - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (next < low || next > high) : (next & 0xC0) != 0x80) return false;
    }
    i += extra + 1;
  }
  return true;
}

std::string base64(std::string_view bytes) {
  static constexpr char digits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint32_t(static_cast<unsigned char>(bytes[i + 2]));
    out.push_back(digits[(n >> 18) & 63]);
    out.push_back(digits[(n >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? digits[(n >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? digits[n & 63] : '=');
  }
  return out;
}

nlohmann::json header_json(const amqp::FieldValue& value) {
  if (const auto* table = value.get_if<amqp::FieldTable>()) return table_json(*table);
  if (const auto* array = value.get_if<amqp::FieldArray>()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : *array)
      out.push_back(header_json(item));
    return out;
  }
  if (const auto* flag = value.get_if<bool>()) return *flag;
  if (auto number = value.as_int64()) return *number;
  if (const auto* number = value.get_if<double>()) return *number;
  if (const auto* number = value.get_if<float>()) return *number;
  if (const auto* time = value.get_if<amqp::Timestamp>()) return time->seconds;
  if (const auto* bytes = value.get_if<amqp::ByteArray>()) {
    return is_utf8(bytes->bytes) ? nlohmann::json(bytes->bytes)
                                 : nlohmann::json({{"base64", base64(bytes->bytes)}});
  }
  if (auto text = value.as_string()) {
    return is_utf8(*text) ? nlohmann::json(std::string(*text))
                          : nlohmann::json({{"base64", base64(*text)}});
  }
  if (const auto* decimal = value.get_if<amqp::Decimal>()) {
    return double(decimal->value) / std::pow(10.0, decimal->scale);
  }
  if (auto number = value.get_if<uint32_t>()) return *number;
  return nullptr;
}

nlohmann::json message_json(const ParkedMessage& parked, uint64_t now_seconds) {
  const amqp::BasicProperties& p = parked.message.properties;
  nlohmann::json properties = nlohmann::json::object();
  auto put = [&](const char* name, const std::optional<std::string>& value) {
    if (value) properties[name] = *value;
  };
  put("content_type", p.content_type);
  put("content_encoding", p.content_encoding);
  if (p.delivery_mode) properties["delivery_mode"] = *p.delivery_mode;
  if (p.priority) properties["priority"] = *p.priority;
  put("correlation_id", p.correlation_id);
  put("reply_to", p.reply_to);
  put("expiration", p.expiration);
  put("message_id", p.message_id);
  if (p.timestamp) properties["timestamp"] = *p.timestamp;
  put("type", p.type);
  put("user_id", p.user_id);
  put("app_id", p.app_id);

  nlohmann::json out;
  out["position"] = parked.position;
  out["message_id"] = parked.message_id;
  out["parked_at"] = parked.parked_at ? nlohmann::json(iso_time(*parked.parked_at)) : nullptr;
  out["age_seconds"] = parked.parked_at && *parked.parked_at <= now_seconds
                           ? nlohmann::json(now_seconds - *parked.parked_at)
                           : nullptr;
  out["reason"] = parked.reason;
  out["attempts"] = parked.attempts ? nlohmann::json(*parked.attempts) : nullptr;
  out["error"] = parked.error;
  out["queue"] = parked.queue;
  out["original_exchange"] = parked.original_exchange;
  out["original_routing_key"] = parked.original_routing_key;
  out["replays"] = parked.replays;
  out["history"] = history_json(p.headers ? &*p.headers : nullptr);
  out["properties"] = properties;
  out["headers"] = p.headers ? table_json(*p.headers) : nlohmann::json::object();
  out["body_size"] = parked.message.body.size();
  if (is_utf8(parked.message.body)) {
    out["body"] = parked.message.body;
    out["body_encoding"] = "utf-8";
  } else {
    out["body"] = base64(parked.message.body);
    out["body_encoding"] = "base64";
  }
  return out;
}

std::string iso_time(uint64_t seconds) {
  std::time_t t = std::time_t(seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

bool nests_at_most(std::string_view text, size_t limit) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

}  // namespace retryloop::parking
