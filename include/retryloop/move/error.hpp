#pragma once

#include <system_error>

namespace retryloop::move {

/// Why a walk or a move could not go on. They come in client::Error, whose text names the queue.
enum class MoveError {
  queue_missing = 1,     ///< the queue to read does not exist
  queue_unanswered = 2,  ///< the queue counts 0, and a basic.get to confirm it keeps failing
};

const std::error_category& move_category() noexcept;
std::error_code make_error_code(MoveError e) noexcept;

}  // namespace retryloop::move

namespace std {
template <>
struct is_error_code_enum<retryloop::move::MoveError> : true_type {};
}  // namespace std
