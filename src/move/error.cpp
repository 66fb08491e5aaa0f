#include "retryloop/move/error.hpp"

#include <string>

namespace retryloop::move {
namespace {

class MoveCategory : public std::error_category {
 public:
  const char* name() const noexcept override { return "retryloop move"; }
  std::string message(int value) const override {
    switch (static_cast<MoveError>(value)) {
      case MoveError::queue_missing:
        return "queue not found";
      case MoveError::queue_unanswered:
        return "queue did not answer whether it is empty";
    }
    return "unknown move error";
  }
};

}  // namespace

const std::error_category& move_category() noexcept {
  static const MoveCategory category;
  return category;
}

std::error_code make_error_code(MoveError e) noexcept {
  return {static_cast<int>(e), move_category()};
}

}  // namespace retryloop::move
