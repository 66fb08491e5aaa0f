#pragma once

#include <memory>
#include <string>
#include <vector>

#include "retryloop/store/database.hpp"

namespace retryloop::test {

/// A database of its own for one test, with the retryloop tables in place: a fresh SQLite file
/// under the build tree, or a fresh schema of the throwaway PostgreSQL (RETRYLOOP_TEST_PG_URL,
/// set by scripts/with-postgres), reached through a URL whose search_path selects it, so that
/// tests running at once never see each other's rows.
struct TestDatabase {
  std::string label;  ///< "sqlite" or "postgresql", for test sections
  std::string url;    ///< for store::Database::open, the relay and the inbox
  std::unique_ptr<store::Database> open() const { return store::Database::open(url); }
};

/// The PostgreSQL URL from RETRYLOOP_TEST_PG_URL; fails the test when it is not set.
std::string postgres_url();

/// One fresh SQLite database and one fresh PostgreSQL schema, both migrated. `name` goes into
/// the file and schema names.
std::vector<TestDatabase> test_databases(const std::string& name);
TestDatabase fresh_sqlite(const std::string& name);
TestDatabase fresh_postgres(const std::string& name);
/// fresh_sqlite or fresh_postgres by label ("sqlite" or "postgresql"), for a test that runs once
/// per store: `database_for(GENERATE("sqlite", "postgresql"), name)`.
TestDatabase database_for(const std::string& label, const std::string& name);

}  // namespace retryloop::test
