#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace retryloop::amqp {

/// AMQP decimal ('D'): value / 10^scale.
struct Decimal {
  uint8_t scale = 0;
  uint32_t value = 0;
  friend bool operator==(const Decimal& a, const Decimal& b) {
    return a.scale == b.scale && a.value == b.value;
  }
};

/// AMQP timestamp ('T'): seconds since the Unix epoch.
struct Timestamp {
  uint64_t seconds = 0;
  friend bool operator==(const Timestamp& a, const Timestamp& b) { return a.seconds == b.seconds; }
};

/// AMQP void ('V'): a field that is present with no value.
struct Void {
  friend bool operator==(const Void&, const Void&) { return true; }
};

/// AMQP byte array ('x'): raw bytes, kept apart from long strings ('S') so that a round trip
/// keeps the type letter.
struct ByteArray {
  std::string bytes;
  friend bool operator==(const ByteArray& a, const ByteArray& b) { return a.bytes == b.bytes; }
};

class FieldValue;
struct FieldEntry;

/// An array of field values ('A').
using FieldArray = std::vector<FieldValue>;

/// A field table ('F'): named values in insertion order. Decoding keeps the order and the type
/// letter of every value, so decode followed by encode gives back the same bytes.
class FieldTable {
 public:
  using iterator = std::vector<FieldEntry>::iterator;
  using const_iterator = std::vector<FieldEntry>::const_iterator;

  FieldTable();
  FieldTable(std::initializer_list<FieldEntry> entries);
  FieldTable(const FieldTable&);
  FieldTable(FieldTable&&) noexcept;
  FieldTable& operator=(const FieldTable&);
  FieldTable& operator=(FieldTable&&) noexcept;
  ~FieldTable();

  /// The value named `name`, or nullptr.
  const FieldValue* find(std::string_view name) const;
  FieldValue* find(std::string_view name);

  /// Replaces the value named `name` in place, or appends it at the end.
  void set(std::string name, FieldValue value);

  /// Appends without looking for an existing entry (used by the decoder, which must keep
  /// whatever the peer sent).
  void append(std::string name, FieldValue value);

  /// Appends an entry named `name` holding Void and returns its value, to be filled in place:
  /// the decoder's way, which builds no temporary value to move.
  FieldValue& append_void(std::string_view name);

  /// Removes the value named `name`; returns whether there was one.
  bool erase(std::string_view name);

  /// Removes every entry whose name satisfies `pred`; returns how many were removed.
  template <class Pred>
  size_t erase_if(Pred pred);

  size_t size() const;
  bool empty() const;
  void clear();
  void reserve(size_t n);
  iterator begin();
  iterator end();
  const_iterator begin() const;
  const_iterator end() const;

  friend bool operator==(const FieldTable& a, const FieldTable& b);
  friend bool operator!=(const FieldTable& a, const FieldTable& b) { return !(a == b); }

 private:
  std::vector<FieldEntry> entries_;
};

/// One value of a field table or array, tagged with its RabbitMQ type letter:
/// `t` bool, `b` int8, `B` uint8, `s` int16, `u` uint16, `I` int32, `i` uint32, `l` int64,
/// `f` float, `d` double, `D` Decimal, `S` long string, `x` ByteArray, `A` FieldArray,
/// `T` Timestamp, `F` FieldTable, `V` Void.
class FieldValue {
 public:
  using Storage = std::variant<Void, bool, int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t,
                               int64_t, float, double, Decimal, std::string, ByteArray, FieldArray,
                               Timestamp, FieldTable>;

  FieldValue() = default;
  FieldValue(Void v) : storage_(v) {}
  FieldValue(bool v) : storage_(v) {}
  FieldValue(int8_t v) : storage_(v) {}
  FieldValue(uint8_t v) : storage_(v) {}
  FieldValue(int16_t v) : storage_(v) {}
  FieldValue(uint16_t v) : storage_(v) {}
  FieldValue(int32_t v) : storage_(v) {}
  FieldValue(uint32_t v) : storage_(v) {}
  FieldValue(int64_t v) : storage_(v) {}
  FieldValue(float v) : storage_(v) {}
  FieldValue(double v) : storage_(v) {}
  FieldValue(Decimal v) : storage_(v) {}
  FieldValue(std::string v) : storage_(std::move(v)) {}
  FieldValue(std::string_view v) : storage_(std::string(v)) {}
  FieldValue(const char* v) : storage_(std::string(v)) {}
  FieldValue(ByteArray v) : storage_(std::move(v)) {}
  FieldValue(FieldArray v) : storage_(std::move(v)) {}
  FieldValue(Timestamp v) : storage_(v) {}
  FieldValue(FieldTable v) : storage_(std::move(v)) {}

  /// The RabbitMQ type letter of the held value.
  char type_letter() const;

  /// The held value if it is a T, else nullptr.
  template <class T>
  const T* get_if() const {
    return std::get_if<T>(&storage_);
  }
  template <class T>
  T* get_if() {
    return std::get_if<T>(&storage_);
  }

  /// The value as a signed 64-bit integer if it holds any integer type that fits, else nullopt.
  std::optional<int64_t> as_int64() const;

  /// The string if the value holds a long string ('S') or a byte array ('x'), else nullopt.
  std::optional<std::string_view> as_string() const;

  const Storage& storage() const { return storage_; }
  Storage& storage() { return storage_; }

  friend bool operator==(const FieldValue& a, const FieldValue& b) {
    return a.storage_ == b.storage_;
  }
  friend bool operator!=(const FieldValue& a, const FieldValue& b) { return !(a == b); }

 private:
  Storage storage_;
};

/// A named entry of a FieldTable.
struct FieldEntry {
  FieldEntry() = default;
  FieldEntry(std::string name, FieldValue value) : name(std::move(name)), value(std::move(value)) {}
  /// An entry holding Void, to be filled in place.
  explicit FieldEntry(std::string_view name) : name(name) {}

  std::string name;
  FieldValue value;
  friend bool operator==(const FieldEntry& a, const FieldEntry& b) {
    return a.name == b.name && a.value == b.value;
  }
};

template <class Pred>
size_t FieldTable::erase_if(Pred pred) {
  size_t before = entries_.size();
  auto kept = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!pred(it->name)) {
      if (kept != it) *kept = std::move(*it);
      ++kept;
    }
  }
  entries_.erase(kept, entries_.end());
  return before - entries_.size();
}

}  // namespace retryloop::amqp
