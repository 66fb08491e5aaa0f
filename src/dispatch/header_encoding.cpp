#include "retryloop/dispatch/header_encoding.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "retryloop/amqp/buffer.hpp"
#include "retryloop/dispatch/detail/utf8.hpp"

namespace retryloop::dispatch {
namespace {

constexpr char hex_digits[] = "0123456789abcdef";
constexpr char base64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                           static_cast<unsigned char>(bytes[i + 2]);
    out += base64_digits[group >> 18];
    out += base64_digits[(group >> 12) & 63];
    out += base64_digits[(group >> 6) & 63];
    out += base64_digits[group & 63];
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) group |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += base64_digits[group >> 18];
    out += base64_digits[(group >> 12) & 63];
    out += rest == 2 ? base64_digits[(group >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// RFC 4648 base64, padded or not; nullopt for any other character or a length no encoding has.
std::optional<std::string> unbase64(std::string_view text) {
  if (text.size() % 4 == 0 && !text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 3 && !text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t group = 0;
  int bits = 0;
  for (char c : text) {
    const int value = base64_value(c);
    if (value < 0) return std::nullopt;
    group = (group << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((group >> bits) & 0xFF);
    }
  }
  return out;
}

void write_escape(std::string& out, uint32_t unit) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4)
    out += hex_digits[(unit >> shift) & 0xF];
}

// `text` (valid UTF-8) as a JSON string of ASCII characters only.
void write_string(std::string& out, std::string_view text) {
  out += '"';
  size_t i = 0;
  while (i < text.size()) {
    const uint32_t code = detail::next_code_point(text, i).value_or(0xFFFD);
    if (code == '"') {
      out += "\\\"";
    } else if (code == '\\') {
      out += "\\\\";
    } else if (code == '\n') {
      out += "\\n";
    } else if (code == '\r') {
      out += "\\r";
    } else if (code == '\t') {
      out += "\\t";
    } else if (code >= 0x20 && code < 0x7F) {
      out += static_cast<char>(code);
    } else if (code < 0x10000) {
      write_escape(out, code);
    } else {
      const uint32_t offset = code - 0x10000;
      write_escape(out, 0xD800 + (offset >> 10));
      write_escape(out, 0xDC00 + (offset & 0x3FF));
    }
  }
  out += '"';
}

template <class Float>
void write_floating(std::string& out, Float value) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
  } else if (std::isinf(value)) {
    out += value < 0 ? "\"-Infinity\"" : "\"Infinity\"";
  } else {
    char text[64];
    auto [end, status] = std::to_chars(text, text + sizeof text, value);
    std::string_view number(text, static_cast<size_t>(end - text));
    out += number;
    // A number without a point or an exponent reads back as an integer, and "-0" as 0.
    if (status == std::errc() && number.find_first_of(".e") == std::string_view::npos) {
      out += ".0";
    }
  }
}

void write_decimal(std::string& out, const amqp::Decimal& decimal) {
  std::string digits = std::to_string(decimal.value);
  if (decimal.scale > 0) {
    if (digits.size() <= decimal.scale) digits.insert(0, decimal.scale + 1 - digits.size(), '0');
    digits.insert(digits.size() - decimal.scale, 1, '.');
  }
  out += '"';
  out += digits;
  out += '"';
}

void write_table(std::string& out, const amqp::FieldTable& table);

template <class Write>
void write_tagged(std::string& out, char tag, Write write) {
  out += "{\"";
  out += tag;
  out += "\":";
  write();
  out += '}';
}

void write_value(std::string& out, const amqp::FieldValue& value) {
  const char tag = value.type_letter();
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, amqp::Void>) {
          out += "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out += std::to_string(v);
        } else if constexpr (std::is_integral_v<T>) {
          write_tagged(out, tag, [&] { out += std::to_string(v); });
        } else if constexpr (std::is_floating_point_v<T>) {
          write_tagged(out, tag, [&] { write_floating(out, v); });
        } else if constexpr (std::is_same_v<T, amqp::Decimal>) {
          write_tagged(out, tag, [&] { write_decimal(out, v); });
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (detail::is_utf8(v)) {
            write_string(out, v);
          } else {
            write_tagged(out, tag, [&] { write_string(out, base64(v)); });
          }
        } else if constexpr (std::is_same_v<T, amqp::ByteArray>) {
          write_tagged(out, tag, [&] { write_string(out, base64(v.bytes)); });
        } else if constexpr (std::is_same_v<T, amqp::Timestamp>) {
          write_tagged(out, tag, [&] { out += std::to_string(v.seconds); });
        } else if constexpr (std::is_same_v<T, amqp::FieldArray>) {
          out += '[';
          for (size_t i = 0; i < v.size(); ++i) {
            if (i > 0) out += ',';
            write_value(out, v[i]);
          }
          out += ']';
        } else {
          static_assert(std::is_same_v<T, amqp::FieldTable>);
          write_tagged(out, tag, [&] { write_table(out, v); });
        }
      },
      value.storage());
}

void write_table(std::string& out, const amqp::FieldTable& table) {
  std::unordered_set<std::string_view> written;
  out += '{';
  bool first = true;
  for (const auto& entry : table) {
    if (!detail::is_utf8(entry.name) || !written.insert(entry.name).second) continue;
    if (!first) out += ',';
    first = false;
    write_string(out, entry.name);
    out += ':';
    write_value(out, entry.value);
  }
  out += '}';
}

using json = nlohmann::json;

// A JSON value that a type tag gives its meaning to.
struct Raw {
  enum class Kind { none, null, boolean, integer, floating, string, array, table };
  Kind kind = Kind::none;
  bool boolean = false;
  bool negative = false;
  uint64_t magnitude = 0;
  // A floating number written as an integer: one too large for any integer type.
  bool integral = false;
  std::string text;
  amqp::FieldArray array;
  amqp::FieldTable table;

  static Raw of_integer(int64_t value) {
    Raw raw;
    raw.kind = Kind::integer;
    raw.negative = value < 0;
    raw.magnitude = raw.negative ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
    return raw;
  }

  std::string describe() const {
    switch (kind) {
      case Kind::null:
        return "null";
      case Kind::boolean:
        return boolean ? "true" : "false";
      case Kind::integer:
        return (negative ? "-" : "") + std::to_string(magnitude);
      case Kind::floating:
        return text;
      case Kind::string:
        return "a string";
      case Kind::array:
        return "an array";
      case Kind::table:
        return "an object";
      case Kind::none:
        break;
    }
    return "nothing";
  }
};

template <class Int>
std::optional<Int> integer_as(const Raw& raw) {
  if (raw.kind != Raw::Kind::integer) return std::nullopt;
  if (raw.negative) {
    if constexpr (std::is_signed_v<Int>) {
      const uint64_t limit = static_cast<uint64_t>(-(std::numeric_limits<Int>::min() + 1)) + 1;
      if (raw.magnitude > limit) return std::nullopt;
      return static_cast<Int>(0 - static_cast<int64_t>(raw.magnitude - 1) - 1);
    } else {
      return std::nullopt;
    }
  }
  if (raw.magnitude > static_cast<uint64_t>(std::numeric_limits<Int>::max())) return std::nullopt;
  return static_cast<Int>(raw.magnitude);
}

template <class Float>
std::optional<Float> floating_as(const Raw& raw) {
  if (raw.kind == Raw::Kind::integer) {
    const auto magnitude = static_cast<Float>(raw.magnitude);
    return raw.negative ? -magnitude : magnitude;
  }
  if (raw.kind == Raw::Kind::string) {
    if (raw.text == "NaN") return std::numeric_limits<Float>::quiet_NaN();
    if (raw.text == "Infinity") return std::numeric_limits<Float>::infinity();
    if (raw.text == "-Infinity") return -std::numeric_limits<Float>::infinity();
    return std::nullopt;
  }
  if (raw.kind != Raw::Kind::floating) return std::nullopt;
  Float value{};
  const char* end = raw.text.data() + raw.text.size();
  auto [stop, status] = std::from_chars(raw.text.data(), end, value);
  if (status != std::errc() || stop != end) return std::nullopt;
  return value;
}

std::optional<amqp::Decimal> decimal_of(const Raw& raw) {
  if (raw.kind != Raw::Kind::string) return std::nullopt;
  std::string_view text = raw.text;
  const size_t point = text.find('.');
  std::string_view whole = text.substr(0, point);
  std::string_view fraction =
      point == std::string_view::npos ? std::string_view() : text.substr(point + 1);
  if (whole.empty() || (point != std::string_view::npos && fraction.empty())) return std::nullopt;
  if (fraction.size() > std::numeric_limits<uint8_t>::max()) return std::nullopt;
  uint64_t value = 0;
  for (std::string_view part : {whole, fraction}) {
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + static_cast<uint64_t>(c - '0');
      if (value > std::numeric_limits<uint32_t>::max()) return std::nullopt;
    }
  }
  return amqp::Decimal{static_cast<uint8_t>(fraction.size()), static_cast<uint32_t>(value)};
}

template <class T>
std::optional<amqp::FieldValue> wrap(std::optional<T> value) {
  if (!value) return std::nullopt;
  return amqp::FieldValue(std::move(*value));
}

// The value a type tag and the JSON it holds mean; nullopt when the JSON does not fit the tag.
std::optional<amqp::FieldValue> tagged_value(char tag, Raw& raw) {
  switch (tag) {
    case 't':
      if (raw.kind != Raw::Kind::boolean) return std::nullopt;
      return amqp::FieldValue(raw.boolean);
    case 'b':
      return wrap(integer_as<int8_t>(raw));
    case 'B':
      return wrap(integer_as<uint8_t>(raw));
    case 's':
      return wrap(integer_as<int16_t>(raw));
    case 'u':
      return wrap(integer_as<uint16_t>(raw));
    case 'I':
      return wrap(integer_as<int32_t>(raw));
    case 'i':
      return wrap(integer_as<uint32_t>(raw));
    case 'l':
      return wrap(integer_as<int64_t>(raw));
    case 'f':
      return wrap(floating_as<float>(raw));
    case 'd':
      return wrap(floating_as<double>(raw));
    case 'D':
      return wrap(decimal_of(raw));
    case 'S':
      if (raw.kind != Raw::Kind::string) return std::nullopt;
      return wrap(unbase64(raw.text));
    case 'x': {
      if (raw.kind != Raw::Kind::string) return std::nullopt;
      auto bytes = unbase64(raw.text);
      if (!bytes) return std::nullopt;
      return amqp::FieldValue(amqp::ByteArray{std::move(*bytes)});
    }
    case 'T': {
      if (raw.kind != Raw::Kind::integer || raw.negative) return std::nullopt;
      return amqp::FieldValue(amqp::Timestamp{raw.magnitude});
    }
    case 'A':
      if (raw.kind != Raw::Kind::array) return std::nullopt;
      return amqp::FieldValue(std::move(raw.array));
    case 'F':
      if (raw.kind != Raw::Kind::table) return std::nullopt;
      return amqp::FieldValue(std::move(raw.table));
    case 'V':
      if (raw.kind != Raw::Kind::null) return std::nullopt;
      return amqp::FieldValue(amqp::Void{});
    default:
      return std::nullopt;
  }
}

constexpr std::string_view tag_letters = "tbBsuIilfdDSxATFV";

// Builds the table from the parser's events; a handler that returns false ends the parse, with
// the reason in error().
class TableBuilder {
 public:
  bool null() {
    Raw raw;
    raw.kind = Raw::Kind::null;
    return scalar(std::move(raw));
  }
  bool boolean(bool value) {
    Raw raw;
    raw.kind = Raw::Kind::boolean;
    raw.boolean = value;
    return scalar(std::move(raw));
  }
  bool number_integer(json::number_integer_t value) { return scalar(Raw::of_integer(value)); }
  bool number_unsigned(json::number_unsigned_t value) {
    Raw raw;
    raw.kind = Raw::Kind::integer;
    raw.magnitude = value;
    return scalar(std::move(raw));
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    Raw raw;
    raw.kind = Raw::Kind::floating;
    raw.text = text;
    raw.integral = text.find_first_of(".eE") == std::string::npos;
    return scalar(std::move(raw));
  }
  bool string(json::string_t& value) {
    Raw raw;
    raw.kind = Raw::Kind::string;
    raw.text = std::move(value);
    return scalar(std::move(raw));
  }
  bool binary(json::binary_t&) { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) {
    if (frames_.empty()) return push(Frame::Kind::table);
    Frame& top = frames_.back();
    if (top.kind == Frame::Kind::tag) {
      if (top.tag != 'F') return fail(tag_mismatch(top.tag, "an object"));
      return push(Frame::Kind::table);
    }
    return push(Frame::Kind::tag);
  }

  bool key(json::string_t& name) {
    Frame& top = frames_.back();
    if (top.kind == Frame::Kind::tag) {
      if (top.tag != 0) {
        return fail(
            "a typed value is an object with one member, named by its type letter; "
            "this one has \"" +
            std::string(1, top.tag) + "\" and \"" + name + "\"");
      }
      if (name.size() != 1 || tag_letters.find(name[0]) == std::string_view::npos) {
        return fail("\"" + name + "\" is not a type letter (one of " + std::string(tag_letters) +
                    ")");
      }
      top.tag = name[0];
      return true;
    }
    if (!top.names.insert(name).second) return fail("\"" + name + "\" is named twice");
    top.key = std::move(name);
    return true;
  }

  bool end_object() {
    Frame frame = std::move(frames_.back());
    frames_.pop_back();
    if (frame.kind == Frame::Kind::table) {
      if (frames_.empty()) {
        result_ = std::move(frame.table);
        return true;
      }
      Raw raw;
      raw.kind = Raw::Kind::table;
      raw.table = std::move(frame.table);
      return scalar(std::move(raw));
    }
    if (frame.tag == 0) return fail("an empty object is no typed value");
    std::optional<amqp::FieldValue> value = tagged_value(frame.tag, frame.raw);
    if (!value) return fail(tag_mismatch(frame.tag, frame.raw.describe()));
    return place(std::move(*value));
  }

  bool start_array(std::size_t) {
    if (frames_.empty()) return fail("the headers are not a JSON object");
    Frame& top = frames_.back();
    if (top.kind == Frame::Kind::tag && top.tag != 'A') {
      return fail(tag_mismatch(top.tag, "an array"));
    }
    return push(Frame::Kind::array);
  }

  bool end_array() {
    Frame frame = std::move(frames_.back());
    frames_.pop_back();
    Raw raw;
    raw.kind = Raw::Kind::array;
    raw.array = std::move(frame.array);
    return scalar(std::move(raw));
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (error_.empty()) error_ = std::string("not JSON: ") + e.what();
    return false;
  }

  std::optional<amqp::FieldTable>& result() { return result_; }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    enum class Kind { table, array, tag };
    Kind kind = Kind::table;
    amqp::FieldTable table;
    std::unordered_set<std::string> names;
    std::string key;
    amqp::FieldArray array;
    char tag = 0;
    Raw raw;
  };

  static std::string tag_mismatch(char tag, const std::string& what) {
    return "type \"" + std::string(1, tag) + "\" cannot hold " + what;
  }

  bool fail(std::string reason) {
    if (error_.empty()) error_ = std::move(reason);
    return false;
  }

  bool push(Frame::Kind kind) {
    if (kind != Frame::Kind::tag && ++nesting_ > amqp::kDefaultMaxNesting) {
      return fail("tables and arrays nest deeper than " + std::to_string(amqp::kDefaultMaxNesting) +
                  " levels");
    }
    Frame frame;
    frame.kind = kind;
    frames_.push_back(std::move(frame));
    return true;
  }

  // A value in the place the parser is at: held by a tag, or a plain JSON value.
  bool scalar(Raw raw) {
    if (raw.kind == Raw::Kind::table || raw.kind == Raw::Kind::array) --nesting_;
    if (frames_.empty()) return fail("the headers are not a JSON object");
    Frame& top = frames_.back();
    if (top.kind == Frame::Kind::tag) {
      top.raw = std::move(raw);
      return true;
    }
    switch (raw.kind) {
      case Raw::Kind::null:
        return place(amqp::Void{});
      case Raw::Kind::boolean:
        return place(raw.boolean);
      case Raw::Kind::integer: {
        auto value = integer_as<int64_t>(raw);
        if (!value) return fail(raw.describe() + " is out of range for an int64");
        return place(*value);
      }
      case Raw::Kind::floating: {
        if (raw.integral) return fail(raw.describe() + " is out of range for an int64");
        auto value = floating_as<double>(raw);
        if (!value) return fail(raw.describe() + " is out of range for a double");
        return place(*value);
      }
      case Raw::Kind::string:
        return place(std::move(raw.text));
      case Raw::Kind::array:
        return place(std::move(raw.array));
      case Raw::Kind::table:
      case Raw::Kind::none:
        break;
    }
    return fail("a table without its type tag");
  }

  bool place(amqp::FieldValue value) {
    Frame& top = frames_.back();
    if (top.kind == Frame::Kind::table) {
      top.table.append(std::move(top.key), std::move(value));
    } else {
      top.array.push_back(std::move(value));
    }
    return true;
  }

  std::vector<Frame> frames_;
  int nesting_ = 0;
  std::optional<amqp::FieldTable> result_;
  std::string error_;
};

}  // namespace

std::string encode_headers(const amqp::FieldTable& table) {
  std::string out;
  write_table(out, table);
  return out;
}

std::optional<amqp::FieldTable> decode_headers(std::string_view field_value, std::string* error) {
  TableBuilder builder;
  bool parsed = false;
  try {
    parsed = json::sax_parse(field_value.begin(), field_value.end(), &builder);
  } catch (const std::exception& e) {
    if (error) *error = std::string("not JSON: ") + e.what();
    return std::nullopt;
  }
  if (!parsed || !builder.result()) {
    if (error) {
      *error = builder.error().empty() ? "the headers are not a JSON object" : builder.error();
    }
    return std::nullopt;
  }
  return std::move(builder.result());
}

}  // namespace retryloop::dispatch
