#pragma once

#include <memory>
#include <string>

#include "retryloop/store/database.hpp"

namespace retryloop::store::detail {

std::unique_ptr<Database> open_sqlite(const std::string& path, bool create);
std::unique_ptr<Database> adopt_sqlite(sqlite3* connection);
std::unique_ptr<Database> open_postgres(const std::string& conninfo);
std::unique_ptr<Database> adopt_postgres(pg_conn* connection);

}  // namespace retryloop::store::detail
