// retryloop topology plan|apply|verify|export|delete: output and exit codes only; the work is
// done by retryloop::topology.

#include "topology_command.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "migrate_command.hpp"
#include "retryloop/management/management.hpp"
#include "retryloop/topology/declarer.hpp"
#include "retryloop/topology/definitions.hpp"
#include "retryloop/topology/delay_levels.hpp"
#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology.hpp"

namespace retryloop::cli {

namespace {

using topology::Action;
using topology::ActionKind;
using topology::ActionResult;
using topology::Outcome;
using topology::Report;

struct TopologyArgs {
  std::string file;
  std::vector<std::string> services;
  bool json = false;
  ConnectionArgs connection;
  std::string vhost;
  bool yes = false;
  bool force = false;
  bool exists_only = false;
  /// verify: the management API to ask for quorum queues' members (--management).
  std::string management;
};

std::string service_names(const topology::Topology& t) {
  std::vector<std::string> names;
  for (const auto& s : t.services)
    names.push_back(s.name);
  return plural(names.size(), "service") + " (" + join(names) + ")";
}

// ---- describing actions ----

struct Columns {
  std::string kind;
  std::string object;
  std::string detail;
};

std::string binding_detail(const Action& a) {
  if (a.exchange_type == "fanout") return "";
  if (a.exchange_type == "headers") {
    std::string match;
    std::vector<std::string> headers;
    for (const auto& entry : a.arguments) {
      if (entry.name == "x-match") {
        match = topology::format_value(entry.value);
      } else {
        headers.push_back(entry.name + "=" + topology::format_value(entry.value));
      }
    }
    return "match " + match + ": " + join(headers);
  }
  return "key " + (a.routing_key.empty() ? std::string("\"\"") : a.routing_key);
}

Columns columns(const Action& a) {
  switch (a.kind) {
    case ActionKind::declare_exchange:
    case ActionKind::check_exchange:
    case ActionKind::delete_exchange:
      return {"exchange", a.name, ""};
    case ActionKind::declare_queue:
    case ActionKind::check_queue:
    case ActionKind::delete_queue:
      return {"queue", a.name, ""};
    case ActionKind::bind_queue:
      return {"binding", a.exchange + " -> " + a.name, binding_detail(a)};
    case ActionKind::bind_exchange:
      return {"binding", a.exchange + " -> exchange " + a.name, binding_detail(a)};
  }
  return {"", a.name, ""};
}

std::string argument_text(const amqp::FieldEntry& entry) {
  std::string value = topology::format_value(entry.value);
  if (entry.name == "x-message-ttl") {
    if (auto ms = entry.value.as_int64()) {
      value += " (" + topology::duration_label(std::chrono::milliseconds(*ms)) + ")";
    }
  } else if (entry.name == "x-dead-letter-exchange" && value == "\"\"") {
    value += " (the default exchange)";
  }
  return entry.name + " = " + value;
}

std::string shared_note(const Action& a) {
  if (a.services.size() < 2) return "";
  return "shared by " + join(a.services);
}

// ---- plan ----

std::string service_summary(const topology::Service& s) {
  std::vector<std::string> delays;
  for (auto d : s.retry.delays)
    delays.push_back(topology::duration_label(d));
  std::string text = s.name + ": queue " + topology::input_queue_name(s) + " (" +
                     topology::to_string(s.queue_type) + "), " + topology::to_string(s.retry.mode) +
                     " mode, ";
  if (s.retry.backoff) {
    const auto& b = *s.retry.backoff;
    char factor[64];
    std::snprintf(factor, sizeof factor, "x%g, jitter %g", b.multiplier, b.jitter);
    text += "backoff " + topology::duration_label(b.initial) + " to " +
            topology::duration_label(b.max) + " (" + factor + ")";
  } else {
    text += (delays.size() == 1 ? "delay " : "delays ") + join(delays) +
            (delays.size() > 1 ? " (the last repeats)" : "");
  }
  text += ", at most " + plural(static_cast<size_t>(s.retry.max_attempts), "attempt");
  if (s.retry.max_retry_duration) {
    text +=
        " or " + topology::duration_label(*s.retry.max_retry_duration) + " after the first failure";
  }
  if (s.retry.delay_levels) {
    text += ", delay levels of " + topology::duration_label(s.retry.delay_levels->base) + " (" +
            plural(static_cast<size_t>(s.retry.delay_levels->levels), "level") + ", at most " +
            topology::duration_label(topology::longest_level_delay(s)) + ")";
  }
  if (s.queue_type == topology::QueueType::quorum) {
    text += ", parked after " +
            plural(static_cast<size_t>(s.delivery_limit.value_or(topology::default_delivery_limit)),
                   "unsettled delivery", "unsettled deliveries") +
            " (delivery_limit)";
  }
  return text;
}

/// {"orders": {"consecutive_unavailable": 5, ...}}: each service's breaker.
nlohmann::json outage_by_service(const topology::Topology& t) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& s : t.services)
    out[s.name] = topology::outage_json(s.outage);
  return out;
}

void print_plan(const std::string& file, const topology::Topology& t, const topology::Plan& plan) {
  std::cout << file << ": " << service_names(t) << ", " << plural(plan.actions.size(), "step")
            << ". Nothing is sent to a broker.\n";
  std::map<std::string, const topology::Service*> by_name;
  for (const auto& s : t.services)
    by_name.emplace(s.name, &s);
  std::string current;
  Table table;
  size_t step = 0;
  for (const auto& a : plan.actions) {
    ++step;
    // The vhost's objects (the schedule's, the audit stream) belong to no service.
    const std::string owner = a.services.empty() ? std::string() : a.services.front();
    if (owner != current) {
      current = owner;
      auto service = by_name.find(owner);
      if (service != by_name.end()) {
        table.add_line("");
        table.add_line(service_summary(*service->second));
        table.add_line("  " + topology::describe_outage(service->second->outage));
      }
    }
    Columns c = columns(a);
    std::string detail;
    switch (a.kind) {
      case ActionKind::declare_exchange:
        detail = a.exchange_type + ", durable";
        break;
      case ActionKind::check_exchange:
        detail = a.exchange_type + ", not declared: must exist already (\"declare\": false)";
        break;
      case ActionKind::declare_queue:
        if (const amqp::FieldValue* type = a.arguments.find("x-queue-type")) {
          detail = std::string(type->as_string().value_or("?")) + ", durable";
        } else {
          detail = "classic, durable";
        }
        break;
      case ActionKind::check_queue:
        detail = "not declared: must exist already (it receives scheduled messages)";
        break;
      case ActionKind::bind_queue:
      case ActionKind::bind_exchange:
        detail = c.detail;
        break;
      default:
        break;
    }
    std::string note = shared_note(a);
    if (!note.empty()) detail += "; " + note;
    table.add({std::to_string(step), c.kind, c.object, detail});
    if (a.kind != ActionKind::bind_queue && a.kind != ActionKind::bind_exchange) {
      for (const auto& entry : a.arguments)
        table.add({"", "", "", argument_text(entry)});
    }
  }
  table.print(std::cout, "  ");
}

int run_plan(const TopologyArgs& args) {
  auto t = load_topology_or_fail(args.file, args.services);
  auto plan = topology::make_plan(t);
  if (args.json) {
    nlohmann::json out = topology::to_json(plan);
    out["file"] = args.file;
    std::vector<std::string> names;
    for (const auto& s : t.services)
      names.push_back(s.name);
    out["services"] = names;
    out["outage"] = outage_by_service(t);
    std::cout << out.dump(2) << "\n";
  } else {
    print_plan(args.file, t, plan);
  }
  return exit_ok;
}

// ---- reports (apply, verify, delete) ----

constexpr uint16_t access_refused = 403;

/// Objects that exist but whose arguments the user may not compare (verify without configure
/// permission).
size_t refused_comparisons(const Report& report) {
  return static_cast<size_t>(
      std::count_if(report.results.begin(), report.results.end(), [](const ActionResult& r) {
        return r.outcome == Outcome::failed && r.exists.value_or(false) &&
               r.error.reply_code == access_refused;
      }));
}

std::string outcome_word(Outcome o) {
  switch (o) {
    case Outcome::matches:
      return "ok";
    case Outcome::not_checked:
      return "unchecked";
    case Outcome::not_run:
      return "not run";
    case Outcome::would_delete:
      return "would delete";
    case Outcome::not_empty:
      return "not empty";
    case Outcome::in_use:
      return "in use";
    default:
      return topology::to_string(o);
  }
}

std::string queue_counts(const ActionResult& r, bool with_consumers) {
  if (!r.messages) return "";
  std::string text = plural(*r.messages, "message");
  if (with_consumers && r.consumers) text += ", " + plural(*r.consumers, "consumer");
  return text;
}

std::string result_note(const ActionResult& r, bool counts) {
  switch (r.outcome) {
    case Outcome::drifted:
      if (r.drift) {
        return r.drift->argument + ": the file wants " + r.drift->wanted + ", the broker has " +
               r.drift->actual;
      }
      return r.error.reply_text;
    case Outcome::failed:
      if (r.exists.value_or(false) && r.error.reply_code == access_refused &&
          (r.action.kind == ActionKind::declare_queue ||
           r.action.kind == ActionKind::declare_exchange)) {
        return "exists; comparing its arguments was refused (403: it takes configure permission)";
      }
      if (r.error.reply_code == access_refused && !r.error.needed_permission().empty()) {
        return r.error.reply_text + "; " + r.error.needed_permission() + " is needed";
      }
      return r.error.reply_code != 0 ? r.error.reply_text : r.error.message();
    case Outcome::exists:
      if (r.action.kind == ActionKind::check_queue) {
        return "declared elsewhere; receives scheduled messages";
      }
      if (r.action.kind == ActionKind::check_exchange) {
        std::string shared = shared_note(r.action);
        return "declared elsewhere (\"declare\": false), so its type is not compared" +
               (shared.empty() ? "" : "; " + shared);
      }
      break;
    case Outcome::missing:
      if (r.action.kind == ActionKind::check_queue) {
        return "not found; a scheduled queue that no service of the file declares must be "
               "declared by its owner first";
      }
      if (r.action.kind == ActionKind::check_exchange) {
        return "not found; \"declare\": false means its owner must declare it";
      }
      return "not found";
    case Outcome::not_empty:
    case Outcome::in_use:
    case Outcome::would_delete:
      return queue_counts(r, true);
    case Outcome::deleted:
      if (r.messages.value_or(0) == 0) return "";
      return plural(*r.messages, "message") + " deleted with it";
    default:
      break;
  }
  std::string note = counts ? queue_counts(r, false) : "";
  std::string shared = shared_note(r.action);
  if (!shared.empty()) note += (note.empty() ? "" : "; ") + shared;
  for (const auto& missing : r.defaults_missing) {
    note += (note.empty() ? "" : "; ") + std::string("declared without ") + missing.argument +
            " (new ones get " + missing.wanted + ")";
  }
  if (r.older_form) {
    note += (note.empty() ? "" : "; ") +
            std::string("older form: dead-letters straight to the service queue");
  }
  return note;
}

/// A missing input queue whose wait queues exist: what happens to the retries waiting there.
void print_missing_queue_hint(const Report& report) {
  for (const auto& q : report.results) {
    if (q.action.role != topology::Role::input_queue || q.outcome != Outcome::missing) continue;
    bool waiting = false, older = false;
    for (const auto& r : report.results) {
      if (r.action.role != topology::Role::wait_queue || r.action.services != q.action.services) {
        continue;
      }
      waiting = waiting || r.exists.value_or(false);
      older = older || r.older_form;
    }
    if (!waiting) continue;
    std::cout << "Queue " << q.action.name << " is missing but its wait queues exist: ";
    if (older) {
      std::cout << "some are in the older form, so a retry waiting there whose delay ends before "
                   "the queue is back is dropped by the broker (docs/topology.md, \"Older "
                   "queues\"). Run `retryloop topology apply` now.\n";
    } else {
      std::cout << "a retry whose delay ends before the queue is back goes to parking; once "
                   "`retryloop topology apply` has declared the queue again, `retryloop parking "
                   "replay "
                << q.action.services.at(0) << " --reason unrouted` sends it back.\n";
    }
  }
}

/// Wait queues in the form older releases declared: what it risks, and how to move them on.
void print_older_form_hint(const Report& report) {
  std::vector<std::string> names;
  for (const auto& r : report.results) {
    if (r.older_form) names.push_back(r.action.name);
  }
  if (names.empty()) return;
  std::cout << "The wait " << (names.size() == 1 ? "queue " : "queues ") << join(names)
            << (names.size() == 1 ? " dead-letters" : " dead-letter")
            << " through the default exchange straight to the service queue, as older releases "
               "declared them: a retry whose service queue is gone when its delay ends is "
               "dropped, where the current form parks it. docs/topology.md, \"Older queues\", "
               "shows how to move a wait queue to the current form without losing what it "
               "holds.\n";
}

/// What an object declared without retryloop's default arguments means, and how to move it on.
void print_defaults_hint(const Report& report) {
  bool version = false, parking_limit = false, level_limit = false, limit = false;
  for (const auto& r : report.results) {
    for (const auto& missing : r.defaults_missing) {
      if (missing.argument == "x-queue-version") version = true;
      if (missing.argument != "x-delivery-limit") continue;
      if (r.action.role == topology::Role::parking_queue) {
        parking_limit = true;
      } else if (r.action.role == topology::Role::delay_queue &&
                 r.action.arguments.find("x-message-ttl") != nullptr) {
        level_limit = true;
      } else {
        limit = true;
      }
    }
  }
  if (version) {
    std::cout << "Classic queues declared without x-queue-version are version 1 on RabbitMQ 3.x "
                 "unless a policy says otherwise; a policy with \"queue-version\": 2 converts "
                 "them in place (docs/topology.md, \"Older queues\").\n";
  }
  if (parking_limit) {
    std::cout << "A quorum parking queue declared without x-delivery-limit has RabbitMQ 4.x's "
                 "default limit of 20, and every read of a parked message counts toward it: set "
                 "a policy with \"delivery-limit\" (docs/topology.md, \"Older queues\").\n";
  }
  if (level_limit) {
    std::cout << "A quorum delay level declared without x-delivery-limit has RabbitMQ 4.x's "
                 "default limit of 20: a message handed back to it 20 times (by a reader other "
                 "than retryloop) would leave its level early. Set a policy with "
                 "\"delivery-limit\" (docs/topology.md, \"Older queues\").\n";
  }
  if (limit) {
    std::cout << "A quorum queue declared without x-delivery-limit has RabbitMQ 4.x's default "
                 "limit of 20, and none on 3.x (docs/topology.md, \"Older queues\").\n";
  }
}

void print_results(const Report& report, bool counts) {
  Table table;
  for (const auto& r : report.results) {
    if (r.outcome == Outcome::absent && r.action.kind == ActionKind::bind_queue) continue;
    Columns c = columns(r.action);
    std::string note = result_note(r, counts);
    const bool binding =
        r.action.kind == ActionKind::bind_queue || r.action.kind == ActionKind::bind_exchange;
    if (binding && !c.detail.empty()) {
      note = c.detail + (note.empty() ? "" : "; " + note);
    }
    table.add({outcome_word(r.outcome), c.kind, c.object, note});
  }
  table.print(std::cout, "  ");
}

nlohmann::json report_json(const std::string& command, const std::string& file,
                           const client::Uri& uri, const Report& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& r : report.results) {
    nlohmann::json j = topology::to_json(topology::Plan{{r.action}})["actions"][0];
    j["outcome"] = topology::to_string(r.outcome);
    if (r.drift) {
      j["drift"] = {{"argument", r.drift->argument},
                    {"wanted", r.drift->wanted},
                    {"actual", r.drift->actual}};
    }
    if (r.error) {
      j["error"] = r.error.reply_code != 0 ? r.error.reply_text : r.error.message();
      if (r.error.reply_code != 0) j["reply_code"] = r.error.reply_code;
    }
    if (r.messages) j["messages"] = *r.messages;
    if (r.consumers) j["consumers"] = *r.consumers;
    if (r.older_form) j["older_form"] = true;
    for (const auto& missing : r.defaults_missing) {
      j["defaults_missing"].push_back(
          {{"argument", missing.argument}, {"new_objects_get", missing.wanted}});
    }
    results.push_back(std::move(j));
  }
  nlohmann::json out = {{"command", command},
                        {"file", file},
                        {"broker", uri.redacted()},
                        {"ok", report.ok()},
                        {"results", std::move(results)}};
  if (report.connection_error) out["connection_error"] = report.connection_error.message();
  return out;
}

/// The exit code of a finished report; prints the connection failure, if any.
int report_exit_code(const Report& report, const client::Uri& uri) {
  if (report.connection_error) {
    std::cerr << "retryloop: the connection to " << uri.redacted()
              << " failed midway: " << report.connection_error.message() << "\n";
    return exit_connection;
  }
  return report.ok() ? exit_ok : exit_broker_refused;
}

// ---- quorum members (verify --management) ----

std::string members_note(const management::MembersCheck& check) {
  if (!check.found) return check.error.message;
  const management::QueueMembers& m = *check.found;
  std::string note = std::to_string(m.online.size()) + " of " + std::to_string(m.members.size()) +
                     " members online";
  std::vector<std::string> offline = check.offline();
  if (!offline.empty()) note += " (offline: " + join(offline) + ")";
  if (!m.leader.empty()) {
    const bool leader_offline =
        std::find(offline.begin(), offline.end(), m.leader) != offline.end();
    note += ", leader " + m.leader + (leader_offline ? " (offline: not yet replaced)" : "");
  }
  if (check.wanted) {
    note += "; the file asks for " + std::to_string(*check.wanted);
    if (m.members.size() < static_cast<size_t>(*check.wanted)) {
      note += ": add members with rabbitmq-queues grow or add_member";
    }
  }
  return note;
}

management::ApiUrl parse_management_url(const std::string& url, const client::Uri& uri) {
  try {
    return management::parse_api_url(url, uri.user, uri.password);
  } catch (const std::exception& e) {
    throw Failure(exit_usage, std::string("invalid management URL (--management or "
                                          "RETRYLOOP_MANAGEMENT_URL): ") +
                                  e.what());
  }
}

/// Asks the management API about the plan's quorum queues; false when one has fewer members
/// online than it should, or could not be asked. With `json`, adds a row to it per queue instead
/// of printing.
bool check_quorum_members(const management::ApiUrl& url, const client::Uri& uri,
                          const topology::Plan& plan, nlohmann::json* json) {
  management::ManagementClient api(url);
  auto checks = management::check_members(api, plan, uri.vhost);
  bool ok = true;
  Table table;
  for (const auto& check : checks) {
    ok = ok && check.ok();
    if (json != nullptr) {
      nlohmann::json j = {{"queue", check.queue}, {"ok", check.ok()}};
      if (check.wanted) j["wanted"] = *check.wanted;
      if (check.found) {
        j["members"] = check.found->members;
        j["online"] = check.found->online;
        j["leader"] = check.found->leader;
      } else {
        j["error"] = check.error.message;
      }
      json->push_back(std::move(j));
    } else {
      table.add({check.ok()    ? "ok"
                 : check.found ? "too few"
                               : "failed",
                 "members", check.queue, members_note(check)});
    }
  }
  if (json == nullptr && !checks.empty()) {
    std::cout << "Quorum members, from " << api.url().redacted() << ":\n";
    table.print(std::cout, "  ");
    std::cout << "\n";
  }
  return ok;
}

std::string counted(const Report& report, Outcome o, const std::string& text) {
  size_t n = report.count(o);
  return n == 0 ? std::string() : std::to_string(n) + " " + text;
}

std::string summary(const Report& report,
                    const std::vector<std::pair<Outcome, std::string>>& parts) {
  std::vector<std::string> items;
  for (const auto& [o, text] : parts) {
    std::string item = counted(report, o, text);
    if (!item.empty()) items.push_back(item);
  }
  return join(items);
}

constexpr const char* drift_hint =
    "retryloop: RabbitMQ cannot change the arguments of an existing queue or exchange; `retryloop "
    "topology migrate FILE --dry-run` shows how migrate changes the queues with every message "
    "kept (docs/migrate.md)\n";

int run_report(const TopologyArgs& args, const std::string& command) {
  auto t = load_topology_or_fail(args.file, args.services);
  auto uri = parse_url(args.connection);
  auto plan = topology::make_plan(t);
  const bool members = command == "verify" && !args.management.empty();
  const management::ApiUrl api =
      members ? parse_management_url(args.management, uri) : management::ApiUrl{};
  topology::VerifyOptions verify_options;
  verify_options.compare_arguments = !args.exists_only;
  auto runner = [&command, verify_options](const std::shared_ptr<client::Connection>& connection,
                                           const topology::Plan& p,
                                           topology::ReportCallback callback) {
    if (command == "apply") return topology::apply(connection, p, std::move(callback));
    return topology::verify(connection, p, std::move(callback), verify_options);
  };
  if (!args.json) {
    std::cout << (command == "apply" ? "Applying " : "Verifying ") << args.file
              << (command == "apply" ? " to " : " against ") << uri.redacted() << ": "
              << service_names(t) << "\n";
    // The breaker lives in the consumers, not on the broker: verify shows what they will use.
    if (command == "verify") {
      for (const auto& s : t.services)
        std::cout << "  " << s.name << " " << topology::describe_outage(s.outage) << "\n";
    }
    std::cout << "\n";
  }
  Report result;
  // verify: the services' unfinished migrations, read once the report is in.
  std::map<std::string, migrate::Record> migrations;
  int code = with_connection(uri, [&](const auto& connection, auto done) {
    client::Error immediate = runner(connection, plan, [&, connection, done](const Report& report) {
      result = report;
      if (command != "verify" || report.connection_error) return done(exit_ok);
      std::vector<std::string> names;
      for (const auto& s : t.services)
        names.push_back(s.name);
      read_unfinished_migrations(connection, names,
                                 [&, done](std::map<std::string, migrate::Record> found) {
                                   migrations = std::move(found);
                                   done(exit_ok);
                                 });
    });
    if (immediate) {
      result.connection_error = immediate;
      done(exit_connection);
    }
  });
  if (code != exit_ok) return code;
  if (args.json) {
    nlohmann::json out = report_json(command, args.file, uri, result);
    if (command == "verify") {
      out["outage"] = outage_by_service(t);
      out["migrating"] = nlohmann::json::object();
      for (const auto& [service, record] : migrations)
        out["migrating"][service] = unfinished_json(record);
    }
    if (members) {
      out["members"] = nlohmann::json::array();
      if (!check_quorum_members(api, uri, plan, &out["members"])) out["ok"] = false;
    }
    std::cout << out.dump(2) << "\n";
    code = report_exit_code(result, uri);
    return code == exit_ok && out["ok"] == false ? exit_broker_refused : code;
  }
  print_results(result, command == "verify");
  std::cout << "\n";
  const bool members_ok = !members || check_quorum_members(api, uri, plan, nullptr);
  print_defaults_hint(result);
  print_older_form_hint(result);
  print_missing_queue_hint(result);
  if (command == "apply") {
    std::string text = summary(result, {{Outcome::created, "created"},
                                        {Outcome::existed, "already existed"},
                                        {Outcome::bound, "bindings in place"},
                                        {Outcome::drifted, "drifted"},
                                        {Outcome::missing, "missing"},
                                        {Outcome::failed, "refused"},
                                        {Outcome::not_run, "not run"}});
    std::cout << "Done: " << text << ".\n";
    if (!result.ok() && !result.connection_error) {
      std::cerr << "retryloop: the broker does not match " << args.file
                << " (see above); nothing was deleted or changed to fix it\n";
      if (result.count(Outcome::drifted) > 0) std::cerr << drift_hint;
    }
  } else {
    std::string text = summary(result, {{Outcome::matches, "match"},
                                        {Outcome::exists, "exist"},
                                        {Outcome::drifted, "drifted"},
                                        {Outcome::missing, "missing"},
                                        {Outcome::failed, "failed"},
                                        {Outcome::not_run, "not run"}});
    std::cout << "Result: " << text << ".\n";
    size_t unchecked = result.count(Outcome::not_checked);
    if (unchecked > 0) {
      std::cout << plural(unchecked, "binding was", "bindings were")
                << " not checked: AMQP 0-9-1 cannot check a binding without creating it.\n"
                << "Run `retryloop topology apply` to make sure they exist (it is idempotent).\n";
    }
    if (args.exists_only) {
      std::cout << "Arguments were not compared (--exists-only): drift is not detected.\n";
    }
    for (const auto& [service, record] : migrations)
      std::cerr << "retryloop: service " << service
                << " is migrating: " << unfinished_text(record, args.file) << "\n";
    if (!members_ok) {
      std::cerr << "retryloop: quorum queues have fewer members online than " << args.file
                << " asks for, or their members could not be read (see above)\n";
    }
    if (!result.ok() && !result.connection_error) {
      std::cerr << "retryloop: the broker does not match " << args.file << " (see above)\n";
      if (result.count(Outcome::drifted) > 0) std::cerr << drift_hint;
      if (refused_comparisons(result) > 0) {
        std::cerr << "retryloop: verify compares arguments by declaring each object with the "
                     "file's arguments, which needs configure permission; connect as a user "
                     "that has it, or add --exists-only to check only that the objects exist\n";
      }
    }
  }
  code = report_exit_code(result, uri);
  return code == exit_ok && !members_ok ? exit_broker_refused : code;
}

// ---- export ----

int run_export(const TopologyArgs& args) {
  auto t = load_topology_or_fail(args.file, args.services);
  std::string vhost = args.vhost;
  if (vhost.empty()) vhost = parse_url(args.connection).vhost;
  auto definitions = topology::export_definitions(topology::make_plan(t), vhost);
  std::cout << definitions.dump(2) << "\n";
  return exit_ok;
}

// ---- delete ----

int run_delete(const TopologyArgs& args) {
  auto t = load_topology_or_fail(args.file, args.services);
  auto uri = parse_url(args.connection);
  auto plan = topology::make_delete_plan(t);
  topology::DeleteOptions options;
  options.execute = args.yes;
  options.force = args.force;
  Report result;
  int code = with_connection(uri, [&](const auto& connection, auto done) {
    client::Error immediate =
        topology::remove(connection, plan, options, [&result, done](const Report& report) {
          result = report;
          done(exit_ok);
        });
    if (immediate) {
      result.connection_error = immediate;
      done(exit_connection);
    }
  });
  if (code != exit_ok) return code;
  if (args.json) {
    std::cout << report_json("delete", args.file, uri, result).dump(2) << "\n";
    return report_exit_code(result, uri);
  }
  std::cout << (args.yes ? "Deleting " : "Checking what deleting ") << service_names(t)
            << (args.yes ? " from " : " would remove from ") << uri.redacted() << "\n\n";
  print_results(result, true);
  std::cout << "\n";
  std::vector<std::string> inputs;
  for (const auto& s : t.services) {
    if (std::find(inputs.begin(), inputs.end(), s.input.exchange) == inputs.end()) {
      inputs.push_back(s.input.exchange);
    }
  }
  std::string kept_note = "Input exchanges are never deleted (" + join(inputs) +
                          "): publishers and other services may use them.\n";
  std::vector<std::string> level_sets;
  for (const auto& s : t.services) {
    const std::string set = topology::delay_set_name(s);
    if (!set.empty() && std::find(level_sets.begin(), level_sets.end(), set) == level_sets.end()) {
      level_sets.push_back(set);
    }
  }
  if (!level_sets.empty()) {
    kept_note += "Delay levels are never deleted (" + join(level_sets, ".*, ") +
                 ".*): other services of the vhost may share them.\n";
  }
  size_t refused = result.count(Outcome::not_empty) + result.count(Outcome::in_use);
  if (result.connection_error) return report_exit_code(result, uri);
  if (refused > 0) {
    std::vector<std::string> reasons;
    for (const auto& r : result.results) {
      if (r.outcome == Outcome::not_empty) {
        reasons.push_back(r.action.name + " holds " + plural(r.messages.value_or(0), "message"));
      } else if (r.outcome == Outcome::in_use) {
        reasons.push_back(r.action.name + " has " + plural(r.consumers.value_or(0), "consumer"));
      }
    }
    std::cout << (result.count(Outcome::deleted) > 0 ? "Stopped" : "Nothing was deleted") << ": "
              << join(reasons, "; ") << ".\n";
    std::cerr << "retryloop: " << (args.yes ? "refusing" : "--yes would refuse")
              << " to delete queues that hold messages or have consumers; move or replay the "
                 "messages first, stop the consumers, or add --force to delete them anyway (the "
                 "messages are lost)\n";
    return exit_broker_refused;
  }
  if (!result.ok()) {
    std::cout << "Stopped: "
              << summary(result, {{Outcome::deleted, "deleted"},
                                  {Outcome::failed, "refused"},
                                  {Outcome::kept, "kept"}})
              << ".\n";
    return report_exit_code(result, uri);
  }
  if (!args.yes) {
    size_t n = result.count(Outcome::would_delete);
    if (n == 0) {
      std::cout << "Nothing to delete: none of these objects exist.\n";
    } else {
      std::cout << "Nothing was deleted. Run again with --yes to delete these "
                << plural(n, "object") << ".\n";
    }
  } else {
    std::cout << "Done: "
              << summary(result,
                         {{Outcome::deleted, "deleted"}, {Outcome::absent, "were already absent"}})
              << ".\n";
  }
  std::cout << kept_note;
  return exit_ok;
}

// ---- command line ----

/// Adds a subcommand with its own arguments (CLI11 reads RETRYLOOP_URL for every subcommand, so
/// they must not share the variable the URL goes to).
std::pair<CLI::App*, std::shared_ptr<TopologyArgs>> add_command(CLI::App& group,
                                                                const std::string& name,
                                                                const std::string& summary,
                                                                const std::string& details) {
  auto args = std::make_shared<TopologyArgs>();
  CLI::App* command = group.add_subcommand(name, summary);
  command->footer(wrap(details) + "\n\n" + exit_codes_help);
  command->add_option("FILE", args->file, "Topology file (JSON; see docs/topology.md)")
      ->required()
      ->type_name("");
  command
      ->add_option("--service", args->services,
                   "Only this service (repeat for several); default: every service in FILE")
      ->type_name("NAME")
      ->allow_extra_args(false);
  add_connection_option(*command, args->connection);
  return {command, args};
}

}  // namespace

void add_topology_commands(CLI::App& app, int& exit_code) {
  CLI::App* group = app.add_subcommand(
      "topology", "Set up and check each service's queues and exchanges from a topology file");
  describe_command(*group);
  group->require_subcommand(1);

  auto [plan, plan_args] = add_command(
      *group, "plan", "Print what apply would declare, with every argument (no broker needed)",
      "Prints the ordered list of exchanges, queues and bindings apply declares, with their "
      "arguments. Sends nothing to a broker (--url is accepted and ignored).");
  plan->add_flag("--json", plan_args->json, "Print the plan as JSON");
  plan->callback([args = plan_args, &exit_code] { exit_code = run_plan(*args); });

  auto [apply, apply_args] = add_command(
      *group, "apply", "Declare everything in FILE (idempotent) and report what existed",
      "Declares every exchange, queue and binding of FILE and reports which were created and which "
      "already existed. An object that exists with other arguments is reported (with the "
      "argument, the value the file wants and the value the broker has) and left alone: apply "
      "never deletes or redeclares anything. It then goes on with the rest and exits 3.");
  apply->add_flag("--json", apply_args->json, "Print the report as JSON");
  apply->callback([args = apply_args, &exit_code] { exit_code = run_report(*args, "apply"); });

  auto [verify, verify_args] = add_command(
      *group, "verify", "Check the broker against FILE without creating anything",
      "Reports missing objects and arguments that differ from FILE, and exits 0 only when "
      "everything matches. Each object is looked up with a passive declare; one that exists is "
      "then declared with FILE's arguments, which the broker refuses when they differ and "
      "otherwise leaves alone. That is the only way AMQP 0-9-1 can compare arguments: it needs "
      "configure permission, and an object someone deletes in that instant is created again. "
      "--exists-only avoids both and does not see drift. Bindings cannot be checked over AMQP "
      "0-9-1 without creating them, so they are listed as unchecked.");
  verify->add_flag("--json", verify_args->json, "Print the report as JSON");
  verify->add_flag("--exists-only", verify_args->exists_only,
                   "Only check that the objects exist (passive declares): never creates anything "
                   "and needs no configure permission, but cannot see drifted arguments");
  verify
      ->add_option("--management", verify_args->management,
                   "Also read each quorum queue's members from this management API "
                   "(http://[user:pass@]host:15672/; the user of --url by default) and report a "
                   "queue with fewer members online than the file's \"replicas\" (or than it "
                   "has); also RETRYLOOP_MANAGEMENT_URL")
      ->envname("RETRYLOOP_MANAGEMENT_URL")
      ->type_name("URL");
  verify->callback([args = verify_args, &exit_code] { exit_code = run_report(*args, "verify"); });

  auto [exp, exp_args] = add_command(
      *group, "export", "Print RabbitMQ definitions for rabbitmqctl import_definitions",
      "Prints definitions JSON that `rabbitmqctl import_definitions FILE` accepts and that give "
      "the same objects as apply. The virtual host must exist before the import. No broker is "
      "needed; --url only supplies the default --vhost.");
  exp->add_option("--vhost", exp_args->vhost,
                  "Virtual host the definitions are for; default: the vhost of --url")
      ->type_name("VHOST");
  exp->callback([args = exp_args, &exit_code] { exit_code = run_export(*args); });

  auto [del, del_args] = add_command(
      *group, "delete", "Delete the services' queues and their wait and parking exchanges",
      "Deletes each service's input queue, wait queues, wait exchange, parking queue and parking "
      "exchange; never an input exchange, which publishers and other services may share. Without "
      "--yes it deletes nothing and lists what it would delete. It refuses (exit 3, nothing "
      "deleted) while any of the queues holds messages or has consumers, unless --force.");
  del->add_flag("--yes", del_args->yes, "Really delete");
  del->add_flag("--force", del_args->force,
                "Also delete queues that hold messages or have consumers (the messages are lost)");
  del->add_flag("--json", del_args->json, "Print the report as JSON");
  del->callback([args = del_args, &exit_code] { exit_code = run_delete(*args); });
}

}  // namespace retryloop::cli
