// Reads arbitrary bytes as the start of an HTTP connection, as the parking console and the
// operations endpoint do: framed against the limits, then, when complete, answered by
// cpp-httplib's routing. Oracle: it never crashes; a complete request's length lies within the
// bytes and frames the same alone; a request's shorter start is never complete; fed in pieces,
// a byte at a time too, the bytes frame as they do at once, with as many bytes gone through, at
// most twice as many as were fed; a refusal has a status and a reason; every answer is one HTTP
// response (no 100 Continue before it) that closes the connection and no handler sees a body
// over the limit.
#include <algorithm>
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
  RequestFramer whole(limits);
  whole.feed(bytes);
  check(whole.examined() <= 2 * size);
  // A byte at a time, and in pieces whose sizes the bytes themselves give.
  for (const bool bytewise : {true, false}) {
    RequestFramer pieces(limits);
    for (size_t at = 0;
         at < size && pieces.framing().status == RequestFraming::Status::incomplete;) {
      const size_t before = at;
      at = std::min(size, at + (bytewise ? 1 : 1 + size_t(data[at]) % 64));
      const RequestFraming& so_far = pieces.feed(bytes.substr(before, at - before));
      // Complete with the piece that ends it, not before nor after.
      if (so_far.status == RequestFraming::Status::complete) {
        check(so_far.length > before && so_far.length <= at);
      }
    }
    const RequestFraming& fed = pieces.framing();
    check(fed.status == framing.status);
    check(fed.length == framing.length);
    check(fed.refusal_status == framing.refusal_status);
    check(fed.reason == framing.reason);
    check(fed.head_read == framing.head_read);
    check(fed.expects_continue == framing.expects_continue);
    check(pieces.examined() == whole.examined());
  }
  const std::string answer = server().answer(bytes);
  check(answer.rfind("HTTP/1.1 ", 0) == 0);
  check(answer.rfind("HTTP/1.1 100 ", 0) != 0);
  check(answer.find("Connection: close\r\n") != std::string::npos);
  return 0;
}
