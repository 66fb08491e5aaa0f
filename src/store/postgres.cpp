#include <libpq-fe.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "backends.hpp"

namespace retryloop::store::detail {
namespace {

constexpr Oid bytea_oid = 17;

ErrorKind kind_of(const char* sqlstate) {
  std::string_view state = sqlstate ? sqlstate : "";
  if (state.size() != 5) return ErrorKind::other;
  auto cls = state.substr(0, 2);
  if (cls == "08" || cls == "57") return ErrorKind::connection;  // connection, operator shutdown
  if (state == "40001" || state == "40P01" || state == "55P03") return ErrorKind::busy;
  if (cls == "23") return ErrorKind::constraint;
  if (state == "42P01" || state == "42703") return ErrorKind::schema;
  if (cls == "42" || cls == "22") return ErrorKind::usage;
  return ErrorKind::other;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// bytea's text output: \x followed by two hex digits per byte.
std::string decode_bytea(const char* text, size_t size) {
  if (size < 2 || text[0] != '\\' || text[1] != 'x') {
    throw StoreError(ErrorKind::other, "postgresql: bytea not in hex format (bytea_output)");
  }
  std::string out;
  out.reserve((size - 2) / 2);
  for (size_t i = 2; i + 1 < size; i += 2) {
    int high = hex_value(text[i]), low = hex_value(text[i + 1]);
    if (high < 0 || low < 0) throw StoreError(ErrorKind::other, "postgresql: bad bytea text");
    out += static_cast<char>(high * 16 + low);
  }
  return out;
}

void ignore_notice(void*, const char*) {}

class Postgres final : public Database {
 public:
  Postgres(PGconn* conn, bool owned) : conn_(conn), owned_(owned) {
    if (owned_) PQsetNoticeProcessor(conn_, ignore_notice, nullptr);
  }
  ~Postgres() override {
    if (owned_) PQfinish(conn_);
  }

  Dialect dialect() const override { return Dialect::postgresql; }
  bool in_transaction() const override {
    auto status = PQtransactionStatus(conn_);
    return status == PQTRANS_INTRANS || status == PQTRANS_INERROR || status == PQTRANS_ACTIVE;
  }
  bool usable() const override { return PQstatus(conn_) == CONNECTION_OK; }
  void set_lock_timeout(std::chrono::milliseconds timeout) override {
    execute_script("SET lock_timeout = " + std::to_string(timeout.count()));
  }

  Result execute(std::string_view sql, const std::vector<Value>& parameters) override {
    std::vector<std::string> numbers(parameters.size());
    std::vector<const char*> values(parameters.size());
    std::vector<int> lengths(parameters.size()), formats(parameters.size());
    for (size_t i = 0; i < parameters.size(); ++i) {
      const Value& value = parameters[i];
      if (std::holds_alternative<std::monostate>(value)) {
        values[i] = nullptr;
      } else if (const auto* number = std::get_if<int64_t>(&value)) {
        numbers[i] = std::to_string(*number);
        values[i] = numbers[i].c_str();
      } else if (const auto* text = std::get_if<std::string>(&value)) {
        values[i] = text->c_str();
      } else {
        const auto& blob = std::get<Blob>(value);
        values[i] = blob.bytes.data();
        lengths[i] = static_cast<int>(blob.bytes.size());
        formats[i] = 1;
      }
    }
    std::string statement(sql);
    PGresult* res = PQexecParams(conn_, statement.c_str(), static_cast<int>(parameters.size()),
                                 nullptr, values.data(), lengths.data(), formats.data(), 0);
    return take(res, sql);
  }

  void execute_script(std::string_view sql) override {
    std::string text(sql);
    take(PQexec(conn_, text.c_str()), sql);
  }

  void listen(const std::string& channel) override {
    char* quoted = PQescapeIdentifier(conn_, channel.c_str(), channel.size());
    if (!quoted) fail(nullptr, "LISTEN");
    std::string sql = std::string("LISTEN ") + quoted;
    PQfreemem(quoted);
    execute_script(sql);
  }

  int notification_descriptor() const override { return PQsocket(conn_); }

  size_t take_notifications() override {
    if (!PQconsumeInput(conn_)) return 0;  // broken: usable() now says so
    size_t count = 0;
    while (PGnotify* notify = PQnotifies(conn_)) {
      ++count;
      PQfreemem(notify);
    }
    return count;
  }

 protected:
  void begin_statement() override { execute_script("BEGIN"); }

 private:
  Result take(PGresult* res, std::string_view sql) {
    struct Clear {
      PGresult* r;
      ~Clear() { PQclear(r); }
    } clear{res};
    auto status = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) fail(res, sql);
    Result result;
    const int rows = PQntuples(res), columns = PQnfields(res);
    result.rows.reserve(rows);
    for (int r = 0; r < rows; ++r) {
      std::vector<std::optional<std::string>> row;
      row.reserve(columns);
      for (int c = 0; c < columns; ++c) {
        if (PQgetisnull(res, r, c)) {
          row.emplace_back();
          continue;
        }
        const char* text = PQgetvalue(res, r, c);
        size_t size = static_cast<size_t>(PQgetlength(res, r, c));
        row.emplace_back(PQftype(res, c) == bytea_oid ? decode_bytea(text, size)
                                                      : std::string(text, size));
      }
      result.rows.emplace_back(std::move(row));
    }
    const char* affected = PQcmdTuples(res);
    if (affected && *affected) result.affected = std::strtoull(affected, nullptr, 10);
    return result;
  }

  [[noreturn]] void fail(PGresult* res, std::string_view sql) {
    const char* sqlstate = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    std::string message = res ? PQresultErrorMessage(res) : "";
    if (message.empty()) message = PQerrorMessage(conn_);
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
      message.pop_back();
    }
    ErrorKind kind = PQstatus(conn_) != CONNECTION_OK ? ErrorKind::connection : kind_of(sqlstate);
    throw StoreError(kind,
                     "postgresql: " + message + " (in: " + std::string(sql.substr(0, 200)) + ")");
  }

  PGconn* conn_;
  bool owned_;
};

}  // namespace

std::unique_ptr<Database> open_postgres(const std::string& conninfo) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (!conn) throw StoreError(ErrorKind::connection, "postgresql: out of memory");
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string message = PQerrorMessage(conn);
    while (!message.empty() && message.back() == '\n')
      message.pop_back();
    PQfinish(conn);
    throw StoreError(ErrorKind::connection,
                     "postgresql " + redact(conninfo) + ": cannot connect: " + message);
  }
  return std::make_unique<Postgres>(conn, true);
}

std::unique_ptr<Database> adopt_postgres(pg_conn* connection) {
  if (!connection) throw StoreError(ErrorKind::usage, "postgresql: adopt(nullptr)");
  return std::make_unique<Postgres>(connection, false);
}

}  // namespace retryloop::store::detail
