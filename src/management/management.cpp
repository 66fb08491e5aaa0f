#include "retryloop/management/management.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace retryloop::management {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view text, const char* part) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    int high = i + 2 < text.size() ? hex_value(text[i + 1]) : -1;
    int low = i + 2 < text.size() ? hex_value(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      throw std::invalid_argument(std::string("bad percent-encoding in the management URL's ") +
                                  part);
    }
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

/// Every byte but the unreserved ones encoded: a vhost "/" is "%2F" in the API's paths.
std::string percent_encode(std::string_view text) {
  static const char digits[] = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += digits[u >> 4];
      out += digits[u & 0xF];
    }
  }
  return out;
}

std::vector<std::string> strings(const nlohmann::json& body, const char* key) {
  std::vector<std::string> out;
  auto it = body.find(key);
  if (it == body.end() || !it->is_array()) return out;
  for (const auto& item : *it) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

ApiHost parse_host(std::string_view authority, uint16_t default_port) {
  ApiHost out;
  out.port = default_port;
  std::string_view host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      throw std::invalid_argument("the management URL's IPv6 host lacks its closing ']'");
    }
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw std::invalid_argument("bad text after the IPv6 host");
      port = after.substr(1);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) throw std::invalid_argument("the management URL names no host");
  out.host = percent_decode(host, "host");
  if (!port.empty()) {
    if (port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw std::invalid_argument("the management URL's port must be a number from 1 to 65535");
    }
    const int value = std::stoi(std::string(port));
    if (value < 1 || value > 65535) {
      throw std::invalid_argument("the management URL's port must be a number from 1 to 65535");
    }
    out.port = static_cast<uint16_t>(value);
  }
  return out;
}

}  // namespace

std::string ApiHost::text() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

std::string ApiUrl::redacted() const {
  std::string list;
  for (const auto& h : hosts)
    list += (list.empty() ? "" : ",") + h.text();
  return std::string(tls ? "https" : "http") + "://" + (user.empty() ? "" : user + ":***@") + list +
         path_prefix + "/";
}

ApiUrl parse_api_url(std::string_view url, const std::string& default_user,
                     const std::string& default_password) {
  ApiUrl out;
  std::string_view rest;
  uint16_t default_port = 15672;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    out.tls = true;
    default_port = 15671;
    rest = url.substr(8);
  } else {
    throw std::invalid_argument(
        "a management URL starts with http:// or https://, as in "
        "http://guest:guest@localhost:15672/");
  }
  if (rest.find_first_of("?#") != std::string_view::npos) {
    throw std::invalid_argument("a management URL takes no query or fragment");
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  while (!path.empty() && path.back() == '/')
    path.remove_suffix(1);
  out.path_prefix = percent_decode(path, "path");

  const size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    const size_t colon = userinfo.find(':');
    out.user = percent_decode(userinfo.substr(0, colon), "user name");
    out.password = colon == std::string_view::npos
                       ? std::string()
                       : percent_decode(userinfo.substr(colon + 1), "password");
    authority = authority.substr(at + 1);
  } else {
    out.user = default_user;
    out.password = default_password;
  }

  while (true) {
    const size_t comma = authority.find(',');
    out.hosts.push_back(parse_host(authority.substr(0, comma), default_port));
    if (comma == std::string_view::npos) break;
    authority = authority.substr(comma + 1);
  }
  return out;
}

ManagementClient::ManagementClient(ApiUrl url, std::chrono::milliseconds timeout)
    : url_(std::move(url)), timeout_(timeout) {}

std::optional<QueueMembers> ManagementClient::queue(const std::string& vhost,
                                                    const std::string& name,
                                                    ApiError& error) const {
  const std::string path =
      url_.path_prefix + "/api/queues/" + percent_encode(vhost) + "/" + percent_encode(name);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout_);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(timeout_ - seconds);
  // The first host that gives an HTTP answer is the one asked; one that gives none is skipped.
  std::unique_ptr<httplib::Response> response;
  std::string unanswered;
  for (const auto& host : url_.hosts) {
    httplib::Client client((url_.tls ? "https://" : "http://") + host.text());
    client.set_connection_timeout(static_cast<time_t>(seconds.count()),
                                  static_cast<time_t>(micros.count()));
    client.set_read_timeout(static_cast<time_t>(seconds.count()),
                            static_cast<time_t>(micros.count()));
    client.set_basic_auth(url_.user, url_.password);
    httplib::Result result = client.Get(path);
    if (result) {
      response = std::make_unique<httplib::Response>(std::move(result.value()));
      break;
    }
    unanswered +=
        (unanswered.empty() ? "" : "; ") + host.text() + ": " + httplib::to_string(result.error());
  }
  if (!response) {
    error = {0,
             "no answer from the management API at " + url_.redacted() + " (" + unanswered + ")"};
    return std::nullopt;
  }
  const httplib::Response* result = response.get();
  if (result->status != 200) {
    std::string reason = result->status == 401   ? "wrong user name or password"
                         : result->status == 404 ? "no such queue in vhost '" + vhost + "'"
                                                 : "HTTP " + std::to_string(result->status);
    error = {result->status, "the management API at " + url_.redacted() + " answered " +
                                 std::to_string(result->status) + " for queue '" + name +
                                 "': " + reason};
    return std::nullopt;
  }
  nlohmann::json body = nlohmann::json::parse(result->body, nullptr, false);
  if (!body.is_object()) {
    error = {result->status, "the management API at " + url_.redacted() +
                                 " answered with something other than a JSON object for queue '" +
                                 name + "'"};
    return std::nullopt;
  }
  QueueMembers members;
  if (auto type = body.find("type"); type != body.end() && type->is_string()) {
    members.type = type->get<std::string>();
  }
  if (auto leader = body.find("leader"); leader != body.end() && leader->is_string()) {
    members.leader = leader->get<std::string>();
  }
  members.members = strings(body, "members");
  members.online = strings(body, "online");
  return members;
}

size_t MembersCheck::required() const {
  if (wanted) return static_cast<size_t>(*wanted);
  return found ? found->members.size() : 0;
}

bool MembersCheck::ok() const {
  return found && !found->members.empty() && found->online.size() >= required();
}

std::vector<std::string> MembersCheck::offline() const {
  std::vector<std::string> out;
  if (!found) return out;
  for (const auto& member : found->members) {
    if (std::find(found->online.begin(), found->online.end(), member) == found->online.end()) {
      out.push_back(member);
    }
  }
  return out;
}

std::vector<MembersCheck> check_members(const ManagementClient& client, const topology::Plan& plan,
                                        const std::string& vhost) {
  std::vector<MembersCheck> checks;
  for (const auto& action : plan.actions) {
    if (action.kind != topology::ActionKind::declare_queue) continue;
    const amqp::FieldValue* type = action.arguments.find("x-queue-type");
    if (type == nullptr || type->as_string() != std::string_view("quorum")) continue;
    MembersCheck check;
    check.queue = action.name;
    if (const amqp::FieldValue* size = action.arguments.find("x-quorum-initial-group-size")) {
      check.wanted = size->as_int64();
    }
    check.found = client.queue(vhost, action.name, check.error);
    checks.push_back(std::move(check));
  }
  return checks;
}

}  // namespace retryloop::management
