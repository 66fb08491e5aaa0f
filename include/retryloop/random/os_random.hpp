#pragma once

#include <cstddef>
#include <string>
#include <system_error>

namespace retryloop::random {

/// Fills `size` bytes at `data` from the operating system's random source, getrandom(2), which
/// blocks only until the kernel's pool is first seeded at boot. Returns the source's error (ENOSYS
/// on a kernel without getrandom, or what a seccomp filter answers): there is no weaker fallback,
/// and the bytes are then unspecified.
std::error_code fill_random(void* data, size_t size);

/// 32 lowercase hex digits spelling 16 bytes drawn from the operating system for this id alone:
/// 128 bits, with no state shared with other ids, threads or processes. Sets `error` and returns
/// an empty string when the source fails.
std::string random_id(std::error_code& error);

/// The same; throws std::system_error ("getrandom: ...") when the source fails.
std::string random_id();

/// A number in [0, 1) made of 53 bits drawn from the operating system. Sets `error` and returns
/// 0 when the source fails.
double random_fraction(std::error_code& error);

}  // namespace retryloop::random
