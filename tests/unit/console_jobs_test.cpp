// The parking console's queue of jobs and its bridge between threads, without a broker.

#include <uv.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "retryloop/console/detail/jobs.hpp"
#include "retryloop/console/detail/loop_bridge.hpp"

using namespace retryloop;
using namespace std::chrono_literals;
using console::detail::Job;
using console::detail::JobQueue;
using console::detail::LoopBridge;
using console::detail::Reply;

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

TEST_CASE("One scan waits at most and takes the latest filter; actions go ahead of it",
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

TEST_CASE("A request that timed out waiting for the loop is never run; one that ran answers",
          "[console]") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  std::atomic<int> runs{0};
  {
    LoopBridge bridge(&loop);
    // The loop is busy elsewhere: the wait times out, and the request must then never run.
    std::optional<Reply> late = bridge.call(
        [&] {
          ++runs;
          return Reply{200, "{}"};
        },
        50ms);
    CHECK_FALSE(late);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(runs == 0);

    std::optional<Reply> answered;
    std::thread caller([&] {
      answered = bridge.call(
          [&] {
            ++runs;
            return Reply{202, "{}"};
          },
          10s);
    });
    while (runs == 0)
      uv_run(&loop, UV_RUN_NOWAIT);
    caller.join();
    REQUIRE(answered);
    CHECK(answered->status == 202);
    CHECK(runs == 1);

    bridge.close();
    CHECK_FALSE(bridge.call([] { return Reply{}; }, 10s));
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}
