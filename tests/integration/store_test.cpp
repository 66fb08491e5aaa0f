// The store layer on a real SQLite file and a real PostgreSQL server: one statement text for
// both, values of every kind, error kinds, transactions, schema versions.

#include <catch2/catch.hpp>
#include <filesystem>

#include "retryloop/outbox/schema.hpp"
#include "retryloop/store/database.hpp"
#include "support/databases.hpp"

using namespace retryloop;

TEST_CASE("One statement text runs on SQLite and PostgreSQL with every kind of value", "[store]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "values").open();
  const bool postgres = db->dialect() == store::Dialect::postgresql;
  db->execute_script(std::string("CREATE TABLE t (id ") +
                     (postgres ? "bigserial PRIMARY KEY" : "INTEGER PRIMARY KEY AUTOINCREMENT") +
                     ", n bigint, s text, b " + (postgres ? "bytea" : "blob") + ")");
  const std::string bytes("\0\x01\xff\xfe binary\n", 12);
  auto inserted =
      db->execute("INSERT INTO t (n, s, b) VALUES ($1, $2, $3), ($4, $5, $6) RETURNING id",
                  {int64_t{-9000000000}, "text with 'quotes' and $1", store::Blob{bytes},
                   store::Value{}, store::Value{}, store::Value{}});
  REQUIRE(inserted.rows.size() == 2);
  CHECK(inserted.affected == 2);

  // $2 before $1: parameters are numbered, not positional.
  auto rows = db->execute("SELECT n, s, b FROM t WHERE id = $2 OR id = $1 ORDER BY id",
                          {inserted.rows[0].integer(0), inserted.rows[1].integer(0)});
  REQUIRE(rows.rows.size() == 2);
  CHECK(rows.rows[0].integer(0) == -9000000000);
  CHECK(rows.rows[0].text(1) == std::optional<std::string>("text with 'quotes' and $1"));
  CHECK(rows.rows[0].text(2) == std::optional<std::string>(bytes));
  CHECK(rows.rows[1].is_null(0));
  CHECK(rows.rows[1].is_null(1));
  CHECK(rows.rows[1].is_null(2));
  CHECK_THROWS_AS(rows.rows[1].integer(0), store::StoreError);

  auto updated = db->execute("UPDATE t SET n = n + 1 WHERE n IS NOT NULL");
  CHECK(updated.affected == 1);
  CHECK(db->execute("SELECT count(*) FROM t").rows[0].integer(0) == 2);
  CHECK(db->execute("SELECT count(*) FROM t WHERE id IN (" + store::placeholders(1, 3) + ")",
                    {int64_t{-1}, inserted.rows[1].integer(0), int64_t{-2}})
            .rows[0]
            .integer(0) == 1);
}

TEST_CASE("Store errors say what kind of failure they are", "[store]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "errors").open();
  db->execute_script("CREATE TABLE u (k text PRIMARY KEY)");
  db->execute("INSERT INTO u (k) VALUES ($1)", {"a"});

  auto kind_of = [&](const std::string& sql, std::vector<store::Value> values = {}) {
    try {
      db->execute(sql, values);
    } catch (const store::StoreError& error) {
      INFO(error.what());
      CHECK(std::string(error.what()).find(label) != std::string::npos);
      return error.kind();
    }
    FAIL("no error from: " << sql);
    return store::ErrorKind::other;
  };
  CHECK(kind_of("INSERT INTO u (k) VALUES ($1)", {"a"}) == store::ErrorKind::constraint);
  CHECK(kind_of("SELECT * FROM no_such_table") == store::ErrorKind::schema);
  CHECK(kind_of("SELEKT 1") == store::ErrorKind::usage);
  // The connection is still usable after each failure.
  CHECK(db->execute("SELECT count(*) FROM u").rows[0].integer(0) == 1);
}

TEST_CASE(
    "A transaction rolls back unless it is committed, and a second connection sees only "
    "what was committed",
    "[store]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto database = test::database_for(label, "transactions");
  auto writer = database.open();
  auto reader = database.open();
  writer->execute_script("CREATE TABLE v (n integer)");
  {
    store::Transaction transaction(*writer);
    writer->execute("INSERT INTO v (n) VALUES (1)");
    CHECK(writer->in_transaction());
  }
  CHECK_FALSE(writer->in_transaction());
  {
    store::Transaction transaction(*writer);
    writer->execute("INSERT INTO v (n) VALUES (2)");
    transaction.commit();
  }
  auto seen = reader->execute("SELECT n FROM v");
  REQUIRE(seen.rows.size() == 1);
  CHECK(seen.rows[0].integer(0) == 2);
}

TEST_CASE("The schema migrates once, is checked, and a newer one is refused", "[store]") {
  const std::string label = GENERATE("sqlite", "postgresql");
  INFO(label);
  auto db = test::database_for(label, "schema").open();
  CHECK(outbox::installed_version(*db) == outbox::schema_version);
  auto again = outbox::migrate(*db);
  CHECK(again.from == outbox::schema_version);
  CHECK(again.to == outbox::schema_version);
  CHECK_NOTHROW(outbox::require_schema(*db));

  db->execute("UPDATE retryloop_schema SET version = 99");
  try {
    outbox::migrate(*db);
    FAIL("a newer schema was accepted");
  } catch (const store::StoreError& error) {
    CHECK(error.kind() == store::ErrorKind::schema);
    CHECK_THAT(error.what(), Catch::Contains("newer than this release"));
  }
  CHECK(outbox::installed_version(*db) == 99);  // the refused migration changed nothing
  CHECK_THROWS_WITH(outbox::require_schema(*db), Catch::Contains("use a newer retryloop"));
}

TEST_CASE("A database without the tables is refused with the command that creates them",
          "[store]") {
  auto path = std::filesystem::temp_directory_path() / "retryloop-store-test-missing.db";
  std::filesystem::remove(path);
  try {
    store::Database::open("sqlite:" + path.string(), false);
    FAIL("a missing SQLite file was opened");
  } catch (const store::StoreError& error) {
    CHECK(error.kind() == store::ErrorKind::schema);
    CHECK_THAT(error.what(), Catch::Contains("retryloop outbox init"));
  }
  CHECK_FALSE(std::filesystem::exists(path));

  auto db = store::Database::open("sqlite::memory:");
  CHECK(outbox::installed_version(*db) == 0);
  CHECK_THROWS_WITH(outbox::require_schema(*db), Catch::Contains("retryloop outbox init"));
}

TEST_CASE("Database URLs are recognised, and passwords never reach an error", "[store]") {
  CHECK(store::redact("postgresql://app:s3cret@db:5432/orders") ==
        "postgresql://app:***@db:5432/orders");
  CHECK(store::redact("host=db password=s3cret dbname=orders") ==
        "host=db password=*** dbname=orders");
  CHECK(store::redact("sqlite:/var/lib/app.db") == "sqlite:/var/lib/app.db");
  CHECK_THROWS_WITH(store::Database::open("mysql://x"), Catch::Contains("unknown database URL"));
  CHECK_THROWS_WITH(store::Database::open("sqlite:"), Catch::Contains("without a file"));
  try {
    store::Database::open("postgresql://app:s3cret@127.0.0.1:1/none?connect_timeout=2");
    FAIL("connected to port 1");
  } catch (const store::StoreError& error) {
    CHECK(error.kind() == store::ErrorKind::connection);
    CHECK_THAT(error.what(), !Catch::Contains("s3cret"));
  }
}
