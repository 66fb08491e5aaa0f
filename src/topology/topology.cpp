#include "retryloop/topology/topology.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <tuple>

#include "retryloop/amqp/printable.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"

namespace retryloop::topology {

namespace {

constexpr size_t max_name_bytes = 255;
// More members than any cluster retryloop has met; Raft wants an odd number, and 3 or 5 is usual.
constexpr int64_t max_replicas = 99;

std::string service_path(size_t index) {
  return "services[" + std::to_string(index) + "]";
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

/// A name for messages: quoted, escaped as amqp::printable does (control characters, C1 and
/// bidirectional controls, bytes that are not UTF-8), long names shortened at a character boundary.
std::string quote(std::string_view name) {
  const bool utf8 = valid_utf8(name);
  size_t shown = std::min<size_t>(name.size(), 60);
  while (utf8 && shown < name.size() && (static_cast<unsigned char>(name[shown]) & 0xC0) == 0x80) {
    --shown;
  }
  std::string out = "\"";
  for (char c : amqp::printable(name.substr(0, shown))) {
    if (c == '"') out += '\\';
    out += c;
  }
  if (shown < name.size()) out += "...";
  out += "\"";
  return out;
}

class Validator {
 public:
  explicit Validator(const Topology& topology) : topology_(topology) {}

  std::vector<TopologyError> run() {
    if (topology_.services.empty() && !topology_.schedule && !topology_.audit) {
      add("", "services", "lists no services; add at least one");
    }
    std::map<std::string, size_t> names;
    for (size_t i = 0; i < topology_.services.size(); ++i) {
      const Service& service = topology_.services[i];
      bool name_ok = check_service(i, service);
      auto [it, inserted] = names.emplace(service.name, i);
      if (!inserted && !service.name.empty()) {
        add(service.name, service_path(i) + ".name",
            "duplicate service name " + quote(service.name) + " (also " + service_path(it->second) +
                "); every service needs its own name");
        name_ok = false;
      }
      usable_.push_back(name_ok);
    }
    check_collisions();
    if (topology_.schedule) check_schedule(*topology_.schedule);
    if (topology_.audit && topology_.audit->max_age < std::chrono::seconds(1)) {
      add("", "audit.max_age", "must be at least 1s: the stream keeps records for whole seconds");
    }
    std::stable_sort(errors_.begin(), errors_.end(),
                     [](const TopologyError& a, const TopologyError& b) {
                       return service_index(a.path) < service_index(b.path);
                     });
    return std::move(errors_);
  }

 private:
  static size_t service_index(const std::string& path) {
    if (path.rfind("services[", 0) != 0) return 0;
    return std::strtoull(path.c_str() + 9, nullptr, 10) + 1;
  }

  void add(const std::string& service, std::string path, std::string message) {
    errors_.push_back({service, std::move(path), std::move(message), 0, 0});
  }

  /// Checks a name RabbitMQ will be asked to create or look up; returns whether it is usable.
  bool check_name(const Service& service, const std::string& path, std::string_view name,
                  bool reserved_allowed) {
    if (name.empty()) {
      add(service.name, path, "must not be empty");
      return false;
    }
    if (name.size() > max_name_bytes) {
      add(service.name, path,
          quote(name) + " is " + std::to_string(name.size()) +
              " bytes long; RabbitMQ allows at most 255");
      return false;
    }
    if (!valid_utf8(name)) {
      add(service.name, path, quote(name) + " is not valid UTF-8, which RabbitMQ refuses");
      return false;
    }
    for (char c : name) {
      auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7F) {
        add(service.name, path,
            quote(name) + " contains a control character; use letters, digits, '.', '-', '_'");
        return false;
      }
    }
    if (is_delay_level_object(name)) {
      add(service.name, path,
          quote(name) + " begins with \"retryloop.delay.\", which the shared delay levels use");
      return false;
    }
    if (!reserved_allowed && name.rfind("amq.", 0) == 0) {
      add(service.name, path,
          quote(name) + " begins with \"amq.\", which RabbitMQ reserves for its own objects");
      return false;
    }
    return true;
  }

  bool check_service(size_t index, const Service& service) {
    const std::string p = service_path(index);
    bool name_ok = check_name(service, p + ".name", service.name, false);
    if (name_ok) {
      // The longest derived name is the wait queue with the longest label.
      std::string longest = breaker_instances_queue_name(service.name);
      for (auto delay : wait_delays(service)) {
        std::string wait = wait_queue_name(service.name, delay);
        if (wait.size() > longest.size()) longest = wait;
      }
      if (longest.size() > max_name_bytes) {
        add(service.name, p + ".name",
            "the derived name " + quote(longest) + " would be " + std::to_string(longest.size()) +
                " bytes long; RabbitMQ allows at most 255, so shorten the service name");
        name_ok = false;
      }
    }
    if (!service.queue.empty() && service.queue != service.name) {
      check_name(service, p + ".queue", service.queue, false);
    }
    check_input(p + ".input", service);
    check_retry(p + ".retry", service);
    check_parking(p + ".parking", service);
    check_delivery_limit(p + ".delivery_limit", service);
    check_replicas(p + ".replicas", service);
    for (const auto& problem : outage::check(service.outage)) {
      add(service.name, p + ".outage." + problem.key, problem.message);
    }
    return name_ok;
  }

  void check_delivery_limit(const std::string& p, const Service& service) {
    if (!service.delivery_limit) return;
    if (service.queue_type != QueueType::quorum) {
      add(service.name, p,
          "applies to quorum queues only (classic queues have no delivery limit); set "
          "\"queue_type\": \"quorum\" or leave it out");
    } else if (*service.delivery_limit < 1) {
      add(service.name, p,
          "must be at least 1, not " + std::to_string(*service.delivery_limit) +
              " (leave it out for the default, " + std::to_string(default_delivery_limit) + ")");
    } else if (*service.delivery_limit >= broker_delivery_limit) {
      add(service.name, p,
          "must be below " + std::to_string(broker_delivery_limit) +
              ", the limit retryloop gives the queue itself so that the broker never acts on it");
    }
  }

  void check_replicas(const std::string& p, const Service& service) {
    if (!service.replicas) return;
    if (service.queue_type != QueueType::quorum) {
      add(service.name, p,
          "applies to quorum queues only (a classic queue lives on one node); set "
          "\"queue_type\": \"quorum\" or leave it out");
    } else if (*service.replicas < 1 || *service.replicas > max_replicas) {
      add(service.name, p,
          "must be from 1 to " + std::to_string(max_replicas) + ", not " +
              std::to_string(*service.replicas) +
              " (leave it out for a member on every node of the cluster)");
    }
  }

  void check_input(const std::string& p, const Service& service) {
    const Input& input = service.input;
    if (input.exchange.empty()) {
      add(service.name, p + ".exchange",
          "must not be empty (the default exchange cannot be bound to)");
    } else {
      check_name(service, p + ".exchange", input.exchange, !input.declare);
    }
    const std::string b = p + ".bindings";
    switch (input.type) {
      case ExchangeType::fanout:
        if (!input.bindings.empty()) {
          add(service.name, b,
              "a fanout exchange ignores routing keys; leave \"bindings\" out (the queue is "
              "bound once)");
        }
        return;
      case ExchangeType::direct:
      case ExchangeType::topic:
        if (input.bindings.empty()) {
          add(service.name, b,
              std::string("a ") + to_string(input.type) +
                  " exchange needs at least one binding (a routing key), or the queue gets "
                  "nothing");
        }
        break;
      case ExchangeType::headers:
        if (input.bindings.empty()) {
          add(service.name, b,
              "a headers exchange needs at least one binding, such as {\"match\": \"all\", "
              "\"headers\": {\"type\": \"order\"}}");
        }
        break;
    }
    std::map<BindingKey, size_t> bindings;
    for (size_t k = 0; k < input.bindings.size(); ++k) {
      const Binding& binding = input.bindings[k];
      const std::string bk = b + "[" + std::to_string(k) + "]";
      if (input.type == ExchangeType::headers) {
        if (!binding.routing_key.empty()) {
          add(service.name, bk, "a headers exchange ignores routing keys; give match and headers");
        }
        if (binding.headers.empty()) {
          add(service.name, bk + ".headers",
              "must list at least one header to match (to take every message, use a fanout "
              "exchange)");
        }
        std::map<std::string, bool> seen;
        for (const auto& [name, value] : binding.headers) {
          const std::string hp = bk + ".headers." + name;
          if (name.empty()) {
            add(service.name, bk + ".headers", "a header name must not be empty");
          } else if (name.size() > max_name_bytes || !valid_utf8(name)) {
            add(service.name, hp, "a header name must be valid UTF-8 of at most 255 bytes");
          } else if (name.rfind("x-", 0) == 0) {
            add(service.name, hp,
                "headers beginning with \"x-\" are ignored by the headers exchange, so this "
                "binding would never match on it");
          } else if (!seen.emplace(name, true).second) {
            add(service.name, hp, "header " + quote(name) + " is listed twice");
          }
          if (const auto* text = std::get_if<std::string>(&value)) {
            if (!valid_utf8(*text)) add(service.name, hp, "the value is not valid UTF-8");
          }
        }
      } else {
        if (!binding.headers.empty()) {
          add(service.name, bk,
              "headers only apply to a headers exchange; this one is " +
                  std::string(to_string(input.type)));
        }
        if (binding.routing_key.size() > max_name_bytes) {
          add(service.name, bk,
              "the routing key is " + std::to_string(binding.routing_key.size()) +
                  " bytes long; RabbitMQ allows at most 255");
        } else if (!valid_utf8(binding.routing_key)) {
          add(service.name, bk, "the routing key is not valid UTF-8");
        }
      }
      auto [first, inserted] = bindings.emplace(binding_key(binding), k);
      if (!inserted) {
        std::string what = input.type == ExchangeType::headers
                               ? std::string("binding")
                               : "binding " + quote(binding.routing_key);
        add(service.name, bk,
            "duplicate " + what + " (same as bindings[" + std::to_string(first->second) + "])");
      }
    }
  }

  /// What makes two bindings the same: the key, the match and the headers in any order.
  using BindingKey =
      std::tuple<std::string, HeadersMatch, std::vector<std::pair<std::string, HeaderValue>>>;

  static BindingKey binding_key(const Binding& binding) {
    BindingKey key{binding.routing_key, binding.match, binding.headers};
    std::sort(std::get<2>(key).begin(), std::get<2>(key).end());
    return key;
  }

  void check_ttl(const Service& service, const std::string& path, std::chrono::milliseconds value,
                 const char* what) {
    if (value.count() <= 0) {
      add(service.name, path, std::string(what) + " must be longer than zero");
    } else if (value > max_ttl) {
      add(service.name, path,
          duration_label(value) + " is longer than the largest TTL RabbitMQ accepts (" +
              std::to_string(max_ttl.count()) + "ms, about 49 days)");
    }
  }

  void check_retry(const std::string& p, const Service& service) {
    const Retry& retry = service.retry;
    const std::string d = p + ".delays";
    if (retry.delays.empty() && !retry.backoff) {
      add(service.name, d, "must list at least one delay, such as [\"30s\"]");
    } else if (retry.mode == RetryMode::reject && retry.delays.size() > 1) {
      add(service.name, d,
          "reject mode takes exactly one delay (it has " + std::to_string(retry.delays.size()) +
              "); for a backoff sequence use \"mode\": \"republish\"");
    } else if (retry.mode == RetryMode::in_queue && retry.delays.size() > 2) {
      add(service.name, d,
          "in_queue mode takes one delay, or two: the step the queue multiplies by the failed "
          "deliveries, and the most it waits (it has " +
              std::to_string(retry.delays.size()) + ")");
    } else if (retry.mode == RetryMode::in_queue && retry.delays.size() == 2 &&
               retry.delays[1] < retry.delays[0]) {
      add(service.name, d + "[1]",
          "the most an in_queue retry waits, " + duration_label(retry.delays[1]) +
              ", is shorter than its step " + duration_label(retry.delays[0]));
    }
    if (retry.mode == RetryMode::in_queue) check_in_queue(p, service);
    for (size_t k = 0; k < retry.delays.size(); ++k) {
      check_ttl(service, d + "[" + std::to_string(k) + "]", retry.delays[k], "a delay");
    }
    if (retry.max_attempts < 1) {
      add(service.name, p + ".max_attempts",
          "must be at least 1 (it counts the first delivery), not " +
              std::to_string(retry.max_attempts));
    }
    if (retry.max_retry_duration && retry.max_retry_duration->count() <= 0) {
      add(service.name, p + ".max_retry_duration",
          "must be longer than zero (leave it out for no time limit)");
    }
    if (retry.delay_levels) check_delay_levels(p + ".delay_levels", service);
    if (retry.backoff) check_backoff(p + ".backoff", service);
  }

  /// The in_queue mode rests on a quorum queue's delayed retry, and keeps no header of its own
  /// on the message (it is never copied), so it has no first failure to time a budget from.
  void check_in_queue(const std::string& p, const Service& service) {
    if (service.queue_type != QueueType::quorum) {
      add(service.name, p + ".mode",
          "in_queue needs \"queue_type\": \"quorum\" (RabbitMQ 4.3's delayed retry is a quorum "
          "queue's)");
    }
    if (service.retry.max_retry_duration) {
      add(service.name, p + ".max_retry_duration",
          "is not available in in_queue mode, which never copies the message and so keeps no "
          "time of its first failure; use max_attempts");
    }
  }

  void check_delay_levels(const std::string& p, const Service& service) {
    const DelayLevels& levels = *service.retry.delay_levels;
    if (service.retry.mode != RetryMode::republish) {
      add(service.name, p,
          "needs \"mode\": \"republish\": the consumer publishes each retry into the levels");
      return;
    }
    if (levels.base.count() <= 0) {
      add(service.name, p + ".base", "must be longer than zero");
      return;
    }
    if (levels.max && *levels.max < levels.base) {
      add(service.name, p + ".max",
          duration_label(*levels.max) + " is shorter than the base " + duration_label(levels.base));
      return;
    }
    if (levels.levels < 1 || levels.levels > max_delay_levels) {
      add(service.name, p + (levels.max ? ".max" : ".levels"),
          (levels.max ? "needs " + std::to_string(levels.levels) + " levels; " : std::string()) +
              "the levels must number 1 to " + std::to_string(max_delay_levels) +
              (levels.max ? "; raise the base" : ""));
      return;
    }
    const int64_t top = levels.base.count() << (levels.levels - 1);
    if (top > max_ttl.count() || top <= 0) {
      add(service.name, p + (levels.max ? ".max" : ".levels"),
          "the top level would hold messages for " +
              duration_label(std::chrono::milliseconds(top)) +
              ", longer than the largest TTL RabbitMQ accepts (about 49 days); use fewer levels "
              "or a larger base");
      return;
    }
    const std::string& queue = input_queue_name(service);
    const size_t key_bytes = size_t(levels.levels) * 2 + queue.size();
    if (key_bytes > max_name_bytes) {
      add(service.name, p,
          "a retry's routing key (" + std::to_string(levels.levels) +
              " bits and the queue name) would be " + std::to_string(key_bytes) +
              " bytes; RabbitMQ allows 255: use fewer levels or a shorter queue name");
    }
    size_t start = 0;
    while (start <= queue.size()) {
      size_t end = queue.find('.', start);
      if (end == std::string::npos) end = queue.size();
      std::string_view word(queue.data() + start, end - start);
      if (word == "*" || word == "#") {
        add(service.name, p,
            "the queue name " + quote(queue) + " has the word " + quote(std::string(word)) +
                ", which a topic binding reads as a wildcard; rename the queue");
        break;
      }
      start = end + 1;
    }
  }

  void check_schedule(const Schedule& schedule) {
    const std::string p = "delay_levels";
    const size_t errors_before = errors_.size();
    Service levels = schedule_target(schedule, "q");
    levels.name.clear();
    check_delay_levels(p, levels);
    if (errors_.size() != errors_before) return;
    if (schedule.queues.empty()) {
      add("", p + ".queues",
          "lists no queues; name the queues that may receive scheduled messages");
    }
    std::map<std::string, size_t> seen;
    for (size_t i = 0; i < schedule.queues.size(); ++i) {
      const std::string& queue = schedule.queues[i];
      const std::string qp = p + ".queues[" + std::to_string(i) + "]";
      Service nameless;
      if (!check_name(nameless, qp, queue, false)) continue;
      if (!seen.emplace(queue, i).second) {
        add("", qp, "lists " + quote(queue) + " twice");
        continue;
      }
      const size_t before = errors_.size();
      check_delay_levels(p, schedule_target(schedule, queue));
      for (size_t e = before; e < errors_.size(); ++e) {
        errors_[e].service.clear();
        errors_[e].path = qp;
      }
      for (const Service& s : topology_.services) {
        if (queue == parking_queue_name(s.name)) {
          add("", qp,
              quote(queue) + " is the parking queue of service " + quote(s.name) +
                  "; replay parked messages with `retryloop parking replay` instead");
        }
        for (auto delay : wait_delays(s)) {
          if (queue == wait_queue_name(s.name, delay)) {
            add("", qp, quote(queue) + " is a wait queue of service " + quote(s.name));
          }
        }
      }
    }
  }

  void check_backoff(const std::string& p, const Service& service) {
    const RetryBackoff& backoff = *service.retry.backoff;
    if (!service.retry.delay_levels) {
      add(service.name, p,
          "waits in the delay levels: add \"delay_levels\", such as {\"base\": \"100ms\", "
          "\"max\": \"1h\"}");
      return;
    }
    if (!service.retry.delays.empty()) {
      add(service.name, service_path_of(p) + ".delays",
          "give either \"delays\" or \"backoff\": both say how long a retry waits");
    }
    if (backoff.initial.count() <= 0) {
      add(service.name, p + ".initial", "must be longer than zero");
    }
    if (backoff.max < backoff.initial) {
      add(service.name, p + ".max",
          duration_label(backoff.max) + " is shorter than initial " +
              duration_label(backoff.initial));
    }
    const auto longest = longest_level_delay(service);
    if (longest.count() > 0 && backoff.max > longest) {
      add(service.name, p + ".max",
          duration_label(backoff.max) + " is longer than the delay levels wait (at most " +
              duration_label(longest) + ")");
    }
    if (!(backoff.multiplier >= 1.0 && backoff.multiplier <= 1000.0)) {
      add(service.name, p + ".multiplier", "must be from 1 to 1000");
    }
    if (!(backoff.jitter >= 0.0 && backoff.jitter <= 1.0)) {
      add(service.name, p + ".jitter", "must be from 0 to 1 (a fraction of the delay)");
    }
  }

  /// "services[0].retry" from "services[0].retry.backoff".
  static std::string service_path_of(const std::string& path) {
    return path.substr(0, path.rfind('.'));
  }

  void check_parking(const std::string& p, const Service& service) {
    if (service.parking.max_length && *service.parking.max_length < 1) {
      add(service.name, p + ".max_length",
          "must be at least 1, not " + std::to_string(*service.parking.max_length) +
              " (leave it out for no limit)");
    }
    if (service.parking.ttl) check_ttl(service, p + ".ttl", *service.parking.ttl, "the TTL");
  }

  struct Owner {
    size_t service;
    std::string what;
  };

  static constexpr size_t no_service = static_cast<size_t>(-1);

  std::string owner_text(const Owner& owner) const {
    if (owner.service == no_service) return owner.what;
    const Service& s = topology_.services[owner.service];
    return owner.what + " of service " + quote(s.name) + " (" + service_path(owner.service) + ")";
  }

  void check_collisions() {
    std::map<std::string, Owner> queues;
    std::map<std::string, Owner> exchanges;
    // Derived names first, so that a clash with a chosen name is reported at the chosen name.
    for (size_t i = 0; i < topology_.services.size(); ++i) {
      if (!usable_[i]) continue;
      const Service& s = topology_.services[i];
      auto claim = [&](std::map<std::string, Owner>& table, const std::string& name,
                       const char* kind, const char* what) {
        auto [it, inserted] = table.emplace(name, Owner{i, what});
        if (!inserted) {
          add(s.name, service_path(i) + ".name",
              std::string("the ") + what + " " + quote(name) + " is also the " + kind + " " +
                  owner_text(it->second) + "; rename one of the services");
        }
      };
      claim(queues, parking_queue_name(s.name), "queue", "parking queue");
      claim(queues, breaker_state_queue_name(s.name), "queue", "breaker state queue");
      claim(queues, breaker_token_queue_name(s.name), "queue", "breaker token queue");
      claim(queues, breaker_instances_queue_name(s.name), "queue", "breaker instances queue");
      claim(exchanges, breaker_exchange_name(s.name), "exchange", "breaker exchange");
      for (auto delay : wait_delays(s)) {
        claim(queues, wait_queue_name(s.name, delay), "queue", "wait queue");
      }
      claim(exchanges, wait_exchange_name(s.name), "exchange", "wait exchange");
      // The parking exchange has the parking queue's name: a clash shows on the queue already.
      exchanges.emplace(parking_exchange_name(s.name), Owner{i, "parking exchange"});
    }
    if (topology_.audit) {
      queues.emplace(audit_stream_name(),
                     Owner{no_service, "audit stream of the top-level \"audit\""});
    }
    std::map<std::string, size_t> inputs;
    for (size_t i = 0; i < topology_.services.size(); ++i) {
      const Service& s = topology_.services[i];
      const std::string& queue = input_queue_name(s);
      // A duplicate or unusable service name already has its error; its default queue would
      // only repeat it.
      bool named_queue = !s.queue.empty() && s.queue != s.name;
      if (!queue.empty() && (usable_[i] || named_queue)) {
        std::string path =
            service_path(i) + (s.queue.empty() || s.queue == s.name ? ".name" : ".queue");
        auto [it, inserted] = queues.emplace(queue, Owner{i, "input queue"});
        if (!inserted) {
          std::string also = it->second.what == "input queue" ? "; each service needs its own queue"
                                                              : "; choose another queue name";
          add(s.name, path,
              "queue " + quote(queue) + " is also the " + owner_text(it->second) + also);
        }
      }
      // The wait queues dead-letter through the wait exchange with Q's name as the routing key,
      // so Q's name must not be the key of one of its delays.
      for (auto delay : wait_delays(s)) {
        if (queue.empty() || queue != duration_label(delay)) continue;
        add(s.name, service_path(i) + (s.queue.empty() ? ".name" : ".queue"),
            "queue " + quote(queue) + " is also the routing key of the delay " + quote(queue) +
                " in the wait exchange " + quote(wait_exchange_name(s.name)) +
                "; choose another queue name");
      }
      const std::string& exchange = s.input.exchange;
      if (exchange.empty()) continue;
      auto derived = exchanges.find(exchange);
      if (derived != exchanges.end()) {
        add(s.name, service_path(i) + ".input.exchange",
            "exchange " + quote(exchange) + " is the " + owner_text(derived->second) +
                "; an input exchange must be another one");
        continue;
      }
      auto [it, inserted] = inputs.emplace(exchange, i);
      if (!inserted) {
        const Service& first = topology_.services[it->second];
        if (first.input.type != s.input.type) {
          add(s.name, service_path(i) + ".input.type",
              "exchange " + quote(exchange) + " is " + to_string(first.input.type) + " in " +
                  service_path(it->second) +
                  "; services sharing an exchange must agree on its "
                  "type");
        }
      }
    }
  }

  const Topology& topology_;
  std::vector<bool> usable_;
  std::vector<TopologyError> errors_;
};

}  // namespace

std::string to_string(const TopologyError& error, std::string_view source) {
  std::string out;
  if (!source.empty()) {
    out += source;
    if (error.line > 0) {
      out += ":" + std::to_string(error.line) + ":" + std::to_string(error.column);
    }
    out += ": ";
  }
  if (!error.path.empty()) {
    out += error.path;
    bool about_name =
        error.path.size() >= 5 && error.path.compare(error.path.size() - 5, 5, ".name") == 0;
    if (!error.service.empty() && !about_name) out += " (service " + quote(error.service) + ")";
    out += ": ";
  }
  out += error.message;
  return out;
}

std::vector<TopologyError> validate(const Topology& topology) {
  return Validator(topology).run();
}

Topology select_services(const Topology& topology, const std::vector<std::string>& names) {
  if (names.empty()) return topology;
  for (const auto& name : names) {
    bool found = std::any_of(topology.services.begin(), topology.services.end(),
                             [&](const Service& s) { return s.name == name; });
    if (!found) {
      std::string known;
      for (const auto& s : topology.services)
        known += (known.empty() ? "" : ", ") + s.name;
      throw std::invalid_argument("no service named " + quote(name) + " (the file has: " + known +
                                  ")");
    }
  }
  Topology selected;
  selected.schedule = topology.schedule;
  selected.audit = topology.audit;
  for (const auto& s : topology.services) {
    if (std::find(names.begin(), names.end(), s.name) != names.end()) {
      selected.services.push_back(s);
    }
  }
  return selected;
}

const char* to_string(QueueType type) {
  return type == QueueType::quorum ? "quorum" : "classic";
}

const char* to_string(ExchangeType type) {
  switch (type) {
    case ExchangeType::direct:
      return "direct";
    case ExchangeType::topic:
      return "topic";
    case ExchangeType::fanout:
      return "fanout";
    case ExchangeType::headers:
      return "headers";
  }
  return "direct";
}

const char* to_string(RetryMode mode) {
  switch (mode) {
    case RetryMode::reject:
      return "reject";
    case RetryMode::republish:
      return "republish";
    case RetryMode::in_queue:
      return "in_queue";
  }
  return "reject";
}

std::pair<unsigned, unsigned> broker_needed(const Service& service) {
  if (service.retry.mode == RetryMode::in_queue) return {4, 3};
  return {0, 0};
}

const char* to_string(HeadersMatch match) {
  return match == HeadersMatch::any ? "any" : "all";
}

const std::string& input_queue_name(const Service& service) {
  return service.queue.empty() ? service.name : service.queue;
}

std::string wait_exchange_name(std::string_view service_name) {
  return std::string(service_name) + ".wait";
}

std::string wait_queue_name(std::string_view service_name, std::chrono::milliseconds delay) {
  return std::string(service_name) + ".wait." + duration_label(delay);
}

std::string parking_exchange_name(std::string_view service_name) {
  return std::string(service_name) + ".parking";
}

std::string parking_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".parking";
}

std::string migration_record_name(std::string_view service_name) {
  return std::string(service_name) + ".migration";
}

std::string migration_settling_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".migration.settling";
}

std::string migration_copied_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".migration.copied";
}

namespace {
constexpr std::string_view holding_suffix = ".migrating";
}  // namespace

std::string holding_queue_name(std::string_view queue) {
  return std::string(queue).append(holding_suffix);
}

bool is_holding_queue_of(std::string_view name, std::string_view queue) {
  return name.size() == queue.size() + holding_suffix.size() &&
         name.substr(0, queue.size()) == queue && name.substr(queue.size()) == holding_suffix;
}

std::string breaker_exchange_name(std::string_view service_name) {
  return std::string(service_name) + ".breaker";
}

std::string breaker_state_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".breaker.state";
}

std::string breaker_token_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".breaker.token";
}

std::string breaker_instances_queue_name(std::string_view service_name) {
  return std::string(service_name) + ".breaker.instances";
}

std::string audit_stream_name() {
  return "retryloop.audit";
}

std::vector<std::chrono::milliseconds> wait_delays(const Service& service) {
  std::vector<std::chrono::milliseconds> out;
  if (service.retry.mode == RetryMode::in_queue) return out;  // the input queue waits itself
  for (auto delay : service.retry.delays) {
    if (std::find(out.begin(), out.end(), delay) == out.end()) out.push_back(delay);
  }
  return out;
}

std::chrono::milliseconds delay_after_attempt(const Service& service, int attempt) {
  const auto& delays = service.retry.delays;
  if (delays.empty()) return std::chrono::milliseconds(0);
  if (service.retry.mode == RetryMode::reject) return delays.front();
  if (service.retry.mode == RetryMode::in_queue) {
    const auto step = delays.front() * std::max(attempt, 1);
    return delays.size() > 1 ? std::min(step, delays[1]) : delays.front();
  }
  size_t index = attempt < 1 ? 0 : static_cast<size_t>(attempt - 1);
  return delays[std::min(index, delays.size() - 1)];
}

std::string wait_routing_key(const Service& service, int attempt) {
  return duration_label(delay_after_attempt(service, attempt));
}

}  // namespace retryloop::topology
