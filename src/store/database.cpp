#include "retryloop/store/database.hpp"

#include <charconv>

#include "backends.hpp"

namespace retryloop::store {

const char* to_string(Dialect dialect) {
  return dialect == Dialect::sqlite ? "sqlite" : "postgresql";
}

bool Row::is_null(size_t column) const {
  return !text(column).has_value();
}

const std::optional<std::string>& Row::text(size_t column) const {
  if (column >= columns_.size()) {
    throw StoreError(ErrorKind::usage, "column " + std::to_string(column) + " of a row of " +
                                           std::to_string(columns_.size()));
  }
  return columns_[column];
}

int64_t Row::integer(size_t column) const {
  const auto& value = text(column);
  if (!value) throw StoreError(ErrorKind::usage, "column " + std::to_string(column) + " is NULL");
  int64_t out = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, out);
  if (ec != std::errc() || ptr != end) {
    throw StoreError(ErrorKind::usage,
                     "column " + std::to_string(column) + " is not an integer: '" + *value + "'");
  }
  return out;
}

namespace {

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::unique_ptr<Database> Database::open(const std::string& url, bool create) {
  if (starts_with(url, "sqlite:")) {
    std::string path = url.substr(7);
    // sqlite:///absolute/path and sqlite://relative are accepted as well as sqlite:path.
    if (starts_with(path, "//")) path = path.substr(2);
    if (path.empty()) {
      throw StoreError(ErrorKind::usage,
                       "sqlite URL without a file: '" + url + "' (sqlite:PATH or sqlite::memory:)");
    }
    return detail::open_sqlite(path, create);
  }
  if (starts_with(url, "postgresql://") || starts_with(url, "postgres://") ||
      url.find('=') != std::string::npos) {
    return detail::open_postgres(url);
  }
  throw StoreError(ErrorKind::usage,
                   "unknown database URL '" + redact(url) +
                       "': expected sqlite:PATH or postgresql://user@host:port/dbname");
}

std::unique_ptr<Database> Database::adopt(sqlite3* connection) {
  return detail::adopt_sqlite(connection);
}

std::unique_ptr<Database> Database::adopt(pg_conn* connection) {
  return detail::adopt_postgres(connection);
}

Database::~Database() = default;

void Database::begin() {
  begin_statement();
}
void Database::commit() {
  execute("COMMIT");
}

void Database::rollback() {
  if (!usable() || !in_transaction()) return;
  try {
    execute("ROLLBACK");
  } catch (const StoreError& error) {
    if (error.kind() != ErrorKind::connection) throw;
  }
}

std::string Database::file_path() const {
  return {};
}
void Database::listen(const std::string&) {}
int Database::notification_descriptor() const {
  return -1;
}
size_t Database::take_notifications() {
  return 0;
}

Transaction::Transaction(Database& database) : database_(database) {
  database_.begin();
}

Transaction::~Transaction() {
  if (!open_) return;
  try {
    database_.rollback();
  } catch (...) {
    // A destructor cannot report it; the connection is left for its owner to discard.
  }
}

void Transaction::commit() {
  open_ = false;
  database_.commit();
}

std::string redact(const std::string& url) {
  // scheme://user:password@host... -> scheme://user:***@host...
  auto scheme = url.find("://");
  if (scheme != std::string::npos) {
    auto at = url.find('@', scheme + 3);
    auto colon = url.find(':', scheme + 3);
    if (at != std::string::npos && colon != std::string::npos && colon < at) {
      return url.substr(0, colon + 1) + "***" + url.substr(at);
    }
    return url;
  }
  // keyword form: password=secret -> password=***
  auto key = url.find("password=");
  if (key == std::string::npos) return url;
  auto end = url.find(' ', key);
  return url.substr(0, key + 9) + "***" + (end == std::string::npos ? "" : url.substr(end));
}

std::string placeholders(size_t first, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    if (i) out += ", ";
    out += '$';
    out += std::to_string(first + i);
  }
  return out;
}

}  // namespace retryloop::store
