#include "retryloop/random/os_random.hpp"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "retryloop/random/detail/source.hpp"

namespace retryloop::random {

namespace {

std::atomic<detail::Source> current_source{nullptr};

constexpr size_t id_bytes = 16;

}  // namespace

namespace detail {

Source replace_source(Source source) {
  return current_source.exchange(source);
}

}  // namespace detail

std::error_code fill_random(void* data, size_t size) {
  const detail::Source source = current_source.load();
  auto* bytes = static_cast<unsigned char*>(data);
  size_t filled = 0;
  while (filled < size) {
    const ssize_t n = source != nullptr ? source(bytes + filled, size - filled, 0)
                                        : getrandom(bytes + filled, size - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::error_code(errno, std::generic_category());
    }
    if (n == 0) return std::make_error_code(std::errc::io_error);
    filled += size_t(n);
  }
  return {};
}

std::string random_id(std::error_code& error) {
  unsigned char bytes[id_bytes];
  error = fill_random(bytes, sizeof bytes);
  if (error) return {};
  static constexpr char digits[] = "0123456789abcdef";
  std::string id;
  id.reserve(2 * sizeof bytes);
  for (unsigned char byte : bytes) {
    id += digits[byte >> 4];
    id += digits[byte & 0xF];
  }
  return id;
}

std::string random_id() {
  std::error_code error;
  std::string id = random_id(error);
  if (error) throw std::system_error(error, "getrandom");
  return id;
}

double random_fraction(std::error_code& error) {
  uint64_t bits = 0;
  error = fill_random(&bits, sizeof bits);
  if (error) return 0.0;
  // The top 53 bits, the mantissa of a double: every value k / 2^53, 0 <= k < 2^53.
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace retryloop::random
