#pragma once

#include "retryloop/store/database.hpp"

namespace retryloop::outbox {

/// The version of the tables this release reads and writes (`retryloop_outbox`,
/// `retryloop_inbox`, `retryloop_cancelled`), recorded in `retryloop_schema`. docs/outbox.md
/// describes each version.
constexpr int schema_version = 3;

/// What migrate() did.
struct Migration {
  int from = 0;  ///< 0: there were no tables
  int to = 0;
};

/// Creates the tables, or migrates them to schema_version, one version at a time, in one
/// transaction; concurrent calls wait for each other. Refuses (StoreError, schema) a database
/// whose schema is newer than this release.
Migration migrate(store::Database& database);

/// The schema version the database holds; 0 when it has none.
int installed_version(store::Database& database);

/// Throws StoreError (schema), naming the command that fixes it, unless the database holds
/// exactly schema_version.
void require_schema(store::Database& database);

}  // namespace retryloop::outbox
