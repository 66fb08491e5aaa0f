#include "retryloop/dispatch/answer.hpp"

#include <cstdint>
#include <utility>

#include "retryloop/amqp/printable.hpp"
#include "retryloop/dispatch/detail/calendar.hpp"

namespace retryloop::dispatch {
namespace {

using std::chrono::milliseconds;
using Outcome = retry::Outcome;

bool is_space(char c) {
  return c == ' ' || c == '\t';
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && is_space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && is_space(text.back()))
    text.remove_suffix(1);
  return text;
}

constexpr std::string_view short_days[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
constexpr std::string_view long_days[] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                          "Friday", "Saturday", "Sunday"};
constexpr std::string_view months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// Reads an HTTP-date from left to right; every read consumes only on success.
class DateReader {
 public:
  explicit DateReader(std::string_view text) : text_(text) {}

  bool at_end() const { return position_ == text_.size(); }

  bool literal(char c) {
    if (position_ < text_.size() && text_[position_] == c) {
      ++position_;
      return true;
    }
    return false;
  }

  // One space or more.
  bool spaces() {
    size_t start = position_;
    while (position_ < text_.size() && text_[position_] == ' ')
      ++position_;
    return position_ > start;
  }

  // The letters up to the next character that is not one.
  std::string_view word() {
    size_t start = position_;
    while (position_ < text_.size() && ((text_[position_] >= 'a' && text_[position_] <= 'z') ||
                                        (text_[position_] >= 'A' && text_[position_] <= 'Z'))) {
      ++position_;
    }
    return text_.substr(start, position_ - start);
  }

  // Between `least` and `most` decimal digits.
  std::optional<int> number(size_t least, size_t most) {
    size_t start = position_;
    int value = 0;
    while (position_ < text_.size() && position_ - start < most && text_[position_] >= '0' &&
           text_[position_] <= '9') {
      value = value * 10 + (text_[position_] - '0');
      ++position_;
    }
    if (position_ - start < least) {
      position_ = start;
      return std::nullopt;
    }
    return value;
  }

  std::optional<unsigned> month() {
    std::string_view name = word();
    for (unsigned i = 0; i < 12; ++i) {
      if (same_ignoring_case(name, months[i])) return i + 1;
    }
    return std::nullopt;
  }

  struct TimeOfDay {
    int hour = 0, minute = 0, second = 0;
  };

  // hour ":" minute ":" second
  std::optional<TimeOfDay> time_of_day() {
    auto hour = number(2, 2);
    if (!hour || !literal(':')) return std::nullopt;
    auto minute = number(2, 2);
    if (!minute || !literal(':')) return std::nullopt;
    auto second = number(2, 2);
    if (!second || *hour > 23 || *minute > 59 || *second > 60) return std::nullopt;
    return TimeOfDay{*hour, *minute, *second};
  }

 private:
  std::string_view text_;
  size_t position_ = 0;
};

bool is_one_of(std::string_view word, const std::string_view (&names)[7]) {
  for (std::string_view name : names) {
    if (same_ignoring_case(word, name)) return true;
  }
  return false;
}

std::optional<int64_t> unix_seconds(int64_t year, unsigned month, int day,
                                    const DateReader::TimeOfDay& time) {
  if (day < 1 || static_cast<unsigned>(day) > detail::days_in_month(year, month)) {
    return std::nullopt;
  }
  const int64_t days = detail::days_from_civil({year, month, static_cast<unsigned>(day)});
  return days * 86400 + time.hour * 3600 + time.minute * 60 + time.second;
}

// Sun, 06 Nov 1994 08:49:37 GMT (after the day name and its comma).
std::optional<int64_t> imf_fixdate(DateReader& in) {
  if (!in.spaces()) return std::nullopt;
  auto day = in.number(1, 2);
  if (!day || !in.spaces()) return std::nullopt;
  auto month = in.month();
  if (!month || !in.spaces()) return std::nullopt;
  auto year = in.number(4, 4);
  if (!year || !in.spaces()) return std::nullopt;
  auto time = in.time_of_day();
  if (!time || !in.spaces() || !same_ignoring_case(in.word(), "GMT") || !in.at_end()) {
    return std::nullopt;
  }
  return unix_seconds(*year, *month, *day, *time);
}

// Sunday, 06-Nov-94 08:49:37 GMT (after the day name and its comma). RFC 9110: a two-digit year
// more than 50 years in the future is the most recent past year with the same last two digits.
std::optional<int64_t> rfc850_date(DateReader& in, int64_t current_year) {
  if (!in.spaces()) return std::nullopt;
  auto day = in.number(1, 2);
  if (!day || !in.literal('-')) return std::nullopt;
  auto month = in.month();
  if (!month || !in.literal('-')) return std::nullopt;
  auto two_digit_year = in.number(2, 2);
  if (!two_digit_year || !in.spaces()) return std::nullopt;
  auto time = in.time_of_day();
  if (!time || !in.spaces() || !same_ignoring_case(in.word(), "GMT") || !in.at_end()) {
    return std::nullopt;
  }
  const int64_t century = current_year - (current_year % 100 + 100) % 100;
  int64_t year = century + *two_digit_year;
  if (year > current_year + 50) year -= 100;
  return unix_seconds(year, *month, *day, *time);
}

// Sun Nov  6 08:49:37 1994 (after the day name).
std::optional<int64_t> asctime_date(DateReader& in) {
  if (!in.spaces()) return std::nullopt;
  auto month = in.month();
  if (!month || !in.spaces()) return std::nullopt;
  auto day = in.number(1, 2);
  if (!day || !in.spaces()) return std::nullopt;
  auto time = in.time_of_day();
  if (!time || !in.spaces()) return std::nullopt;
  auto year = in.number(4, 4);
  if (!year || !in.at_end()) return std::nullopt;
  return unix_seconds(*year, *month, *day, *time);
}

int64_t unix_milliseconds(std::chrono::system_clock::time_point now) {
  return std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count();
}

int64_t year_of(std::chrono::system_clock::time_point now) {
  int64_t ms = unix_milliseconds(now);
  int64_t days = ms / 86400000 - (ms % 86400000 < 0 ? 1 : 0);
  return detail::civil_from_days(days).year;
}

std::optional<int64_t> http_date(std::string_view text, std::chrono::system_clock::time_point now) {
  DateReader in(text);
  std::string_view day_name = in.word();
  if (in.literal(',')) {
    if (is_one_of(day_name, short_days)) return imf_fixdate(in);
    if (is_one_of(day_name, long_days)) return rfc850_date(in, year_of(now));
    return std::nullopt;
  }
  if (is_one_of(day_name, short_days)) return asctime_date(in);
  return std::nullopt;
}

std::optional<milliseconds> delay_seconds(std::string_view digits) {
  constexpr int64_t cap_seconds = max_retry_after.count() / 1000;
  int64_t seconds = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    if (seconds <= cap_seconds) seconds = seconds * 10 + (c - '0');
  }
  if (seconds >= cap_seconds) return max_retry_after;
  return milliseconds(seconds * 1000);
}

std::string_view failure_words(Failure failure) {
  switch (failure) {
    case Failure::refused:
      return "the connection was refused";
    case Failure::resolve:
      return "the host name did not resolve";
    case Failure::connect_timeout:
      return "no connection within the connect timeout";
    case Failure::timeout:
      return "no whole answer within the request timeout";
    case Failure::tls:
      return "TLS failed";
    case Failure::broken:
      return "the connection broke or the answer was not HTTP";
    case Failure::none:
      break;
  }
  return "no answer";
}

std::string_view target_of(const AnswerContext& context) {
  return context.target.empty() ? std::string_view("the endpoint") : context.target;
}

std::string no_answer_text(const Response& response, const AnswerContext& context) {
  std::string text = amqp::printable(target_of(context));
  text += " got no answer: ";
  text += failure_words(response.failure);
  text += " (" + std::string(to_string(response.failure)) + ", after " +
          std::to_string(std::chrono::duration_cast<milliseconds>(response.elapsed).count()) +
          " ms)";
  if (!response.failure_text.empty()) {
    text += ": " + amqp::printable(response.failure_text.substr(0, max_quoted_body_bytes));
  }
  return text;
}

// At most max_quoted_body_bytes of `body`, not ending inside a UTF-8 sequence that is whole in
// `body`.
std::string_view body_head(std::string_view body) {
  if (body.size() <= max_quoted_body_bytes) return body;
  size_t end = max_quoted_body_bytes;
  size_t start = end;
  while (start > 0 && end - start < 3 && (static_cast<unsigned char>(body[start]) & 0xC0) == 0x80)
    --start;
  const auto lead = static_cast<unsigned char>(body[start]);
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (start < end && start + length > end) end = start;
  return body.substr(0, end);
}

std::string quoted_body(const Response& response) {
  if (response.body.empty() && !response.body_cut) return {};
  std::string_view head = body_head(response.body);
  std::string text = ": " + amqp::printable(head);
  if (response.body_cut) {
    text += " [answer longer than the client reads: cut at " +
            std::to_string(response.body.size()) + " bytes]";
  } else if (head.size() < response.body.size()) {
    text += " [" + std::to_string(response.body.size()) + " bytes in all]";
  }
  return text;
}

std::string answered_text(const Response& response, const AnswerContext& context,
                          std::string_view note) {
  std::string text = amqp::printable(target_of(context));
  text += " answered " + std::to_string(response.status);
  if (std::string_view reason = reason_phrase(response.status); !reason.empty()) {
    text += ' ';
    text += reason;
  }
  text += note;
  text += quoted_body(response);
  return text;
}

bool is_permanent_status(int status) {
  switch (status) {
    case 400:
    case 404:
    case 410:
    case 413:
    case 415:
    case 422:
      return true;
    default:
      return false;
  }
}

Outcome retry_with(std::optional<milliseconds> delay, std::string text) {
  return delay ? Outcome::retry_after(*delay, std::move(text)) : Outcome::retry(std::move(text));
}

}  // namespace

std::optional<milliseconds> parse_retry_after(std::string_view value,
                                              std::chrono::system_clock::time_point now) {
  value = trimmed(value);
  if (value.empty()) return std::nullopt;
  if (value.front() >= '0' && value.front() <= '9') return delay_seconds(value);
  std::optional<int64_t> date = http_date(value, now);
  if (!date) return std::nullopt;
  const int64_t wait = *date * 1000 - unix_milliseconds(now);
  if (wait <= 0) return milliseconds(0);
  if (wait >= max_retry_after.count()) return max_retry_after;
  return milliseconds(wait);
}

retry::Outcome outcome_of(const Response& response, const AnswerContext& context) {
  if (response.failure != Failure::none) {
    return Outcome::unavailable(no_answer_text(response, context));
  }
  auto retry_after = [&]() -> std::optional<milliseconds> {
    std::string_view value = response.header("Retry-After");
    if (value.empty()) return std::nullopt;
    return parse_retry_after(value, context.now);
  };

  if (std::string_view said = trimmed(response.header(outcome_header)); !said.empty()) {
    const std::string note = " with " + std::string(outcome_header) + ": ";
    auto text = [&](std::string_view word) {
      return answered_text(response, context, note + std::string(word));
    };
    if (same_ignoring_case(said, "ack")) return Outcome::ack();
    if (same_ignoring_case(said, "retry")) return retry_with(retry_after(), text("retry"));
    if (same_ignoring_case(said, "permanent")) return Outcome::permanent(text("permanent"));
    if (same_ignoring_case(said, "poison")) return Outcome::poison(text("poison"));
    if (same_ignoring_case(said, "drop")) return Outcome::drop(text("drop"));
    return retry_with(retry_after(),
                      answered_text(response, context,
                                    " with an unknown " + std::string(outcome_header) + " \"" +
                                        amqp::printable(said.substr(0, 64)) +
                                        "\" (expected ack, retry, permanent, poison or drop)"));
  }

  const int status = response.status;
  if (status >= 200 && status <= 299) return Outcome::ack();
  std::string text = answered_text(response, context, {});
  if (status == 429) {
    Outcome outcome = Outcome::overloaded(std::move(text));
    outcome.delay = retry_after();
    return outcome;
  }
  if (status == 502 || status == 503 || status == 504) {
    return Outcome::unavailable(std::move(text));
  }
  if (is_permanent_status(status)) return Outcome::permanent(std::move(text));
  return retry_with(retry_after(), std::move(text));
}

std::string_view reason_phrase(int status) {
  static constexpr std::pair<int, std::string_view> phrases[] = {
      {100, "Continue"},
      {101, "Switching Protocols"},
      {200, "OK"},
      {201, "Created"},
      {202, "Accepted"},
      {203, "Non-Authoritative Information"},
      {204, "No Content"},
      {205, "Reset Content"},
      {206, "Partial Content"},
      {300, "Multiple Choices"},
      {301, "Moved Permanently"},
      {302, "Found"},
      {303, "See Other"},
      {304, "Not Modified"},
      {307, "Temporary Redirect"},
      {308, "Permanent Redirect"},
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {402, "Payment Required"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {406, "Not Acceptable"},
      {407, "Proxy Authentication Required"},
      {408, "Request Timeout"},
      {409, "Conflict"},
      {410, "Gone"},
      {411, "Length Required"},
      {412, "Precondition Failed"},
      {413, "Content Too Large"},
      {414, "URI Too Long"},
      {415, "Unsupported Media Type"},
      {416, "Range Not Satisfiable"},
      {417, "Expectation Failed"},
      {421, "Misdirected Request"},
      {422, "Unprocessable Entity"},
      {423, "Locked"},
      {424, "Failed Dependency"},
      {425, "Too Early"},
      {426, "Upgrade Required"},
      {428, "Precondition Required"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {451, "Unavailable For Legal Reasons"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"},
      {505, "HTTP Version Not Supported"},
      {507, "Insufficient Storage"},
      {508, "Loop Detected"},
      {511, "Network Authentication Required"},
  };
  for (const auto& [code, phrase] : phrases) {
    if (code == status) return phrase;
  }
  return {};
}

}  // namespace retryloop::dispatch
