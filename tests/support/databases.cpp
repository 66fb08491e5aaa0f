#include "support/databases.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "retryloop/outbox/schema.hpp"
#include "support/harness.hpp"

namespace retryloop::test {

std::string postgres_url() {
  const char* url = std::getenv("RETRYLOOP_TEST_PG_URL");
  if (!url || !*url) {
    FAIL("RETRYLOOP_TEST_PG_URL is not set: run the database tests through scripts/with-postgres");
  }
  return url;
}

TestDatabase fresh_sqlite(const std::string& name) {
  auto directory = std::filesystem::path(RETRYLOOP_BINARY_DIR) / "test-databases";
  std::filesystem::create_directories(directory);
  auto path = directory / (unique_name(name) + ".db");
  for (const char* suffix : {"", "-wal", "-shm"})
    std::remove((path.string() + suffix).c_str());
  TestDatabase database{"sqlite", "sqlite:" + path.string()};
  outbox::migrate(*database.open());
  return database;
}

TestDatabase fresh_postgres(const std::string& name) {
  std::string schema;
  for (char c : unique_name(name))
    schema += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  std::string base = postgres_url();
  auto admin = store::Database::open(base);
  admin->execute_script("CREATE SCHEMA " + schema);
  std::string url = base + (base.find('?') == std::string::npos ? "?" : "&") +
                    "options=-csearch_path%3D" + schema;
  TestDatabase database{"postgresql", url};
  outbox::migrate(*database.open());
  return database;
}

TestDatabase database_for(const std::string& label, const std::string& name) {
  return label == "sqlite" ? fresh_sqlite(name) : fresh_postgres(name);
}

std::vector<TestDatabase> test_databases(const std::string& name) {
  return {fresh_sqlite(name), fresh_postgres(name)};
}

}  // namespace retryloop::test
