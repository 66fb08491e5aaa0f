#include "retryloop/outage/settings.hpp"

namespace retryloop::outage {
namespace {

constexpr std::chrono::milliseconds shortest_interval{100};
constexpr std::chrono::milliseconds longest_interval = std::chrono::hours(1);
constexpr int most_calls = 1000000;

void check_interval(std::vector<SettingProblem>& problems, const char* key,
                    std::chrono::milliseconds value) {
  if (value < shortest_interval || value > longest_interval) {
    problems.push_back({key, "must be from 100ms to 1h"});
  }
}

}  // namespace

std::vector<SettingProblem> check(const Settings& settings) {
  std::vector<SettingProblem> problems;
  if (settings.consecutive_unavailable < 1 || settings.consecutive_unavailable > most_calls) {
    problems.push_back(
        {"consecutive_unavailable",
         "must be from 1 to 1000000, not " + std::to_string(settings.consecutive_unavailable)});
  }
  if (settings.failure_rate) {
    const FailureRate& rate = *settings.failure_rate;
    if (!(rate.threshold > 0.0 && rate.threshold <= 1.0)) {
      problems.push_back({"failure_rate.threshold",
                          "must be above 0 and at most 1 (the fraction of calls that failed)"});
    }
    check_interval(problems, "failure_rate.window", rate.window);
    if (rate.minimum_calls < 1 || rate.minimum_calls > most_calls) {
      problems.push_back({"failure_rate.minimum_calls",
                          "must be from 1 to 1000000, not " + std::to_string(rate.minimum_calls)});
    }
  }
  check_interval(problems, "probe_interval", settings.probe_interval);
  check_interval(problems, "ramp.interval", settings.ramp.interval);
  return problems;
}

}  // namespace retryloop::outage
