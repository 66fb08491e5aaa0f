#pragma once

#include <sys/types.h>

#include <cstddef>

namespace retryloop::random::detail {

/// What fill_random draws from: a function with getrandom(2)'s signature and contract (it may
/// return fewer bytes than asked, or -1 with errno set).
using Source = ssize_t (*)(void* buffer, size_t length, unsigned int flags);

/// Makes every draw call `source` (nullptr: getrandom again) and returns the source it replaces.
/// For tests, which observe how many bytes each draw asks for, or make the source fail. Draws
/// already running may still use the old source.
Source replace_source(Source source);

}  // namespace retryloop::random::detail
