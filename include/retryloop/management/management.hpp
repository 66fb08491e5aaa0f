#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retryloop/topology/plan.hpp"

namespace retryloop::management {

/// One node's management API address.
struct ApiHost {
  std::string host;
  uint16_t port = 15672;

  /// `host:port`, with an IPv6 host in brackets.
  std::string text() const;
};

/// Where the management HTTP API listens: `http[s]://[user:pass@]host[:port][,host2[:port]...]
/// [/prefix]`, one host or several nodes of a cluster, asked in order until one answers. A port
/// defaults to 15672 (15671 for https). Without credentials in the URL the caller's (the AMQP
/// URI's) are used: see parse_api_url.
struct ApiUrl {
  bool tls = false;
  std::vector<ApiHost> hosts;
  std::string user;
  std::string password;
  /// A path the API is mounted under (`management.path_prefix`), without a trailing slash.
  std::string path_prefix;

  /// The URL with the password replaced by `***`, for output and logs.
  std::string redacted() const;
};

/// Parses `url`; a URL without a user takes `default_user` and `default_password`. Throws
/// std::invalid_argument naming what is wrong (scheme, port, percent-encoding, a query).
ApiUrl parse_api_url(std::string_view url, const std::string& default_user,
                     const std::string& default_password);

/// A queue as the management API shows it. For a quorum queue, its Raft members: the nodes that
/// hold a replica, those of them that are running, and the one that leads.
struct QueueMembers {
  std::string type;  ///< "quorum", "classic", "stream"
  std::string leader;
  std::vector<std::string> members;
  std::vector<std::string> online;
};

/// Why a request got no usable answer: `status` 0 when no HTTP answer came (refused, timed out,
/// TLS), else the HTTP status (401 wrong credentials, 404 no such queue or vhost, ...).
struct ApiError {
  int status = 0;
  std::string message;
};

/// A blocking client of one node's management API. Each call makes one HTTP request and waits
/// for it, at most `timeout`; it never throws. Not for the event loop's thread of a running
/// consumer: the CLI calls it after its AMQP work.
class ManagementClient {
 public:
  explicit ManagementClient(ApiUrl url,
                            std::chrono::milliseconds timeout = std::chrono::seconds(10));

  /// GET /api/queues/VHOST/NAME, from the first host that answers. nullopt with `error` set when
  /// it fails; a missing queue is an error with status 404.
  std::optional<QueueMembers> queue(const std::string& vhost, const std::string& name,
                                    ApiError& error) const;

  const ApiUrl& url() const { return url_; }

 private:
  ApiUrl url_;
  std::chrono::milliseconds timeout_;
};

/// One quorum queue of a plan, compared with what the broker says of its members.
struct MembersCheck {
  std::string queue;
  /// The members the plan asks for: its `x-quorum-initial-group-size`, or nullopt when it sets
  /// none (then every member the queue has should be online).
  std::optional<int64_t> wanted;
  /// What the API said; nullopt when it could not be asked (see `error`).
  std::optional<QueueMembers> found;
  ApiError error;

  /// The members that must be online: `wanted`, or every member the queue has.
  size_t required() const;
  /// The queue answered, and has at least `required()` members online.
  bool ok() const;
  /// Members that are not online, in the API's order.
  std::vector<std::string> offline() const;
};

/// Asks `client` about every quorum queue that `plan` declares (in plan order), in `vhost`.
std::vector<MembersCheck> check_members(const ManagementClient& client, const topology::Plan& plan,
                                        const std::string& vhost);

}  // namespace retryloop::management
