// Reads arbitrary bytes as an HTTP application's answer to `retryloop dispatch`: a status, header
// fields and a body (lines: the status, then `Name: value` fields, a blank line, the body), and
// maps it to an outcome; the first line is also read as a Retry-After value on its own. Oracle:
// nothing crashes or throws; a parsed Retry-After is never negative nor longer than
// max_retry_after; an outcome's delay is within the same bounds; its error text quotes at most
// max_quoted_body_bytes of the body, escaped, so that it holds no line break.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "retryloop/dispatch/answer.hpp"

using namespace retryloop;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

bool within_bounds(std::chrono::milliseconds wait) {
  return wait.count() >= 0 && wait <= dispatch::max_retry_after;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto now = std::chrono::system_clock::time_point(std::chrono::seconds(1796400000));

  const std::string_view first = input.substr(0, input.find('\n'));
  if (auto wait = dispatch::parse_retry_after(first, now)) check(within_bounds(*wait));

  dispatch::Response response;
  size_t at = first.size() + 1;
  int status = 0;
  for (char c : first.substr(0, 4))
    if (c >= '0' && c <= '9') status = status * 10 + (c - '0');
  response.status = status;
  response.failure = status == 0 ? dispatch::Failure::broken : dispatch::Failure::none;
  while (at < input.size()) {
    const size_t end = input.find('\n', at);
    const std::string_view line = input.substr(at, end == std::string_view::npos ? end : end - at);
    at = end == std::string_view::npos ? input.size() : end + 1;
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    response.headers.emplace_back(std::string(line.substr(0, colon)),
                                  std::string(line.substr(colon + 1)));
  }
  if (at < input.size()) response.body = std::string(input.substr(at));
  response.body_cut = size % 2 == 1;

  const retry::Outcome outcome =
      dispatch::outcome_of(response, dispatch::AnswerContext{now, "POST http://app/orders"});
  if (outcome.delay) check(within_bounds(*outcome.delay));
  check(outcome.text.find('\n') == std::string::npos);
  check(outcome.text.size() <= 4 * dispatch::max_quoted_body_bytes + 1024);
  return 0;
}
