#pragma once

#include <vector>

#include "retryloop/outbox/outbox.hpp"
#include "retryloop/store/database.hpp"

namespace retryloop::outbox::detail {

/// The columns decode_row() reads, in its order, for a SELECT list.
extern const char* const row_columns;

/// A row selected with row_columns. Throws StoreError (usage) when its properties or headers
/// cannot become a message's; `lenient` keeps those empty instead (to list such a row).
OutboxRow decode_row(const store::Row& row, bool lenient = false);

/// PostgreSQL, in the transaction of a claim that holds the locks of the claimed rows' ordering
/// keys: leaves out of `rows` (the claimed rows, in id order) every row of a key that has a row
/// pending or failed before the key's last row in `rows` and not among them, a row that the claim
/// passed over while another relay held the key. Those rows stay pending, to be claimed again
/// from the key's first. Returns how many rows it left out.
size_t leave_out_overtaking_rows(store::Database& database, std::vector<OutboxRow>& rows);

}  // namespace retryloop::outbox::detail
