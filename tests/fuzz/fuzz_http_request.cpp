// Reads arbitrary bytes as the start of an HTTP connection, as the parking console and the
// operations endpoint do: framed against the limits, then, when complete, answered by
// cpp-httplib's routing. Oracle: it never crashes; a complete request's length lies within the
// bytes and frames the same alone; a request's shorter start is never complete; a refusal
// has a status and a reason; every answer is one HTTP response that closes the connection and
// no handler sees a body over the limit.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "retryloop/http/bounded_server.hpp"
#include "retryloop/http/request_framing.hpp"

using namespace retryloop::http;

namespace {

void check_at(bool condition, const char* what, int line) {
  if (condition) return;
  std::fprintf(stderr, "fuzz_http_request.cpp:%d: check failed: %s\n", line, what);
  std::abort();
}
#define check(condition) check_at((condition), #condition, __LINE__)

constexpr size_t kMaxBody = 512;

/// Routes shaped like the console's and the endpoint's: reads with parameters, posts that read
/// the body, a check before routing.
BoundedServer& server() {
  static BoundedServer* server = [] {
    ServerLimits limits;
    limits.request.max_head_bytes = 1024;
    limits.request.max_body_bytes = kMaxBody;
    auto* made = new BoundedServer(limits);
    made->set_pre_routing_handler([](const httplib::Request& request, httplib::Response& response) {
      if (request.get_header_value("X-Retryloop-Token") != "t") {
        response.status = 403;
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    made->Get("/metrics", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("up 1\n", "text/plain");
    });
    made->Get("/api/message", [](const httplib::Request& request, httplib::Response& response) {
      response.set_content(request.get_param_value("scan") + request.get_param_value("index"),
                           "text/plain");
    });
    made->Post("/api/note", [](const httplib::Request& request, httplib::Response& response) {
      check(request.body.size() <= kMaxBody);
      response.set_content(request.body, "application/json");
    });
    return made;
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  limits.max_head_bytes = 1024;
  limits.max_body_bytes = kMaxBody;
  const RequestFraming framing = frame_request(bytes, limits);
  switch (framing.status) {
    case RequestFraming::Status::complete: {
      check(framing.length > 0 && framing.length <= size);
      const RequestFraming alone = frame_request(bytes.substr(0, framing.length), limits);
      check(alone.status == RequestFraming::Status::complete && alone.length == framing.length);
      const RequestFraming start = frame_request(bytes.substr(0, framing.length - 1), limits);
      check(start.status == RequestFraming::Status::incomplete);
      break;
    }
    case RequestFraming::Status::refused:
      check(framing.refusal_status >= 400 && framing.refusal_status < 600);
      check(!framing.reason.empty());
      break;
    case RequestFraming::Status::incomplete:
      check(size < limits.max_head_bytes || framing.head_read);
      break;
  }
  const std::string answer = server().answer(bytes);
  check(answer.rfind("HTTP/1.1 ", 0) == 0);
  check(answer.find("Connection: close\r\n") != std::string::npos);
  return 0;
}
