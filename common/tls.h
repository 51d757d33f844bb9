// TLS for weft's TCP sessions (OpenSSL 3; docs/decisions.md): TLS 1.3 only, both sides
// present certificates, both verify them against the configured CA bundle (and CRL).
// A TlsContext is built once from the daemon's configuration and shared by its
// sessions; reload() swaps in re-read files for new handshakes while existing sessions
// continue.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct ssl_session_st SSL_SESSION;

namespace weft::tls {

struct Config {
  std::string ca_file;    // PEM bundle of the CAs whose certificates are accepted
  std::string cert_file;  // this side's certificate (chain), PEM
  std::string key_file;   // its private key, PEM
  std::string crl_file;   // optional: PEM CRLs of the CA(s); revoked peers are refused
  // Servers: session resumption (TLS 1.3 tickets) with the key in this file (80 random
  // bytes, made by write_ticket_key), so that tickets outlive a restart. Empty: no
  // tickets, every handshake is a full one. Clients resume whenever they hold a ticket.
  std::string ticket_key_file;
  bool enabled() const { return !cert_file.empty(); }
};
// A new random ticket key in `path` (mode 0600, replaced atomically): tickets sealed
// with the previous key are refused from the next reload on.
Status write_ticket_key(const std::string& path);
// Every file of a configuration exists and is readable (what a daemon checks at start,
// naming the key whose file is wrong).
Status check_config(const Config& c, const std::string& prefix);

// Who the peer's verified certificate says it is.
struct Identity {
  std::string subject;             // "CN=m17,OU=machine,O=example"
  std::string common_name;         // CN
  std::vector<std::string> units;  // OU values
  std::vector<std::string> dns;    // subjectAltName DNS entries
  std::vector<std::string> uris;   // subjectAltName URI entries
  std::vector<std::string> ips;    // subjectAltName IP entries, as text
  std::string serial;              // hex
};

enum class Role { kServer, kClient };

class Context {
 public:
  static Result<std::shared_ptr<Context>> create(const Config& c, Role role);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // Re-reads the files: new handshakes use them, sessions already up are unaffected. On
  // error the old files stay in use.
  Status reload();
  Role role() const { return role_; }
  // A new connection's TLS state on `fd`. A client names the server it expects: its
  // certificate must carry that DNS name or IP address.
  // A client resumes the last session it was given a ticket for, if any.
  Result<SSL*> new_ssl(int fd, const std::string& expected_server) const;

  struct TicketKey {
    unsigned char name[16], aes[32], hmac[32];
  };
  const TicketKey* ticket_key() const { return has_ticket_key_ ? &ticket_key_ : nullptr; }
  // Clients: the newest session ticket (called by OpenSSL when one arrives).
  void remember(SSL_SESSION* s);

 private:
  Context(Config c, Role role) : config_(std::move(c)), role_(role) {}
  Config config_;
  Role role_;
  SSL_CTX* ctx_ = nullptr;
  TicketKey ticket_key_{};
  bool has_ticket_key_ = false;
  SSL_SESSION* last_session_ = nullptr;
};

// The outcome of one step of a non-blocking handshake, read or write.
enum class Want { kDone, kRead, kWrite, kClosed, kError };

// Drives the handshake; on kError, *why says what failed ("certificate verify failed:
// certificate has expired").
Want handshake(SSL* ssl, std::string* why);
// Reads up to n bytes into buf; *got = bytes read (when kDone).
Want read(SSL* ssl, char* buf, size_t n, size_t* got, std::string* why);
// Writes up to n bytes; *put = bytes written (when kDone).
Want write(SSL* ssl, const char* buf, size_t n, size_t* put, std::string* why);
// The verified peer's identity (after the handshake).
Identity peer_identity(SSL* ssl);
// Sends close_notify (best effort, never blocks), so the peer sees a clean end.
void shutdown(SSL* ssl);
void free_ssl(SSL* ssl);

// SHA-256 of `data`, as 64 hex digits (the audit log's parameter digests).
std::string sha256_hex(const std::string& data);

}  // namespace weft::tls
