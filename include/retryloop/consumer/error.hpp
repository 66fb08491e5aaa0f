#pragma once

#include <system_error>

namespace retryloop::consumer {

/// Why a consumer could not use its service's topology. They come in client::Error, whose text
/// names the object.
enum class ConsumerError {
  topology_drift = 1,  ///< an object exists with other arguments than the topology wants
  topology_missing,    ///< an object declared elsewhere ("declare": false) does not exist
  broker_too_old,      ///< the service needs a later RabbitMQ (the in_queue retry mode: 4.3)
};

const std::error_category& consumer_category() noexcept;
std::error_code make_error_code(ConsumerError e) noexcept;

}  // namespace retryloop::consumer

namespace std {
template <>
struct is_error_code_enum<retryloop::consumer::ConsumerError> : true_type {};
}  // namespace std
