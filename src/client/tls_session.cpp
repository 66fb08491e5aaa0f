#include "tls_session.hpp"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <system_error>

namespace retryloop::client::detail {
namespace {

bool is_ip_address(const std::string& host) {
  unsigned char address[16];
  return inet_pton(AF_INET, host.c_str(), address) == 1 ||
         inet_pton(AF_INET6, host.c_str(), address) == 1;
}

/// Text from a certificate, with anything but printable ASCII replaced.
std::string printable(const char* data, size_t size) {
  std::string out(data, size);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

/// OpenSSL's reason for the oldest error queued, or `fallback`; empties the error queue.
std::string openssl_reason(const char* fallback) {
  unsigned long code = ERR_peek_error();
  std::string text;
  if (code != 0) {
    if (ERR_SYSTEM_ERROR(code)) {
      text = std::error_code(ERR_GET_REASON(code), std::generic_category()).message();
    } else if (const char* reason = ERR_reason_error_string(code)) {
      text = reason;
    }
  }
  ERR_clear_error();
  return text.empty() ? fallback : text;
}

std::string name_text(const X509_NAME* name) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return {};
  X509_NAME_print_ex(bio, name, 0, XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB);
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  std::string text = size > 0 ? printable(data, static_cast<size_t>(size)) : std::string();
  BIO_free(bio);
  return text;
}

/// The DNS and IP entries of the certificate's subjectAltName: "DNS:localhost, IP:127.0.0.1".
std::string subject_alt_names(X509* certificate) {
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return {};
  std::string text;
  int shown = 0;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    std::string entry;
    if (name->type == GEN_DNS) {
      const ASN1_STRING* dns = name->d.dNSName;
      entry = "DNS:" + printable(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                                 static_cast<size_t>(ASN1_STRING_length(dns)));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      char buffer[INET6_ADDRSTRLEN] = {};
      int family = ASN1_STRING_length(ip) == 4 ? AF_INET : AF_INET6;
      if (ASN1_STRING_length(ip) != 4 && ASN1_STRING_length(ip) != 16) continue;
      if (inet_ntop(family, ASN1_STRING_get0_data(ip), buffer, sizeof buffer) == nullptr) continue;
      entry = std::string("IP:") + buffer;
    } else {
      continue;
    }
    if (shown == 8) {
      text += ", ...";
      break;
    }
    if (shown++ > 0) text += ", ";
    text += entry;
  }
  GENERAL_NAMES_free(names);
  return text;
}

bool is_issuer_problem(long result) {
  return result == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
         result == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT ||
         result == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
         result == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
         result == X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE;
}

}  // namespace

TlsSession::TlsSession(TlsSettings settings) : settings_(std::move(settings)) {}

TlsSession::~TlsSession() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // frees both BIOs
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

Error TlsSession::create(const TlsSettings& settings, std::unique_ptr<TlsSession>& out) {
  ERR_clear_error();
  std::unique_ptr<TlsSession> session(new TlsSession(settings));
  const std::string& name = settings.server_name;
  session->ctx_ = SSL_CTX_new(TLS_client_method());
  SSL_CTX* ctx = session->ctx_;
  if (ctx == nullptr) {
    return Error(ClientError::tls_failed, "cannot set up TLS: " + openssl_reason("out of memory"));
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (settings.verify_peer) {
    if (name.empty()) {
      return Error(ClientError::tls_failed,
                   "no server name to check the broker's certificate against");
    }
    if (!settings.ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, settings.ca_file.c_str(), nullptr) != 1) {
        return Error(ClientError::tls_failed,
                     "cannot load the CA file '" + settings.ca_file +
                         "': " + openssl_reason("no PEM certificate in it"));
      }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return Error(ClientError::tls_failed,
                   "cannot load the system's trusted CAs: " + openssl_reason("unknown error"));
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, verify_callback);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
  if (settings.cert_file.empty() != settings.key_file.empty()) {
    return Error(ClientError::tls_failed,
                 std::string("a client certificate needs both certfile and keyfile; only ") +
                     (settings.cert_file.empty() ? "keyfile" : "certfile") + " is given");
  }
  if (!settings.cert_file.empty()) {
    // An encrypted key is refused, not asked for on the terminal.
    SSL_CTX_set_default_passwd_cb(ctx, [](char*, int, int, void*) { return 0; });
    if (SSL_CTX_use_certificate_chain_file(ctx, settings.cert_file.c_str()) != 1) {
      return Error(ClientError::tls_failed, "cannot load the client certificate '" +
                                                settings.cert_file +
                                                "': " + openssl_reason("no PEM certificate in it"));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, settings.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return Error(ClientError::tls_failed, "cannot load the client key '" + settings.key_file +
                                                "': " + openssl_reason("no PEM private key in it"));
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {  // OpenSSL 3 checks on load; older ones here
      return Error(ClientError::tls_failed, "cannot load the client key '" + settings.key_file +
                                                "': key values mismatch the certificate '" +
                                                settings.cert_file + "'");
    }
  }

  session->ssl_ = SSL_new(ctx);
  SSL* ssl = session->ssl_;
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out_bio = BIO_new(BIO_s_mem());
  if (ssl == nullptr || in == nullptr || out_bio == nullptr) {
    BIO_free(in);
    BIO_free(out_bio);
    return Error(ClientError::tls_failed, "cannot set up TLS: " + openssl_reason("out of memory"));
  }
  // An empty memory BIO means "wait for more", not end of stream.
  BIO_set_mem_eof_return(in, -1);
  BIO_set_mem_eof_return(out_bio, -1);
  SSL_set_bio(ssl, in, out_bio);
  session->network_in_ = in;
  session->network_out_ = out_bio;
  SSL_set_app_data(ssl, session.get());
  SSL_set_connect_state(ssl);

  bool ip = is_ip_address(name);
  // SNI carries host names only (RFC 6066).
  if (!ip && !name.empty() && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
    return Error(ClientError::tls_failed,
                 "server name '" + name + "' cannot be sent as SNI: " + openssl_reason("invalid"));
  }
  if (settings.verify_peer) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    int ok = 0;
    if (ip) {
      ok = X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str());
    } else {
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = SSL_set1_host(ssl, name.c_str());
    }
    if (ok != 1) {
      return Error(ClientError::tls_failed,
                   "server name '" + name + "' cannot be checked: " + openssl_reason("invalid"));
    }
  }
  out = std::move(session);
  return {};
}

int TlsSession::verify_callback(int ok, X509_STORE_CTX* store) {
  if (ok == 1) return ok;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* self = ssl != nullptr ? static_cast<TlsSession*>(SSL_get_app_data(ssl)) : nullptr;
  if (self != nullptr && self->failed_depth_ < 0) {
    self->failed_depth_ = X509_STORE_CTX_get_error_depth(store);
    if (X509* certificate = X509_STORE_CTX_get_current_cert(store)) {
      self->failed_subject_ = name_text(X509_get_subject_name(certificate));
      self->failed_issuer_ = name_text(X509_get_issuer_name(certificate));
      self->failed_names_ = subject_alt_names(certificate);
    }
  }
  return ok;
}

void TlsSession::feed(std::string_view ciphertext) {
  if (!established_ && first_bytes_.size() < 8) {
    first_bytes_.append(ciphertext.substr(0, 8 - first_bytes_.size()));
  }
  size_t written = 0;
  // A memory BIO grows as needed; it fails only when out of memory, which SSL_read reports.
  BIO_write_ex(network_in_, ciphertext.data(), ciphertext.size(), &written);
}

Error TlsSession::handshake(bool& done) {
  done = established_;
  if (done) return {};
  if (failed_) return Error(ClientError::tls_failed, "the TLS handshake already failed");
  ERR_clear_error();
  int rc = SSL_do_handshake(ssl_);
  if (rc == 1) {
    established_ = true;
    done = true;
    return {};
  }
  int error = SSL_get_error(ssl_, rc);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return {};
  failed_ = true;
  long verify = SSL_get_verify_result(ssl_);
  if (settings_.verify_peer && verify != X509_V_OK) {
    ERR_clear_error();
    return verification_failure(verify);
  }
  std::string reason = openssl_reason("the handshake failed");
  if (first_bytes_.compare(0, 4, "AMQP") == 0) {
    reason = "the broker answered in plain AMQP: " + settings_.peer +
             " is not a TLS port (use amqp://, or the broker's amqps port)";
  } else {
    reason = "TLS handshake with " + settings_.peer + " failed: " + reason;
  }
  return Error(ClientError::tls_failed, reason);
}

Error TlsSession::verification_failure(long result) const {
  std::string text = X509_verify_cert_error_string(result);
  if (result == X509_V_ERR_HOSTNAME_MISMATCH || result == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    text += ": the certificate of " + settings_.peer + " is not valid for '" +
            settings_.server_name + "'";
    if (!failed_names_.empty()) text += " (it names " + failed_names_ + ")";
    return Error(ClientError::tls_failed, text);
  }
  text += " (broker " + settings_.peer;
  if (!failed_subject_.empty()) {
    text += ", certificate ";
    if (failed_depth_ > 0) text += "at depth " + std::to_string(failed_depth_) + " ";
    text += "'" + failed_subject_ + "' issued by '" + failed_issuer_ + "'";
  }
  if (is_issuer_problem(result)) {
    text += settings_.ca_file.empty()
                ? "; the system's trusted CAs do not include its CA: give it with cacertfile=PATH"
                : "; its CA is not in '" + settings_.ca_file + "'";
  }
  text += ")";
  return Error(ClientError::tls_failed, text);
}

Error TlsSession::read(char* buffer, size_t capacity, size_t& size, bool& closed) {
  size = 0;
  closed = false;
  while (size < capacity) {
    ERR_clear_error();
    size_t n = 0;
    if (SSL_read_ex(ssl_, buffer + size, capacity - size, &n) == 1) {
      size += n;
      continue;
    }
    int error = SSL_get_error(ssl_, 0);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return {};
    if (error == SSL_ERROR_ZERO_RETURN) {
      closed = true;
      return {};
    }
    failed_ = true;
    return Error(ClientError::connection_lost, "TLS: " + openssl_reason("cannot decrypt"));
  }
  return {};
}

Error TlsSession::write(std::string_view plaintext) {
  while (!plaintext.empty()) {
    ERR_clear_error();
    size_t n = 0;
    if (SSL_write_ex(ssl_, plaintext.data(), plaintext.size(), &n) != 1) {
      failed_ = true;
      return Error(ClientError::connection_lost, "TLS: " + openssl_reason("cannot encrypt"));
    }
    plaintext.remove_prefix(n);
  }
  return {};
}

void TlsSession::shutdown() {
  if (!established_ || failed_ || shut_down_) return;
  shut_down_ = true;
  ERR_clear_error();
  SSL_shutdown(ssl_);  // queues close_notify; the broker's answer is not awaited
  ERR_clear_error();
}

size_t TlsSession::pending() const {
  return BIO_ctrl_pending(network_out_);
}

std::string_view TlsSession::take_pending() {
  size_t size = pending();
  if (size == 0) return {};
  if (size > sending_capacity_) {
    sending_capacity_ = std::max(size, 2 * sending_capacity_);
    sending_.reset(new char[sending_capacity_]);
  }
  size_t taken = 0;
  BIO_read_ex(network_out_, sending_.get(), size, &taken);
  return {sending_.get(), taken};
}

std::string TlsSession::description() const {
  if (!established_) return "TLS handshake not done";
  return std::string(SSL_get_version(ssl_)) + " " + SSL_get_cipher_name(ssl_);
}

}  // namespace retryloop::client::detail
