#include "retryloop/parking/error.hpp"

#include <string>

namespace retryloop::parking {
namespace {

class ParkingCategory : public std::error_category {
 public:
  const char* name() const noexcept override { return "retryloop parking"; }
  std::string message(int value) const override {
    switch (static_cast<ParkingError>(value)) {
      case ParkingError::queue_missing:
        return "queue not found";
      case ParkingError::no_delay_levels:
        return "the service has no delay levels";
    }
    return "unknown parking error";
  }
};

}  // namespace

const std::error_category& parking_category() noexcept {
  static const ParkingCategory category;
  return category;
}

std::error_code make_error_code(ParkingError e) noexcept {
  return {static_cast<int>(e), parking_category()};
}

}  // namespace retryloop::parking
