#include "retryloop/dispatch/http_client.hpp"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace retryloop::dispatch {
namespace detail {

/// Where the requests go: `origin` + a path, or `url` for the target's own path.
struct HttpTarget {
  std::string url;
  std::string origin;
  std::string unix_socket;
  bool tls = false;
};

}  // namespace detail

namespace {

using detail::HttpTarget;
using Clock = std::chrono::steady_clock;

constexpr const char* kClosedText = "closed before the answer";

/// curl_global_init, once per process, whichever thread comes first (never cleaned up: other
/// parts of the process may use libcurl too).
CURLcode start_curl() {
  static const CURLcode started = curl_global_init(CURL_GLOBAL_DEFAULT);
  return started;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

std::string_view trimmed(std::string_view text) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && blank(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && blank(text.back()))
    text.remove_suffix(1);
  return text;
}

HttpTarget parse_target(const std::string& target) {
  HttpTarget parsed;
  if (starts_with(target, "unix:")) {
    const std::string rest = target.substr(5);
    const auto colon = rest.find(':');
    parsed.unix_socket = rest.substr(0, colon);
    const std::string path = colon == std::string::npos ? "/" : rest.substr(colon + 1);
    if (parsed.unix_socket.empty() || parsed.unix_socket.front() != '/')
      throw std::invalid_argument("the target " + target + " names no absolute socket path");
    if (path.empty() || path.front() != '/')
      throw std::invalid_argument("the target " + target + " has an HTTP path without a leading /");
    parsed.origin = "http://localhost";
    parsed.url = parsed.origin + path;
  } else if (starts_with(target, "http://") || starts_with(target, "https://")) {
    parsed.tls = starts_with(target, "https://");
    const auto host = target.find("://") + 3;
    const auto path = target.find_first_of("/?#", host);
    parsed.origin = target.substr(0, path);
    parsed.url = path == std::string::npos ? target + "/" : target;
    if (path != std::string::npos && target[path] != '/') parsed.url.insert(path, "/");
  } else {
    throw std::invalid_argument("the target " + target +
                                " is not an http://, https:// or unix: address");
  }
  CURLU* url = curl_url();
  if (url == nullptr) throw std::runtime_error("libcurl could not parse a URL");
  const CURLUcode checked = curl_url_set(url, CURLUPART_URL, parsed.url.c_str(), 0);
  char* host = nullptr;
  const bool has_host =
      checked == CURLUE_OK && curl_url_get(url, CURLUPART_HOST, &host, 0) == CURLUE_OK;
  curl_free(host);
  curl_url_cleanup(url);
  if (!has_host) throw std::invalid_argument("the target " + target + " is not a valid URL");
  return parsed;
}

Failure failure_of(CURLcode code, bool connected) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
      return Failure::refused;
    case CURLE_COULDNT_RESOLVE_HOST:
      return Failure::resolve;
    case CURLE_OPERATION_TIMEDOUT:
      return connected ? Failure::timeout : Failure::connect_timeout;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_USE_SSL_FAILED:
      return Failure::tls;
    default:
      return Failure::broken;
  }
}

Response closed_response() {
  Response response;
  response.failure = Failure::broken;
  response.failure_text = kClosedText;
  return response;
}

}  // namespace

class HttpClient::Impl {
 public:
  Impl(HttpClient* owner, uv_loop_t* loop, ClientSettings settings)
      : owner_(owner), loop_(loop), settings_(std::move(settings)) {
    if (settings_.pool_size == 0) throw std::invalid_argument("the pool size must be at least 1");
    if (settings_.max_body_bytes == 0 || settings_.max_header_bytes == 0)
      throw std::invalid_argument("the answer limits must be at least 1 byte");
    if (start_curl() != CURLE_OK) throw std::runtime_error("libcurl could not start");
    const curl_version_info_data* curl = curl_version_info(CURLVERSION_NOW);
    if (settings_.http_version == HttpVersion::http2_prior_knowledge &&
        curl->version_num < 0x080000)
      throw std::invalid_argument(std::string("HTTP/2 with prior knowledge needs libcurl 8.0.0 or "
                                              "later; libcurl ") +
                                  curl->version +
                                  " fails every reused connection (curl issue "
                                  "10634)");
    target_ = parse_target(settings_.target);
    multi_ = curl_multi_init();
    if (multi_ == nullptr) throw std::runtime_error("libcurl could not make a multi handle");
    const long pool = long(std::min<std::size_t>(settings_.pool_size, 1 << 20));
    curl_multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS, pool);
    curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, pool);
    curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, pool);
    curl_multi_setopt(multi_, CURLMOPT_PIPELINING, long(CURLPIPE_MULTIPLEX));
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &Impl::on_socket);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &Impl::on_timer_set);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    uv_timer_init(loop_, &timer_);
    timer_.data = this;
  }

  ~Impl() {
    for (auto& transfer : idle_)
      curl_easy_cleanup(transfer->easy);
  }

  void post(std::string_view path, const HeaderFields& headers, std::string body,
            ResponseCallback done) {
    if (closing_) {
      done(closed_response());
      return;
    }
    Transfer* transfer = start_transfer();
    if (transfer == nullptr) {
      Response response;
      response.failure = Failure::broken;
      response.failure_text = "libcurl could not make an easy handle";
      done(std::move(response));
      return;
    }
    transfer->done = std::move(done);
    transfer->body = std::move(body);
    set_url(*transfer, path);
    set_headers(*transfer, headers);
    CURL* easy = transfer->easy;
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(transfer->body.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, transfer->body.data());
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer->header_list.data());
    transfer->started = Clock::now();
    const CURLMcode added = curl_multi_add_handle(multi_, easy);
    if (added != CURLM_OK) {
      Response response;
      response.failure = Failure::broken;
      response.failure_text = curl_multi_strerror(added);
      auto callback = std::move(transfer->done);
      end_transfer(transfer);
      callback(std::move(response));
    }
  }

  /// Starts closing. `run_callbacks`: fail the requests in flight through their callbacks
  /// (close()), or drop them unrun (the owner's destructor).
  void close(ClosedCallback closed, bool run_callbacks) {
    if (closing_) return;
    closing_ = true;
    closed_ = std::move(closed);
    std::vector<std::unique_ptr<Transfer>> aborted = std::move(active_);
    active_.clear();
    for (auto& transfer : aborted)
      curl_multi_remove_handle(multi_, transfer->easy);
    for (auto& transfer : aborted) {
      curl_easy_cleanup(transfer->easy);
      transfer->easy = nullptr;
    }
    for (auto& transfer : idle_)
      curl_easy_cleanup(transfer->easy);
    idle_.clear();
    curl_multi_cleanup(multi_);
    multi_ = nullptr;
    while (!live_watches_.empty())
      release_watch(live_watches_.back());
    uv_timer_stop(&timer_);
    ++closes_pending_;
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Impl::on_handle_closed);
    requests_ += aborted.size();
    if (!run_callbacks) return;
    for (auto& transfer : aborted) {
      Response response = std::move(transfer->response);
      response.failure = Failure::broken;
      response.failure_text = kClosedText;
      response.elapsed =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - transfer->started);
      auto callback = std::move(transfer->done);
      callback(std::move(response));
    }
  }

  /// The owner goes away: nothing of it may be touched from now on.
  void detach() {
    owner_ = nullptr;
    close({}, false);
  }

  std::size_t in_flight() const { return active_.size(); }

  ClientStats stats() const {
    ClientStats stats;
    stats.in_flight = active_.size();
    stats.connections_open = connections_open_;
    stats.connections_opened = connections_opened_;
    stats.requests = requests_;
    stats.bodies_cut = bodies_cut_;
    stats.http2_answers = http2_answers_;
    return stats;
  }

 private:
  /// One request, and the easy handle it runs on; kept for the next request when it ends.
  struct Transfer {
    Impl* impl = nullptr;
    CURL* easy = nullptr;
    std::size_t slot = 0;  // its place in active_
    std::string url;       // what CURLOPT_URL is set to
    std::string body;
    std::string header_text;              // the fields, each "name: value" and a NUL
    std::vector<curl_slist> header_list;  // pointing into header_text
    ResponseCallback done;
    Response response;
    Clock::time_point started;
    std::size_t header_bytes = 0;
    bool connected = false;
    bool body_started = false;
    bool body_cut = false;
    bool headers_too_large = false;
    char error[CURL_ERROR_SIZE] = {};
  };

  /// A uv_poll_t on one of libcurl's sockets, from libcurl's first CURL_POLL_IN/OUT for it to
  /// its CURL_POLL_REMOVE; its memory is kept for the next socket after its close. A connection's
  /// socket (one on_open_socket opened) goes back to libcurl's pool with CURL_POLL_REMOVE after
  /// each exchange and comes out with CURL_POLL_IN for the next one: its watch stays, parked,
  /// until on_close_socket, so that a request on a reused connection changes no epoll interest.
  /// Any other socket (the resolver's) is closed by libcurl itself, unseen: its watch goes at
  /// CURL_POLL_REMOVE, so that no watch outlives its descriptor.
  struct SocketWatch {
    uv_poll_t poll;
    Impl* impl = nullptr;
    curl_socket_t fd = CURL_SOCKET_BAD;
    std::size_t slot = 0;  // its place in live_watches_
    int events = 0;        // what uv_poll_start was last given; 0: stopped
    bool parked = false;   // libcurl said CURL_POLL_REMOVE and has not asked for it again
  };

  /// A descriptor's live watch, and whether it is a connection's socket, which on_open_socket
  /// opened and on_close_socket will close (the resolver's are closed by libcurl, unseen).
  struct Descriptor {
    SocketWatch* watch = nullptr;
    bool opened = false;
  };

  Transfer* start_transfer() {
    std::unique_ptr<Transfer> transfer;
    if (!idle_.empty()) {
      transfer = std::move(idle_.back());
      idle_.pop_back();
    } else {
      transfer = std::make_unique<Transfer>();
      transfer->impl = this;
      transfer->easy = curl_easy_init();
      if (transfer->easy == nullptr) return nullptr;
      configure(*transfer);
    }
    transfer->response = Response{};
    transfer->header_bytes = 0;
    transfer->connected = false;
    transfer->body_started = false;
    transfer->body_cut = false;
    transfer->headers_too_large = false;
    transfer->error[0] = '\0';
    transfer->slot = active_.size();
    active_.push_back(std::move(transfer));
    return active_.back().get();
  }

  /// Takes `transfer` out of active_ and keeps it for the next request, or frees it.
  void end_transfer(Transfer* transfer) {
    const std::size_t slot = transfer->slot;
    std::unique_ptr<Transfer> ended = std::move(active_[slot]);
    if (slot + 1 != active_.size()) {
      active_[slot] = std::move(active_.back());
      active_[slot]->slot = slot;
    }
    active_.pop_back();
    ended->body.clear();
    ended->done = nullptr;
    if (idle_.size() < 2 * settings_.pool_size) {
      idle_.push_back(std::move(ended));
    } else {
      curl_easy_cleanup(ended->easy);
    }
  }

  void configure(Transfer& transfer) {
    CURL* easy = transfer.easy;
    curl_easy_setopt(easy, CURLOPT_PRIVATE, &transfer);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, transfer.error);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy, CURLOPT_PROXY, "");
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &Impl::on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &Impl::on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, &transfer);
    curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, &Impl::on_connected);
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, &transfer);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, &Impl::on_open_socket);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, this);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, &Impl::on_close_socket);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, this);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, long(settings_.connect_timeout.count()));
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, long(settings_.request_timeout.count()));
    switch (settings_.http_version) {
      case HttpVersion::http1:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1));
        break;
      case HttpVersion::negotiate:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
                         long(target_.tls ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_1_1));
        break;
      case HttpVersion::http2_prior_knowledge:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE));
        break;
    }
    // Where HTTP/2 may come, wait for a connection that may multiplex rather than open another.
    const bool may_multiplex = settings_.http_version == HttpVersion::http2_prior_knowledge ||
                               (settings_.http_version == HttpVersion::negotiate && target_.tls);
    if (may_multiplex) curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
    if (!target_.unix_socket.empty())
      curl_easy_setopt(easy, CURLOPT_UNIX_SOCKET_PATH, target_.unix_socket.c_str());
    if (target_.tls) {
      curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
      curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
      if (!settings_.ca_file.empty())
        curl_easy_setopt(easy, CURLOPT_CAINFO, settings_.ca_file.c_str());
      if (!settings_.client_certificate.empty()) {
        curl_easy_setopt(easy, CURLOPT_SSLCERT, settings_.client_certificate.c_str());
        curl_easy_setopt(easy, CURLOPT_SSLKEY,
                         settings_.client_key.empty() ? settings_.client_certificate.c_str()
                                                      : settings_.client_key.c_str());
      }
    }
  }

  void set_url(Transfer& transfer, std::string_view path) {
    if (path.empty()) {
      if (transfer.url == target_.url) return;
      transfer.url = target_.url;
    } else {
      const std::size_t origin = target_.origin.size();
      const bool slash = path.front() == '/';
      if (transfer.url.size() == origin + path.size() + (slash ? 0 : 1) &&
          starts_with(transfer.url, target_.origin) &&
          std::string_view(transfer.url).substr(transfer.url.size() - path.size()) == path)
        return;
      transfer.url = target_.origin;
      if (!slash) transfer.url.push_back('/');
      transfer.url.append(path);
    }
    curl_easy_setopt(transfer.easy, CURLOPT_URL, transfer.url.c_str());
  }

  /// Builds the request's field list in the transfer's own storage: no allocation once the
  /// transfer has carried a request as large.
  static void set_headers(Transfer& transfer, const HeaderFields& headers) {
    std::string& text = transfer.header_text;
    text.clear();
    bool has_content_type = false;
    for (const auto& [name, value] : headers) {
      if (same_ignoring_case(name, "Content-Type")) has_content_type = true;
      const std::size_t start = text.size();
      text.append(name);
      if (value.empty()) {
        text.push_back(';');  // libcurl's way to send a field with no value
      } else {
        text.append(": ");
        const std::size_t value_start = text.size();
        text.append(value);
        for (std::size_t at = text.find_first_of("\r\n", value_start); at != std::string::npos;
             at = text.find_first_of("\r\n", at + 1))
          text[at] = ' ';
      }
      if (text.find_first_of("\r\n", start) < text.size())
        text.resize(start);  // in the name
      else
        text.push_back('\0');
    }
    text.append("Expect:");  // no 100-continue round trip before a large body
    text.push_back('\0');
    if (!has_content_type) {
      text.append("Content-Type:");  // none, rather than libcurl's form type
      text.push_back('\0');
    }
    auto& list = transfer.header_list;
    list.clear();
    for (std::size_t at = 0; at < text.size(); at += std::strlen(text.data() + at) + 1)
      list.push_back(curl_slist{text.data() + at, nullptr});
    for (std::size_t i = 0; i + 1 < list.size(); ++i)
      list[i].next = &list[i + 1];
  }

  void finish(Transfer* transfer, CURLcode result) {
    Response response = std::move(transfer->response);
    long status = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &status);
    response.status = int(status);
    long version = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_HTTP_VERSION, &version);
    if (status != 0 && version == CURL_HTTP_VERSION_2_0) ++http2_answers_;
    if (transfer->body_cut) ++bodies_cut_;
    if (transfer->headers_too_large) {
      response.failure = Failure::broken;
      response.failure_text = "the answer's header is larger than " +
                              std::to_string(settings_.max_header_bytes) + " bytes";
    } else if (result != CURLE_OK && !(result == CURLE_WRITE_ERROR && transfer->body_cut)) {
      response.failure = failure_of(result, transfer->connected);
      response.failure_text =
          transfer->error[0] != '\0' ? transfer->error : curl_easy_strerror(result);
    }
    response.body_cut = transfer->body_cut;
    response.elapsed =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - transfer->started);
    ++requests_;
    auto callback = std::move(transfer->done);
    end_transfer(transfer);
    callback(std::move(response));
  }

  /// Ends the transfers libcurl says are done, until the client closes meanwhile.
  void read_done() {
    int left = 0;
    while (!closing_) {
      CURLMsg* message = curl_multi_info_read(multi_, &left);
      if (message == nullptr) break;
      if (message->msg != CURLMSG_DONE) continue;
      Transfer* transfer = nullptr;
      curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, &transfer);
      const CURLcode result = message->data.result;
      curl_multi_remove_handle(multi_, transfer->easy);
      finish(transfer, result);
    }
  }

  void act(curl_socket_t fd, int events) {
    int running = 0;
    curl_multi_socket_action(multi_, fd, events, &running);
    read_done();
  }

  SocketWatch* watch(curl_socket_t fd) {
    SocketWatch* watch;
    if (!free_watches_.empty()) {
      watch = free_watches_.back();
      free_watches_.pop_back();
    } else {
      watches_.push_back(std::make_unique<SocketWatch>());
      watch = watches_.back().get();
      watch->impl = this;
    }
    if (uv_poll_init_socket(loop_, &watch->poll, fd) != 0) {
      free_watches_.push_back(watch);
      return nullptr;
    }
    watch->poll.data = watch;
    watch->fd = fd;
    watch->events = 0;
    watch->parked = false;
    watch->slot = live_watches_.size();
    live_watches_.push_back(watch);
    descriptor(fd).watch = watch;
    return watch;
  }

  /// What the client knows of descriptor `fd` (a valid one), grown as needed.
  Descriptor& descriptor(curl_socket_t fd) {
    if (std::size_t(fd) >= descriptors_.size()) descriptors_.resize(std::size_t(fd) + 1);
    return descriptors_[std::size_t(fd)];
  }

  /// Asks the loop for `events` on the watch's socket, unless it asks for them already.
  static void watch_for(SocketWatch* watch, int events) {
    if (events == watch->events) return;
    watch->events = events;
    if (events == 0) {
      uv_poll_stop(&watch->poll);
    } else {
      uv_poll_start(&watch->poll, events, &Impl::on_poll);
    }
  }

  void release_watch(SocketWatch* watch) {
    const std::size_t slot = watch->slot;
    live_watches_[slot] = live_watches_.back();
    live_watches_[slot]->slot = slot;
    live_watches_.pop_back();
    descriptor(watch->fd).watch = nullptr;
    uv_poll_stop(&watch->poll);
    ++closes_pending_;
    uv_close(reinterpret_cast<uv_handle_t*>(&watch->poll), &Impl::on_handle_closed);
  }

  void handle_closed(uv_handle_t* handle) {
    if (handle != reinterpret_cast<uv_handle_t*>(&timer_))
      free_watches_.push_back(static_cast<SocketWatch*>(handle->data));
    if (--closes_pending_ != 0 || !closing_) return;
    if (owner_ != nullptr) {
      owner_->final_stats_ = stats();
      owner_->impl_ = nullptr;
    }
    ClosedCallback closed = std::move(closed_);
    delete this;
    if (closed) closed();
  }

  static int on_socket(CURL*, curl_socket_t fd, int what, void* client, void*) {
    auto* impl = static_cast<Impl*>(client);
    if (impl->closing_) return 0;
    Descriptor& descriptor = impl->descriptor(fd);
    SocketWatch* watch = descriptor.watch;
    if (what == CURL_POLL_REMOVE) {
      // A connection's socket is parked until it is closed or used again: readable only, so
      // that a connection the server closes meanwhile is seen once (on_poll stops the watch
      // then) and never spins; the interest a request on a reused connection asks for is most
      // often this one. A parked watch does not keep the loop running, as an idle connection did
      // not before.
      if (watch != nullptr && !descriptor.opened) {
        impl->release_watch(watch);
      } else if (watch != nullptr) {
        watch->parked = true;
        uv_unref(reinterpret_cast<uv_handle_t*>(&watch->poll));
        watch_for(watch, watch->events == 0 ? 0 : UV_READABLE);
      }
      return 0;
    }
    if (watch == nullptr) {
      watch = impl->watch(fd);
      if (watch == nullptr) return -1;
    } else if (watch->parked) {
      watch->parked = false;
      uv_ref(reinterpret_cast<uv_handle_t*>(&watch->poll));
    }
    int events = 0;
    if (what & CURL_POLL_IN) events |= UV_READABLE;
    if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
    watch_for(watch, events);
    return 0;
  }

  static int on_timer_set(CURLM*, long timeout_ms, void* client) {
    auto* impl = static_cast<Impl*>(client);
    if (impl->closing_) return 0;
    if (timeout_ms < 0) {
      uv_timer_stop(&impl->timer_);
    } else {
      uv_timer_start(&impl->timer_, &Impl::on_timer, uint64_t(timeout_ms), 0);
    }
    return 0;
  }

  static void on_timer(uv_timer_t* timer) {
    static_cast<Impl*>(timer->data)->act(CURL_SOCKET_TIMEOUT, 0);
  }

  static void on_poll(uv_poll_t* poll, int status, int events) {
    auto* watch = static_cast<SocketWatch*>(poll->data);
    if (watch->parked) {
      // An idle connection became readable: the server closed it or wrote out of turn. libcurl
      // finds that out when it next looks at the connection; until then, no more of its events.
      watch_for(watch, 0);
      return;
    }
    int flags = 0;
    if (status < 0) {
      flags = CURL_CSELECT_ERR;
    } else {
      if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
      if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
    }
    watch->impl->act(watch->fd, flags);
  }

  static void on_handle_closed(uv_handle_t* handle) {
    Impl* impl = handle->type == UV_TIMER ? static_cast<Impl*>(handle->data)
                                          : static_cast<SocketWatch*>(handle->data)->impl;
    impl->handle_closed(handle);
  }

  static curl_socket_t on_open_socket(void* client, curlsocktype, curl_sockaddr* address) {
    const int fd = ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
    if (fd < 0) return CURL_SOCKET_BAD;
    auto* impl = static_cast<Impl*>(client);
    impl->descriptor(fd).opened = true;
    ++impl->connections_open_;
    ++impl->connections_opened_;
    return fd;
  }

  static int on_close_socket(void* client, curl_socket_t fd) {
    auto* impl = static_cast<Impl*>(client);
    --impl->connections_open_;
    Descriptor& descriptor = impl->descriptor(fd);
    descriptor.opened = false;
    // The watch must not outlive the descriptor, whose number the next socket may get.
    if (descriptor.watch != nullptr) impl->release_watch(descriptor.watch);
    return ::close(fd);
  }

  static int on_connected(void* user, char*, char*, int, int) {
    static_cast<Transfer*>(user)->connected = true;
    return CURL_PREREQFUNC_OK;
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
    const std::size_t bytes = size * count;
    auto* transfer = static_cast<Transfer*>(user);
    transfer->body_started = true;
    std::string& body = transfer->response.body;
    const std::size_t room = transfer->impl->settings_.max_body_bytes - body.size();
    if (bytes <= room) {
      body.append(data, bytes);
      return bytes;
    }
    body.append(data, room);
    transfer->body_cut = true;
    return 0;  // not all taken: libcurl ends the transfer
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
    const std::size_t bytes = size * count;
    auto* transfer = static_cast<Transfer*>(user);
    transfer->header_bytes += bytes;
    if (transfer->header_bytes > transfer->impl->settings_.max_header_bytes) {
      transfer->headers_too_large = true;
      return 0;
    }
    if (transfer->body_started) return bytes;  // trailers
    auto& headers = transfer->response.headers;
    const std::string_view line(data, bytes);
    if (starts_with(line, "HTTP/")) {
      headers.clear();  // a new answer: the one before was interim (1xx)
      return bytes;
    }
    if (line.empty() || line.front() == '\r' || line.front() == '\n') return bytes;
    if (line.front() == ' ' || line.front() == '\t') {
      if (!headers.empty()) {
        headers.back().second.push_back(' ');
        headers.back().second.append(trimmed(line));
      }
      return bytes;
    }
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return bytes;
    headers.emplace_back(std::string(trimmed(line.substr(0, colon))),
                         std::string(trimmed(line.substr(colon + 1))));
    return bytes;
  }

  HttpClient* owner_;
  uv_loop_t* loop_;
  ClientSettings settings_;
  HttpTarget target_;
  CURLM* multi_ = nullptr;
  uv_timer_t timer_{};
  bool closing_ = false;
  ClosedCallback closed_;
  std::size_t closes_pending_ = 0;

  std::vector<std::unique_ptr<Transfer>> active_;
  std::vector<std::unique_ptr<Transfer>> idle_;
  std::vector<std::unique_ptr<SocketWatch>> watches_;  // every watch made, owned here
  std::vector<SocketWatch*> live_watches_;
  std::vector<SocketWatch*> free_watches_;
  std::vector<Descriptor> descriptors_;  // by descriptor number

  std::size_t connections_open_ = 0;
  std::uint64_t connections_opened_ = 0;
  std::uint64_t requests_ = 0;
  std::uint64_t bodies_cut_ = 0;
  std::uint64_t http2_answers_ = 0;
};

HttpClient::HttpClient(uv_loop_t* loop, ClientSettings settings)
    : impl_(new Impl(this, loop, std::move(settings))) {}

HttpClient::~HttpClient() {
  if (impl_ != nullptr) impl_->detach();
}

void HttpClient::post(std::string_view path, const HeaderFields& headers, std::string body,
                      ResponseCallback done) {
  if (impl_ == nullptr) {
    done(closed_response());
    return;
  }
  impl_->post(path, headers, std::move(body), std::move(done));
}

void HttpClient::close(ClosedCallback closed) {
  if (impl_ != nullptr) impl_->close(std::move(closed), true);
}

std::size_t HttpClient::in_flight() const {
  return impl_ != nullptr ? impl_->in_flight() : 0;
}

ClientStats HttpClient::stats() const {
  return impl_ != nullptr ? impl_->stats() : final_stats_;
}

}  // namespace retryloop::dispatch
