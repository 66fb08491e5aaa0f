#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace retryloop::dispatch::detail {

// The code point of the UTF-8 sequence at `i`, moving `i` past it; nullopt for a byte that does
// not start a well-formed sequence (overlong forms, surrogates and values above U+10FFFF are not
// well-formed), moving `i` past that one byte.
inline std::optional<uint32_t> next_code_point(std::string_view text, size_t& i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  if (lead < 0x80) {
    ++i;
    return lead;
  }
  size_t extra = 0;
  unsigned char low = 0x80, high = 0xBF;
  uint32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    extra = 1;
    code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    extra = 2;
    code = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    extra = 3;
    code = lead & 0x07;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    ++i;
    return std::nullopt;
  }
  if (text.size() - i <= extra) {
    ++i;
    return std::nullopt;
  }
  for (size_t k = 1; k <= extra; ++k) {
    const auto next = static_cast<unsigned char>(text[i + k]);
    if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) {
      ++i;
      return std::nullopt;
    }
    code = (code << 6) | (next & 0x3F);
  }
  i += extra + 1;
  return code;
}

inline bool is_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (!next_code_point(text, i)) return false;
  }
  return true;
}

}  // namespace retryloop::dispatch::detail
