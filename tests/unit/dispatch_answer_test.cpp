// The outcome an HTTP answer means, and Retry-After in all its forms.

#include <catch2/catch.hpp>

#include <random>

#include "retryloop/dispatch/answer.hpp"

using namespace retryloop;
using dispatch::AnswerContext;
using dispatch::Failure;
using dispatch::outcome_of;
using dispatch::parse_retry_after;
using dispatch::Response;
using retry::OutcomeKind;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

namespace {

// Sun, 06 Nov 1994 08:49:37 GMT
const system_clock::time_point november_1994{seconds(784111777)};
// Thu, 01 Jan 2026 00:00:00 GMT
const system_clock::time_point january_2026{seconds(1767225600)};

const AnswerContext context{november_1994 - seconds(60), "POST http://app/orders"};

Response answer(int status, std::string body = {},
                std::vector<std::pair<std::string, std::string>> headers = {}) {
  Response response;
  response.status = status;
  response.body = std::move(body);
  response.headers = std::move(headers);
  return response;
}

Response no_answer(Failure failure, std::string text) {
  Response response;
  response.failure = failure;
  response.failure_text = std::move(text);
  response.elapsed = std::chrono::milliseconds(1500);
  return response;
}

bool is_visible_ascii(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F || c >= 0x80) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("A 2xx answer acks the message", "[dispatch]") {
  for (int status : {200, 201, 202, 204, 299}) {
    CAPTURE(status);
    auto outcome = outcome_of(answer(status, "ignored"), context);
    CHECK(outcome.kind == OutcomeKind::ack);
    CHECK(outcome.text.empty());
    CHECK_FALSE(outcome.delay);
  }
}

TEST_CASE("A 429 answer is overloaded, paced by its Retry-After", "[dispatch]") {
  auto outcome = outcome_of(answer(429, "slow down", {{"Retry-After", "120"}}), context);
  CHECK(outcome.kind == OutcomeKind::unavailable);
  CHECK(outcome.overloaded_dependency);
  REQUIRE(outcome.delay);
  CHECK(*outcome.delay == seconds(120));
  CHECK(outcome.text == "POST http://app/orders answered 429 Too Many Requests: slow down");

  outcome =
      outcome_of(answer(429, {}, {{"retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"}}), context);
  CHECK(outcome.overloaded_dependency);
  REQUIRE(outcome.delay);
  CHECK(*outcome.delay == seconds(60));

  outcome = outcome_of(answer(429), context);
  CHECK(outcome.kind == OutcomeKind::unavailable);
  CHECK(outcome.overloaded_dependency);
  CHECK_FALSE(outcome.delay);
  CHECK(outcome.text == "POST http://app/orders answered 429 Too Many Requests");

  outcome = outcome_of(answer(429, {}, {{"Retry-After", "soon"}}), context);
  CHECK(outcome.overloaded_dependency);
  CHECK_FALSE(outcome.delay);
}

TEST_CASE(
    "A 502, 503 or 504 answer is unavailable: the breaker counts it, the message is not "
    "charged",
    "[dispatch]") {
  for (int status : {502, 503, 504}) {
    CAPTURE(status);
    auto outcome = outcome_of(answer(status, "upstream down", {{"Retry-After", "30"}}), context);
    CHECK(outcome.kind == OutcomeKind::unavailable);
    CHECK_FALSE(outcome.overloaded_dependency);
    CHECK_FALSE(outcome.delay);
    CHECK(outcome.text.find("POST http://app/orders answered " + std::to_string(status)) == 0);
  }
  CHECK(outcome_of(answer(503), context).text ==
        "POST http://app/orders answered 503 Service Unavailable");
}

TEST_CASE("Every exchange without an answer is unavailable and says why", "[dispatch]") {
  for (Failure failure : {Failure::refused, Failure::resolve, Failure::connect_timeout,
                          Failure::timeout, Failure::tls, Failure::broken}) {
    CAPTURE(to_string(failure));
    auto outcome = outcome_of(no_answer(failure, "curl said\nso"), context);
    CHECK(outcome.kind == OutcomeKind::unavailable);
    CHECK_FALSE(outcome.overloaded_dependency);
    CHECK_FALSE(outcome.delay);
    CHECK(outcome.text.find("POST http://app/orders got no answer: ") == 0);
    CHECK(outcome.text.find(std::string("(") + to_string(failure) + ", after 1500 ms)") !=
          std::string::npos);
    CHECK(outcome.text.find("curl said\\nso") != std::string::npos);
  }
  CHECK(outcome_of(no_answer(Failure::refused, "Connection refused"), context).text ==
        "POST http://app/orders got no answer: the connection was refused (refused, after 1500 "
        "ms): Connection refused");
  // A status the failed exchange may have left behind does not count.
  Response timed_out = no_answer(Failure::timeout, {});
  timed_out.status = 200;
  CHECK(outcome_of(timed_out, context).kind == OutcomeKind::unavailable);
}

TEST_CASE("400, 404, 410, 413, 415 and 422 park the message with the status and the body",
          "[dispatch]") {
  for (int status : {400, 404, 410, 413, 415, 422}) {
    CAPTURE(status);
    auto outcome = outcome_of(answer(status, "no", {{"Retry-After", "5"}}), context);
    CHECK(outcome.kind == OutcomeKind::permanent);
    CHECK_FALSE(outcome.delay);
  }
  CHECK(
      outcome_of(answer(422, R"({"error":"amount is negative"})"), context).text ==
      R"(POST http://app/orders answered 422 Unprocessable Entity: {"error":"amount is negative"})");
  CHECK(outcome_of(answer(404), context).text == "POST http://app/orders answered 404 Not Found");
}

TEST_CASE("The error quotes the first KiB of the body, made safe for a header", "[dispatch]") {
  std::string body(2000, 'a');
  body[1023] = 'b';
  body[1024] = 'c';
  auto text = outcome_of(answer(400, body), context).text;
  CHECK(text == "POST http://app/orders answered 400 Bad Request: " + std::string(1023, 'a') +
                    "b [2000 bytes in all]");

  // A character across the 1 KiB mark is left out whole.
  text = outcome_of(answer(400, std::string(1023, 'a') + "\xC3\xA9" + "zz"), context).text;
  CHECK(text == "POST http://app/orders answered 400 Bad Request: " + std::string(1023, 'a') +
                    " [1027 bytes in all]");

  // Line breaks, controls and bytes that are not UTF-8 are escaped.
  text = outcome_of(answer(422, "line 1\r\nline 2\t\x01\x7f\xff caf\xC3\xA9"), context).text;
  CHECK(text ==
        "POST http://app/orders answered 422 Unprocessable Entity: line 1\\r\\nline "
        "2\\t\\x01\\x7F\\xFF caf\xC3\xA9");
  CHECK(text.find('\n') == std::string::npos);
  CHECK(text.find('\r') == std::string::npos);

  text = outcome_of(answer(500, std::string("nul\0byte", 8)), context).text;
  CHECK(text == "POST http://app/orders answered 500 Internal Server Error: nul\\x00byte");
}

TEST_CASE("A body the client cut still maps by its status, and the error says it was cut",
          "[dispatch]") {
  Response cut = answer(422, std::string(4096, 'x'));
  cut.body_cut = true;
  auto outcome = outcome_of(cut, context);
  CHECK(outcome.kind == OutcomeKind::permanent);
  CHECK(outcome.text ==
        "POST http://app/orders answered 422 Unprocessable Entity: " + std::string(1024, 'x') +
            " [answer longer than the client reads: cut at 4096 bytes]");

  cut.status = 200;
  CHECK(outcome_of(cut, context).kind == OutcomeKind::ack);
  cut.status = 503;
  CHECK(outcome_of(cut, context).kind == OutcomeKind::unavailable);
  cut.status = 500;
  CHECK(outcome_of(cut, context).kind == OutcomeKind::retry);
}

TEST_CASE("500, 408, 409 and any other status retry, after the Retry-After when there is one",
          "[dispatch]") {
  for (int status :
       {500, 408, 409, 100, 101, 301, 304, 307, 401, 403, 418, 499, 501, 505, 599, 0, 999, -1}) {
    CAPTURE(status);
    auto outcome = outcome_of(answer(status, "oops"), context);
    CHECK(outcome.kind == OutcomeKind::retry);
    CHECK_FALSE(outcome.delay);
    CHECK(outcome.text.find("POST http://app/orders answered " + std::to_string(status)) == 0);

    outcome = outcome_of(answer(status, "oops", {{"Retry-After", "42"}}), context);
    CHECK(outcome.kind == OutcomeKind::retry);
    REQUIRE(outcome.delay);
    CHECK(*outcome.delay == seconds(42));
  }
  CHECK(outcome_of(answer(500, "boom"), context).text ==
        "POST http://app/orders answered 500 Internal Server Error: boom");
  CHECK(outcome_of(answer(599, "odd"), context).text == "POST http://app/orders answered 599: odd");
  CHECK(outcome_of(answer(409, {}, {{"Retry-After", "garbage"}}), context).delay == std::nullopt);
}

TEST_CASE("Retryloop-Outcome overrides the status", "[dispatch]") {
  struct Case {
    const char* value;
    int status;
    OutcomeKind kind;
  };
  const Case cases[] = {
      {"ack", 500, OutcomeKind::ack},
      {"ACK", 422, OutcomeKind::ack},
      {"retry", 200, OutcomeKind::retry},
      {" Retry ", 422, OutcomeKind::retry},
      {"permanent", 200, OutcomeKind::permanent},
      {"Permanent", 503, OutcomeKind::permanent},
      {"poison", 200, OutcomeKind::poison},
      {"POISON", 500, OutcomeKind::poison},
      {"drop", 200, OutcomeKind::drop},
      {"\tdrop", 429, OutcomeKind::drop},
  };
  for (const Case& c : cases) {
    CAPTURE(c.value, c.status);
    auto outcome = outcome_of(answer(c.status, "why", {{"Retryloop-Outcome", c.value}}), context);
    CHECK(outcome.kind == c.kind);
    CHECK_FALSE(outcome.overloaded_dependency);
    CHECK_FALSE(outcome.delay);
  }
  CHECK(outcome_of(answer(200, "duplicate order", {{"retryloop-outcome", "drop"}}), context).text ==
        "POST http://app/orders answered 200 OK with Retryloop-Outcome: drop: duplicate order");
  CHECK(outcome_of(answer(200, "bad schema", {{"Retryloop-Outcome", "poison"}}), context).text ==
        "POST http://app/orders answered 200 OK with Retryloop-Outcome: poison: bad schema");
}

TEST_CASE("Retry-After applies to an overriding retry", "[dispatch]") {
  auto outcome =
      outcome_of(answer(200, {}, {{"Retryloop-Outcome", "retry"}, {"Retry-After", "90"}}), context);
  CHECK(outcome.kind == OutcomeKind::retry);
  REQUIRE(outcome.delay);
  CHECK(*outcome.delay == seconds(90));

  outcome = outcome_of(answer(422, {}, {{"Retryloop-Outcome", "permanent"}, {"Retry-After", "90"}}),
                       context);
  CHECK(outcome.kind == OutcomeKind::permanent);
  CHECK_FALSE(outcome.delay);
}

TEST_CASE("An unknown Retryloop-Outcome is a retry whose error names the value", "[dispatch]") {
  for (int status : {200, 422, 503}) {
    CAPTURE(status);
    auto outcome = outcome_of(answer(status, {}, {{"Retryloop-Outcome", "later"}}), context);
    CHECK(outcome.kind == OutcomeKind::retry);
    CHECK(outcome.text.find("with an unknown Retryloop-Outcome \"later\" (expected ack, retry, "
                            "permanent, poison or drop)") != std::string::npos);
  }
  auto outcome = outcome_of(
      answer(200, {}, {{"Retryloop-Outcome", "acknowledge"}, {"Retry-After", "7"}}), context);
  CHECK(outcome.kind == OutcomeKind::retry);
  REQUIRE(outcome.delay);
  CHECK(*outcome.delay == seconds(7));

  outcome = outcome_of(answer(200, {}, {{"Retryloop-Outcome", "a\x01\xff"}}), context);
  CHECK(outcome.kind == OutcomeKind::retry);
  CHECK(outcome.text.find("\"a\\x01\\xFF\"") != std::string::npos);

  // An empty value says nothing: the status decides.
  CHECK(outcome_of(answer(200, {}, {{"Retryloop-Outcome", ""}}), context).kind == OutcomeKind::ack);
  CHECK(outcome_of(answer(422, {}, {{"Retryloop-Outcome", "  "}}), context).kind ==
        OutcomeKind::permanent);
}

TEST_CASE("Error texts name the endpoint when no target is given", "[dispatch]") {
  CHECK(outcome_of(answer(500), AnswerContext{november_1994, {}}).text ==
        "the endpoint answered 500 Internal Server Error");
}

TEST_CASE("Retry-After in delay-seconds", "[dispatch]") {
  CHECK(parse_retry_after("120", november_1994) == milliseconds(120000));
  CHECK(parse_retry_after("0", november_1994) == milliseconds(0));
  CHECK(parse_retry_after("00042", november_1994) == milliseconds(42000));
  CHECK(parse_retry_after(" \t5 ", november_1994) == milliseconds(5000));
  CHECK(parse_retry_after("86399", november_1994) == milliseconds(86399000));
  // Longer waits, numbers too long for any integer included, saturate at the cap.
  CHECK(parse_retry_after("86400", november_1994) == dispatch::max_retry_after);
  CHECK(parse_retry_after("31536000", november_1994) == dispatch::max_retry_after);
  CHECK(parse_retry_after("99999999999999999999999999999999999999", november_1994) ==
        dispatch::max_retry_after);
}

TEST_CASE("Retry-After as an HTTP-date in each of its three forms", "[dispatch]") {
  const auto now = november_1994 - seconds(60);
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now) == milliseconds(60000));
  CHECK(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now) == milliseconds(60000));
  CHECK(parse_retry_after("Sun Nov  6 08:49:37 1994", now) == milliseconds(60000));
  CHECK(parse_retry_after("Sun Nov 06 08:49:37 1994", now) == milliseconds(60000));
  // Recipients are lenient about case and single-digit days.
  CHECK(parse_retry_after("sun, 6 nov 1994 08:49:37 gmt", now) == milliseconds(60000));

  // From a time between seconds.
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", november_1994 - milliseconds(1500)) ==
        milliseconds(1500));
  // A date now or in the past is no wait at all.
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", november_1994) == milliseconds(0));
  CHECK(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", november_1994) == milliseconds(0));
  CHECK(parse_retry_after("Sun Nov  6 08:49:36 1994", november_1994) == milliseconds(0));
  // A date far ahead is the cap.
  CHECK(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", november_1994) ==
        dispatch::max_retry_after);
  // Leap days and leap seconds.
  CHECK(parse_retry_after("Tue, 29 Feb 2000 00:00:00 GMT",
                          system_clock::time_point(seconds(951782400 - 10))) ==
        milliseconds(10000));
  CHECK(parse_retry_after("Sat, 31 Dec 2016 23:59:60 GMT",
                          system_clock::time_point(seconds(1483228800 - 10))) ==
        milliseconds(10000));
}

TEST_CASE("An RFC 850 date's two-digit year is at most 50 years ahead", "[dispatch]") {
  // From 2026: 76 is 2076 (50 years ahead), 77 is 1977.
  CHECK(parse_retry_after("Wednesday, 01-Jan-76 00:00:00 GMT", january_2026) ==
        dispatch::max_retry_after);
  CHECK(parse_retry_after("Saturday, 01-Jan-77 00:00:00 GMT", january_2026) == milliseconds(0));
  CHECK(parse_retry_after("Thursday, 01-Jan-26 00:00:10 GMT", january_2026) == milliseconds(10000));
}

TEST_CASE("Retry-After that is neither a number nor a date gives nothing", "[dispatch]") {
  const char* const invalid[] = {
      "",
      " ",
      "-5",
      "+5",
      "1.5",
      "5s",
      "5 s",
      "12 34",
      "0x10",
      "5\n",
      "soon",
      "Sun, 06 Nov 1994 08:49:37",
      "Sun, 06 Nov 1994 08:49:37 UTC",
      "Sun, 06 Nov 1994 08:49:37 GMT trailing",
      "Sun, 06 Nov 94 08:49:37 GMT",
      "Sun, 06 Nov 1994 8:49:37 GMT",
      "Sun, 31 Feb 1994 08:49:37 GMT",
      "Mon, 29 Feb 2100 08:49:37 GMT",
      "Sun, 00 Nov 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 24:00:00 GMT",
      "Sun, 06 Nov 1994 23:60:00 GMT",
      "Sun, 06 Nov 1994 23:59:61 GMT",
      "Sun, 06 Foo 1994 08:49:37 GMT",
      "Funday, 06-Nov-94 08:49:37 GMT",
      "Sunday, 06 Nov 1994 08:49:37 GMT",
      "Sun, 06-Nov-94 08:49:37 GMT",
      "Sunday, 06-Nov-1994 08:49:37 GMT",
      "Sun Nov  6 08:49:37 94",
      "Sun Nov  6 08:49:37 1994 GMT",
      "Sun,06 Nov 1994 08:49:37 GMT",
      "2026-01-01T00:00:00Z",
  };
  for (const char* value : invalid) {
    CAPTURE(value);
    CHECK_FALSE(parse_retry_after(value, november_1994));
  }
  CHECK_FALSE(parse_retry_after(std::string_view("1\0", 2), november_1994));
}

TEST_CASE("Retry-After and outcome_of take any bytes without failing", "[dispatch]") {
  std::mt19937 random(53);
  const std::string alphabet = "0123456789 ,-:SunNovGMTday\t\r\n\x01\xff";
  const std::string seeds[] = {"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
                               "Sun Nov  6 08:49:37 1994", "120"};
  for (int round = 0; round < 20000; ++round) {
    std::string value = seeds[round % 4];
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = value.empty() ? 0 : random() % value.size();
      const char c = alphabet[random() % alphabet.size()];
      switch (random() % 3) {
        case 0:
          if (!value.empty()) value[at] = c;
          break;
        case 1:
          value.insert(at, 1, c);
          break;
        default:
          if (!value.empty()) value.erase(at, 1);
      }
    }
    const auto now = system_clock::time_point(seconds(static_cast<int64_t>(random() % 4000000000)));
    auto wait = parse_retry_after(value, now);
    if (wait) {
      CHECK(*wait >= milliseconds(0));
      CHECK(*wait <= dispatch::max_retry_after);
    }
    auto outcome = outcome_of(answer(static_cast<int>(random() % 700), value,
                                     {{"Retry-After", value}, {"Retryloop-Outcome", value}}),
                              AnswerContext{now, value});
    CHECK(is_visible_ascii(outcome.text));
  }
  // The ends of the clock.
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", system_clock::time_point::min()) ==
        dispatch::max_retry_after);
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", system_clock::time_point::max()) ==
        milliseconds(0));
  CHECK(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", system_clock::time_point::min()));
  CHECK(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", system_clock::time_point::max()));
}
