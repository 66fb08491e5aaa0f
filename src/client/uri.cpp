#include "retryloop/client/uri.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace retryloop::client {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view text, const char* part) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    int hi = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
    int lo = i + 2 < text.size() ? hex_digit(text[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      throw std::invalid_argument(std::string("bad percent-encoding in the URI's ") + part);
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

template <class T>
T parse_number(std::string_view text, const char* what, T min, T max) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || value < min ||
      value > max) {
    throw std::invalid_argument(std::string("URI ") + what + " must be a number from " +
                                std::to_string(min) + " to " + std::to_string(max) + ", not '" +
                                std::string(text) + "'");
  }
  return static_cast<T>(value);
}

void apply_query(Uri& uri, std::string_view query) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key(pair.substr(0, eq));
    std::string value =
        eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1), "query");
    if (key == "heartbeat") {
      uri.heartbeat_seconds = parse_number<uint16_t>(value, "heartbeat", 0, 65535);
    } else if (key == "frame_max") {
      uri.frame_max = parse_number<uint32_t>(value, "frame_max", 4096, 0xFFFFFFFFu);
    } else if (key == "channel_max") {
      uri.channel_max = parse_number<uint16_t>(value, "channel_max", 1, 65535);
    } else if (key == "connection_timeout") {
      uri.connect_timeout = std::chrono::milliseconds(
          parse_number<uint32_t>(value, "connection_timeout", 1, 86400000));
    } else if (key == "cacertfile") {
      uri.ca_file = value;
    } else if (key == "certfile") {
      uri.cert_file = value;
    } else if (key == "keyfile") {
      uri.key_file = value;
    } else if (key == "verify") {
      if (value != "verify_peer" && value != "verify_none") {
        throw std::invalid_argument("URI verify must be verify_peer or verify_none, not '" + value +
                                    "'");
      }
      uri.verify_peer = value == "verify_peer";
    } else if (key == "server_name_indication") {
      uri.server_name = value;
    } else if (key == "host_order") {
      if (value != "in_order" && value != "shuffled") {
        throw std::invalid_argument("URI host_order must be in_order or shuffled, not '" + value +
                                    "'");
      }
      uri.host_order = value == "shuffled" ? HostOrder::shuffled : HostOrder::in_order;
    } else {
      throw std::invalid_argument("unknown URI query option '" + key + "'");
    }
  }
}

// One `host[:port]` of the URI's host list (`[v6]:port` for IPv6); `default_port` when it has
// none. `index` names it in errors.
Endpoint parse_endpoint(std::string_view text, uint16_t default_port, size_t index) {
  const std::string which = index == 0 ? "" : " (host " + std::to_string(index + 1) + ")";
  if (text.empty()) throw std::invalid_argument("URI host list has an empty host" + which);
  std::string_view host = text;
  std::string_view port;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) {
      throw std::invalid_argument("URI IPv6 host lacks ']'" + which);
    }
    host = text.substr(1, close - 1);
    std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        throw std::invalid_argument("URI has junk after the IPv6 host" + which);
      }
      port = after.substr(1);
      if (port.empty()) throw std::invalid_argument("URI port is empty" + which);
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string_view::npos) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
      if (port.empty()) throw std::invalid_argument("URI port is empty" + which);
    }
  }
  Endpoint endpoint;
  endpoint.host = host.empty() ? "localhost" : percent_decode(host, "host");
  endpoint.port = port.empty() ? default_port : parse_number<uint16_t>(port, "port", 1, 65535);
  return endpoint;
}

}  // namespace

Uri parse_uri(std::string_view text) {
  Uri uri;
  size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) {
    throw std::invalid_argument("URI must start with amqp:// or amqps://");
  }
  std::string_view scheme = text.substr(0, scheme_end);
  if (scheme == "amqps") {
    uri.tls = true;
    uri.port = 5671;
  } else if (scheme != "amqp") {
    throw std::invalid_argument("URI scheme must be amqp or amqps, not '" + std::string(scheme) +
                                "'");
  }
  std::string_view rest = text.substr(scheme_end + 3);

  size_t query_start = rest.find('?');
  std::string_view query;
  if (query_start != std::string_view::npos) {
    query = rest.substr(query_start + 1);
    rest = rest.substr(0, query_start);
  }
  size_t path_start = rest.find('/');
  std::string_view authority = rest.substr(0, path_start);
  if (path_start != std::string_view::npos) {
    std::string_view path = rest.substr(path_start + 1);
    if (path.find('/') != std::string_view::npos) {
      throw std::invalid_argument("URI vhost must be one path segment; write vhost '/' as %2F");
    }
    if (!path.empty()) uri.vhost = percent_decode(path, "vhost");
  }

  size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    size_t colon = userinfo.find(':');
    uri.user = percent_decode(userinfo.substr(0, colon), "user name");
    uri.password = colon == std::string_view::npos
                       ? ""
                       : percent_decode(userinfo.substr(colon + 1), "password");
  }

  if (authority.empty()) {
    uri.host = "localhost";
  } else {
    size_t index = 0;
    while (true) {
      const size_t comma = authority.find(',');
      Endpoint endpoint = parse_endpoint(authority.substr(0, comma), uri.port, index);
      if (index == 0) {
        uri.host = endpoint.host;
        uri.port = endpoint.port;
      } else {
        uri.other_hosts.push_back(endpoint);
      }
      ++index;
      if (comma == std::string_view::npos) break;
      authority = authority.substr(comma + 1);
    }
  }
  apply_query(uri, query);
  return uri;
}

std::string Endpoint::text() const {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string Uri::redacted() const {
  std::string out = tls ? "amqps://" : "amqp://";
  out += user;
  out += ":***@";
  bool first = true;
  for (const auto& endpoint : hosts()) {
    out += (first ? "" : ",") + endpoint.text();
    first = false;
  }
  out += "/";
  for (char c : vhost) {
    if (c == '/') {
      out += "%2F";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<Endpoint> Uri::hosts() const {
  std::vector<Endpoint> all{Endpoint{host, port}};
  all.insert(all.end(), other_hosts.begin(), other_hosts.end());
  return all;
}

Uri Uri::with_only(const Endpoint& endpoint) const {
  Uri one = *this;
  one.host = endpoint.host;
  one.port = endpoint.port;
  one.other_hosts.clear();
  return one;
}

Uri Uri::with_last(const Endpoint& endpoint) const {
  std::vector<Endpoint> all = hosts();
  auto found = std::find(all.begin(), all.end(), endpoint);
  if (found == all.end() || all.size() == 1) return *this;
  std::rotate(found, found + 1, all.end());
  Uri rotated = *this;
  rotated.host = all.front().host;
  rotated.port = all.front().port;
  rotated.other_hosts.assign(all.begin() + 1, all.end());
  return rotated;
}

}  // namespace retryloop::client
