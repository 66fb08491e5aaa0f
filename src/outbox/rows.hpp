#pragma once

#include "retryloop/outbox/outbox.hpp"
#include "retryloop/store/database.hpp"

namespace retryloop::outbox::detail {

/// The columns decode_row() reads, in its order, for a SELECT list.
extern const char* const row_columns;

/// A row selected with row_columns. Throws StoreError (usage) when its properties or headers
/// cannot become a message's; `lenient` keeps those empty instead (to list such a row).
OutboxRow decode_row(const store::Row& row, bool lenient = false);

}  // namespace retryloop::outbox::detail
