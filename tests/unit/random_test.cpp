// Random ids and numbers: each drawn from the operating system (getrandom) when it is made, so
// that no two processes share a stream of ids, and an error when the source fails.

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "retryloop/consumer/detail/instance_id.hpp"
#include "retryloop/random/detail/source.hpp"
#include "retryloop/random/os_random.hpp"
#include "retryloop/retry/backoff.hpp"

using namespace retryloop;
using namespace std::chrono_literals;

namespace {

/// What the scripted source was asked for, and what it answers.
struct Script {
  std::vector<size_t> asked;
  unsigned char next_byte = 0;
  /// Fill every byte with this instead of counting up, when set.
  int fill = -1;
  /// Answer at most this many bytes a call.
  size_t at_most = SIZE_MAX;
  /// Fail each call with this errno (EINTR only once).
  int fail_with = 0;
};
Script script;

ssize_t scripted_source(void* buffer, size_t length, unsigned int) {
  script.asked.push_back(length);
  if (script.fail_with != 0) {
    errno = script.fail_with;
    if (script.fail_with == EINTR) script.fail_with = 0;
    return -1;
  }
  const size_t n = std::min(length, script.at_most);
  auto* bytes = static_cast<unsigned char*>(buffer);
  for (size_t i = 0; i < n; ++i)
    bytes[i] = script.fill >= 0 ? static_cast<unsigned char>(script.fill) : script.next_byte++;
  return static_cast<ssize_t>(n);
}

/// Draws from scripted_source while it lives.
struct ScriptedSource {
  random::detail::Source previous;
  ScriptedSource() : previous(random::detail::replace_source(scripted_source)) { script = {}; }
  ~ScriptedSource() { random::detail::replace_source(previous); }
};

bool is_hex_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST_CASE("A random id spells 16 bytes drawn from the operating system for that id alone",
          "[random]") {
  ScriptedSource source;
  const std::string first = random::random_id();
  const std::vector<size_t> asked_for_first = script.asked;
  const std::string second = random::random_id();
  // 128 bits for each id, asked for when it is made: no engine seeded once (from 32 bits, or
  // any number of them) that later ids are derived from.
  CHECK(asked_for_first == std::vector<size_t>{16});
  CHECK(script.asked == std::vector<size_t>{16, 16});
  CHECK(first == "000102030405060708090a0b0c0d0e0f");
  CHECK(second == "101112131415161718191a1b1c1d1e1f");
}

TEST_CASE("Random ids made on many threads at once never repeat and are 32 hex digits",
          "[random]") {
  constexpr int threads = 8, per_thread = 20000;
  std::vector<std::vector<std::string>> made(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&made, t] {
      for (int i = 0; i < per_thread; ++i)
        made[t].push_back(random::random_id());
    });
  }
  for (auto& worker : workers)
    worker.join();
  std::set<std::string> seen;
  for (const auto& ids : made) {
    for (const auto& id : ids) {
      REQUIRE(is_hex_id(id));
      seen.insert(id);
    }
  }
  CHECK(seen.size() == size_t(threads) * per_thread);
}

TEST_CASE("A draw the kernel answers in parts, or interrupts, still fills every byte", "[random]") {
  ScriptedSource source;
  script.fail_with = EINTR;
  script.at_most = 5;
  CHECK(random::random_id() == "000102030405060708090a0b0c0d0e0f");
  CHECK(script.asked == std::vector<size_t>{16, 16, 11, 6, 1});
}

TEST_CASE("When the operating system's source fails, a random id is an error, never a weaker id",
          "[random]") {
  ScriptedSource source;
  script.fail_with = ENOSYS;
  std::error_code error;
  CHECK(random::random_id(error).empty());
  CHECK(error == std::errc::function_not_supported);
  CHECK_THROWS_AS(random::random_id(), std::system_error);
  CHECK_THROWS_WITH(random::random_id(), Catch::StartsWith("getrandom"));
  error.clear();
  CHECK(random::random_fraction(error) == 0.0);
  CHECK(error == std::errc::function_not_supported);
}

TEST_CASE(
    "When the operating system's source fails, a backoff's jitter and a consumer's instance id "
    "come from the clock: nothing throws in a loop's callback",
    "[random]") {
  ScriptedSource source;
  script.fail_with = ENOSYS;
  const retry::Backoff backoff{std::chrono::milliseconds(1000), std::chrono::milliseconds(1000),
                               2.0, 0.25};
  std::set<int64_t> seen;
  for (int i = 0; i < 50; ++i) {
    const auto delay = backoff.delay(0);
    CHECK(delay >= std::chrono::milliseconds(750));
    CHECK(delay <= std::chrono::milliseconds(1250));
    seen.insert(delay.count());
  }
  CHECK(seen.size() > 1);
  const std::string first = consumer::detail::instance_id();
  const std::string second = consumer::detail::instance_id();
  CHECK(first.substr(first.rfind('.')) != second.substr(second.rfind('.')));
}

TEST_CASE("A random fraction takes 53 bits from the operating system and stays below 1",
          "[random]") {
  ScriptedSource source;
  script.fill = 0xFF;
  std::error_code error;
  const double highest = random::random_fraction(error);
  CHECK_FALSE(error);
  CHECK(script.asked == std::vector<size_t>{8});
  CHECK(highest < 1.0);
  CHECK(highest == 1.0 - 0x1.0p-53);
  retry::Backoff backoff;
  backoff.initial = 1000ms;
  backoff.jitter = 0.25;
  CHECK(backoff.delay(0) == 1250ms);
  script.fill = 0;
  CHECK(random::random_fraction(error) == 0.0);
  CHECK(backoff.delay(0) == 750ms);
}
