// The parking console's request check and filter parsing, without a server.

#include <unistd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_set>

#include "retryloop/console/detail/api.hpp"
#include "retryloop/parking/parked_json.hpp"

using namespace retryloop;
using console::detail::Access;
using console::detail::RequestFacts;

namespace {

Access loopback_access() {
  Access access;
  access.identities = {{"console", console::Role::admin, "0123456789abcdef0123456789abcdef"}};
  access.hosts = console::detail::allowed_hosts("127.0.0.1", 8080);
  return access;
}

/// A replay as the console's own page sends it.
RequestFacts page_replay() {
  RequestFacts request;
  request.method = "POST";
  request.path = "/api/replay";
  request.host = "127.0.0.1:8080";
  request.origin = "http://127.0.0.1:8080";
  request.fetch_site = "same-origin";
  request.token = "0123456789abcdef0123456789abcdef";
  request.content_type = "application/json";
  return request;
}

int status_of(const RequestFacts& request) {
  return console::detail::check_request(request, loopback_access()).status;
}

}  // namespace

TEST_CASE("The console's own page gets in, and a request without the token does not", "[console]") {
  CHECK(status_of(page_replay()) == 0);

  RequestFacts request = page_replay();
  request.token.clear();
  CHECK(status_of(request) == 403);
  CHECK_THAT(console::detail::check_request(request, loopback_access()).reason,
             Catch::Contains("X-Retryloop-Token"));
  request.token = "0123456789abcdef0123456789abcdeX";
  CHECK(status_of(request) == 403);
  request.token = "0123456789abcdef";  // a prefix of the token
  CHECK(status_of(request) == 403);

  // Reads need the token too: a parked body may hold personal data.
  RequestFacts read = page_replay();
  read.method = "GET";
  read.path = "/api/state";
  read.origin.clear();
  read.token.clear();
  CHECK(status_of(read) == 403);

  // The page and its script need none.
  RequestFacts page = read;
  page.path = "/app.js";
  CHECK(status_of(page) == 0);
  page.method = "POST";
  CHECK(status_of(page) == 405);
}

TEST_CASE("Requests from another origin or for another host are refused", "[console]") {
  RequestFacts request = page_replay();
  request.origin = "http://evil.example";
  CHECK(status_of(request) == 403);
  request.origin = "null";  // a sandboxed frame or a data: page
  CHECK(status_of(request) == 403);
  request.origin = "http://localhost:8080";  // the console under its other name
  CHECK(status_of(request) == 403);
  request.host = "localhost:8080";
  CHECK(status_of(request) == 0);

  request = page_replay();
  request.fetch_site = "cross-site";
  CHECK(status_of(request) == 403);
  request.fetch_site = "same-site";  // another port of the same host is another origin
  CHECK(status_of(request) == 403);
  request.fetch_site = "none";  // typed in the address bar
  CHECK(status_of(request) == 0);

  request = page_replay();
  request.method = "OPTIONS";  // a CORS preflight: no cross-origin request is ever allowed
  CHECK(status_of(request) == 403);

  // DNS rebinding: a site's name resolved to 127.0.0.1.
  request = page_replay();
  request.host = "evil.example:8080";
  request.origin = "http://evil.example:8080";
  CHECK(status_of(request) == 403);
  request.host = "127.0.0.1:9090";
  request.origin.clear();
  CHECK(status_of(request) == 403);

  // A form can send text/plain or a urlencoded body, never JSON.
  request = page_replay();
  request.content_type = "text/plain";
  CHECK(status_of(request) == 415);
  request.content_type = "Application/JSON; charset=utf-8";
  CHECK(status_of(request) == 0);
  request.content_type = "application/json ;charset=utf-8";
  CHECK(status_of(request) == 0);
  for (const char* other : {"application/jsonx", "application/json-seq", "application/json5",
                            "application/json-patch+json", "text/json", ""}) {
    INFO(other);
    request.content_type = other;
    CHECK(status_of(request) == 415);
  }
}

TEST_CASE("A console on loopback answers to its address and localhost, and elsewhere to any host",
          "[console]") {
  using console::detail::allowed_hosts;
  using console::detail::is_loopback;
  const auto hosts = allowed_hosts("127.0.0.2", 80);
  CHECK(std::find(hosts.begin(), hosts.end(), "127.0.0.2:80") != hosts.end());
  CHECK(std::find(hosts.begin(), hosts.end(), "localhost:80") != hosts.end());
  const auto v6 = allowed_hosts("::1", 8080);
  CHECK(std::find(v6.begin(), v6.end(), "[::1]:8080") != v6.end());
  CHECK(allowed_hosts("0.0.0.0", 8080).empty());
  CHECK(allowed_hosts("10.1.2.3", 8080).empty());

  CHECK(is_loopback("127.0.0.1"));
  CHECK(is_loopback("localhost"));
  CHECK(is_loopback("::1"));
  CHECK_FALSE(is_loopback("127.evil.example"));
  CHECK_FALSE(is_loopback("0.0.0.0"));

  Access anywhere;
  anywhere.identities = {{"console", console::Role::admin, "t"}};
  RequestFacts request;
  request.method = "GET";
  request.path = "/";
  request.host = "console.internal:8080";
  CHECK(console::detail::check_request(request, anywhere).status == 0);
}

TEST_CASE("A random token is 32 hex digits, and a new one each time", "[console]") {
  const std::string token = console::detail::random_token();
  CHECK(token.size() == 32);
  CHECK(token.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(token != console::detail::random_token());
  CHECK(console::detail::same_token("abc", "abc"));
  CHECK_FALSE(console::detail::same_token("abc", "abd"));
  CHECK_FALSE(console::detail::same_token("abc", "abcd"));
  CHECK_FALSE(console::detail::same_token("", "a"));
}

TEST_CASE("A filter in a request becomes a parking filter, and a bad one names its field",
          "[console]") {
  using console::detail::parse_filter;
  const parking::Filter filter = parse_filter(nlohmann::json::parse(R"json({
      "reasons": ["exhausted", "(none)"], "error_first_line": "(none)",
      "error_contains": "timeout", "message_ids": ["m-1", "m-2"], "routing_key": "order.created",
      "parked_from": 1700000000, "parked_until": 1700003600, "older_than": "7d"
})json"));
  CHECK(filter.reasons == std::vector<std::string>{"exhausted", ""});
  CHECK(filter.error_first_line == std::string());
  CHECK(filter.error_contains == "timeout");
  CHECK(filter.message_ids == std::unordered_set<std::string>{"m-1", "m-2"});
  CHECK(filter.original_routing_key == std::string("order.created"));
  CHECK(filter.parked_from == uint64_t(1700000000));
  CHECK(filter.parked_until == uint64_t(1700003600));
  CHECK(filter.older_than == std::chrono::milliseconds(7 * 24 * 3600 * 1000LL));
  CHECK(parse_filter(nlohmann::json::object()).empty());

  auto refuses = [&](const char* json, const char* why) {
    INFO(json);
    CHECK_THROWS_WITH(parse_filter(nlohmann::json::parse(json)), Catch::Contains(why));
  };
  // An empty list would take every message: a selection of none must not.
  refuses(R"({"message_ids": []})", "message_ids");
  refuses(R"({"reasons": []})", "reasons");
  refuses(R"({"message_ids": [1]})", "strings only");
  refuses(R"({"parked_from": -5})", "parked_from");
  refuses(R"({"parked_from": "yesterday"})", "parked_from");
  refuses(R"({"older_than": "7 days"})", "older_than \"7 days\"");
  refuses(R"({"routing_key": 7})", "routing_key");
  refuses(R"({"reason": ["poison"]})", "unknown filter field reason");
  refuses(R"(["poison"])", "JSON object");
}

TEST_CASE("Request bodies are measured for depth before parsing, and strings do not count",
          "[console]") {
  using parking::nests_at_most;
  CHECK(nests_at_most(R"({"filter": {"reasons": ["poison"]}})", 3));
  CHECK_FALSE(nests_at_most(R"({"filter": {"reasons": ["poison"]}})", 2));
  CHECK(nests_at_most(R"({"error_contains": "[[[[{{{{"})", 1));
  CHECK(nests_at_most(R"({"error_contains": "a \" [[[["})", 1));
  CHECK_FALSE(nests_at_most(R"({"error_contains": "\\", "x": [[]]})", 2));
  const std::string deep =
      R"({"filter": )" + std::string(500000, '[') + std::string(500000, ']') + "}";
  CHECK_FALSE(nests_at_most(deep, console::detail::max_request_depth));
}

TEST_CASE("older_than becomes the parked_until it means when the action is asked for",
          "[console]") {
  using console::detail::pin_older_than;
  const uint64_t now = 1700000000;
  CHECK(pin_older_than(nlohmann::json::parse(R"({"older_than": "7d", "reasons": ["poison"]})"),
                       now) ==
        nlohmann::json::parse(R"({"parked_until": 1699395200, "reasons": ["poison"]})"));
  // Filter::matches takes an age of at least the duration, rounded up to whole seconds.
  CHECK(pin_older_than(nlohmann::json::parse(R"({"older_than": "1500ms"})"), now) ==
        nlohmann::json::parse(R"({"parked_until": 1699999998})"));
  CHECK(pin_older_than(nlohmann::json::parse(R"({"older_than": "1h", "parked_until": 5})"), now) ==
        nlohmann::json::parse(R"({"parked_until": 5})"));
  CHECK(pin_older_than(nlohmann::json::parse(R"({"reasons": ["poison"]})"), now) ==
        nlohmann::json::parse(R"({"reasons": ["poison"]})"));

  const parking::Filter relative =
      console::detail::parse_filter(nlohmann::json::parse(R"({"older_than": "7d"})"));
  const parking::Filter pinned = console::detail::parse_filter(
      pin_older_than(nlohmann::json::parse(R"({"older_than": "7d"})"), now));
  for (uint64_t parked_at : {now - 7 * 86400 - 1, now - 7 * 86400, now - 7 * 86400 + 1}) {
    parking::ParkedMessage parked;
    parked.parked_at = parked_at;
    CHECK(pinned.matches(parked, now) == relative.matches(parked, now));
    // Later, the relative filter takes more; the pinned one the same.
    CHECK(pinned.matches(parked, now + 3600) == relative.matches(parked, now));
  }
}

TEST_CASE("Each call needs a role, and a token of a lesser role is refused naming it",
          "[console]") {
  Access access = loopback_access();
  access.identities = {{"ana", console::Role::reader, "aaaaaaaaaaaaaaaaaaaa"},
                       {"bob", console::Role::operator_, "bbbbbbbbbbbbbbbbbbbb"},
                       {"cyd", console::Role::admin, "cccccccccccccccccccc"}};
  auto as = [&](const std::string& token, const std::string& method, const std::string& path) {
    RequestFacts request = page_replay();
    request.token = token;
    request.method = method;
    request.path = path;
    return console::detail::check_request(request, access);
  };
  const std::string ana = "aaaaaaaaaaaaaaaaaaaa", bob = "bbbbbbbbbbbbbbbbbbbb",
                    cyd = "cccccccccccccccccccc";
  for (const auto& token : {ana, bob, cyd}) {
    CHECK(as(token, "GET", "/api/state").status == 0);
    CHECK(as(token, "GET", "/api/whoami").status == 0);
    CHECK(as(token, "POST", "/api/count").status == 0);
    CHECK(as(token, "POST", "/api/scan").status == 0);
  }
  auto replay = as(ana, "POST", "/api/replay");
  CHECK(replay.status == 403);
  CHECK(replay.reason == "this needs the operator role; ana has the reader role");
  CHECK(as(ana, "POST", "/api/stop").status == 403);
  CHECK(as(ana, "POST", "/api/edit").reason ==
        "this needs the operator role; ana has the reader role");
  CHECK(as(ana, "POST", "/api/note").status == 403);
  CHECK(as(ana, "GET", "/api/audit").status == 0);
  CHECK(as(ana, "GET", "/api/services").status == 0);
  CHECK(as(bob, "POST", "/api/edit").status == 0);
  CHECK(as(bob, "POST", "/api/note").status == 0);
  CHECK(as(bob, "POST", "/api/replay").status == 0);
  CHECK(as(bob, "POST", "/api/stop").status == 0);
  CHECK(as(bob, "POST", "/api/purge").reason ==
        "this needs the admin role; bob has the operator role");
  CHECK(as(cyd, "POST", "/api/purge").status == 0);
  CHECK(as("", "GET", "/metrics").status == 403);  // a metrics scrape needs a token too
  CHECK(as(ana, "GET", "/metrics").status == 0);
  CHECK(as("dddddddddddddddddddd", "GET", "/api/state").reason == "wrong token");
  CHECK(console::detail::identify(access, bob)->name == "bob");
  CHECK(console::detail::identify(access, "b") == nullptr);
}

TEST_CASE("A tokens file gives names, roles and tokens, and its mistakes name their line",
          "[console]") {
  const auto path =
      std::filesystem::temp_directory_path() / ("retryloop-tokens-" + std::to_string(::getpid()));
  auto read = [&](const std::string& text) {
    std::ofstream(path) << text;
    return console::read_identities(path.string());
  };
  auto identities = read(
      "# who role token\n\nana reader aaaaaaaaaaaaaaaa\n  bob operator "
      "bbbbbbbbbbbbbbbb\ncyd admin cccccccccccccccc\n");
  REQUIRE(identities.size() == 3);
  CHECK(identities[1].name == "bob");
  CHECK(identities[1].role == console::Role::operator_);
  CHECK(identities[2].token == "cccccccccccccccc");
  const std::string at = path.string() + ":2: ";
  CHECK_THROWS_WITH(read("ana reader aaaaaaaaaaaaaaaa\nbob owner bbbbbbbbbbbbbbbb\n"),
                    at + "the role \"owner\" is not reader, operator or admin");
  CHECK_THROWS_WITH(read("ana reader aaaaaaaaaaaaaaaa\nbob reader short\n"),
                    at + "the token of bob is shorter than 16 characters: anyone could guess it");
  CHECK_THROWS_WITH(read("ana reader aaaaaaaaaaaaaaaa\nbob admin aaaaaaaaaaaaaaaa\n"),
                    at + "the token of bob is also ana's");
  CHECK_THROWS_WITH(read("ana reader aaaaaaaaaaaaaaaa\nana admin bbbbbbbbbbbbbbbb\n"),
                    at + "ana is named twice");
  CHECK_THROWS_WITH(read("ana reader\n"),
                    path.string() + ":1: give NAME ROLE TOKEN, separated by spaces");
  CHECK_THROWS_WITH(read("# nobody\n"), path.string() + " names nobody");
  // A name that is not UTF-8 would be answered by /api/whoami as invalid JSON.
  CHECK_THROWS_WITH(read("ana reader aaaaaaaaaaaaaaaa\nb\xff\xfe"
                         "b reader bbbbbbbbbbbbbbbb\n"),
                    at + "the name is not UTF-8 text");
  std::filesystem::remove(path);
}

TEST_CASE("A token file or tokens file that never ends is refused once past its size limit",
          "[console]") {
  CHECK_THROWS_WITH(console::read_identities("/dev/zero"),
                    "/dev/zero is larger than 1 MiB; is it a tokens file?");
  CHECK_THROWS_WITH(console::read_token_file("/dev/zero"),
                    "/dev/zero is larger than 4 KiB; is it a token file?");
  CHECK_THROWS_WITH(console::read_token_file("/nonexistent/token"),
                    "cannot read the token file /nonexistent/token");
}
