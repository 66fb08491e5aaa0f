#include "retryloop/dispatch/response.hpp"

namespace retryloop::dispatch {

const char* to_string(Failure failure) {
  switch (failure) {
    case Failure::none:
      return "none";
    case Failure::refused:
      return "refused";
    case Failure::resolve:
      return "resolve";
    case Failure::connect_timeout:
      return "connect-timeout";
    case Failure::timeout:
      return "timeout";
    case Failure::tls:
      return "tls";
    case Failure::broken:
      return "broken";
  }
  return "unknown";
}

bool same_ignoring_case(std::string_view a, std::string_view b) {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view Response::header(std::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (same_ignoring_case(field, name)) return value;
  }
  return {};
}

}  // namespace retryloop::dispatch
