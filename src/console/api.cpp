#include "retryloop/console/detail/api.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "retryloop/random/os_random.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::console::detail {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

bool is_json_media_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t'))
    type.remove_suffix(1);
  return lower(type) == "application/json";
}

/// The groups call messages without a reason or an error "(none)", as `parking stats` does.
std::string group_key(std::string text) {
  return text == "(none)" ? std::string() : text;
}

std::string text_field(const nlohmann::json& json, const char* name) {
  const nlohmann::json& value = json.at(name);
  if (!value.is_string()) throw std::invalid_argument(std::string(name) + " must be a string");
  return value.get<std::string>();
}

/// A non-empty array of strings: an empty one would take every message, which an action on a
/// selection of none must not do.
std::vector<std::string> texts_field(const nlohmann::json& json, const char* name) {
  const nlohmann::json& value = json.at(name);
  if (!value.is_array() || value.empty()) {
    throw std::invalid_argument(std::string(name) + " must be an array of at least one string");
  }
  std::vector<std::string> out;
  for (const auto& item : value) {
    if (!item.is_string()) {
      throw std::invalid_argument(std::string(name) + " must hold strings only");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

uint64_t seconds_field(const nlohmann::json& json, const char* name) {
  const nlohmann::json& value = json.at(name);
  if (!value.is_number_unsigned()) {
    throw std::invalid_argument(std::string(name) +
                                " must be a whole number of seconds since the epoch");
  }
  return value.get<uint64_t>();
}

}  // namespace

Refusal check_request(const RequestFacts& request, const Access& access) {
  const std::string host = lower(request.host);
  if (!access.hosts.empty() &&
      std::find(access.hosts.begin(), access.hosts.end(), host) == access.hosts.end()) {
    return {403, "the Host header names another site than this console"};
  }
  if (request.method == "OPTIONS") {
    return {403, "cross-origin requests are refused (no CORS)"};
  }
  if (!request.origin.empty() && lower(request.origin) != "http://" + host) {
    return {403, "cross-origin request refused: Origin " + request.origin + " is not this console"};
  }
  if (!request.fetch_site.empty() && request.fetch_site != "same-origin" &&
      request.fetch_site != "none") {
    return {403, "cross-origin request refused: Sec-Fetch-Site is " + request.fetch_site};
  }
  if (!starts_with(request.path, "/api/") && request.path != "/metrics") {
    if (request.method != "GET" && request.method != "HEAD") return {405, "method not allowed"};
    return {};
  }
  if (request.token.empty()) {
    return {403, std::string("the token is missing: send it in the ") + token_header + " header"};
  }
  const Identity* who = identify(access, request.token);
  if (who == nullptr) return {403, "wrong token"};
  const Role needed = role_needed(request.method, request.path);
  if (who->role < needed) {
    return {403, std::string("this needs the ") + to_string(needed) + " role; " + who->name +
                     " has the " + to_string(who->role) + " role"};
  }
  if (request.method == "POST" && !is_json_media_type(request.content_type)) {
    return {415, "send the request body as application/json"};
  }
  return {};
}

Role role_needed(std::string_view method, std::string_view path) {
  if (method != "POST") return Role::reader;
  if (path == "/api/purge") return Role::admin;
  if (path == "/api/replay" || path == "/api/stop" || path == "/api/edit" || path == "/api/note") {
    return Role::operator_;
  }
  return Role::reader;
}

const Identity* identify(const Access& access, std::string_view token) {
  const Identity* found = nullptr;
  for (const Identity& identity : access.identities) {  // every one, whichever matches
    if (same_token(token, identity.token)) found = &identity;
  }
  return found;
}

bool is_loopback(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  return starts_with(host, "127.") && std::all_of(host.begin(), host.end(), [](char c) {
           return c == '.' || (c >= '0' && c <= '9');
         });
}

std::vector<std::string> allowed_hosts(const std::string& listen_host, uint16_t port) {
  if (!is_loopback(listen_host)) return {};
  const std::string suffix = ":" + std::to_string(port);
  std::vector<std::string> hosts = {"localhost" + suffix, "127.0.0.1" + suffix, "[::1]" + suffix};
  const std::string own = listen_host.find(':') != std::string::npos && listen_host.front() != '['
                              ? "[" + listen_host + "]" + suffix
                              : lower(listen_host) + suffix;
  if (std::find(hosts.begin(), hosts.end(), own) == hosts.end()) hosts.push_back(own);
  return hosts;
}

bool same_token(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return difference == 0;
}

std::string random_token() {
  return random::random_id();
}

parking::Filter parse_filter(const nlohmann::json& json) {
  parking::Filter filter;
  if (json.is_null()) return filter;
  if (!json.is_object()) throw std::invalid_argument("the filter must be a JSON object");
  static const std::vector<std::string> known = {
      "reasons",     "error_first_line", "error_cause",  "error_contains", "message_ids",
      "routing_key", "parked_from",      "parked_until", "older_than"};
  for (const auto& item : json.items()) {
    if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
      throw std::invalid_argument("unknown filter field " + item.key());
    }
  }
  if (json.contains("reasons")) {
    for (auto& reason : texts_field(json, "reasons"))
      filter.reasons.push_back(group_key(std::move(reason)));
  }
  if (json.contains("error_first_line")) {
    filter.error_first_line = group_key(text_field(json, "error_first_line"));
  }
  if (json.contains("error_cause")) {
    filter.error_fingerprint = group_key(text_field(json, "error_cause"));
  }
  if (json.contains("error_contains")) filter.error_contains = text_field(json, "error_contains");
  if (json.contains("message_ids")) {
    for (auto& id : texts_field(json, "message_ids"))
      filter.message_ids.insert(std::move(id));
  }
  if (json.contains("routing_key")) filter.original_routing_key = text_field(json, "routing_key");
  if (json.contains("parked_from")) filter.parked_from = seconds_field(json, "parked_from");
  if (json.contains("parked_until")) filter.parked_until = seconds_field(json, "parked_until");
  if (json.contains("older_than")) {
    const std::string text = text_field(json, "older_than");
    std::string why;
    filter.older_than = topology::parse_duration(text, &why);
    if (!filter.older_than) throw std::invalid_argument("older_than \"" + text + "\" " + why);
  }
  return filter;
}

nlohmann::json pin_older_than(nlohmann::json filter, uint64_t now_seconds) {
  if (!filter.is_object() || !filter.contains("older_than")) return filter;
  const auto older_than = topology::parse_duration(filter.at("older_than").get<std::string>());
  if (!older_than) return filter;
  const uint64_t ms = uint64_t(std::max<int64_t>(older_than->count(), 0));
  const uint64_t seconds = ms / 1000 + (ms % 1000 != 0);
  if (seconds > now_seconds) return filter;
  uint64_t until = now_seconds - seconds;
  if (filter.contains("parked_until")) {
    until = std::min(until, filter.at("parked_until").get<uint64_t>());
  }
  filter.erase("older_than");
  filter["parked_until"] = until;
  return filter;
}

}  // namespace retryloop::console::detail
