#include <sqlite3.h>
#include <unistd.h>

#include <string>
#include <unordered_map>

#include "backends.hpp"

namespace retryloop::store::detail {
namespace {

ErrorKind kind_of(int code, const char* message) {
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return ErrorKind::busy;
    case SQLITE_CONSTRAINT:
      return ErrorKind::constraint;
    case SQLITE_CANTOPEN:
    case SQLITE_NOTADB:
      return ErrorKind::connection;
    case SQLITE_MISUSE:
    case SQLITE_RANGE:
      return ErrorKind::usage;
    default:
      break;
  }
  std::string_view text = message ? message : "";
  if (text.rfind("no such table", 0) == 0 || text.rfind("no such column", 0) == 0) {
    return ErrorKind::schema;
  }
  if (text.find("syntax error") != std::string_view::npos) return ErrorKind::usage;
  return ErrorKind::other;
}

// $1 -> ?1, outside quoted strings and identifiers, so that statements are written once.
std::string sqlite_parameters(std::string_view sql) {
  std::string out;
  out.reserve(sql.size());
  char quote = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    char c = sql[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '$' && i + 1 < sql.size() && sql[i + 1] >= '0' && sql[i + 1] <= '9') {
      c = '?';
    }
    out += c;
  }
  return out;
}

class Sqlite final : public Database {
 public:
  Sqlite(sqlite3* db, std::string name, bool owned)
      : db_(db), name_(std::move(name)), owned_(owned) {}

  ~Sqlite() override {
    for (auto& [sql, statement] : statements_)
      sqlite3_finalize(statement);
    if (owned_) sqlite3_close_v2(db_);
  }

  Dialect dialect() const override { return Dialect::sqlite; }
  bool in_transaction() const override { return sqlite3_get_autocommit(db_) == 0; }
  bool usable() const override { return true; }
  std::string file_path() const override {
    const char* file = sqlite3_db_filename(db_, "main");
    return file ? file : "";
  }
  void set_lock_timeout(std::chrono::milliseconds timeout) override {
    sqlite3_busy_timeout(db_, static_cast<int>(timeout.count()));
  }

  Result execute(std::string_view sql, const std::vector<Value>& parameters) override {
    sqlite3_stmt* statement = prepare(sql);
    struct Reset {
      sqlite3_stmt* s;
      ~Reset() {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
      }
    } reset{statement};
    int expected = sqlite3_bind_parameter_count(statement);
    if (expected > static_cast<int>(parameters.size())) {
      throw StoreError(ErrorKind::usage,
                       "sqlite: statement needs " + std::to_string(expected) + " parameters, got " +
                           std::to_string(parameters.size()) + ": " + std::string(sql));
    }
    for (int i = 0; i < expected; ++i)
      bind(statement, i + 1, parameters[i], sql);

    Result result;
    const int columns = sqlite3_column_count(statement);
    for (;;) {
      int rc = sqlite3_step(statement);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) fail(rc, sql);
      std::vector<std::optional<std::string>> row;
      row.reserve(columns);
      for (int c = 0; c < columns; ++c) {
        switch (sqlite3_column_type(statement, c)) {
          case SQLITE_NULL:
            row.emplace_back();
            break;
          case SQLITE_BLOB: {
            const void* data = sqlite3_column_blob(statement, c);
            int size = sqlite3_column_bytes(statement, c);
            row.emplace_back(std::string(static_cast<const char*>(data), size));
            break;
          }
          default: {
            const unsigned char* data = sqlite3_column_text(statement, c);
            int size = sqlite3_column_bytes(statement, c);
            row.emplace_back(std::string(reinterpret_cast<const char*>(data), size));
          }
        }
      }
      result.rows.emplace_back(std::move(row));
    }
    if (!sqlite3_stmt_readonly(statement)) result.affected = sqlite3_changes64(db_);
    return result;
  }

  void execute_script(std::string_view sql) override {
    char* message = nullptr;
    int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message);
    if (rc != SQLITE_OK) {
      std::string text = message ? message : sqlite3_errstr(rc);
      sqlite3_free(message);
      throw StoreError(kind_of(rc, text.c_str()), "sqlite " + name_ + ": " + text);
    }
  }

 protected:
  void begin_statement() override { execute("BEGIN IMMEDIATE", {}); }

 private:
  sqlite3_stmt* prepare(std::string_view sql) {
    std::string key(sql);
    auto found = statements_.find(key);
    if (found != statements_.end()) return found->second;
    std::string text = sqlite_parameters(sql);
    sqlite3_stmt* statement = nullptr;
    int rc =
        sqlite3_prepare_v2(db_, text.c_str(), static_cast<int>(text.size()), &statement, nullptr);
    if (rc != SQLITE_OK) fail(rc, sql);
    // Statements built for one batch size or id list would fill the cache without end.
    if (statements_.size() >= 256) {
      for (auto& [old, cached] : statements_)
        sqlite3_finalize(cached);
      statements_.clear();
    }
    statements_.emplace(std::move(key), statement);
    return statement;
  }

  void bind(sqlite3_stmt* statement, int index, const Value& value, std::string_view sql) {
    int rc = SQLITE_OK;
    if (std::holds_alternative<std::monostate>(value)) {
      rc = sqlite3_bind_null(statement, index);
    } else if (const auto* number = std::get_if<int64_t>(&value)) {
      rc = sqlite3_bind_int64(statement, index, *number);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      rc = sqlite3_bind_text64(statement, index, text->data(), text->size(), SQLITE_TRANSIENT,
                               SQLITE_UTF8);
    } else {
      const auto& blob = std::get<Blob>(value);
      rc = sqlite3_bind_blob64(statement, index, blob.bytes.data(), blob.bytes.size(),
                               SQLITE_TRANSIENT);
    }
    if (rc != SQLITE_OK) fail(rc, sql);
  }

  [[noreturn]] void fail(int rc, std::string_view sql) {
    const char* message = sqlite3_errmsg(db_);
    std::string statement(sql.substr(0, 200));
    throw StoreError(kind_of(rc, message),
                     "sqlite " + name_ + ": " + message + " (in: " + statement + ")");
  }

  sqlite3* db_;
  std::string name_;
  bool owned_;
  std::unordered_map<std::string, sqlite3_stmt*> statements_;
};

}  // namespace

std::unique_ptr<Database> open_sqlite(const std::string& path, bool create) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0), nullptr);
  if (rc != SQLITE_OK && !create && access(path.c_str(), F_OK) != 0) {
    sqlite3_close_v2(db);
    throw StoreError(ErrorKind::schema, "sqlite " + path +
                                            ": no such database file (run 'retryloop outbox "
                                            "init --db sqlite:" +
                                            path + "' to create it)");
  }
  if (rc != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    throw StoreError(ErrorKind::connection, "sqlite " + path + ": cannot open: " + message);
  }
  sqlite3_extended_result_codes(db, 1);
  auto database = std::make_unique<Sqlite>(db, path, true);
  sqlite3_busy_timeout(db, 10000);
  if (path != ":memory:") database->execute_script("PRAGMA journal_mode=WAL");
  database->execute_script("PRAGMA foreign_keys=ON");
  return database;
}

std::unique_ptr<Database> adopt_sqlite(sqlite3* connection) {
  if (!connection) throw StoreError(ErrorKind::usage, "sqlite: adopt(nullptr)");
  const char* file = sqlite3_db_filename(connection, "main");
  return std::make_unique<Sqlite>(connection, file && *file ? file : ":memory:", false);
}

}  // namespace retryloop::store::detail
