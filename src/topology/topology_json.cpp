#include "retryloop/topology/topology_json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::topology {

namespace {

using nlohmann::json;

constexpr size_t max_file_bytes = 16u << 20;
constexpr int max_depth = 64;

std::string quoted(const std::string& text) {
  std::string shown = text.size() > 60 ? text.substr(0, 60) + "..." : text;
  return json(shown).dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "true/false";
    case json::value_t::number_float:
      return "a fractional number";
    default:
      return "a number";
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      size_t cost = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                            std::tolower(static_cast<unsigned char>(b[j - 1]))
                        ? 0
                        : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// Finds duplicate keys (which JSON parsers silently collapse) in a pass over the text of its own
/// (json::sax_parse), and keeps the nesting depth bounded. A parse callback would do it in the same
/// pass, but nlohmann's callback parser looks through the whole enclosing array at the end of each
/// object, which makes a long array of objects take quadratic time.
class KeyWatcher {
 public:
  struct Duplicate {
    std::string path;
    std::string key;
  };
  struct TooDeep {};

  bool null() { return advance(); }
  bool boolean(bool) { return advance(); }
  bool number_integer(json::number_integer_t) { return advance(); }
  bool number_unsigned(json::number_unsigned_t) { return advance(); }
  bool number_float(json::number_float_t, const json::string_t&) { return advance(); }
  bool string(json::string_t&) { return advance(); }
  bool binary(json::binary_t&) { return advance(); }
  bool start_object(std::size_t) { return start(false); }
  bool start_array(std::size_t) { return start(true); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool key(json::string_t& key) {
    Frame& top = frames_.back();
    if (!top.keys.insert(key).second) duplicates.push_back({join(key), key});
    top.key = key;
    return true;
  }
  /// The text is not JSON: the parse that follows reports it.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

  std::vector<Duplicate> duplicates;

 private:
  struct Frame {
    bool array;
    size_t index;
    std::string key;
    std::set<std::string> keys;
  };

  bool advance() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }

  bool start(bool array) {
    if (static_cast<int>(frames_.size()) > max_depth) throw TooDeep{};
    frames_.push_back({array, 0, {}, {}});
    return true;
  }

  bool end() {
    frames_.pop_back();
    return advance();
  }

  std::string join(const std::string& last) const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.array) {
        path += "[" + std::to_string(f.index) + "]";
      } else {
        path += (path.empty() ? "" : ".") + f.key;
      }
    }
    return path + (path.empty() ? "" : ".") + last;
  }

  std::vector<Frame> frames_;
};

class Reader {
 public:
  ParseResult run(std::string_view text, std::string source) {
    ParseResult result;
    result.source = std::move(source);
    const size_t nul = text.find('\0');
    if (nul != std::string_view::npos) {
      const auto [line, column] = position(text, nul);
      result.errors.push_back({"", "",
                               "a NUL byte, which JSON text never holds; is it a topology file?",
                               line, column});
      return result;
    }
    KeyWatcher watcher;
    json root;
    try {
      json::sax_parse(text.begin(), text.end(), &watcher, json::input_format_t::json, true, false);
      root = json::parse(text.begin(), text.end(), nullptr, true, false);
    } catch (const json::parse_error& e) {
      result.errors.push_back(malformed(text, e));
      return result;
    } catch (const KeyWatcher::TooDeep&) {
      result.errors.push_back({"", "", "the JSON is nested more than 64 levels deep", 0, 0});
      return result;
    } catch (const json::exception& e) {
      // out_of_range: a number beyond what a double holds ("number overflow parsing '1e999'").
      std::string what = e.what();
      const size_t bracket = what.find("] ");
      if (bracket != std::string::npos) what = what.substr(bracket + 2);
      if (what.size() > 120) what = what.substr(0, 117) + "...";
      result.errors.push_back({"", "", "malformed JSON: " + what, 0, 0});
      return result;
    }
    for (const auto& d : watcher.duplicates) {
      error(d.path, "duplicate key " + quoted(d.key) + "; each key may appear once per object");
    }
    Topology topology = read_topology(root);
    for (auto& e : validate(topology)) {
      if (!suppressed(e.path)) errors_.push_back(std::move(e));
    }
    name_services(root);
    std::stable_sort(errors_.begin(), errors_.end(), [](const auto& a, const auto& b) {
      return service_index(a.path) < service_index(b.path);
    });
    if (errors_.empty()) {
      result.topology = std::move(topology);
    } else {
      result.errors = std::move(errors_);
    }
    return result;
  }

 private:
  static size_t service_index(const std::string& path) {
    if (path.rfind("services[", 0) != 0) return 0;
    return std::strtoull(path.c_str() + 9, nullptr, 10) + 1;
  }

  /// nlohmann quotes everything read since the last complete value ("last read: '5<U+000A>
  /// }<U+000A>  ]<U+000A>}<U+000A>x'"), which can span many lines: keep its last line, and at most
  /// 40 characters of it, since the line and column already say where.
  static std::string shorten_last_read(const std::string& detail) {
    constexpr std::string_view marker = "last read: '";
    constexpr std::string_view newline = "<U+000A>";
    size_t begin = detail.find(marker);
    if (begin == std::string::npos) return detail;
    begin += marker.size();
    size_t end = detail.find("'; ", begin);
    if (end == std::string::npos) end = detail.rfind('\'');
    if (end == std::string::npos || end <= begin) return detail;
    std::string read = detail.substr(begin, end - begin);
    size_t last_line = read.rfind(newline);
    if (last_line != std::string::npos) read = read.substr(last_line + newline.size());
    size_t first = read.find_first_not_of(' ');
    if (first == std::string::npos) return detail;
    read = read.substr(first);
    if (read.size() > 40) read = "..." + read.substr(read.size() - 40);
    return detail.substr(0, begin) + read + detail.substr(end);
  }

  /// The line and column (both from 1) of the byte at `offset`.
  static std::pair<size_t, size_t> position(std::string_view text, size_t offset) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return {line, column};
  }

  static TopologyError malformed(std::string_view text, const json::parse_error& e) {
    size_t end = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    const auto [line, column] = position(text, end);
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    size_t at = what.find("column ");
    at = at == std::string::npos ? std::string::npos : what.find(": ", at);
    std::string detail = at == std::string::npos ? what : what.substr(at + 2);
    detail = shorten_last_read(detail);
    // The message quotes what was last read, which may be any bytes: keep the output printable.
    std::string printable;
    for (char c : detail) {
      auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u >= 0x7F) {
        static const char hex[] = "0123456789ABCDEF";
        printable += "\\x";
        printable += hex[u >> 4];
        printable += hex[u & 15];
      } else {
        printable += c;
      }
    }
    return {"", "", "malformed JSON: " + printable, line, column};
  }

  void error(const std::string& path, std::string message) {
    errors_.push_back({"", path, std::move(message), 0, 0});
    bad_.insert(path);
  }

  /// Whether `path` or a path it lies under ("a.b" under "a", "a[1]") had an error already.
  bool suppressed(const std::string& path) const {
    for (size_t end = 0; end <= path.size(); ++end) {
      if (end == path.size() || path[end] == '.' || path[end] == '[') {
        if (bad_.count(path.substr(0, end)) > 0) return true;
      }
    }
    return false;
  }

  void name_services(const json& root) {
    if (!root.is_object() || !root.contains("services") || !root["services"].is_array()) return;
    const json& services = root["services"];
    for (auto& e : errors_) {
      if (!e.service.empty() || e.path.rfind("services[", 0) != 0) continue;
      size_t index = service_index(e.path) - 1;
      if (index < services.size() && services[index].is_object()) {
        auto it = services[index].find("name");
        if (it != services[index].end() && it->is_string()) e.service = it->get<std::string>();
      }
    }
  }

  /// Reports keys of `object` not in `allowed`; returns false when `value` is not an object.
  bool expect_object(const json& value, const std::string& path,
                     std::initializer_list<const char*> allowed, const char* example) {
    if (!value.is_object()) {
      error(path,
            std::string("must be an object, such as ") + example + ", not " + type_name(value));
      return false;
    }
    for (const auto& item : value.items()) {
      const std::string& key = item.key();
      bool known =
          std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; });
      if (known) continue;
      std::string message = "unknown key " + quoted(key);
      const char* best = nullptr;
      size_t best_distance = 3;
      for (const char* a : allowed) {
        std::string candidate(a);
        size_t d = edit_distance(key, candidate);
        // A shortened key ("max_len") is close too.
        if (key.size() >= 4 && (candidate.rfind(key, 0) == 0 || key.rfind(candidate, 0) == 0)) {
          d = std::min<size_t>(d, 2);
        }
        if (d < best_distance) {
          best_distance = d;
          best = a;
        }
      }
      if (best != nullptr) {
        message += "; did you mean \"" + std::string(best) + "\"?";
      } else {
        message += " (known keys here:";
        for (const char* a : allowed)
          message += std::string(" ") + a;
        message += ")";
      }
      error(child(path, key), message);
    }
    return true;
  }

  static std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string item(const std::string& path, size_t index) {
    return path + "[" + std::to_string(index) + "]";
  }

  const json* field(const json& object, const char* key, const std::string& path, bool required) {
    auto it = object.find(key);
    if (it == object.end()) {
      if (required) error(child(path, key), "is missing; this key is required");
      return nullptr;
    }
    return &*it;
  }

  std::string read_string(const json& object, const char* key, const std::string& path,
                          bool required, const std::string& fallback = {}) {
    const json* value = field(object, key, path, required);
    if (value == nullptr) return fallback;
    if (!value->is_string()) {
      error(child(path, key), std::string("must be a string, not ") + type_name(*value));
      return fallback;
    }
    return value->get<std::string>();
  }

  template <class Enum>
  Enum read_enum(const json& object, const char* key, const std::string& path, bool required,
                 Enum fallback, std::initializer_list<std::pair<const char*, Enum>> choices,
                 bool* ok = nullptr) {
    const json* value = field(object, key, path, required);
    if (ok != nullptr) *ok = value != nullptr || !required;
    if (value == nullptr) return fallback;
    std::string names;
    for (const auto& [name, _] : choices) {
      names += (names.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    }
    if (value->is_string()) {
      for (const auto& [name, e] : choices) {
        if (value->get<std::string>() == name) return e;
      }
      error(child(path, key), quoted(value->get<std::string>()) + " is not one of " + names);
    } else {
      error(child(path, key),
            std::string("must be one of ") + names + ", not " + type_name(*value));
    }
    if (ok != nullptr) *ok = false;
    return fallback;
  }

  std::chrono::milliseconds read_duration(const json& value, const std::string& path) {
    constexpr std::chrono::milliseconds placeholder{1000};
    if (!value.is_string()) {
      std::string message =
          std::string("must be a duration string such as \"30s\", not ") + type_name(value);
      if (value.is_number()) message += " (a bare number has no unit)";
      error(path, message);
      return placeholder;
    }
    std::string reason;
    auto parsed = parse_duration(value.get<std::string>(), &reason);
    if (!parsed) {
      error(path, quoted(value.get<std::string>()) + " " + reason);
      return placeholder;
    }
    return *parsed;
  }

  /// A whole number; `fallback` when absent or wrong (after reporting it).
  std::optional<int64_t> read_integer(const json& object, const char* key, const std::string& path,
                                      bool required, int64_t max) {
    const json* value = field(object, key, path, required);
    if (value == nullptr) return std::nullopt;
    const std::string p = child(path, key);
    if (value->is_number_unsigned()) {
      auto v = value->get<uint64_t>();
      if (v > static_cast<uint64_t>(max)) {
        error(p, "must be at most " + std::to_string(max));
        return std::nullopt;
      }
      return static_cast<int64_t>(v);
    }
    if (value->is_number_integer()) return value->get<int64_t>();
    // A whole number beyond 64 bits is parsed as a double.
    if (value->is_number_float() && std::trunc(value->get<double>()) == value->get<double>()) {
      error(p, value->get<double>() > 0
                   ? "must be at most " + std::to_string(max)
                   : std::string("is too far below zero for a whole number of 64 bits"));
      return std::nullopt;
    }
    error(p, std::string("must be a whole number, not ") + type_name(*value));
    return std::nullopt;
  }

  Topology read_topology(const json& root) {
    Topology topology;
    if (!expect_object(root, "", {"services", "delay_levels", "audit"}, "{\"services\": [...]}")) {
      bad_.insert("services");
      return topology;
    }
    if (const json* levels = field(root, "delay_levels", "", false)) {
      topology.schedule = read_schedule(*levels, "delay_levels");
    }
    if (const json* audit = field(root, "audit", "", false)) {
      topology.audit = Audit{};
      if (expect_object(*audit, "audit", {"max_age"}, "{\"max_age\": \"365d\"}")) {
        if (const json* age = field(*audit, "max_age", "audit", false)) {
          topology.audit->max_age = read_duration(*age, "audit.max_age");
        }
      }
    }
    const json* services = field(root, "services", "", !topology.schedule && !topology.audit);
    if (services == nullptr) return topology;
    if (!services->is_array()) {
      error("services", std::string("must be an array of services, not ") + type_name(*services));
      return topology;
    }
    for (size_t i = 0; i < services->size(); ++i) {
      topology.services.push_back(read_service((*services)[i], item("services", i)));
    }
    return topology;
  }

  Service read_service(const json& value, const std::string& p) {
    Service service;
    if (!expect_object(value, p,
                       {"name", "queue", "queue_type", "delivery_limit", "replicas", "input",
                        "retry", "parking", "outage"},
                       "{\"name\": \"orders\", \"input\": {...}, \"retry\": {...}}")) {
      return service;
    }
    service.name = read_string(value, "name", p, true);
    service.queue = read_string(value, "queue", p, false, service.name);
    if (service.queue.empty() && value.contains("queue") && value["queue"].is_string()) {
      error(child(p, "queue"), "must not be empty; leave \"queue\" out to use the service name");
      service.queue = service.name;
    }
    service.queue_type =
        read_enum(value, "queue_type", p, false, QueueType::classic,
                  {{"classic", QueueType::classic}, {"quorum", QueueType::quorum}});
    if (value.contains("delivery_limit")) {
      service.delivery_limit = 1;
      if (auto limit = read_integer(value, "delivery_limit", p, false, INT32_MAX)) {
        service.delivery_limit = *limit;
      }
    }
    if (value.contains("replicas")) {
      service.replicas = 1;
      if (auto replicas = read_integer(value, "replicas", p, false, INT32_MAX)) {
        service.replicas = *replicas;
      }
    }
    if (const json* input = field(value, "input", p, true)) {
      service.input = read_input(*input, child(p, "input"));
    }
    if (const json* retry = field(value, "retry", p, true)) {
      service.retry = read_retry(*retry, child(p, "retry"));
    }
    if (const json* parking = field(value, "parking", p, false)) {
      service.parking = read_parking(*parking, child(p, "parking"));
    }
    if (const json* outage = field(value, "outage", p, false)) {
      service.outage = read_outage(*outage, child(p, "outage"));
    }
    return service;
  }

  Input read_input(const json& value, const std::string& p) {
    Input input;
    if (!expect_object(value, p, {"exchange", "type", "declare", "bindings"},
                       "{\"exchange\": \"orders.in\", \"type\": \"topic\", \"bindings\": "
                       "[\"order.*\"]}")) {
      return input;
    }
    input.exchange = read_string(value, "exchange", p, true);
    bool type_ok = true;
    input.type = read_enum(value, "type", p, true, ExchangeType::direct,
                           {{"direct", ExchangeType::direct},
                            {"topic", ExchangeType::topic},
                            {"fanout", ExchangeType::fanout},
                            {"headers", ExchangeType::headers}},
                           &type_ok);
    if (const json* declare = field(value, "declare", p, false)) {
      if (declare->is_boolean()) {
        input.declare = declare->get<bool>();
      } else {
        error(child(p, "declare"),
              std::string("must be true or false, not ") + type_name(*declare));
      }
    }
    const std::string b = child(p, "bindings");
    if (!type_ok) bad_.insert(b);
    const json* bindings = field(value, "bindings", p, false);
    if (bindings == nullptr) return input;
    if (!bindings->is_array()) {
      error(b, std::string("must be an array, not ") + type_name(*bindings));
      return input;
    }
    for (size_t k = 0; k < bindings->size(); ++k) {
      const json& binding = (*bindings)[k];
      const std::string bk = item(b, k);
      if (input.type == ExchangeType::headers && type_ok) {
        input.bindings.push_back(read_headers_binding(binding, bk));
      } else if (binding.is_string()) {
        input.bindings.push_back({binding.get<std::string>(), HeadersMatch::all, {}});
      } else {
        error(bk, std::string("must be a routing key string, such as \"order.*\", not ") +
                      type_name(binding) +
                      (binding.is_object() ? " (objects are for headers exchanges)" : ""));
        input.bindings.push_back({"placeholder." + std::to_string(k), HeadersMatch::all, {}});
      }
    }
    return input;
  }

  Binding read_headers_binding(const json& value, const std::string& p) {
    Binding binding;
    binding.headers.emplace_back("placeholder", std::string(p));
    if (value.is_string()) {
      error(p,
            "a headers exchange binding is an object, such as {\"match\": \"all\", \"headers\": "
            "{\"type\": \"order\"}}, not a routing key");
      return binding;
    }
    if (!expect_object(value, p, {"match", "headers"},
                       "{\"match\": \"all\", \"headers\": {\"type\": \"order\"}}")) {
      return binding;
    }
    binding.match = read_enum(value, "match", p, false, HeadersMatch::all,
                              {{"all", HeadersMatch::all}, {"any", HeadersMatch::any}});
    const json* headers = field(value, "headers", p, true);
    if (headers == nullptr) return binding;
    const std::string h = child(p, "headers");
    if (!headers->is_object()) {
      error(h, std::string("must be an object of header names and values, not ") +
                   type_name(*headers));
      return binding;
    }
    binding.headers.clear();
    for (const auto& [name, v] : headers->items()) {
      if (v.is_string()) {
        binding.headers.emplace_back(name, v.get<std::string>());
      } else if (v.is_boolean()) {
        binding.headers.emplace_back(name, v.get<bool>());
      } else if (v.is_number_integer() &&
                 !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) {
        binding.headers.emplace_back(name, v.get<int64_t>());
      } else {
        error(child(h, name), std::string("a header value must be a string, a whole number or "
                                          "true/false, not ") +
                                  type_name(v));
        binding.headers.emplace_back(name, std::string());
      }
    }
    return binding;
  }

  Retry read_retry(const json& value, const std::string& p) {
    Retry retry;
    retry.delays.push_back(std::chrono::seconds(1));  // placeholder until read
    retry.max_attempts = 1;
    if (!expect_object(
            value, p,
            {"mode", "delays", "max_attempts", "max_retry_duration", "delay_levels", "backoff"},
            "{\"mode\": \"reject\", \"delays\": [\"30s\"], \"max_attempts\": 5}")) {
      return retry;
    }
    bool mode_ok = true;
    retry.mode = read_enum(value, "mode", p, false, RetryMode::reject,
                           {{"reject", RetryMode::reject},
                            {"republish", RetryMode::republish},
                            {"in_queue", RetryMode::in_queue}},
                           &mode_ok);
    // An unreadable mode must not also produce "reject mode takes exactly one delay".
    if (!mode_ok) retry.mode = RetryMode::republish;
    // A backoff gives the delays itself: then the tiers are optional.
    const bool has_backoff = value.contains("backoff");
    if (has_backoff && !value.contains("delays")) retry.delays.clear();
    if (const json* delays = field(value, "delays", p, !has_backoff)) {
      const std::string d = child(p, "delays");
      if (delays->is_array()) {
        retry.delays.clear();
        for (size_t k = 0; k < delays->size(); ++k) {
          retry.delays.push_back(read_duration((*delays)[k], item(d, k)));
        }
      } else if (delays->is_string()) {
        error(d, "must be an array of durations, such as [" + quoted(delays->get<std::string>()) +
                     "]");
      } else {
        error(d, std::string("must be an array of durations, such as [\"30s\"], not ") +
                     type_name(*delays));
      }
    }
    if (auto max = read_integer(value, "max_attempts", p, true, INT_MAX)) {
      retry.max_attempts = static_cast<int>(std::max<int64_t>(*max, INT_MIN));
    }
    if (const json* budget = field(value, "max_retry_duration", p, false)) {
      retry.max_retry_duration = read_duration(*budget, child(p, "max_retry_duration"));
    }
    if (const json* levels = field(value, "delay_levels", p, false)) {
      retry.delay_levels = read_delay_levels(*levels, child(p, "delay_levels"));
    }
    if (const json* backoff = field(value, "backoff", p, false)) {
      retry.backoff = read_backoff(*backoff, child(p, "backoff"));
    }
    return retry;
  }

  DelayLevels read_delay_levels(const json& value, const std::string& p) {
    DelayLevels levels{std::chrono::seconds(1), 1, std::nullopt};
    if (!expect_object(value, p, {"base", "levels", "max"},
                       "{\"base\": \"100ms\", \"max\": \"1h\"}")) {
      return levels;
    }
    if (const json* base = field(value, "base", p, true)) {
      levels.base = read_duration(*base, child(p, "base"));
    }
    const bool has_levels = value.contains("levels");
    const bool has_max = value.contains("max");
    if (has_levels == has_max) {
      error(child(p, has_levels ? "levels" : "max"),
            has_levels ? "give either \"levels\" or \"max\", not both"
                       : "is missing; give \"max\" (the longest delay, such as \"1h\") or "
                         "\"levels\" (how many)");
    }
    if (has_levels) {
      if (auto count = read_integer(value, "levels", p, false, INT_MAX)) {
        levels.levels = static_cast<int>(std::max<int64_t>(*count, INT_MIN));
      }
    } else if (const json* max = field(value, "max", p, false)) {
      levels.max = read_duration(*max, child(p, "max"));
      levels.levels = levels_for(levels.base, *levels.max);
    }
    return levels;
  }

  Schedule read_schedule(const json& value, const std::string& p) {
    Schedule schedule;
    schedule.levels = DelayLevels{std::chrono::seconds(1), 1, std::nullopt};
    if (!expect_object(value, p, {"base", "levels", "max", "queue_type", "queues"},
                       "{\"base\": \"1s\", \"max\": \"1d\", \"queues\": [\"orders\"]}")) {
      return schedule;
    }
    json levels = json::object();
    for (const char* key : {"base", "levels", "max"}) {
      if (value.contains(key)) levels[key] = value[key];
    }
    schedule.levels = read_delay_levels(levels, p);
    schedule.queue_type =
        read_enum(value, "queue_type", p, false, QueueType::classic,
                  {{"classic", QueueType::classic}, {"quorum", QueueType::quorum}});
    const json* queues = field(value, "queues", p, true);
    if (queues == nullptr) return schedule;
    const std::string qp = child(p, "queues");
    if (!queues->is_array()) {
      error(qp, std::string("must be an array of queue names, not ") + type_name(*queues));
      return schedule;
    }
    for (size_t i = 0; i < queues->size(); ++i) {
      if (!(*queues)[i].is_string()) {
        error(item(qp, i), std::string("must be a queue name, not ") + type_name((*queues)[i]));
        continue;
      }
      schedule.queues.push_back((*queues)[i].get<std::string>());
    }
    return schedule;
  }

  std::optional<double> read_number(const json& object, const char* key, const std::string& path) {
    const json* value = field(object, key, path, false);
    if (value == nullptr) return std::nullopt;
    if (value->is_number()) return value->get<double>();
    error(child(path, key), std::string("must be a number, not ") + type_name(*value));
    return std::nullopt;
  }

  RetryBackoff read_backoff(const json& value, const std::string& p) {
    RetryBackoff backoff{std::chrono::seconds(1), std::chrono::seconds(1), 2.0, 0.2};
    if (!expect_object(value, p, {"initial", "max", "multiplier", "jitter"},
                       "{\"initial\": \"1s\", \"max\": \"10m\", \"multiplier\": 2, "
                       "\"jitter\": 0.2}")) {
      return backoff;
    }
    if (const json* initial = field(value, "initial", p, true)) {
      backoff.initial = read_duration(*initial, child(p, "initial"));
    }
    if (const json* max = field(value, "max", p, true)) {
      backoff.max = read_duration(*max, child(p, "max"));
    }
    if (auto multiplier = read_number(value, "multiplier", p)) backoff.multiplier = *multiplier;
    if (auto jitter = read_number(value, "jitter", p)) backoff.jitter = *jitter;
    return backoff;
  }

  Parking read_parking(const json& value, const std::string& p) {
    Parking parking;
    if (!expect_object(value, p, {"max_length", "ttl"},
                       "{\"max_length\": 1000000, \"ttl\": \"14d\"}")) {
      return parking;
    }
    if (value.contains("max_length")) {
      parking.max_length = 1;
      if (auto max = read_integer(value, "max_length", p, false, INT64_MAX)) {
        parking.max_length = *max;
      }
    }
    if (const json* ttl = field(value, "ttl", p, false)) {
      parking.ttl = read_duration(*ttl, child(p, "ttl"));
    }
    return parking;
  }

  /// A whole number that must fit an int; `fallback` when absent or wrong (after reporting it).
  int read_count(const json& object, const char* key, const std::string& path, int fallback) {
    if (!object.contains(key)) return fallback;
    auto count = read_integer(object, key, path, false, INT_MAX);
    if (!count) return fallback;
    return static_cast<int>(std::max<int64_t>(*count, INT_MIN));
  }

  outage::Settings read_outage(const json& value, const std::string& p) {
    outage::Settings settings;
    if (!expect_object(value, p,
                       {"consecutive_unavailable", "failure_rate", "probe_interval", "ramp"},
                       "{\"consecutive_unavailable\": 5, \"probe_interval\": \"5s\"}")) {
      return settings;
    }
    settings.consecutive_unavailable =
        read_count(value, "consecutive_unavailable", p, settings.consecutive_unavailable);
    if (const json* interval = field(value, "probe_interval", p, false)) {
      settings.probe_interval = read_duration(*interval, child(p, "probe_interval"));
    }
    if (const json* rate = field(value, "failure_rate", p, false)) {
      const std::string r = child(p, "failure_rate");
      settings.failure_rate = outage::FailureRate{};
      if (expect_object(*rate, r, {"threshold", "window", "minimum_calls"},
                        "{\"threshold\": 0.5, \"window\": \"10s\", \"minimum_calls\": 20}")) {
        if (auto threshold = read_number(*rate, "threshold", r)) {
          settings.failure_rate->threshold = *threshold;
        }
        if (const json* window = field(*rate, "window", r, false)) {
          settings.failure_rate->window = read_duration(*window, child(r, "window"));
        }
        settings.failure_rate->minimum_calls =
            read_count(*rate, "minimum_calls", r, settings.failure_rate->minimum_calls);
      }
    }
    if (const json* ramp = field(value, "ramp", p, false)) {
      const std::string r = child(p, "ramp");
      if (expect_object(*ramp, r, {"interval"}, "{\"interval\": \"2s\"}")) {
        if (const json* interval = field(*ramp, "interval", r, false)) {
          settings.ramp.interval = read_duration(*interval, child(r, "interval"));
        }
      }
    }
    return settings;
  }

  std::set<std::string> bad_;
  std::vector<TopologyError> errors_;
};

}  // namespace

std::vector<std::string> ParseResult::messages() const {
  std::vector<std::string> out;
  out.reserve(errors.size());
  for (const auto& e : errors)
    out.push_back(to_string(e, source));
  return out;
}

ParseResult parse_topology(std::string_view text, std::string source_name) {
  return Reader().run(text, std::move(source_name));
}

ParseResult load_topology(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ParseResult result;
    result.source = path;
    result.errors.push_back({"", "", "is a directory, not a topology file", 0, 0});
    return result;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ParseResult result;
    result.source = path;
    result.errors.push_back(
        {"", "", "cannot read the file: " + std::string(std::strerror(errno)), 0, 0});
    return result;
  }
  std::string text;
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_file_bytes) {
      ParseResult result;
      result.source = path;
      result.errors.push_back(
          {"", "", "the file is larger than 16 MiB; is it a topology file?", 0, 0});
      return result;
    }
  }
  if (in.bad()) {
    ParseResult result;
    result.source = path;
    result.errors.push_back({"", "", "cannot read the file", 0, 0});
    return result;
  }
  return parse_topology(text, path);
}

}  // namespace retryloop::topology
