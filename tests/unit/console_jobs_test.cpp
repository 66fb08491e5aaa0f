// The parking console's queue of jobs, without a broker.

#include <catch2/catch.hpp>

#include <chrono>

#include "retryloop/console/detail/jobs.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using console::detail::Job;
using console::detail::JobQueue;

namespace {

parking::Filter reason_filter(const std::string& reason) {
  parking::Filter filter;
  filter.reasons = {reason};
  return filter;
}

}  // namespace

TEST_CASE("The scan that follows an action keeps a filter the user asked for meanwhile",
          "[console]") {
  JobQueue jobs;
  auto shown = reason_filter("poison");
  auto replay = jobs.make(Job::Kind::replay, shown, {{"reasons", {"poison"}}});
  jobs.push_action(replay);
  REQUIRE(jobs.pop() == replay);

  // While the replay runs, the user applies another filter.
  jobs.request_scan(reason_filter("exhausted"), {{"reasons", {"exhausted"}}}, false);
  // The replay ends: the counts are read again, with the filter shown before.
  jobs.refresh(shown, {{"reasons", {"poison"}}});

  auto scan = jobs.pop();
  REQUIRE(scan);
  CHECK(scan->kind == Job::Kind::scan);
  CHECK(scan->filter.reasons == std::vector<std::string>{"exhausted"});
  CHECK(scan->filter_json == nlohmann::json({{"reasons", {"exhausted"}}}));
  CHECK_FALSE(scan->automatic);
  CHECK(jobs.empty());

  jobs.refresh(shown, {{"reasons", {"poison"}}});
  auto refresh = jobs.pop();
  REQUIRE(refresh);
  CHECK(refresh->filter.reasons == std::vector<std::string>{"poison"});
}

TEST_CASE("One scan waits at most and takes the latest filter, and actions go ahead of it",
          "[console]") {
  JobQueue jobs;
  jobs.request_scan({}, nlohmann::json::object(), true);
  jobs.request_scan(reason_filter("poison"), {{"reasons", {"poison"}}}, false);
  auto purge = jobs.make(Job::Kind::purge, {}, nlohmann::json::object());
  jobs.push_action(purge);
  REQUIRE(jobs.waiting_action() == purge.get());
  REQUIRE(jobs.waiting_scan() != nullptr);
  CHECK(jobs.pop() == purge);
  auto scan = jobs.pop();
  REQUIRE(scan);
  CHECK(scan->filter.reasons == std::vector<std::string>{"poison"});
  CHECK_FALSE(scan->automatic);
  CHECK(jobs.pop() == nullptr);
}

TEST_CASE("An action stopped before it started ends as stopped, for the page to see", "[console]") {
  JobQueue jobs;
  jobs.request_scan({}, nlohmann::json::object(), false);
  auto count = jobs.make(Job::Kind::count, {}, nlohmann::json::object());
  jobs.push_action(count);
  auto stopped = jobs.stop_waiting_action();
  REQUIRE(stopped == count);
  CHECK(stopped->state == Job::State::done);
  CHECK(stopped->interrupted);
  CHECK(jobs.waiting_action() == nullptr);
  CHECK(jobs.waiting_scan() != nullptr);
  CHECK(jobs.stop_waiting_action() == nullptr);
}
