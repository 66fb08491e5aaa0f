#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

struct sqlite3;
struct pg_conn;

namespace retryloop::store {

/// Which SQL a database speaks.
enum class Dialect { sqlite, postgresql };

/// "sqlite" or "postgresql".
const char* to_string(Dialect dialect);

/// Bytes for a `bytea` (PostgreSQL) or `blob` (SQLite) column.
struct Blob {
  std::string bytes;
};

/// A statement parameter: NULL, an integer, text or bytes.
using Value = std::variant<std::monostate, int64_t, std::string, Blob>;

/// What went wrong, as far as a caller can act on it.
enum class ErrorKind {
  connection,  ///< the database is unreachable or the connection broke: open a new one
  busy,        ///< a lock or a serialization conflict: try again later
  constraint,  ///< a constraint refused the statement (unique, not null, check, foreign key)
  schema,      ///< the schema is missing or of another version
  usage,       ///< a bad URL, statement or parameter: a bug or a configuration error
  other,
};

/// Every failure of this layer. `what()` names the database and the statement's error.
class StoreError : public std::runtime_error {
 public:
  StoreError(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  /// True for `connection` and `busy`: the same work may succeed later.
  bool transient() const { return kind_ == ErrorKind::connection || kind_ == ErrorKind::busy; }

 private:
  ErrorKind kind_;
};

/// One row of a result. Columns are read by position; a NULL reads as std::nullopt (text,
/// blob) or throws (integer).
class Row {
 public:
  explicit Row(std::vector<std::optional<std::string>> columns) : columns_(std::move(columns)) {}
  size_t size() const { return columns_.size(); }
  bool is_null(size_t column) const;
  /// The column's text; for a bytea or blob column, its bytes.
  const std::optional<std::string>& text(size_t column) const;
  /// The column as an integer; throws StoreError (usage) for NULL or text that is not one.
  int64_t integer(size_t column) const;

 private:
  std::vector<std::optional<std::string>> columns_;
};

/// The rows a statement returned (with RETURNING, or a query) and the rows it changed.
struct Result {
  std::vector<Row> rows;
  uint64_t affected = 0;
};

/// One connection to SQLite or PostgreSQL, for one thread at a time. Statements are written once
/// for both: parameters are `$1`, `$2`, ... (SQLite gets them as `?1`, `?2`, ...).
///
/// URLs: `sqlite:PATH` (relative or absolute file; created when missing), `sqlite::memory:`,
/// and `postgresql://user:password@host:port/dbname?param=value` (or `postgres://`, or a
/// libpq keyword string such as `host=... dbname=...`).
///
/// SQLite files are opened in WAL mode with a busy timeout (a writer waits for another's
/// transaction instead of failing at once), and `begin()` takes the write lock at once
/// (`BEGIN IMMEDIATE`), so that two writers never deadlock upgrading a read lock.
class Database {
 public:
  /// Opens a connection; throws StoreError (usage for a bad URL, connection if unreachable).
  /// With `create` false, a SQLite file that does not exist is not created: the error is of
  /// kind schema ("no such database file").
  static std::unique_ptr<Database> open(const std::string& url, bool create = true);
  /// Wraps a connection the application opened itself, to enqueue into the outbox within the
  /// application's own transaction. The connection stays the caller's: it is not closed.
  static std::unique_ptr<Database> adopt(sqlite3* connection);
  static std::unique_ptr<Database> adopt(pg_conn* connection);

  virtual ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  virtual Dialect dialect() const = 0;
  /// Runs one statement with its parameters.
  virtual Result execute(std::string_view sql, const std::vector<Value>& parameters = {}) = 0;
  /// Runs several statements without parameters (a schema migration, say).
  virtual void execute_script(std::string_view sql) = 0;

  /// BEGIN (SQLite: BEGIN IMMEDIATE), COMMIT and ROLLBACK. A rollback after a lost connection
  /// does not throw: the server has rolled back already.
  void begin();
  void commit();
  void rollback();
  virtual bool in_transaction() const = 0;

  /// How long a statement waits for a lock another connection holds before it fails with
  /// ErrorKind::busy (SQLite: the busy timeout, 10 s unless set; PostgreSQL: lock_timeout).
  virtual void set_lock_timeout(std::chrono::milliseconds timeout) = 0;

  /// False once the connection broke; such a connection is useless and should be replaced.
  virtual bool usable() const = 0;

  /// SQLite: the database file's absolute path (empty for an in-memory database). PostgreSQL:
  /// empty.
  virtual std::string file_path() const;

  /// PostgreSQL: LISTEN on `channel`. SQLite: does nothing (it has no notifications).
  virtual void listen(const std::string& channel);
  /// A descriptor that becomes readable when a notification may have arrived; -1 if none.
  virtual int notification_descriptor() const;
  /// Reads what arrived on the descriptor and returns how many notifications there were.
  virtual size_t take_notifications();

 protected:
  Database() = default;
  virtual void begin_statement() = 0;
};

/// A transaction that rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(Database& database);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Database& database_;
  bool open_ = true;
};

/// The URL with any password replaced by `***`, for logs and errors.
std::string redact(const std::string& url);

/// `$1, $2, ...` from `first` on, `count` of them: for an `IN (...)` list.
std::string placeholders(size_t first, size_t count);

}  // namespace retryloop::store
