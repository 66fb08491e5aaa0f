#include "retryloop/consumer/error.hpp"

#include <string>

namespace retryloop::consumer {
namespace {

class ConsumerCategory : public std::error_category {
 public:
  const char* name() const noexcept override { return "retryloop consumer"; }
  std::string message(int value) const override {
    switch (static_cast<ConsumerError>(value)) {
      case ConsumerError::topology_drift:
        return "topology drift";
      case ConsumerError::topology_missing:
        return "topology object missing";
      case ConsumerError::broker_too_old:
        return "the broker is too old for the topology";
    }
    return "unknown consumer error";
  }
};

}  // namespace

const std::error_category& consumer_category() noexcept {
  static const ConsumerCategory category;
  return category;
}

std::error_code make_error_code(ConsumerError e) noexcept {
  return {static_cast<int>(e), consumer_category()};
}

}  // namespace retryloop::consumer
