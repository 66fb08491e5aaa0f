#include "retryloop/amqp/field_table.hpp"

#include <type_traits>

namespace retryloop::amqp {

FieldTable::FieldTable() = default;
FieldTable::FieldTable(std::initializer_list<FieldEntry> entries) : entries_(entries) {}
FieldTable::FieldTable(const FieldTable&) = default;
FieldTable::FieldTable(FieldTable&&) noexcept = default;
FieldTable& FieldTable::operator=(const FieldTable&) = default;
FieldTable& FieldTable::operator=(FieldTable&&) noexcept = default;
FieldTable::~FieldTable() = default;

const FieldValue* FieldTable::find(std::string_view name) const {
  for (const FieldEntry& e : entries_) {
    if (e.name == name) return &e.value;
  }
  return nullptr;
}

FieldValue* FieldTable::find(std::string_view name) {
  for (FieldEntry& e : entries_) {
    if (e.name == name) return &e.value;
  }
  return nullptr;
}

void FieldTable::set(std::string name, FieldValue value) {
  if (FieldValue* existing = find(name)) {
    *existing = std::move(value);
    return;
  }
  entries_.push_back(FieldEntry{std::move(name), std::move(value)});
}

void FieldTable::append(std::string name, FieldValue value) {
  entries_.push_back(FieldEntry{std::move(name), std::move(value)});
}

FieldValue& FieldTable::append_void(std::string_view name) {
  return entries_.emplace_back(name).value;
}

bool FieldTable::erase(std::string_view name) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->name == name) {
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

size_t FieldTable::size() const {
  return entries_.size();
}
bool FieldTable::empty() const {
  return entries_.empty();
}
void FieldTable::clear() {
  entries_.clear();
}
void FieldTable::reserve(size_t n) {
  entries_.reserve(n);
}
FieldTable::iterator FieldTable::begin() {
  return entries_.begin();
}
FieldTable::iterator FieldTable::end() {
  return entries_.end();
}
FieldTable::const_iterator FieldTable::begin() const {
  return entries_.begin();
}
FieldTable::const_iterator FieldTable::end() const {
  return entries_.end();
}

bool operator==(const FieldTable& a, const FieldTable& b) {
  return a.entries_ == b.entries_;
}

namespace {

// Indexed like FieldValue::Storage.
constexpr char kTypeLetters[] = {'V', 't', 'b', 'B', 's', 'u', 'I', 'i', 'l',
                                 'f', 'd', 'D', 'S', 'x', 'A', 'T', 'F'};
static_assert(sizeof(kTypeLetters) == std::variant_size_v<FieldValue::Storage>);

}  // namespace

char FieldValue::type_letter() const {
  return kTypeLetters[storage_.index()];
}

std::optional<int64_t> FieldValue::as_int64() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      storage_);
}

std::optional<std::string_view> FieldValue::as_string() const {
  if (const auto* s = std::get_if<std::string>(&storage_)) return std::string_view(*s);
  if (const auto* b = std::get_if<ByteArray>(&storage_)) return std::string_view(b->bytes);
  return std::nullopt;
}

}  // namespace retryloop::amqp
