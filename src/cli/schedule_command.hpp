#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "retryloop/client/publish.hpp"

namespace retryloop::cli {

/// Adds `retryloop send` and `retryloop schedule stats|cancel`. The chosen command stores its exit
/// code in `exit_code` (or throws Failure).
void add_schedule_commands(CLI::App& app, int& exit_code);

/// A time written as `2026-11-27T10:15:00Z`, `2026-11-27T10:15:00.250+02:00` or with a space
/// instead of the `T`: milliseconds since the Unix epoch; nullopt for anything else.
std::optional<int64_t> parse_time(const std::string& text);

/// Milliseconds since the Unix epoch as `2026-11-27T10:15:00.250Z`.
std::string iso_time_ms(int64_t milliseconds);

/// What `retryloop send` reports of one message.
enum class SendOutcome {
  scheduled,  ///< confirmed: the broker holds it
  refused,    ///< returned, nacked, or the publish the broker closed the channel for: not held
  unknown,    ///< the channel or the connection ended before the broker answered: it may or may
              ///< not be held, and sending it again may schedule it twice
};

/// The outcome of one message of `send` from its publish's. `awaiting` is how many publishes
/// awaited their confirms when the channel ended (for `failed`). A channel that the broker
/// closes with 403 to 406 refused one publish (a body over its max_message_size is 406, a delay
/// level that is not declared 404): when that was the only one awaiting, it is the one refused.
/// With more awaiting, which one it was is not known: the broker most likely enqueued those
/// before it and dropped those after it, so each is unknown.
SendOutcome send_outcome(const client::PublishOutcome& publish, size_t awaiting);

}  // namespace retryloop::cli
