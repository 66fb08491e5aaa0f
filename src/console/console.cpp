#include "retryloop/console/console.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <uv.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "page.hpp"
#include "retryloop/client/loop_bridge.hpp"
#include "retryloop/console/detail/api.hpp"
#include "retryloop/console/detail/audit_trail.hpp"
#include "retryloop/console/detail/core.hpp"
#include "retryloop/http/bounded_server.hpp"
#include "retryloop/parking/parked_json.hpp"
#include "retryloop/process/stop_signals.hpp"

namespace retryloop::console {

namespace {

using client::LoopBridge;
using detail::Core;
using detail::Job;
using detail::Reply;
using namespace std::chrono_literals;

/// How long a request waits for the loop thread; the loop answers in microseconds unless it is
/// stuck, and every request only reads or queues.
constexpr auto kLoopTimeout = 10s;

/// Every answer forbids what the page never needs: scripts, styles and connections from
/// elsewhere, inline scripts and event handlers, being framed, sending the address on.
const httplib::Headers kSecurityHeaders = {
    {"Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
     "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Referrer-Policy", "no-referrer"},
    {"Cache-Control", "no-store"},
};

void send(httplib::Response& response, const Reply& reply) {
  response.status = reply.status;
  response.set_content(reply.body, reply.content_type.c_str());
}

void send_error(httplib::Response& response, int status, const std::string& message) {
  send(response,
       Reply{status, nlohmann::json({{"error", message}})
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
}

void answer(LoopBridge& bridge, httplib::Response& response, std::function<Reply()> task) {
  std::optional<Reply> reply;
  const bool ran = bridge.call(
      [&reply, &task] {
        try {
          reply = task();
        } catch (...) {
          reply = Reply{500, R"({"error": "internal error"})"};
        }
      },
      kLoopTimeout);
  if (!ran || !reply) {
    return send_error(response, 503,
                      "the console is stopping or busy; nothing was done, try again");
  }
  send(response, *reply);
}

std::optional<nlohmann::json> json_body(const httplib::Request& request,
                                        httplib::Response& response) {
  if (request.body.empty()) {
    send_error(response, 400,
               "the request has no body: send a JSON object, with Content-Length or "
               "Transfer-Encoding: chunked");
    return std::nullopt;
  }
  if (!parking::nests_at_most(request.body, detail::max_request_depth)) {
    send_error(response, 400,
               "the request body nests deeper than " + std::to_string(detail::max_request_depth) +
                   " levels");
    return std::nullopt;
  }
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(request.body);
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e309'": the text after the tag.
    std::string what = e.what();
    what = what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2);
    if (what.size() > 200) what = what.substr(0, 197) + "...";
    send_error(response, 400, "the request body is not valid JSON: " + what);
    return std::nullopt;
  }
  if (!body.is_object()) {
    send_error(response, 400, "the request body must be a JSON object");
    return std::nullopt;
  }
  return body;
}

std::optional<uint64_t> number_parameter(const httplib::Request& request, const char* name) {
  if (!request.has_param(name)) return std::nullopt;
  const std::string text = request.get_param_value(name);
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoull(text);
}

/// The token a request carries: the X-Retryloop-Token header, else a bearer token (Prometheus
/// sends a scrape's token as `Authorization: Bearer TOKEN`).
std::string request_token(const httplib::Request& request) {
  std::string token = request.get_header_value(detail::token_header);
  const std::string authorization = request.get_header_value("Authorization");
  if (token.empty() && authorization.rfind("Bearer ", 0) == 0) token = authorization.substr(7);
  return token;
}

/// The console's services by name, the first one the default.
struct Cores {
  std::vector<std::shared_ptr<Core>> list;

  /// The core the request's `service` parameter names (the first when it names none), or nullptr
  /// after answering 404.
  std::shared_ptr<Core> of(const httplib::Request& request, httplib::Response& response) const {
    if (!request.has_param("service")) return list.front();
    const std::string name = request.get_param_value("service");
    std::string known;
    for (const auto& core : list) {
      if (core->service().name == name) return core;
      known += (known.empty() ? "" : ", ") + core->service().name;
    }
    send_error(response, 404,
               "this console serves no service " + name + " (it serves " + known + ")");
    return nullptr;
  }
};

/// Prometheus text from several sources as one exposition: each family's `# HELP` and `# TYPE`
/// once, followed by the samples of every source (a family's lines must stay together).
std::string merge_prometheus(const std::vector<std::string>& texts) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::string, std::string>> families;  // name: head, samples
  for (const auto& text : texts) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::string name;
      const bool comment = line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0;
      if (comment) {
        name = line.substr(7, line.find(' ', 7) - 7);
      } else {
        name = line.substr(0, line.find_first_of("{ "));
      }
      auto [it, added] = families.try_emplace(name);
      if (added) order.push_back(name);
      if (!comment) {
        it->second.second += line + "\n";
      } else if (it->second.first.find(line.substr(0, 7)) == std::string::npos) {
        it->second.first += line + "\n";
      }
    }
  }
  std::string out;
  for (const auto& name : order)
    out += families[name].first + families[name].second;
  return out;
}

void add_routes(httplib::Server& server, LoopBridge& bridge, const Cores& cores,
                const std::shared_ptr<detail::AuditTrail>& audit, const detail::Access& access) {
  server.set_pre_routing_handler(
      [access](const httplib::Request& request, httplib::Response& response) {
        detail::RequestFacts facts;
        facts.method = request.method;
        facts.path = request.path;
        facts.host = request.get_header_value("Host");
        facts.origin = request.get_header_value("Origin");
        facts.fetch_site = request.get_header_value("Sec-Fetch-Site");
        facts.token = request_token(request);
        facts.content_type = request.get_header_value("Content-Type");
        const detail::Refusal refusal = detail::check_request(facts, access);
        if (refusal.status == 0) return httplib::Server::HandlerResponse::Unhandled;
        send_error(response, refusal.status, refusal.reason);
        return httplib::Server::HandlerResponse::Handled;
      });
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        send_error(response, 500, "internal error");
      });

  auto asset = [](std::string_view body, const char* type) {
    return [body, type](const httplib::Request&, httplib::Response& response) {
      response.set_content(body.data(), body.size(), type);
    };
  };
  server.Get("/", asset(detail::page_html, "text/html; charset=utf-8"));
  server.Get("/app.js", asset(detail::page_script, "text/javascript; charset=utf-8"));
  server.Get("/app.css", asset(detail::page_style, "text/css; charset=utf-8"));

  // A GET answered by one service's core.
  auto read = [&bridge, &cores](std::function<Reply(Core&, const httplib::Request&)> task) {
    return [&bridge, &cores, task](const httplib::Request& request, httplib::Response& response) {
      auto core = cores.of(request, response);
      if (!core) return;
      answer(bridge, response, [core, task, &request] { return task(*core, request); });
    };
  };
  server.Get("/api/state", read([](Core& core, const httplib::Request&) { return core.state(); }));
  server.Get("/api/messages",
             read([](Core& core, const httplib::Request&) { return core.messages(); }));
  server.Get("/api/message", [&bridge, &cores](const httplib::Request& request,
                                               httplib::Response& response) {
    const auto scan = number_parameter(request, "scan");
    const auto index = number_parameter(request, "index");
    if (!scan || !index) return send_error(response, 400, "give scan=N&index=N");
    auto core = cores.of(request, response);
    if (!core) return;
    answer(bridge, response, [core, scan, index] { return core->message(*scan, *index); });
  });
  server.Get("/metrics",
             [&bridge, &cores, audit](const httplib::Request&, httplib::Response& response) {
               answer(bridge, response, [&cores, audit] {
                 std::vector<std::string> texts;
                 Reply reply;
                 for (const auto& core : cores.list) {
                   reply = core->metrics();
                   texts.push_back(reply.body);
                 }
                 reply.body = merge_prometheus(texts) + audit->metrics();
                 return reply;
               });
             });
  server.Get("/api/services",
             [&bridge, &cores](const httplib::Request&, httplib::Response& response) {
               answer(bridge, response, [&cores] {
                 nlohmann::json list = nlohmann::json::array();
                 for (const auto& core : cores.list)
                   list.push_back(core->summary());
                 return Reply{200, nlohmann::json{{"services", std::move(list)}}.dump(
                                       -1, ' ', false, nlohmann::json::error_handler_t::replace)};
               });
             });
  server.Get("/api/audit", [&bridge, audit](const httplib::Request& request,
                                            httplib::Response& response) {
    const size_t limit = std::min<uint64_t>(number_parameter(request, "limit").value_or(200), 1000);
    answer(bridge, response, [audit, limit] {
      return Reply{
          200, audit->json(limit).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
    });
  });
  server.Post("/api/scan",
              [&bridge, &cores](const httplib::Request& request, httplib::Response& response) {
                auto body = json_body(request, response);
                if (!body) return;
                auto core = cores.of(request, response);
                if (!core) return;
                answer(bridge, response, [core, body = std::move(*body)]() mutable {
                  return core->request_scan(std::move(body));
                });
              });
  // Who did it, for the log and the audit trail: the identity's name and the address it came
  // from.
  auto who = [access](const httplib::Request& request) {
    const Identity* identity = detail::identify(access, request_token(request));
    return (identity != nullptr ? identity->name : std::string("?")) + " at " + request.remote_addr;
  };
  // A POST answered by one service's core, told who asks.
  auto act = [&bridge, &cores,
              who](std::function<Reply(Core&, nlohmann::json&&, const std::string&)> task) {
    return [&bridge, &cores, who, task](const httplib::Request& request,
                                        httplib::Response& response) {
      auto body = json_body(request, response);
      if (!body) return;
      auto core = cores.of(request, response);
      if (!core) return;
      answer(bridge, response, [core, task, body = std::move(*body), who = who(request)]() mutable {
        return task(*core, std::move(body), who);
      });
    };
  };
  auto action = [&act](Job::Kind kind) {
    return act([kind](Core& core, nlohmann::json&& body, const std::string& who) {
      return core.request_action(kind, std::move(body), who);
    });
  };
  server.Get("/api/whoami", [access](const httplib::Request& request, httplib::Response& response) {
    const Identity* identity = detail::identify(access, request_token(request));
    nlohmann::json out{{"name", identity != nullptr ? identity->name : ""},
                       {"role", identity != nullptr ? to_string(identity->role) : ""}};
    response.set_content(out.dump(), "application/json");
  });
  server.Post("/api/replay", action(Job::Kind::replay));
  server.Post("/api/purge", action(Job::Kind::purge));
  server.Post("/api/count", action(Job::Kind::count));
  server.Post("/api/edit", act([](Core& core, nlohmann::json&& body, const std::string& who) {
                return core.request_edit(body, who);
              }));
  server.Post("/api/note", act([](Core& core, nlohmann::json&& body, const std::string& who) {
                return core.request_note(body, who);
              }));
  server.Post("/api/stop",
              [&bridge, &cores](const httplib::Request& request, httplib::Response& response) {
                auto core = cores.of(request, response);
                if (!core) return;
                answer(bridge, response, [core] { return core->stop_action(); });
              });
}

/// The text of `path`, read in blocks up to `max_bytes`: a device that never ends (/dev/zero) is
/// refused once past it.
std::string read_capped(const std::string& path, size_t max_bytes, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read the " + what + " " + path);
  std::string text;
  char block[4096];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    text.append(block, size_t(in.gcount()));
    if (text.size() > max_bytes) {
      const bool mebibytes = max_bytes % (1024 * 1024) == 0;
      throw std::invalid_argument(path + " is larger than " +
                                  (mebibytes ? std::to_string(max_bytes >> 20) + " MiB"
                                             : std::to_string(max_bytes >> 10) + " KiB") +
                                  "; is it a " + what + "?");
    }
  }
  if (in.bad()) throw std::invalid_argument("cannot read the " + what + " " + path);
  return text;
}

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

}  // namespace

const char* to_string(Role role) {
  switch (role) {
    case Role::reader:
      return "reader";
    case Role::operator_:
      return "operator";
    case Role::admin:
      return "admin";
  }
  return "?";
}

std::string read_token_file(const std::string& path) {
  return read_capped(path, 4 * 1024, "token file");
}

std::vector<Identity> read_identities(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw std::invalid_argument("the tokens file " + path + " is a directory");
  }
  std::istringstream in(read_capped(path, 1024 * 1024, "tokens file"));
  std::vector<Identity> identities;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number) + ": ";
    std::istringstream words(line);
    std::string name, role, token, extra;
    if (!(words >> name) || name[0] == '#') continue;
    if (!(words >> role >> token) || (words >> extra)) {
      throw std::invalid_argument(where + "give NAME ROLE TOKEN, separated by spaces");
    }
    if (!parking::is_utf8(name)) {
      throw std::invalid_argument(where + "the name is not UTF-8 text");
    }
    Identity identity{name, Role::reader, token};
    if (role == "operator") {
      identity.role = Role::operator_;
    } else if (role == "admin") {
      identity.role = Role::admin;
    } else if (role != "reader") {
      throw std::invalid_argument(where + "the role \"" + role +
                                  "\" is not reader, operator or admin");
    }
    if (token.size() < 16) {
      throw std::invalid_argument(where + "the token of " + name +
                                  " is shorter than 16 characters: anyone could guess it");
    }
    for (const Identity& other : identities) {
      if (other.name == name) throw std::invalid_argument(where + name + " is named twice");
      if (other.token == token) {
        throw std::invalid_argument(where + "the token of " + name + " is also " + other.name +
                                    "'s");
      }
    }
    identities.push_back(std::move(identity));
  }
  if (identities.empty()) throw std::invalid_argument(path + " names nobody");
  return identities;
}

ServeResult serve(const Options& given, const std::function<void(const ServeInfo&)>& on_ready) {
  Options options = given;
  if (options.services.empty()) throw std::invalid_argument("the console needs a service to serve");
  ServeInfo info;
  detail::Access access;
  if (options.identities.empty()) {
    info.generated_token = options.token.empty();
    if (options.token.empty()) options.token = detail::random_token();
    info.token = options.token;
    access.identities = {{"console", Role::admin, options.token}};
  } else {
    access.identities = options.identities;
  }
  if (options.connection.connection_name.empty()) {
    options.connection.connection_name = "retryloop parking console";
  }

  http::BoundedServer server;
  server.set_default_headers(kSecurityHeaders);
  server.set_refusal_writer([](httplib::Response& response, int status, const std::string& why) {
    send_error(response, status, why);
    for (const auto& header : kSecurityHeaders)
      response.set_header(header.first.c_str(), header.second);
  });
  const std::string host = options.listen_host;
  const int port = server.bind(host, options.listen_port);
  if (port < 0) {
    return {ServeResult::Status::cannot_listen,
            "cannot listen on " + url_host(host) + ":" + std::to_string(options.listen_port) +
                " (is the port in use, or the address not this machine's?)"};
  }
  info.host = host;
  info.port = uint16_t(port);
  info.url = "http://" + url_host(host) + ":" + std::to_string(port) + "/";
  info.loopback = detail::is_loopback(host);
  access.hosts = detail::allowed_hosts(host, info.port);

  uv_loop_t loop;
  uv_loop_init(&loop);
  ServeResult result;
  {
    LoopBridge bridge(&loop);
    auto audit = std::make_shared<detail::AuditTrail>(options.audit_on_broker, options.logger,
                                                      options.audit_key);
    Cores cores;
    for (size_t i = 0; i < options.services.size(); ++i) {
      cores.list.push_back(
          std::make_shared<Core>(&loop, options, options.services[i], audit, i == 0));
    }
    add_routes(server, bridge, cores, audit, access);
    std::atomic<bool> listening_ended{false};
    std::thread http;
    std::unique_ptr<process::StopSignals> signals;
    bool shutting_down = false;
    size_t running = cores.list.size();
    auto shut_down = [&](bool at_once) {
      bridge.close();
      server.stop();
      if (shutting_down && !at_once) return;
      shutting_down = true;
      for (const auto& core : cores.list) {
        core->stop(at_once, [&signals, &running] {
          if (--running == 0 && signals) signals->close();
        });
      }
    };
    signals = std::make_unique<process::StopSignals>(
        &loop,
        [&](int) {
          if (options.logger) {
            options.logger->info(
                "console: stopping (a running replay's copies settle first; again to stop at "
                "once)");
          }
          shut_down(false);
        },
        [&] { shut_down(true); });
    size_t waiting = cores.list.size();
    for (const auto& core : cores.list) {
      core->start([&, name = core->service().name](ServeResult ready) {
        if (result.status != ServeResult::Status::stopped || shutting_down) return;
        if (ready.status != ServeResult::Status::stopped) {
          result = ready;
          if (options.services.size() > 1) result.message = name + ": " + result.message;
          shut_down(true);
          return;
        }
        if (--waiting > 0) return;
        http = std::thread([&server, &listening_ended] {
          server.listen_after_bind();
          listening_ended = true;
        });
        if (on_ready) on_ready(info);
      });
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    // A stop() that came before the server thread began listening is lost: stop until it ends.
    while (http.joinable() && !listening_ended) {
      server.stop();
      std::this_thread::sleep_for(10ms);
    }
    if (http.joinable()) http.join();
  }
  // Every handle was closed before uv_run returned: the bridge's, the core's, the signals' and
  // the connections'.
  if (uv_loop_close(&loop) != 0 && options.logger) {
    options.logger->warn("console: a libuv handle was left open");
  }
  return result;
}

}  // namespace retryloop::console
