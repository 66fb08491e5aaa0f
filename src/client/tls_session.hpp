#pragma once

// Private to the client module: the TLS layer of an amqps:// connection.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "retryloop/client/error.hpp"

struct ssl_st;
struct ssl_ctx_st;
struct bio_st;
struct x509_store_ctx_st;

namespace retryloop::client::detail {

/// What a session checks; the connection resolves it from TlsOptions and the URI.
struct TlsSettings {
  /// PEM file of trusted CAs; empty: the system's trust store.
  std::string ca_file;
  /// The client certificate (chain) and its key, PEM; both empty: none.
  std::string cert_file;
  std::string key_file;
  bool verify_peer = true;
  /// Checked against the certificate, and sent as SNI unless it is an IP address.
  std::string server_name;
  /// The broker's host:port, for messages.
  std::string peer;
};

/// A TLS client session over two OpenSSL memory BIOs, with no I/O of its own: the transport
/// feeds it the bytes read from the socket and writes out what it hands back. Single-threaded.
class TlsSession {
 public:
  /// Sets up the context, verification and SNI. Fails with tls_failed when the CA file cannot
  /// be loaded or the server name is unusable.
  static Error create(const TlsSettings& settings, std::unique_ptr<TlsSession>& out);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  /// Takes bytes read from the socket (copied into the session).
  void feed(std::string_view ciphertext);

  /// Advances the handshake with what was fed; `done` once it has completed. Errors are
  /// tls_failed and say why: the certificate problem (OpenSSL's verify error, the certificate's
  /// names), the broker's alert, or a port that does not speak TLS.
  Error handshake(bool& done);

  /// Decrypts what was fed into `buffer`, filling it as far as possible; `size` gets the count.
  /// `closed` is set when the broker ended the TLS session (close_notify). A corrupt record is a
  /// connection_lost error.
  Error read(char* buffer, size_t capacity, size_t& size, bool& closed);

  /// Encrypts all of `plaintext`; the records wait in pending().
  Error write(std::string_view plaintext);

  /// Queues close_notify, once, if the session is established and has not failed.
  void shutdown();

  /// Encrypted bytes waiting to be sent.
  size_t pending() const;
  /// Moves the waiting bytes into a buffer the session owns and returns them. The view stays
  /// valid until the next call, so one write may be in flight at a time.
  std::string_view take_pending();

  /// "TLSv1.3 TLS_AES_256_GCM_SHA384", once established.
  std::string description() const;
  bool verifies_peer() const { return settings_.verify_peer; }

 private:
  explicit TlsSession(TlsSettings settings);
  Error failure(int ssl_result, const char* during);
  Error verification_failure(long result) const;
  static int verify_callback(int ok, x509_store_ctx_st* store);

  TlsSettings settings_;
  ssl_ctx_st* ctx_ = nullptr;
  ssl_st* ssl_ = nullptr;
  bio_st* network_in_ = nullptr;   // owned by ssl_
  bio_st* network_out_ = nullptr;  // owned by ssl_
  bool established_ = false;
  bool failed_ = false;
  bool shut_down_ = false;
  /// The first bytes the broker sent, to recognise a plain AMQP port.
  std::string first_bytes_;
  /// What the verify callback saw at the first failure.
  std::string failed_subject_;
  std::string failed_issuer_;
  std::string failed_names_;
  int failed_depth_ = -1;
  std::unique_ptr<char[]> sending_;
  size_t sending_capacity_ = 0;
};

}  // namespace retryloop::client::detail
