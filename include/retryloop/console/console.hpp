#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "retryloop/topology/topology.hpp"

namespace spdlog {
class logger;
}

namespace retryloop::console {

/// What a console user may do: `reader` looks (state, messages, scans, counts), `operator` also
/// replays (and stops a running action), `admin` also purges.
enum class Role { reader, operator_ /* `operator` is a keyword */, admin };
const char* to_string(Role role);

/// A console user: a name for the audit trail and the page, a role, and the token they send.
struct Identity {
  std::string name;
  Role role = Role::reader;
  std::string token;
};

/// Reads a tokens file: one identity a line, `NAME ROLE TOKEN` separated by spaces, `#` starting
/// a comment line. Throws std::invalid_argument naming the line and what is wrong: an unknown
/// role, a name that is not UTF-8, a name or token used twice, a token shorter than 16
/// characters, no identity at all; or the file: unreadable, larger than 1 MiB.
std::vector<Identity> read_identities(const std::string& path);

/// The text of a file that holds one token (`--token-file`), as it is. Throws
/// std::invalid_argument when it cannot be read or is larger than 4 KiB.
std::string read_token_file(const std::string& path);

/// The parking console: a web page, served over HTTP, that shows one service's parking queue
/// and replays or purges its messages through retryloop::parking.
struct Options {
  /// The broker; the connection is made again whenever it is lost.
  client::ConnectionOptions connection;
  /// The services whose parking queues the console serves: one, or every service of a topology
  /// file (the page switches between them). The first is shown first.
  std::vector<topology::Service> services;
  /// Keep the audit trail in the vhost's audit stream (the topology file declares `audit`);
  /// false: in memory, for this process only.
  bool audit_on_broker = false;
  /// The audit key (parking::read_audit_key): the console signs the records it appends with it,
  /// and shows a record read back as verified only when its signature is valid. Empty: nothing is
  /// signed, and every record read back is unverified.
  std::string audit_key;
  /// Where to listen. A host that is not a loopback address makes the console reachable from
  /// other machines.
  std::string listen_host = "127.0.0.1";
  /// 0: any free port (ServeInfo::port says which).
  uint16_t listen_port = 8080;
  /// What every API request must carry in the X-Retryloop-Token header. Empty: a random one
  /// (unless `identities` are given). Its holder may do everything (the admin role).
  std::string token;
  /// Named tokens, each with a role (read_identities reads them from a file). When given,
  /// `token` is not used: every API request must carry one of these tokens, and its role must
  /// allow the call (403 naming the role needed otherwise).
  std::vector<Identity> identities;
  /// Messages shown in the list (the first matching ones, from the head of the queue).
  size_t list_limit = 200;
  /// A scan reads every parked message, and each read counts as a delivery in a quorum queue,
  /// so the counts are refreshed automatically only when the depth changed, and at most this
  /// often (and never more often than ten times the last scan's duration). 0: only on demand
  /// and after an action.
  std::chrono::milliseconds rescan_after{30000};
  /// A scan reads every parked message once, and a quorum queue counts each read as a delivery.
  /// So the console checks at start that a quorum service's parking queue has the file's
  /// arguments, `x-delivery-limit` among them (retryloop's 1,000,000; without it RabbitMQ 4.x
  /// drops a message at its 21st read), and refuses to serve it otherwise
  /// (Status::unsafe_delivery_limit). true serves it anyway: for a queue whose limit a policy
  /// raised, which no AMQP client can see. A policy that lowers the limit is not seen either.
  bool allow_counted_reads = false;
  /// Where the console logs (start, actions, reconnects); nullptr: nowhere.
  std::shared_ptr<spdlog::logger> logger;
};

/// Where the console listens, once it does.
struct ServeInfo {
  std::string host;
  uint16_t port = 0;
  std::string token;
  /// Whether the token was made up (Options::token was empty).
  bool generated_token = false;
  /// `http://HOST:PORT/`.
  std::string url;
  /// Whether the host is a loopback address: otherwise other machines can reach the console.
  bool loopback = true;
};

/// Why serve() could not run, or how it ended.
struct ServeResult {
  enum class Status {
    stopped,         ///< stopped by SIGINT or SIGTERM
    cannot_listen,   ///< the address could not be bound
    cannot_connect,  ///< the first connection to the broker failed
    no_queue,        ///< the service's parking queue does not exist
    /// the parking queue is a quorum queue declared without retryloop's delivery limit, or with
    /// other arguments than the file's, or they could not be compared: repeated scans could
    /// drop parked messages (see Options::allow_counted_reads)
    unsafe_delivery_limit,
  };
  Status status = Status::stopped;
  std::string message;
};

/// Connects, listens and serves until SIGINT or SIGTERM (the first lets a running replay's
/// copies settle, a second stops at once). `on_ready` is called once, on the calling thread,
/// when the console is connected and listening. The connection lives on a libuv loop of its own
/// on the calling thread; HTTP requests are handled on other threads, which hand their work to
/// that loop.
ServeResult serve(const Options& options, const std::function<void(const ServeInfo&)>& on_ready);

}  // namespace retryloop::console
