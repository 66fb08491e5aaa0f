#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "retryloop/outage/breaker.hpp"
#include "retryloop/outage/pacer.hpp"
#include "retryloop/outage/settings.hpp"
#include "retryloop/outage/sliding_window.hpp"
#include "retryloop/retry/retry_policy.hpp"

using namespace std::chrono_literals;
using namespace retryloop::outage;
using retryloop::retry::breaker_verdict;
using retryloop::retry::OutcomeKind;

namespace {

/// Every event the breaker reports, in order.
struct Events {
  std::vector<Event> seen;

  EventHandler handler() {
    return [this](const Event& event) { seen.push_back(event); };
  }
  std::vector<std::string> transitions() const {
    std::vector<std::string> out;
    for (const Event& e : seen) {
      out.push_back(std::string(to_string(e.from)) + " -> " + to_string(e.to) + " (" +
                    to_string(e.reason) + ", " + std::to_string(e.limit) + ")");
    }
    return out;
  }
};

Settings with_failure_rate(double threshold, std::chrono::milliseconds window, int minimum) {
  Settings settings;
  settings.failure_rate = FailureRate{threshold, window, minimum};
  return settings;
}

/// Starts a call at `now` and ends it at once with `verdict`.
void call(Breaker& breaker, Verdict verdict, std::chrono::milliseconds now) {
  std::optional<Call> started = breaker.try_start(0, now);
  REQUIRE(started);
  breaker.finished(*started, verdict, now);
}

/// Trips a breaker with default settings at `now` by K unavailable outcomes.
void trip(Breaker& breaker, std::chrono::milliseconds now) {
  for (int i = 0; i < breaker.settings().consecutive_unavailable; ++i)
    call(breaker, Verdict::unavailable, now);
  REQUIRE(breaker.state() == State::open);
}

/// Trips at `now`, probes when due and lets the probe succeed: the breaker is then ramping.
std::chrono::milliseconds trip_and_recover(Breaker& breaker, std::chrono::milliseconds now) {
  trip(breaker, now);
  const std::chrono::milliseconds probe_at = *breaker.wake_at();
  call(breaker, Verdict::success, probe_at);
  return probe_at;
}

}  // namespace

TEST_CASE(
    "The breaker opens after K unavailable outcomes in a row, and a success starts the "
    "count again",
    "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 8, events.handler());
  CHECK(breaker.state() == State::closed);
  CHECK(breaker.limit() == 8);
  for (int i = 0; i < 4; ++i)
    call(breaker, Verdict::unavailable, 10ms);
  call(breaker, Verdict::success, 20ms);
  for (int i = 0; i < 4; ++i)
    call(breaker, Verdict::unavailable, 30ms);
  CHECK(breaker.state() == State::closed);
  CHECK(events.seen.empty());

  call(breaker, Verdict::unavailable, 40ms);
  CHECK(breaker.state() == State::open);
  CHECK(breaker.limit() == 0);
  CHECK_FALSE(breaker.try_start(0, 41ms));
  CHECK(breaker.wake_at() == 40ms + 5s);
  CHECK(events.transitions() ==
        std::vector<std::string>{"closed -> open (consecutive_unavailable, 0)"});
  CHECK(events.seen[0].at == 40ms);
}

TEST_CASE("A closed breaker starts calls up to its concurrency", "[outage]") {
  Breaker breaker(Settings{}, 3);
  CHECK(breaker.try_start(0, 0ms));
  CHECK(breaker.try_start(2, 0ms));
  CHECK_FALSE(breaker.try_start(3, 0ms));
}

TEST_CASE("Unclassified failures trip the breaker only when the topology asks for a failure rate",
          "[outage]") {
  Breaker breaker(Settings{}, 8);
  for (int i = 0; i < 1000; ++i)
    call(breaker, Verdict::failure, std::chrono::milliseconds(i));
  CHECK(breaker.state() == State::closed);
  // Nor do they break a run of unavailable outcomes.
  for (int i = 0; i < 4; ++i)
    call(breaker, Verdict::unavailable, 2s);
  call(breaker, Verdict::failure, 2s);
  call(breaker, Verdict::unavailable, 2s);
  CHECK(breaker.state() == State::open);
}

TEST_CASE(
    "The failure-rate trip opens over its window once the minimum count is reached, even "
    "when no call ever succeeded",
    "[outage]") {
  Events events;
  Breaker breaker(with_failure_rate(0.5, 10s, 20), 8, events.handler());
  for (int i = 0; i < 19; ++i)
    call(breaker, Verdict::failure, std::chrono::milliseconds(10 * i));
  CHECK(breaker.state() == State::closed);
  call(breaker, Verdict::failure, 190ms);
  CHECK(breaker.state() == State::open);
  CHECK(events.transitions() == std::vector<std::string>{"closed -> open (failure_rate, 0)"});
}

TEST_CASE(
    "The failure-rate trip does not open below the minimum count or the threshold, and "
    "forgets results older than its window",
    "[outage]") {
  Breaker breaker(with_failure_rate(0.5, 10s, 20), 8);
  SECTION("below the minimum count") {
    for (int i = 0; i < 10; ++i)
      call(breaker, Verdict::failure, 0ms);
    // The first ten have left the window when the next ten come.
    for (int i = 0; i < 10; ++i)
      call(breaker, Verdict::failure, 11s);
    CHECK(breaker.state() == State::closed);
  }
  SECTION("below the threshold, then at it") {
    for (int i = 0; i < 11; ++i)
      call(breaker, Verdict::success, 0ms);
    for (int i = 0; i < 9; ++i)
      call(breaker, Verdict::failure, 1s);
    CHECK(breaker.state() == State::closed);  // 9 of 20
    call(breaker, Verdict::failure, 1s);
    CHECK(breaker.state() == State::closed);  // 10 of 21
    call(breaker, Verdict::failure, 1s);
    CHECK(breaker.state() == State::open);  // 11 of 22
  }
}

TEST_CASE("An open breaker lets one probe through per probe interval, no more", "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 8, events.handler());
  trip(breaker, 0ms);
  CHECK_FALSE(breaker.try_start(0, 1s));
  CHECK_FALSE(breaker.try_start(0, 4999ms));
  CHECK(breaker.wake_at() == 5s);

  breaker.tick(5s);
  CHECK(breaker.state() == State::probing);
  CHECK(breaker.limit() == 1);
  CHECK_FALSE(breaker.wake_at());
  std::optional<Call> probe = breaker.try_start(0, 5s);
  REQUIRE(probe);
  CHECK(probe->probe());
  CHECK_FALSE(breaker.try_start(0, 5s));
  CHECK_FALSE(breaker.try_start(0, 7s));

  breaker.finished(*probe, Verdict::unavailable, 8s);
  CHECK(breaker.state() == State::open);
  CHECK(breaker.wake_at() == 13s);
  CHECK_FALSE(breaker.try_start(0, 12999ms));
  // try_start applies a due probe itself, without a tick.
  std::optional<Call> second = breaker.try_start(0, 13s);
  REQUIRE(second);
  CHECK(second->probe());
  CHECK(breaker.stats(13s).probes == 2);
  CHECK(events.transitions() == std::vector<std::string>{
                                    "closed -> open (consecutive_unavailable, 0)",
                                    "open -> probing (probe_due, 1)",
                                    "probing -> open (probe_failed, 0)",
                                    "open -> probing (probe_due, 1)",
                                });
}

TEST_CASE(
    "A successful probe ramps the concurrency up, doubling per interval without failures, "
    "to the configured concurrency",
    "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 10, events.handler());
  const auto probed = trip_and_recover(breaker, 0ms);
  CHECK(probed == 5s);
  CHECK(breaker.state() == State::ramping);
  CHECK(breaker.limit() == 2);
  CHECK(breaker.try_start(1, 5s));
  CHECK_FALSE(breaker.try_start(2, 5s));
  CHECK(breaker.wake_at() == 7s);

  breaker.tick(6999ms);
  CHECK(breaker.limit() == 2);
  breaker.tick(7s);
  CHECK(breaker.limit() == 4);
  breaker.tick(9s);
  CHECK(breaker.limit() == 8);
  breaker.tick(11s);
  CHECK(breaker.state() == State::closed);
  CHECK(breaker.limit() == 10);
  CHECK_FALSE(breaker.wake_at());
  CHECK(events.transitions() == std::vector<std::string>{
                                    "closed -> open (consecutive_unavailable, 0)",
                                    "open -> probing (probe_due, 1)",
                                    "probing -> ramping (probe_succeeded, 2)",
                                    "ramping -> ramping (ramp_up, 4)",
                                    "ramping -> ramping (ramp_up, 8)",
                                    "ramping -> closed (ramp_up, 10)",
                                });
}

TEST_CASE("The ramp starts at an eighth of the concurrency, never below 2", "[outage]") {
  const std::pair<int, int> starts[] = {{2, 2}, {3, 2}, {16, 2}, {24, 3}, {32, 4}, {100, 12}};
  for (const auto& [concurrency, start] : starts) {
    Breaker breaker(Settings{}, concurrency);
    trip_and_recover(breaker, 0ms);
    CHECK(breaker.limit() == start);
  }
}

TEST_CASE("A service of concurrency 1 closes at the probe's success", "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 1, events.handler());
  trip_and_recover(breaker, 0ms);
  CHECK(breaker.state() == State::closed);
  CHECK(events.transitions().back() == "probing -> closed (probe_succeeded, 1)");
}

TEST_CASE(
    "A failure during the ramp halves the limit once, not below 2, the ramp then grows by a "
    "quarter, and only the trip rules open the breaker again",
    "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 16, events.handler());
  trip_and_recover(breaker, 0ms);
  breaker.tick(7s);
  breaker.tick(9s);
  REQUIRE(breaker.limit() == 8);

  std::vector<Call> running;
  for (int i = 0; i < 8; ++i)
    running.push_back(std::move(*breaker.try_start(i, 9s)));
  breaker.finished(running[0], Verdict::unavailable, 9500ms);
  CHECK(breaker.state() == State::ramping);
  CHECK(breaker.limit() == 4);
  CHECK(breaker.wake_at() == 9500ms + 2s);
  // The other calls started at the old limit: their failures do not step back again.
  breaker.finished(running[1], Verdict::unavailable, 9600ms);
  CHECK(breaker.limit() == 4);
  // A call started after the step back does.
  breaker.finished(*breaker.try_start(0, 9700ms), Verdict::unavailable, 9700ms);
  CHECK(breaker.limit() == 2);
  // At the floor a failure starts the interval again.
  breaker.finished(*breaker.try_start(0, 9800ms), Verdict::success, 9800ms);
  breaker.finished(*breaker.try_start(0, 9900ms), Verdict::unavailable, 9900ms);
  CHECK(breaker.state() == State::ramping);
  CHECK(breaker.limit() == 2);
  CHECK(breaker.wake_at() == 9900ms + 2s);
  // Backed off, it grows by a quarter, at least 1: 3, 4, 5, 6, 7, 8, 10.
  std::vector<int> limits;
  for (auto at = 11900ms; limits.size() < 7; at += 2s) {
    breaker.tick(at);
    limits.push_back(breaker.limit());
  }
  CHECK(limits == std::vector<int>{3, 4, 5, 6, 7, 8, 10});
  const std::vector<std::string> transitions = events.transitions();
  CHECK(std::count(transitions.begin(), transitions.end(), "ramping -> ramping (step_back, 4)") ==
        1);
  CHECK(std::count(transitions.begin(), transitions.end(), "ramping -> ramping (step_back, 2)") ==
        1);
  // A dependency that is down again (each failure of a new batch steps back on the way): K
  // unavailable in a row open it.
  const auto down = 30s;
  for (int i = 0; i < 5; ++i)
    breaker.finished(*breaker.try_start(0, down), Verdict::unavailable, down);
  CHECK(breaker.state() == State::open);
  CHECK(events.seen.back().reason == Reason::consecutive_unavailable);
  CHECK(breaker.stats(down).trips == 2);
}

TEST_CASE("A success during the ramp does not step back, and the ramp goes on", "[outage]") {
  Breaker breaker(Settings{}, 4);
  trip_and_recover(breaker, 0ms);
  call(breaker, Verdict::success, 6s);
  call(breaker, Verdict::not_counted, 6s);
  CHECK(breaker.limit() == 2);
  breaker.tick(7s);
  CHECK(breaker.state() == State::closed);
}

TEST_CASE("Calls still running when the breaker opened say nothing about the probe", "[outage]") {
  Breaker breaker(Settings{}, 8);
  std::vector<Call> running;
  for (int i = 0; i < 3; ++i)
    running.push_back(std::move(*breaker.try_start(i, 0ms)));
  trip(breaker, 0ms);
  breaker.finished(running[0], Verdict::success, 1s);
  CHECK(breaker.state() == State::open);
  breaker.tick(5s);
  std::optional<Call> probe = breaker.try_start(2, 5s);
  REQUIRE(probe);
  breaker.finished(running[1], Verdict::unavailable, 5100ms);
  breaker.finished(running[2], Verdict::success, 5200ms);
  CHECK(breaker.state() == State::probing);
  CHECK_FALSE(breaker.try_start(0, 5300ms));
  breaker.finished(*probe, Verdict::success, 5400ms);
  CHECK(breaker.state() == State::ramping);
}

TEST_CASE(
    "An operator's pause holds whatever the outcomes and the time, and resume starts with "
    "a probe",
    "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 8, events.handler());
  std::vector<Call> running;
  for (int i = 0; i < 6; ++i)
    running.push_back(std::move(*breaker.try_start(i, 0ms)));

  SECTION("from closed") {
    breaker.pause(1s);
    CHECK(breaker.state() == State::paused);
    CHECK(breaker.limit() == 0);
    CHECK_FALSE(breaker.try_start(0, 1s));
    for (Call& c : running)
      breaker.finished(c, Verdict::unavailable, 2s);
    CHECK(breaker.state() == State::paused);
    breaker.tick(1h);
    CHECK(breaker.state() == State::paused);
    CHECK_FALSE(breaker.wake_at());
    breaker.pause(1h);
    breaker.resume(1h + 1s);
    CHECK(breaker.state() == State::probing);
    CHECK(breaker.limit() == 1);
    breaker.resume(1h + 2s);
    CHECK(events.transitions() == std::vector<std::string>{
                                      "closed -> paused (paused, 0)",
                                      "paused -> probing (resumed, 1)",
                                  });
  }
  SECTION("from open, with a probe due while paused") {
    trip(breaker, 1s);
    breaker.pause(2s);
    breaker.tick(10s);
    CHECK(breaker.state() == State::paused);
    CHECK_FALSE(breaker.try_start(0, 10s));
    breaker.resume(11s);
    std::optional<Call> probe = breaker.try_start(0, 11s);
    REQUIRE(probe);
    breaker.finished(*probe, Verdict::success, 12s);
    CHECK(breaker.state() == State::ramping);
  }
  SECTION("from probing: the probe that was running no longer decides") {
    trip(breaker, 1s);
    std::optional<Call> probe = breaker.try_start(0, 6s);
    REQUIRE(probe);
    breaker.pause(7s);
    breaker.resume(8s);
    breaker.finished(*probe, Verdict::success, 9s);
    CHECK(breaker.state() == State::probing);
  }
}

TEST_CASE("Permanent and poison outcomes never count toward the breaker", "[outage]") {
  using retryloop::retry::Outcome;
  CHECK(breaker_verdict(Outcome::permanent("x")) == Verdict::not_counted);
  CHECK(breaker_verdict(Outcome::poison("x")) == Verdict::not_counted);
  CHECK(breaker_verdict(Outcome::unavailable("x")) == Verdict::unavailable);
  CHECK(breaker_verdict(Outcome::overloaded("x")) == Verdict::overloaded);
  CHECK(breaker_verdict(Outcome::retry("x")) == Verdict::failure);
  CHECK(breaker_verdict(Outcome::ack()) == Verdict::success);
  CHECK(breaker_verdict(Outcome::drop("x")) == Verdict::success);

  Breaker breaker(with_failure_rate(0.5, 10s, 20), 8);
  for (int i = 0; i < 4; ++i)
    call(breaker, Verdict::unavailable, 0ms);
  for (int i = 0; i < 1000; ++i)
    call(breaker, Verdict::not_counted, 1ms);
  // Four failures in the window, and still a run of four: neither trip is reached.
  CHECK(breaker.state() == State::closed);

  SECTION("a probe that ends not counted leaves the next call to probe") {
    call(breaker, Verdict::unavailable, 2ms);
    REQUIRE(breaker.state() == State::open);
    const auto due = *breaker.wake_at();
    std::optional<Call> probe = breaker.try_start(0, due);
    REQUIRE(probe);
    breaker.finished(*probe, Verdict::not_counted, due + 100ms);
    CHECK(breaker.state() == State::probing);
    std::optional<Call> next = breaker.try_start(0, due + 200ms);
    REQUIRE(next);
    CHECK(next->probe());
  }
}

TEST_CASE("The breaker counts its trips, its probes and the time it spent open", "[outage]") {
  Breaker breaker(Settings{}, 4);
  CHECK(breaker.stats(0ms).trips == 0);
  trip(breaker, 1s);
  CHECK(breaker.stats(3s).time_open == 2s);
  std::optional<Call> probe = breaker.try_start(0, 6s);
  breaker.finished(*probe, Verdict::success, 7s);
  const Stats stats = breaker.stats(60s);
  CHECK(stats.trips == 1);
  CHECK(stats.probes == 1);
  CHECK(stats.time_open == 6s);
}

TEST_CASE("The sliding window counts the results of its window and forgets older ones",
          "[outage]") {
  SlidingWindow window(10s, 10);
  window.record(0ms, true);
  window.record(500ms, false);
  window.record(9s, true);
  CHECK(window.totals(9500ms).results == 3);
  CHECK(window.totals(9500ms).failures == 2);
  // The slice of 0 ms and 500 ms leaves the window at 10 s.
  CHECK(window.totals(10s).results == 1);
  CHECK(window.totals(10s).failures == 1);
  CHECK(window.totals(25s).results == 0);
  window.record(25s, false);
  window.clear();
  CHECK(window.totals(25s).results == 0);
}

TEST_CASE("Breaker settings out of range are refused, each naming its key", "[outage]") {
  CHECK(check(Settings{}).empty());
  CHECK(check(with_failure_rate(1.0, 100ms, 1)).empty());

  auto keys = [](const Settings& settings) {
    std::vector<std::string> out;
    for (const auto& problem : check(settings))
      out.push_back(problem.key);
    return out;
  };
  Settings settings;
  settings.consecutive_unavailable = 0;
  settings.probe_interval = 99ms;
  settings.ramp.interval = 2h;
  settings.failure_rate = FailureRate{0.0, 0ms, 0};
  CHECK(keys(settings) == std::vector<std::string>{
                              "consecutive_unavailable",
                              "failure_rate.threshold",
                              "failure_rate.window",
                              "failure_rate.minimum_calls",
                              "probe_interval",
                              "ramp.interval",
                          });
  settings = with_failure_rate(1.5, 10s, 20);
  CHECK(keys(settings) == std::vector<std::string>{"failure_rate.threshold"});
}

TEST_CASE(
    "An overloaded dependency paces the calls but never trips the breaker nor lowers its limit, "
    "and a probe that gets it succeeded",
    "[outage]") {
  Events events;
  Breaker breaker(Settings{}, 32, events.handler());
  // 300 calls accepted over the last second, then a burst of 429s, far more than K in a row.
  for (int i = 0; i < 300; ++i)
    call(breaker, Verdict::success, 1000ms + std::chrono::milliseconds(i * 1000 / 300));
  std::vector<Call> batch;
  for (int i = 0; i < 20; ++i)
    batch.push_back(std::move(*breaker.try_start(0, 2s)));
  for (Call& started : batch)
    breaker.finished(started, Verdict::overloaded, 2s);
  CHECK(breaker.state() == State::closed);
  CHECK(breaker.limit() == 32);
  CHECK(breaker.stats(2s).trips == 0);
  REQUIRE(events.transitions() == std::vector<std::string>{"closed -> closed (overloaded, 32)"});
  CHECK(events.seen.front().rate == Approx(0.95 * 300).epsilon(0.02));  // once for the burst
  // Paced: the bucket is empty, and a call may start once a token has come in.
  CHECK_FALSE(breaker.try_start(0, 2s));
  CHECK(breaker.try_start(0, 2004ms));
  CHECK(breaker.wake_at().has_value());
  // Unavailable outcomes still trip it, and an open breaker forgets the pace.
  trip(breaker, 3s);
  CHECK(breaker.pace() == 0);
  // A probe answered 429: the dependency is up.
  breaker.tick(8s);
  breaker.finished(*breaker.try_start(0, 8s), Verdict::overloaded, 8s);
  CHECK(breaker.state() == State::ramping);
}

TEST_CASE("A pace is 95 % of what the dependency accepted in the last second", "[outage]") {
  Pacer pacer(2s);
  CHECK_FALSE(pacer.active());
  CHECK(pacer.try_take(0ms));
  // 60 calls accepted in the 200 ms since the first: 300 a second, measured over what there is.
  for (int i = 0; i < 60; ++i)
    pacer.accepted(std::chrono::milliseconds(i * 200 / 60));
  CHECK(pacer.overloaded(200ms));
  CHECK(pacer.rate() == Approx(285));
  // The same congestion: a 429 within a quarter of the interval changes nothing.
  CHECK_FALSE(pacer.overloaded(600ms));
  CHECK(pacer.rate() == Approx(285));
  // Over one second it lets through the rate and a burst no larger than 2 % of it.
  int started = 0;
  for (auto at = 200ms; at < 1200ms; at += 1ms)
    while (pacer.try_take(at))
      ++started;
  CHECK(started >= 280);
  CHECK(started <= 285);
  // Nothing accepted at all: the slowest pace, one call a second.
  Pacer starved(2s);
  CHECK(starved.overloaded(5s));
  CHECK(starved.rate() == Approx(1));
}

TEST_CASE(
    "A pace grows faster each interval without a 429 and is lifted once it holds nothing back",
    "[outage]") {
  Pacer pacer(2s);
  for (int i = 0; i < 100; ++i)
    pacer.accepted(std::chrono::milliseconds(i * 10));
  REQUIRE(pacer.overloaded(1s));
  REQUIRE(pacer.rate() == Approx(95));
  CHECK(pacer.due() == 3s);
  // Held back in each interval: +2.5 %, +5 %, +10 %, and no faster.
  double expected = 95;
  const double growth[] = {0.025, 0.05, 0.1, 0.1};
  auto at = 1s;
  for (double g : growth) {
    while (pacer.try_take(at)) {
    }
    at += 2s;
    CHECK_FALSE(pacer.tick(at));
    expected += expected * g;
    CHECK(pacer.rate() == Approx(expected));
  }
  // A new 429 starts the growth from 2.5 % again.
  for (int i = 0; i < 100; ++i)
    pacer.accepted(at + std::chrono::milliseconds(i * 10));
  at += 1s;
  REQUIRE(pacer.overloaded(at));
  CHECK(pacer.rate() == Approx(95));
  while (pacer.try_take(at)) {
  }
  at += 2s;
  pacer.tick(at);
  CHECK(pacer.rate() == Approx(95 * 1.025));
  // Two intervals in which it held nothing back: lifted.
  at += 2s;
  CHECK_FALSE(pacer.tick(at));
  at += 2s;
  CHECK(pacer.tick(at));
  CHECK_FALSE(pacer.active());
  CHECK_FALSE(pacer.due());
  CHECK(pacer.try_take(at));
}

TEST_CASE(
    "A 429's Retry-After lets no call through before it has passed, and the pace starts there",
    "[outage]") {
  Pacer pacer(2s);
  for (int i = 0; i < 100; ++i)
    pacer.accepted(std::chrono::milliseconds(i * 10));
  REQUIRE(pacer.overloaded(1s, 3s));
  CHECK(pacer.rate() == Approx(95));
  int early = 0;
  for (std::chrono::milliseconds at = 1s; at < 4s; at += 1ms)
    early += pacer.try_take(at) ? 1 : 0;
  CHECK(early == 0);
  // Later 429s of the same congestion: a shorter Retry-After brings nothing nearer, a longer one
  // pushes the quiet further.
  CHECK_FALSE(pacer.overloaded(1200ms, 1s));
  CHECK_FALSE(pacer.overloaded(1300ms, 3300ms));
  CHECK_FALSE(pacer.try_take(4500ms));
  // From the end of the quiet, the pace: 95 a second.
  int started = 0;
  for (auto at = 4600ms; at < 5600ms; at += 1ms)
    while (pacer.try_take(at))
      ++started;
  CHECK(started >= 90);
  CHECK(started <= 97);
  // The rate grows one interval after the first quiet's end, not during it.
  CHECK(pacer.due() == 6s);
  // A reset forgets the quiet with the rest.
  REQUIRE(pacer.overloaded(10s, 1h));
  pacer.reset();
  CHECK(pacer.try_take(10s));
}

TEST_CASE("An overloaded call with a Retry-After holds the breaker's calls until it has passed",
          "[outage]") {
  Breaker breaker(Settings{}, 8);
  std::optional<Call> call = breaker.try_start(0, 1s);
  REQUIRE(call);
  breaker.finished(*call, Verdict::overloaded, 1s, 5s);
  CHECK(breaker.state() == State::closed);
  CHECK_FALSE(breaker.try_start(0, 1s));
  CHECK_FALSE(breaker.try_start(0, 5999ms));
  CHECK(breaker.try_start(0, 6s));
}

TEST_CASE("A pace never holds a call back before the first 429 nor after a reset", "[outage]") {
  Pacer pacer(2s);
  for (int i = 0; i < 1000; ++i)
    CHECK(pacer.try_take(0ms));
  pacer.accepted(0ms);
  REQUIRE(pacer.overloaded(0ms));
  pacer.reset();
  CHECK(pacer.try_take(0ms));
  CHECK(pacer.rate() == 0);
}

TEST_CASE(
    "A probe dropped without an outcome (its delivery parked before its handler ran) lets the "
    "next call be the probe",
    "[outage]") {
  Breaker breaker(Settings{}, 8);
  trip(breaker, 0ms);
  {
    std::optional<Call> probe = breaker.try_start(0, 5s);
    REQUIRE(probe);
    CHECK(breaker.state() == State::probing);
    CHECK_FALSE(breaker.try_start(0, 5s));
  }
  std::optional<Call> next = breaker.try_start(0, 5100ms);
  REQUIRE(next);
  breaker.finished(*next, Verdict::success, 5200ms);
  CHECK(breaker.state() == State::ramping);
  CHECK(next->ended());
  breaker.finished(*next, Verdict::unavailable, 5300ms);  // ended: says nothing more
  CHECK(breaker.state() == State::ramping);

  // A call that outlives its breaker ends quietly.
  std::optional<Call> orphan;
  {
    Breaker gone(Settings{}, 8);
    orphan = gone.try_start(0, 0ms);
    REQUIRE(orphan);
  }
  CHECK(orphan->ended());
  orphan.reset();
}
