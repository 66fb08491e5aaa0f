#pragma once

// The parking console's pure parts, apart from the server so that they are tested alone: which
// requests are let in, and how a filter arrives in a request.

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/console/console.hpp"
#include "retryloop/parking/parked_message.hpp"

namespace retryloop::console::detail {

/// The header every API request carries the console's token in. A custom header is what makes
/// the API safe from cross-site requests: a form cannot send one, and a script of another origin
/// can only after a CORS preflight, which the console refuses.
inline constexpr const char* token_header = "X-Retryloop-Token";

/// An HTTP answer: status, content type and body.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

/// What the check needs of one HTTP request; absent headers are empty.
struct RequestFacts {
  std::string method;
  std::string path;
  std::string host;
  std::string origin;
  /// `Sec-Fetch-Site`, which browsers send with every request.
  std::string fetch_site;
  std::string token;
  std::string content_type;
};

/// Who may use the console: each identity with its token and role (the single-token mode is one
/// identity, "console", with the admin role).
struct Access {
  std::vector<Identity> identities;
  /// Accepted values of the Host header; empty: any. A console on a loopback address answers
  /// only to its own address and `localhost`, so that a page of another site whose name was made
  /// to resolve to 127.0.0.1 (DNS rebinding) is refused.
  std::vector<std::string> hosts;
};

/// API request bodies whose arrays and objects nest deeper than this are refused before they are
/// parsed: the JSON library copies and serializes recursively, so a body of a million brackets
/// would overflow the stack. A filter needs three levels.
inline constexpr size_t max_request_depth = 16;

/// Why a request is refused: an HTTP status and a sentence; status 0 lets it in.
struct Refusal {
  int status = 0;
  std::string reason;
};

/// The role an API call needs: POST /api/replay and /api/stop operator, POST /api/purge admin,
/// everything else reader.
Role role_needed(std::string_view method, std::string_view path);

/// The identity whose token `token` is (compared in constant time); nullptr when none.
const Identity* identify(const Access& access, std::string_view token);

/// Checks a request: the Host, then that it comes from the console's own page (no Origin of
/// another site, no CORS preflight), then, for `/api/` paths and `/metrics`, the token (for
/// `/metrics` also as `Authorization: Bearer TOKEN`, as Prometheus sends it), the role it needs
/// (403 naming it) and, for a POST, a JSON body (`Content-Type: application/json`, parameters such
/// as
/// `; charset=utf-8` allowed). Pages and scripts need no token; other methods than GET and HEAD on
/// them are refused.
Refusal check_request(const RequestFacts& request, const Access& access);

/// Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`.
bool is_loopback(std::string_view host);

/// The Host values a console listening on `listen_host`:`port` accepts (see Access::hosts).
std::vector<std::string> allowed_hosts(const std::string& listen_host, uint16_t port);

/// `a == b` in a time that does not depend on where they differ.
bool same_token(std::string_view a, std::string_view b);

/// 32 hex digits from the kernel's random source (random::random_id); throws std::system_error
/// when the source fails.
std::string random_token();

/// The filter of an API request, a JSON object whose fields are all optional:
/// `reasons` (array; "(none)" is the messages without a reason), `error_first_line` (string;
/// "(none)" is the messages without an error), `error_contains`, `message_ids` (array),
/// `routing_key`, `parked_from` and `parked_until` (seconds since the epoch) and `older_than`
/// (a duration such as "7d"). Throws std::invalid_argument naming the field at fault.
parking::Filter parse_filter(const nlohmann::json& json);

/// A filter that parse_filter accepted, with `older_than`, which is relative to the moment the
/// filter is used, replaced by the `parked_until` it means at `now_seconds` (the earlier of the
/// two when both are given). A count and the purge confirmed after it then take the same
/// messages, however long the confirmation took.
nlohmann::json pin_older_than(nlohmann::json filter, uint64_t now_seconds);

}  // namespace retryloop::console::detail
