// Decodes arbitrary bytes as a field table. Oracle: a table that decodes re-encodes to the same
// bytes (booleans other than 0 and 1 become 1, as RabbitMQ reads them), and the re-encoding
// decodes and re-encodes to itself exactly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/amqp/field_table.hpp"

using namespace retryloop::amqp;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

std::string encode(const FieldTable& table) {
  std::string out;
  Writer w(out);
  w.table(table);
  check(!w.error());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  Reader reader(input);
  FieldTable table;
  reader.table(table);
  if (!reader.ok()) return 0;
  std::string_view consumed = input.substr(0, reader.position());

  std::string encoded = encode(table);
  check(encoded.size() == consumed.size());
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] == consumed[i]) continue;
    // Only a non-canonical boolean may change: 't' then a value above 1 that became 1.
    check(i > 0 && encoded[i - 1] == 't' && encoded[i] == 1 &&
          static_cast<uint8_t>(consumed[i]) > 1);
  }

  Reader again(encoded);
  FieldTable decoded;
  again.table(decoded);
  check(again.ok() && again.at_end());
  check(encode(decoded) == encoded);
  return 0;
}
