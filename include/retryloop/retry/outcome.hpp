#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace retryloop::retry {

/// What a handler says became of a message.
enum class OutcomeKind {
  ack,        ///< done: basic.ack
  retry,      ///< failed, may succeed later: next attempt after the delay, or parking (exhausted)
  permanent,  ///< failed, will never succeed: parking at once (reason `permanent`)
  poison,     ///< cannot even be understood (bad format, a bug): parking at once (reason `poison`)
  drop,       ///< not wanted: acked and logged; the message is gone on purpose
  /// a dependency the handler needs is down: not the message's fault. Its service's breaker
  /// counts it, and the consumer keeps the message unsettled and uncharged, to run again when the
  /// breaker lets a call through (docs/outage.md). Only a message that is unavailable
  /// `consecutive_unavailable` times in a row while the breaker stays closed (the dependency
  /// answers the others) is charged, as a retry.
  unavailable,
};

/// A handler's verdict on one delivery. Build it with the named constructors:
/// `Outcome::retry("payment gateway timed out")`.
struct Outcome {
  OutcomeKind kind = OutcomeKind::ack;
  /// The error (retry, permanent, poison) or the reason (drop). Parking stores it, truncated to
  /// 4 KiB, in `retryloop-error`.
  std::string text;
  /// retry: how long the handler asks the message to wait (Outcome::retry_after); nullopt: the
  /// topology's delay for this attempt. An overloaded unavailable: how long the dependency asked
  /// to be left alone (a 429's Retry-After): no call starts before it has passed.
  std::optional<std::chrono::milliseconds> delay;
  /// unavailable only: the dependency answered that it is overloaded (Outcome::overloaded).
  bool overloaded_dependency = false;

  static Outcome ack() { return {OutcomeKind::ack, {}, {}}; }
  static Outcome retry(std::string error) { return {OutcomeKind::retry, std::move(error), {}}; }
  /// A retry that waits `delay` (an HTTP 429's Retry-After, a rate limit's reset time). It counts
  /// as an attempt like retry. With delay levels (republish mode) the message waits `delay`
  /// rounded up to the levels' base (never less than asked), at most their maximum; without
  /// them, the shortest delay tier that is at least as long (else the longest); in reject mode,
  /// the one delay. The log line says when the wait differs from the request.
  static Outcome retry_after(std::chrono::milliseconds delay, std::string error) {
    return {OutcomeKind::retry, std::move(error), delay};
  }
  static Outcome permanent(std::string error) {
    return {OutcomeKind::permanent, std::move(error), {}};
  }
  static Outcome poison(std::string error) { return {OutcomeKind::poison, std::move(error), {}}; }
  /// The dependency failed, not the message: "payments API refused the connection". It feeds the
  /// service's breaker, and costs the message no attempt (see OutcomeKind::unavailable).
  static Outcome unavailable(std::string error) {
    return {OutcomeKind::unavailable, std::move(error), {}};
  }
  /// The dependency answered, but is overloaded: "payments answered 429". Unavailable, so the
  /// message is held uncharged as for unavailable(), but the breaker does not take it as the
  /// dependency being down: it paces the calls to what the dependency accepted (outage::Pacer)
  /// and never trips on it (docs/outage.md).
  static Outcome overloaded(std::string error) {
    Outcome outcome{OutcomeKind::unavailable, std::move(error), {}};
    outcome.overloaded_dependency = true;
    return outcome;
  }
  /// Overloaded, and it said when to come back (a 429's Retry-After): no call to it starts before
  /// `quiet` has passed, and the pace starts from there.
  static Outcome overloaded(std::chrono::milliseconds quiet, std::string error) {
    Outcome outcome = overloaded(std::move(error));
    outcome.delay = quiet;
    return outcome;
  }
  static Outcome drop(std::string reason) { return {OutcomeKind::drop, std::move(reason), {}}; }
};

/// "ack", "retry", "permanent", "poison", "drop", "unavailable".
const char* to_string(OutcomeKind kind);

/// Throw this from a handler for a failure that retrying cannot fix: the message is parked with
/// reason `permanent`. Any other exception escaping a handler counts as `retry`.
class PermanentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throw this from a handler when a dependency is down (Outcome::unavailable), or derive the
/// client library's connection errors from it through ExceptionPolicy::on.
class UnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throw this from a handler to retry after a delay it knows (Outcome::retry_after).
class RetryAfterError : public std::runtime_error {
 public:
  RetryAfterError(std::chrono::milliseconds delay, const std::string& what)
      : std::runtime_error(what), delay_(delay) {}
  std::chrono::milliseconds delay() const { return delay_; }

 private:
  std::chrono::milliseconds delay_;
};

/// Maps the exceptions that escape a handler to outcomes, so that a handler can throw its
/// application's own exception types:
///
///     ExceptionPolicy policy;
///     policy.on<RateLimited>([](const RateLimited& e) {
///       return Outcome::retry_after(e.reset_in(), e.what());
///     });
///     policy.on<std::invalid_argument>([](const auto& e) { return Outcome::poison(e.what()); });
///
/// Rules are tried in the order they were added and the first whose type matches (the type or
/// one derived from it) decides. Without a matching rule: PermanentError is permanent,
/// UnavailableError unavailable, RetryAfterError a retry after its delay, any other exception a
/// retry with its what() (or "unknown exception escaped the handler").
class ExceptionPolicy {
 public:
  /// Exceptions of type E become map(e), a callable that takes `const E&` and returns an Outcome.
  template <class E, class Map>
  ExceptionPolicy& on(Map map) {
    rules_.push_back(
        [map = std::move(map)](const std::exception_ptr& error) -> std::optional<Outcome> {
          try {
            std::rethrow_exception(error);
          } catch (const E& e) {
            return Outcome(map(e));
          } catch (...) {
            return std::nullopt;
          }
        });
    return *this;
  }

  /// The outcome for `error`. Never throws: a rule that throws counts as a retry that says so.
  Outcome classify(const std::exception_ptr& error) const;

 private:
  std::vector<std::function<std::optional<Outcome>(const std::exception_ptr&)>> rules_;
};

}  // namespace retryloop::retry
