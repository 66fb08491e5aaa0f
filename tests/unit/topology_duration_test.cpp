#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "retryloop/topology/duration.hpp"
#include "retryloop/topology/topology.hpp"

using namespace std::chrono_literals;
using retryloop::topology::duration_label;
using retryloop::topology::max_ttl;
using retryloop::topology::parse_duration;

TEST_CASE("Durations are a whole number followed by ms, s, m, h or d", "[topology]") {
  CHECK(parse_duration("250ms") == 250ms);
  CHECK(parse_duration("30s") == 30s);
  CHECK(parse_duration("5m") == 5min);
  CHECK(parse_duration("1h") == 1h);
  CHECK(parse_duration("14d") == std::chrono::hours(14 * 24));
  CHECK(parse_duration("0s") == 0ms);
  CHECK(parse_duration("007s") == 7s);
  CHECK(parse_duration("4294967295ms") == max_ttl);
}

TEST_CASE("Anything else is not a duration, and the reason says why", "[topology]") {
  std::string why;
  CHECK_FALSE(parse_duration("3x", &why));
  CHECK(why.find("is not a duration") == 0);
  CHECK_FALSE(parse_duration("", &why));
  CHECK(why.find("is empty") == 0);
  CHECK_FALSE(parse_duration("-5s", &why));
  CHECK(why.find("is negative") == 0);
  CHECK_FALSE(parse_duration("30", &why));
  CHECK(why.find("has no unit") == 0);
  CHECK_FALSE(parse_duration("99999999999999999999d", &why));
  CHECK(why.find("too long") != std::string::npos);
  CHECK_FALSE(parse_duration("200000000000000d", &why));
  CHECK(why.find("too long") != std::string::npos);
  for (const char* text :
       {"1.5s", "30 s", " 30s", "30s ", "s", "ms", "2w", "30S", "1h30m", "+5s", "5sec", "0x10s"}) {
    INFO(text);
    CHECK_FALSE(parse_duration(text));
  }
}

TEST_CASE("A duration's label uses the largest unit that divides it exactly", "[topology]") {
  CHECK(duration_label(250ms) == "250ms");
  CHECK(duration_label(30000ms) == "30s");
  CHECK(duration_label(90s) == "90s");
  CHECK(duration_label(1500ms) == "1500ms");
  CHECK(duration_label(300s) == "5m");
  CHECK(duration_label(120min) == "2h");
  CHECK(duration_label(48h) == "2d");
  CHECK(duration_label(std::chrono::hours(14 * 24)) == "14d");
  CHECK(duration_label(0ms) == "0ms");
  CHECK(duration_label(max_ttl) == "4294967295ms");
}

TEST_CASE("Labels parse back to the same duration", "[topology]") {
  for (auto ms : {1LL, 999LL, 1000LL, 61000LL, 3600000LL, 86400000LL, 4294967295LL}) {
    std::chrono::milliseconds d(ms);
    CHECK(parse_duration(duration_label(d)) == d);
  }
}
