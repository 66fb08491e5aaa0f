#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/client/error.hpp"

namespace retryloop::migrate {

/// The body of one entry of a copied log: the stamps, one per line.
std::string encode_copied(const std::vector<std::string>& stamps);
/// The stamps of an entry's body; empty lines are skipped.
std::vector<std::string> decode_copied(std::string_view body);

/// What a migration's moves back have copied, kept on the broker, so that a rerun after a kill
/// drops the originals whose copies are already in their queue instead of copying them again
/// (docs/migrate.md, "Resuming"). Each entry is a message of the queue `N.migration.copied`: the
/// stamps of copies confirmed before their originals are acked, with the migration's id and the
/// queue they went to in its headers. The queue keeps the newest 16 MiB (drop-head): a kill leaves
/// only the originals of its last moments' copies. All calls and callbacks happen on the
/// connection's loop thread.
class CopiedLog {
 public:
  /// The log, and the stamps it holds for the migration's copies into the destination.
  using OpenCallback = std::function<void(
      const client::Error& error, std::shared_ptr<CopiedLog> log, std::vector<std::string> copied)>;

  /// Declares the service's log queue and reads back what it holds for migration `migration`'s
  /// copies into `destination` (the entries stay). Returns an error when it cannot start (then
  /// `done` is never called).
  static client::Error open(const std::shared_ptr<client::Connection>& connection,
                            const std::string& service, std::string migration,
                            std::string destination, OpenCallback done);

  /// Adds an entry; `done` once the broker has confirmed it (an error if it did not).
  void append(const std::vector<std::string>& stamps,
              std::function<void(const client::Error& error)> done);
  /// Closes its channel.
  void close();

  struct State;
  explicit CopiedLog(std::shared_ptr<State> state);

 private:
  std::shared_ptr<State> state_;
};

}  // namespace retryloop::migrate
