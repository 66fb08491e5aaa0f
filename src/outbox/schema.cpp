#include "retryloop/outbox/schema.hpp"

#include <string>

namespace retryloop::outbox {
namespace {

// One migration: the statements that take the schema from version - 1 to version.
struct Step {
  int version;
  const char* sqlite;
  const char* postgresql;
};

// Version 1: the outbox and the inbox. Times are milliseconds since the Unix epoch. On
// PostgreSQL, a row with an ordering key takes a per-key lock and only then its id, so that rows
// of one key get ids in the order their transactions commit; and every insert statement
// notifies channel retryloop_outbox at commit, which wakes the relays.
constexpr Step steps[] = {
    {1,
     R"sql(
CREATE TABLE retryloop_outbox (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  exchange TEXT NOT NULL DEFAULT '',
  routing_key TEXT NOT NULL DEFAULT '',
  message_id TEXT NOT NULL DEFAULT (lower(hex(randomblob(16)))),
  properties TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(properties)),
  headers TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
  body BLOB NOT NULL DEFAULT x'',
  ordering_key TEXT,
  created_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
  state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'failed', 'published')),
  attempts INTEGER NOT NULL DEFAULT 0,
  last_error TEXT,
  updated_at INTEGER
);
CREATE INDEX retryloop_outbox_pending ON retryloop_outbox (id) WHERE state = 'pending';
CREATE INDEX retryloop_outbox_failed_keys ON retryloop_outbox (ordering_key, id)
  WHERE state = 'failed';
CREATE INDEX retryloop_outbox_published ON retryloop_outbox (updated_at)
  WHERE state = 'published';
CREATE TABLE retryloop_inbox (
  consumer TEXT NOT NULL,
  message_id TEXT NOT NULL,
  received_at INTEGER NOT NULL,
  PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX retryloop_inbox_received ON retryloop_inbox (received_at);
)sql",
     R"sql(
CREATE SEQUENCE retryloop_outbox_id_seq;
CREATE TABLE retryloop_outbox (
  id bigint PRIMARY KEY DEFAULT nextval('retryloop_outbox_id_seq'),
  exchange text NOT NULL DEFAULT '',
  routing_key text NOT NULL DEFAULT '',
  message_id text NOT NULL DEFAULT gen_random_uuid()::text,
  properties jsonb NOT NULL DEFAULT '{}',
  headers jsonb NOT NULL DEFAULT '{}',
  body bytea NOT NULL DEFAULT '',
  ordering_key text,
  created_at bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'failed', 'published')),
  attempts integer NOT NULL DEFAULT 0,
  last_error text,
  updated_at bigint
);
ALTER SEQUENCE retryloop_outbox_id_seq OWNED BY retryloop_outbox.id;
CREATE INDEX retryloop_outbox_pending ON retryloop_outbox (id) WHERE state = 'pending';
CREATE INDEX retryloop_outbox_failed_keys ON retryloop_outbox (ordering_key, id)
  WHERE state = 'failed';
CREATE INDEX retryloop_outbox_published ON retryloop_outbox (updated_at)
  WHERE state = 'published';
CREATE FUNCTION retryloop_outbox_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.ordering_key IS NOT NULL THEN
    PERFORM pg_advisory_xact_lock(727272001, hashtext(NEW.ordering_key));
    NEW.id := nextval('retryloop_outbox_id_seq');
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER retryloop_outbox_order BEFORE INSERT ON retryloop_outbox
  FOR EACH ROW EXECUTE FUNCTION retryloop_outbox_order();
CREATE FUNCTION retryloop_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('retryloop_outbox', '');
  RETURN NULL;
END $$;
CREATE TRIGGER retryloop_outbox_notify AFTER INSERT ON retryloop_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION retryloop_outbox_notify();
CREATE TABLE retryloop_inbox (
  consumer text NOT NULL,
  message_id text NOT NULL,
  received_at bigint NOT NULL,
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX retryloop_inbox_received ON retryloop_inbox (received_at);
)sql"},
    // Version 2: scheduled delivery. An outbox row may be due later (`due_at`, through the delay
    // levels), and a scheduled message may be cancelled by its id until an inbox consumer sees it.
    {2,
     R"sql(
ALTER TABLE retryloop_outbox ADD COLUMN due_at INTEGER;
CREATE TABLE retryloop_cancelled (
  message_id TEXT PRIMARY KEY,
  cancelled_at INTEGER NOT NULL,
  keep_until INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX retryloop_cancelled_keep ON retryloop_cancelled (keep_until);
)sql",
     R"sql(
ALTER TABLE retryloop_outbox ADD COLUMN due_at bigint;
CREATE TABLE retryloop_cancelled (
  message_id text PRIMARY KEY,
  cancelled_at bigint NOT NULL,
  keep_until bigint NOT NULL
);
CREATE INDEX retryloop_cancelled_keep ON retryloop_cancelled (keep_until);
)sql"},
    // Version 3: a cancellation names the queue of its message, since one id may be scheduled
    // for several queues, and the inbox records the queue each id arrived in, so that a cancel
    // tells a message of its own queue from another's. The queue '' stands for any queue: the
    // cancellations and ids recorded before version 3 keep applying to the id in every queue.
    {3,
     R"sql(
CREATE TABLE retryloop_cancelled_v3 (
  queue TEXT NOT NULL,
  message_id TEXT NOT NULL,
  cancelled_at INTEGER NOT NULL,
  keep_until INTEGER NOT NULL,
  PRIMARY KEY (queue, message_id)
) WITHOUT ROWID;
INSERT INTO retryloop_cancelled_v3 (queue, message_id, cancelled_at, keep_until)
  SELECT '', message_id, cancelled_at, keep_until FROM retryloop_cancelled;
DROP TABLE retryloop_cancelled;
ALTER TABLE retryloop_cancelled_v3 RENAME TO retryloop_cancelled;
CREATE INDEX retryloop_cancelled_keep ON retryloop_cancelled (keep_until);
ALTER TABLE retryloop_inbox ADD COLUMN queue TEXT NOT NULL DEFAULT '';
)sql",
     R"sql(
ALTER TABLE retryloop_cancelled ADD COLUMN queue text NOT NULL DEFAULT '';
ALTER TABLE retryloop_cancelled DROP CONSTRAINT retryloop_cancelled_pkey;
ALTER TABLE retryloop_cancelled ADD PRIMARY KEY (queue, message_id);
ALTER TABLE retryloop_inbox ADD COLUMN queue text NOT NULL DEFAULT '';
)sql"},
};

constexpr const char* create_schema_table =
    "CREATE TABLE IF NOT EXISTS retryloop_schema (component TEXT PRIMARY KEY, version INTEGER NOT "
    "NULL)";

int read_version(store::Database& database) {
  auto result =
      database.execute("SELECT version FROM retryloop_schema WHERE component = 'retryloop'");
  return result.rows.empty() ? 0 : static_cast<int>(result.rows[0].integer(0));
}

}  // namespace

int installed_version(store::Database& database) {
  try {
    return read_version(database);
  } catch (const store::StoreError& error) {
    if (error.kind() == store::ErrorKind::schema) return 0;
    throw;
  }
}

Migration migrate(store::Database& database) {
  store::Transaction transaction(database);
  if (database.dialect() == store::Dialect::postgresql) {
    // Two inits at once: the second waits here, then finds the work done.
    database.execute("SELECT pg_advisory_xact_lock(727272000)");
  }
  database.execute(create_schema_table);
  Migration migration;
  migration.from = read_version(database);
  if (migration.from > schema_version) {
    throw store::StoreError(store::ErrorKind::schema,
                            "the database holds retryloop schema version " +
                                std::to_string(migration.from) + ", newer than this release's " +
                                std::to_string(schema_version) + ": use a newer retryloop");
  }
  for (const Step& step : steps) {
    if (step.version <= migration.from) continue;
    database.execute_script(database.dialect() == store::Dialect::sqlite ? step.sqlite
                                                                         : step.postgresql);
  }
  migration.to = schema_version;
  database.execute(
      "INSERT INTO retryloop_schema (component, version) VALUES ('retryloop', $1) "
      "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
      {int64_t{schema_version}});
  transaction.commit();
  return migration;
}

void require_schema(store::Database& database) {
  int version = installed_version(database);
  if (version == schema_version) return;
  if (version == 0) {
    throw store::StoreError(store::ErrorKind::schema,
                            "the database has no retryloop tables: run 'retryloop outbox init "
                            "--db URL' first");
  }
  throw store::StoreError(
      store::ErrorKind::schema,
      "the database holds retryloop schema version " + std::to_string(version) +
          ", this release needs " + std::to_string(schema_version) +
          (version < schema_version ? ": run 'retryloop outbox init --db URL' to migrate"
                                    : ": use a newer retryloop"));
}

}  // namespace retryloop::outbox
