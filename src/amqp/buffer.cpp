#include "retryloop/amqp/buffer.hpp"

#include <type_traits>
#include <variant>

namespace retryloop::amqp {

// ---- Writer ----

void Writer::table(const FieldTable& table) {
  table_at_depth(table, 1);
}

void Writer::array(const FieldArray& array) {
  array_at_depth(array, 1);
}

void Writer::field_value(const FieldValue& value) {
  value_at_depth(value, 0);
}

void Writer::table_at_depth(const FieldTable& table, int depth) {
  if (depth > max_nesting_) {
    fail(CodecError::nesting_too_deep);
    return;
  }
  size_t at = out_.size();
  u32(0);
  for (const FieldEntry& entry : table) {
    short_string(entry.name);
    value_at_depth(entry.value, depth);
    if (error_) return;
  }
  patch_size(at);
}

void Writer::array_at_depth(const FieldArray& array, int depth) {
  if (depth > max_nesting_) {
    fail(CodecError::nesting_too_deep);
    return;
  }
  size_t at = out_.size();
  u32(0);
  for (const FieldValue& value : array) {
    value_at_depth(value, depth);
    if (error_) return;
  }
  patch_size(at);
}

void Writer::value_at_depth(const FieldValue& value, int depth) {
  u8(static_cast<uint8_t>(value.type_letter()));
  std::visit(
      [this, depth](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Void>) {
        } else if constexpr (std::is_same_v<T, bool>) {
          u8(v ? 1 : 0);
        } else if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>) {
          u8(static_cast<uint8_t>(v));
        } else if constexpr (std::is_same_v<T, int16_t> || std::is_same_v<T, uint16_t>) {
          u16(static_cast<uint16_t>(v));
        } else if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t>) {
          u32(static_cast<uint32_t>(v));
        } else if constexpr (std::is_same_v<T, int64_t>) {
          u64(static_cast<uint64_t>(v));
        } else if constexpr (std::is_same_v<T, float>) {
          f32(v);
        } else if constexpr (std::is_same_v<T, double>) {
          f64(v);
        } else if constexpr (std::is_same_v<T, Decimal>) {
          u8(v.scale);
          u32(v.value);
        } else if constexpr (std::is_same_v<T, std::string>) {
          long_string(v);
        } else if constexpr (std::is_same_v<T, ByteArray>) {
          long_string(v.bytes);
        } else if constexpr (std::is_same_v<T, FieldArray>) {
          array_at_depth(v, depth + 1);
        } else if constexpr (std::is_same_v<T, Timestamp>) {
          u64(v.seconds);
        } else {
          static_assert(std::is_same_v<T, FieldTable>);
          table_at_depth(v, depth + 1);
        }
      },
      value.storage());
}

// ---- Reader ----

namespace {

// Counts the well-formed entries (named) or values of a table or array body without decoding
// them, so that the decoder can reserve once. Stops at the first malformed entry; the decoder
// reports it.
size_t count_fields(std::string_view body, bool named) {
  auto p = reinterpret_cast<const unsigned char*>(body.data());
  size_t size = body.size();
  size_t pos = 0;
  size_t count = 0;
  while (pos < size) {
    if (named) {
      pos += 1 + size_t{p[pos]};
      if (pos >= size) break;
    }
    size_t skip = 0;
    switch (p[pos++]) {
      case 'V':
        break;
      case 't':
      case 'b':
      case 'B':
        skip = 1;
        break;
      case 's':
      case 'u':
        skip = 2;
        break;
      case 'I':
      case 'i':
      case 'f':
        skip = 4;
        break;
      case 'D':
        skip = 5;
        break;
      case 'l':
      case 'd':
      case 'T':
        skip = 8;
        break;
      case 'S':
      case 'x':
      case 'A':
      case 'F':
        if (size - pos < 4) return count;
        skip = 4 + ((size_t{p[pos]} << 24) | (size_t{p[pos + 1]} << 16) |
                    (size_t{p[pos + 2]} << 8) | p[pos + 3]);
        break;
      default:
        return count;
    }
    if (size - pos < skip) break;
    pos += skip;
    ++count;
  }
  return count;
}

}  // namespace

void Reader::table(FieldTable& out) {
  table_at_depth(out, 1);
}

void Reader::array(FieldArray& out) {
  array_at_depth(out, 1);
}

void Reader::field_value(char type, FieldValue& out) {
  value_at_depth(type, out, 0);
}

void Reader::table_at_depth(FieldTable& out, int depth) {
  out.clear();
  if (depth > max_nesting_) {
    fail(CodecError::nesting_too_deep);
    return;
  }
  uint32_t length = u32();
  if (!need(length)) return;
  // Read the entries from a view that ends where the table ends, so that an entry running past
  // the declared length is truncated rather than read from what follows.
  std::string_view whole = data_;
  size_t end = pos_ + length;
  data_ = whole.substr(0, end);
  out.reserve(count_fields(data_.substr(pos_), true));
  while (pos_ < end) {
    std::string_view name = short_string_view();
    char type = static_cast<char>(u8());
    if (error_) break;
    value_at_depth(type, out.append_void(name), depth);
    if (error_) break;
  }
  data_ = whole;
  if (error_) pos_ = data_.size();
}

void Reader::array_at_depth(FieldArray& out, int depth) {
  out.clear();
  if (depth > max_nesting_) {
    fail(CodecError::nesting_too_deep);
    return;
  }
  uint32_t length = u32();
  if (!need(length)) return;
  std::string_view whole = data_;
  size_t end = pos_ + length;
  data_ = whole.substr(0, end);
  out.reserve(count_fields(data_.substr(pos_), false));
  while (pos_ < end) {
    char type = static_cast<char>(u8());
    out.emplace_back();
    value_at_depth(type, out.back(), depth);
    if (error_) break;
  }
  data_ = whole;
  if (error_) pos_ = data_.size();
}

void Reader::value_at_depth(char type, FieldValue& out, int depth) {
  FieldValue::Storage& s = out.storage();
  switch (type) {
    case 't':
      s.emplace<bool>(u8() != 0);
      break;
    case 'b':
      s.emplace<int8_t>(static_cast<int8_t>(u8()));
      break;
    case 'B':
      s.emplace<uint8_t>(u8());
      break;
    case 's':
      s.emplace<int16_t>(static_cast<int16_t>(u16()));
      break;
    case 'u':
      s.emplace<uint16_t>(u16());
      break;
    case 'I':
      s.emplace<int32_t>(static_cast<int32_t>(u32()));
      break;
    case 'i':
      s.emplace<uint32_t>(u32());
      break;
    case 'l':
      s.emplace<int64_t>(static_cast<int64_t>(u64()));
      break;
    case 'f':
      s.emplace<float>(f32());
      break;
    case 'd':
      s.emplace<double>(f64());
      break;
    case 'D': {
      uint8_t scale = u8();
      s.emplace<Decimal>(Decimal{scale, u32()});
      break;
    }
    case 'S':
      // From a string: emplace<std::string>(view) would build and move a temporary variant.
      s.emplace<std::string>(std::string(long_string_view()));
      break;
    case 'x':
      s.emplace<ByteArray>(ByteArray{std::string(long_string_view())});
      break;
    case 'A':
      array_at_depth(s.emplace<FieldArray>(), depth + 1);
      break;
    case 'T':
      s.emplace<Timestamp>(Timestamp{u64()});
      break;
    case 'F':
      table_at_depth(s.emplace<FieldTable>(), depth + 1);
      break;
    case 'V':
      s.emplace<Void>();
      break;
    default:
      fail(CodecError::unknown_field_type);
      break;
  }
}

}  // namespace retryloop::amqp
