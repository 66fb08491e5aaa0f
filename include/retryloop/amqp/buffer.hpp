#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

#include "retryloop/amqp/error.hpp"
#include "retryloop/amqp/field_table.hpp"

namespace retryloop::amqp {

/// How deep field tables and arrays may nest, by default, in either direction. An `x-death`
/// header is three levels deep; a thousand levels is an attack.
inline constexpr int kDefaultMaxNesting = 64;

/// Appends AMQP wire encodings (network byte order) to a caller-owned string. An encoding the
/// wire cannot carry (a short string over 255 bytes, nesting past the limit) sets a sticky error
/// and the bytes written since are unspecified; check `error()` before sending.
class Writer {
 public:
  explicit Writer(std::string& out, int max_nesting = kDefaultMaxNesting)
      : out_(out), max_nesting_(max_nesting) {}

  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) {
    char b[2] = {static_cast<char>(v >> 8), static_cast<char>(v)};
    out_.append(b, 2);
  }
  void u32(uint32_t v) {
    char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                 static_cast<char>(v)};
    out_.append(b, 4);
  }
  void u64(uint64_t v) {
    u32(static_cast<uint32_t>(v >> 32));
    u32(static_cast<uint32_t>(v));
  }
  void f32(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    u32(bits);
  }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  }
  void raw(std::string_view bytes) { out_.append(bytes.data(), bytes.size()); }

  /// Octet length + bytes; sets CodecError::string_too_long past 255 bytes.
  void short_string(std::string_view s) {
    if (s.size() > 255) {
      fail(CodecError::string_too_long);
      return;
    }
    u8(static_cast<uint8_t>(s.size()));
    raw(s);
  }
  /// 32-bit length + bytes; sets CodecError::value_too_long past 4 GiB.
  void long_string(std::string_view s) {
    if (s.size() > std::numeric_limits<uint32_t>::max()) {
      fail(CodecError::value_too_long);
      return;
    }
    u32(static_cast<uint32_t>(s.size()));
    raw(s);
  }

  /// 32-bit byte length + entries, each a short-string name, a type letter and the value.
  void table(const FieldTable& table);
  /// 32-bit byte length + values, each a type letter and the value.
  void array(const FieldArray& array);
  /// A type letter and the value.
  void field_value(const FieldValue& value);

  /// Overwrites 4 bytes at `offset` with the size of what was written after them (a table, an
  /// array or a frame payload); sets CodecError::value_too_long past 4 GiB.
  void patch_size(size_t offset) {
    const size_t size = out_.size() - offset - 4;
    if (size > std::numeric_limits<uint32_t>::max()) {
      fail(CodecError::value_too_long);
      return;
    }
    patch_u32(offset, static_cast<uint32_t>(size));
  }
  /// Overwrites 4 bytes at `offset`.
  void patch_u32(size_t offset, uint32_t v) {
    out_[offset] = static_cast<char>(v >> 24);
    out_[offset + 1] = static_cast<char>(v >> 16);
    out_[offset + 2] = static_cast<char>(v >> 8);
    out_[offset + 3] = static_cast<char>(v);
  }

  size_t size() const { return out_.size(); }
  std::string& buffer() { return out_; }
  std::error_code error() const { return error_; }
  void fail(CodecError e) {
    if (!error_) error_ = make_error_code(e);
  }

 private:
  void table_at_depth(const FieldTable& table, int depth);
  void array_at_depth(const FieldArray& array, int depth);
  void value_at_depth(const FieldValue& value, int depth);

  std::string& out_;
  int max_nesting_;
  std::error_code error_;
};

/// Reads AMQP wire encodings from a byte range it does not own. Every read is bounds-checked:
/// reading past the end sets a sticky CodecError::truncated and returns zero or empty values, so
/// a decoder reads all its fields and checks `ok()` once at the end.
class Reader {
 public:
  explicit Reader(std::string_view data, int max_nesting = kDefaultMaxNesting)
      : data_(data), max_nesting_(max_nesting) {}

  uint8_t u8() {
    if (!need(1)) return 0;
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint16_t u16() {
    if (!need(2)) return 0;
    auto p = reinterpret_cast<const unsigned char*>(data_.data() + pos_);
    pos_ += 2;
    return static_cast<uint16_t>((p[0] << 8) | p[1]);
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    auto p = reinterpret_cast<const unsigned char*>(data_.data() + pos_);
    pos_ += 4;
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  }
  uint64_t u64() {
    uint64_t hi = u32();
    return (hi << 32) | u32();
  }
  float f32() {
    uint32_t bits = u32();
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
  double f64() {
    uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  /// `n` raw bytes as a view into the input.
  std::string_view raw(size_t n) {
    if (!need(n)) return {};
    std::string_view v = data_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view short_string_view() { return raw(u8()); }
  std::string short_string() { return std::string(short_string_view()); }
  std::string_view long_string_view() {
    uint32_t n = u32();
    return raw(n);
  }
  std::string long_string() { return std::string(long_string_view()); }

  /// Decodes a table into `out` (replacing its contents). Unknown type letters and nesting past
  /// the limit are errors.
  void table(FieldTable& out);
  void array(FieldArray& out);
  /// Decodes one value whose type letter has already been read.
  void field_value(char type, FieldValue& out);

  bool ok() const { return !error_; }
  std::error_code error() const { return error_; }
  void fail(CodecError e) {
    if (!error_) error_ = make_error_code(e);
    pos_ = data_.size();
  }
  size_t remaining() const { return data_.size() - pos_; }
  size_t position() const { return pos_; }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  bool need(size_t n) {
    if (data_.size() - pos_ >= n) return true;
    fail(CodecError::truncated);
    return false;
  }
  void table_at_depth(FieldTable& out, int depth);
  void array_at_depth(FieldArray& out, int depth);
  void value_at_depth(char type, FieldValue& out, int depth);

  std::string_view data_;
  size_t pos_ = 0;
  int max_nesting_;
  std::error_code error_;
};

}  // namespace retryloop::amqp
