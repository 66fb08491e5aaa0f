#pragma once

#include "retryloop/outbox/outbox.hpp"
#include "retryloop/store/database.hpp"

namespace retryloop::outbox::detail {

/// The columns decode_row() reads, in its order, for a SELECT list.
extern const char* const row_columns;

/// A row selected with row_columns.
OutboxRow decode_row(const store::Row& row);

}  // namespace retryloop::outbox::detail
