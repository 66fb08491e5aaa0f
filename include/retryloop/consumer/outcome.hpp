#pragma once

#include <stdexcept>
#include <string>

namespace retryloop::consumer {

/// What a handler says became of a message.
enum class OutcomeKind {
  ack,        ///< done: basic.ack
  retry,      ///< failed, may succeed later: next attempt after the delay, or parking (exhausted)
  permanent,  ///< failed, will never succeed: parking at once (reason `permanent`)
  poison,     ///< cannot even be understood (bad format, a bug): parking at once (reason `poison`)
  drop,       ///< not wanted: acked and logged; the message is gone on purpose
};

/// A handler's verdict on one delivery. Build it with the named constructors:
/// `Outcome::retry("payment gateway timed out")`.
struct Outcome {
  OutcomeKind kind = OutcomeKind::ack;
  /// The error (retry, permanent, poison) or the reason (drop). Parking stores it, truncated to
  /// 4 KiB, in `retryloop-error`.
  std::string text;

  static Outcome ack() { return {OutcomeKind::ack, {}}; }
  static Outcome retry(std::string error) { return {OutcomeKind::retry, std::move(error)}; }
  static Outcome permanent(std::string error) { return {OutcomeKind::permanent, std::move(error)}; }
  static Outcome poison(std::string error) { return {OutcomeKind::poison, std::move(error)}; }
  static Outcome drop(std::string reason) { return {OutcomeKind::drop, std::move(reason)}; }
};

/// "ack", "retry", "permanent", "poison", "drop".
const char* to_string(OutcomeKind kind);

/// Throw this from a handler for a failure that retrying cannot fix: the message is parked with
/// reason `permanent`. Any other exception escaping a handler counts as `retry`.
class PermanentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace retryloop::consumer
