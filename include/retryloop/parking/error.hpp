#pragma once

#include <system_error>

namespace retryloop::parking {

/// Why a parking operation could not start. They come in client::Error, whose text names the
/// queue.
enum class ParkingError {
  queue_missing = 1,  ///< the parking queue, or replay's target queue, does not exist
  no_delay_levels,    ///< replay of unrouted retries for a service without delay levels
};

const std::error_category& parking_category() noexcept;
std::error_code make_error_code(ParkingError e) noexcept;

}  // namespace retryloop::parking

namespace std {
template <>
struct is_error_code_enum<retryloop::parking::ParkingError> : true_type {};
}  // namespace std
