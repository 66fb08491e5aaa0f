// Reads arbitrary bytes as a Retryloop-Headers field value, the typed JSON in which `retryloop
// dispatch` carries a message's headers, and decodes it. Oracle: nothing crashes or throws; a
// table it decodes encodes again to ASCII without a control character (a legal HTTP field
// value), and that encoding decodes to the same table and encodes to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "retryloop/dispatch/header_encoding.hpp"

using namespace retryloop;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto table = dispatch::decode_headers(input);
  if (!table) return 0;
  const std::string encoded = dispatch::encode_headers(*table);
  for (char c : encoded)
    check(c >= 0x20 && c < 0x7f);
  const auto again = dispatch::decode_headers(encoded);
  check(again.has_value());
  check(dispatch::encode_headers(*again) == encoded);
  return 0;
}
