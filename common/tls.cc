#include "common/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "common/fs.h"

namespace weft::tls {

namespace {

// The queued OpenSSL errors as one line (and the queue cleared).
std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

std::string asn1_text(const ASN1_STRING* s) {
  if (!s) return "";
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                     static_cast<size_t>(ASN1_STRING_length(s)));
}

std::vector<std::string> name_entries(X509_NAME* name, int nid) {
  std::vector<std::string> out;
  for (int i = -1; (i = X509_NAME_get_index_by_NID(name, nid, i)) >= 0;) {
    X509_NAME_ENTRY* e = X509_NAME_get_entry(name, i);
    out.push_back(asn1_text(X509_NAME_ENTRY_get_data(e)));
  }
  return out;
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

Want step(SSL* ssl, int rc, std::string* why) {
  switch (SSL_get_error(ssl, rc)) {
    case SSL_ERROR_NONE:
      return Want::kDone;
    case SSL_ERROR_WANT_READ:
      return Want::kRead;
    case SSL_ERROR_WANT_WRITE:
      return Want::kWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Want::kClosed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (why) *why = errno ? std::string("connection: ") + std::strerror(errno) : "peer closed";
        return Want::kClosed;
      }
      [[fallthrough]];
    default: {
      long v = SSL_get_verify_result(ssl);
      std::string detail = ssl_errors();
      if (why) {
        *why = detail;
        if (v != X509_V_OK) *why += ": " + std::string(X509_verify_cert_error_string(v));
      }
      return Want::kError;
    }
  }
}

// Seals and opens session tickets with the context's key (RFC 5077 layout: key name,
// AES-256-CBC, HMAC-SHA256). An unknown key name means a full handshake.
int ticket_callback(SSL* ssl, unsigned char key_name[16], unsigned char* iv, EVP_CIPHER_CTX* cipher,
                    EVP_MAC_CTX* mac, int enc) {
  auto* c = static_cast<const Context*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  const Context::TicketKey* k = c ? c->ticket_key() : nullptr;
  if (!k) return 0;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, const_cast<unsigned char*>(k->hmac),
                                        sizeof k->hmac),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  if (enc) {
    std::memcpy(key_name, k->name, sizeof k->name);
    if (RAND_bytes(iv, 16) != 1 ||
        EVP_EncryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k->aes, iv) != 1 ||
        EVP_MAC_CTX_set_params(mac, params) != 1)
      return -1;
    return 1;
  }
  if (std::memcmp(key_name, k->name, sizeof k->name) != 0) return 0;
  if (EVP_MAC_CTX_set_params(mac, params) != 1 ||
      EVP_DecryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k->aes, iv) != 1)
    return -1;
  return 1;
}

int new_session_callback(SSL* ssl, SSL_SESSION* session) {
  auto* c = static_cast<Context*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  if (!c) return 0;
  // A copy: OpenSSL marks the connection's own session unresumable when that connection
  // ends without close_notify (a control plane that was killed), and that is exactly
  // when the ticket is wanted.
  if (SSL_SESSION* copy = SSL_SESSION_dup(session)) c->remember(copy);
  return 0;
}

}  // namespace

Status write_ticket_key(const std::string& path) {
  unsigned char key[sizeof(Context::TicketKey)];
  if (RAND_bytes(key, sizeof key) != 1) return make_error("TLS: no random bytes for a ticket key");
  return write_file_atomic(path, std::string_view(reinterpret_cast<char*>(key), sizeof key), 0600);
}

void Context::remember(SSL_SESSION* s) {
  if (last_session_) SSL_SESSION_free(last_session_);
  last_session_ = s;
}

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

// What a PEM file holds, read with OpenSSL as the handshake will: at least one
// certificate (CA, cert), a private key, or a CRL.
enum class Pem { kCertificates, kKey, kCrl };
Status check_pem(const std::string& field, const std::string& path, Pem kind,
                 EVP_PKEY** key_out = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (4 << 20))
    return field_error(field, "'" + path + "' is not a regular file of at most 4 MiB");
  std::unique_ptr<BIO, BioFree> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return field_error(field, "cannot read '" + path + "'");
  ERR_clear_error();
  bool ok = false;
  switch (kind) {
    case Pem::kCertificates:
      if (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
        X509_free(x);
        ok = true;
      }
      break;
    case Pem::kKey:
      // No passphrase prompt: a daemon cannot type one.
      if (EVP_PKEY* k = PEM_read_bio_PrivateKey(
              bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr)) {
        ok = true;
        if (key_out)
          *key_out = k;
        else
          EVP_PKEY_free(k);
      }
      break;
    case Pem::kCrl:
      if (X509_CRL* c = PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr)) {
        X509_CRL_free(c);
        ok = true;
      }
      break;
  }
  ERR_clear_error();
  if (ok) return {};
  const char* what = kind == Pem::kCertificates ? "a PEM certificate"
                     : kind == Pem::kKey        ? "an unencrypted PEM private key"
                                                : "a PEM certificate revocation list";
  return field_error(field, "'" + path + "' does not hold " + what);
}

}  // namespace

Status check_config(const Config& c, const std::string& prefix) {
  for (auto [key, path] : {std::pair{"tls_ca", &c.ca_file},
                           {"tls_cert", &c.cert_file},
                           {"tls_key", &c.key_file},
                           {"tls_crl", &c.crl_file}}) {
    if (path->empty()) {
      if (std::string(key) == "tls_crl") continue;
      return field_error(prefix + key, "is required when TLS is configured");
    }
    if (::access(path->c_str(), R_OK) != 0)
      return field_error(prefix + key, "cannot read '" + *path + "': " + std::strerror(errno));
  }
  // The contents, not just the names: /etc/passwd is not a CA, /etc/shadow not a key.
  TRY(check_pem(prefix + "tls_ca", c.ca_file, Pem::kCertificates));
  TRY(check_pem(prefix + "tls_cert", c.cert_file, Pem::kCertificates));
  if (!c.crl_file.empty()) TRY(check_pem(prefix + "tls_crl", c.crl_file, Pem::kCrl));
  struct stat st {};
  if (::stat(c.key_file.c_str(), &st) == 0 && (st.st_mode & S_IROTH))
    return field_error(prefix + "tls_key", "'" + c.key_file +
                                               "' is readable by every user: chmod 0600 (or 0640 "
                                               "to the daemon's group)");
  EVP_PKEY* key = nullptr;
  TRY(check_pem(prefix + "tls_key", c.key_file, Pem::kKey, &key));
  std::unique_ptr<BIO, BioFree> bio(BIO_new_file(c.cert_file.c_str(), "r"));
  X509* cert = bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  bool match = cert && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (!match)
    return field_error(
        prefix + "tls_key",
        "'" + c.key_file + "' is not the key of the certificate '" + c.cert_file + "'");
  return {};
}

Result<std::shared_ptr<Context>> Context::create(const Config& c, Role role) {
  static std::once_flag once;
  // SSL_write may write() to a peer that went away: that must be an error, not a signal.
  std::call_once(once, [] { ::signal(SIGPIPE, SIG_IGN); });
  std::shared_ptr<Context> ctx(new Context(c, role));
  TRY(ctx->reload());
  return ctx;
}

Context::~Context() {
  // Connections may outlive this object (they hold the SSL_CTX): their callbacks must
  // not find it any more.
  if (ctx_) SSL_CTX_set_app_data(ctx_, nullptr);
  SSL_CTX_free(ctx_);
  if (last_session_) SSL_SESSION_free(last_session_);
}

Status Context::reload() {
  TRY(check_config(config_, ""));
  SSL_CTX* ctx = SSL_CTX_new(role_ == Role::kServer ? TLS_server_method() : TLS_client_method());
  if (!ctx) return make_error("TLS: " + ssl_errors());
  auto fail = [ctx](const std::string& what) {
    std::string e = what + ": " + ssl_errors();
    SSL_CTX_free(ctx);
    return make_error("TLS: " + e);
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // Idle sessions give their buffers back (thousands of machines hold one each).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx, config_.cert_file.c_str()) != 1)
    return fail("certificate " + config_.cert_file);
  if (SSL_CTX_use_PrivateKey_file(ctx, config_.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail("key " + config_.key_file);
  if (SSL_CTX_check_private_key(ctx) != 1) return fail("key does not match the certificate");
  if (SSL_CTX_load_verify_locations(ctx, config_.ca_file.c_str(), nullptr) != 1)
    return fail("CA bundle " + config_.ca_file);
  if (!config_.crl_file.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    X509_LOOKUP* lookup = X509_STORE_add_lookup(store, X509_LOOKUP_file());
    if (!lookup || X509_load_crl_file(lookup, config_.crl_file.c_str(), X509_FILETYPE_PEM) <= 0)
      return fail("CRL " + config_.crl_file);
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
  }
  // Both sides present certificates and verify the other's.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_app_data(ctx, this);
  TicketKey key{};
  bool has_key = false;
  if (role_ == Role::kServer) {
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);  // stateless tickets only
    if (config_.ticket_key_file.empty()) {
      SSL_CTX_set_num_tickets(ctx, 0);
      SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    } else {
      auto bytes = read_file_bounded(config_.ticket_key_file, 4096);
      if (!bytes.ok() || bytes->size() != sizeof key) {
        SSL_CTX_free(ctx);
        return make_error("TLS: ticket key " + config_.ticket_key_file + " must hold " +
                          std::to_string(sizeof key) + " bytes");
      }
      std::memcpy(&key, bytes->data(), sizeof key);
      has_key = true;
      // A resumed session skips the certificate check, so a ticket lives an hour at most;
      // a reload with a new key (and CRL) ends every ticket at once.
      SSL_CTX_set_timeout(ctx, 3600);
      SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_callback);
      // Resuming a session whose client certificate was verified needs a context id.
      static const unsigned char kSessionContext[] = "weft";
      SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1);
    }
  } else {
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, new_session_callback);
  }
  if (ctx_) SSL_CTX_set_app_data(ctx_, nullptr);  // connections on the old files, as above
  SSL_CTX_free(ctx_);
  ctx_ = ctx;
  ticket_key_ = key;
  has_ticket_key_ = has_key;
  return {};
}

Result<SSL*> Context::new_ssl(int fd, const std::string& expected_server) const {
  SSL* ssl = SSL_new(ctx_);
  if (!ssl) return make_error("TLS: " + ssl_errors());
  if (SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return make_error("TLS: " + ssl_errors());
  }
  if (role_ == Role::kServer) {
    SSL_set_accept_state(ssl);
    return ssl;
  }
  SSL_set_connect_state(ssl);
  if (last_session_) SSL_set_session(ssl, last_session_);
  if (expected_server.empty()) {
    SSL_free(ssl);
    return make_error("TLS: a client must name the server it expects");
  }
  bool ok = is_ip(expected_server)
                ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), expected_server.c_str()) == 1
                : SSL_set1_host(ssl, expected_server.c_str()) == 1 &&
                      SSL_set_tlsext_host_name(ssl, expected_server.c_str()) == 1;
  if (!ok) {
    SSL_free(ssl);
    return make_error("TLS: cannot expect server name '" + expected_server + "'");
  }
  return ssl;
}

Want handshake(SSL* ssl, std::string* why) {
  ERR_clear_error();
  errno = 0;
  Want w = step(ssl, SSL_do_handshake(ssl), why);
  if (w == Want::kDone && SSL_session_reused(ssl)) {
    // A resumed session was verified when its ticket was issued: its certificate must
    // still be within its validity.
    X509* cert = SSL_get0_peer_certificate(ssl);
    if (!cert || X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
      if (why) *why = "resumed session: certificate has expired";
      return Want::kError;
    }
  }
  return w;
}

Want read(SSL* ssl, char* buf, size_t n, size_t* got, std::string* why) {
  ERR_clear_error();
  errno = 0;
  int rc = SSL_read_ex(ssl, buf, n, got);
  return step(ssl, rc, why);
}

Want write(SSL* ssl, const char* buf, size_t n, size_t* put, std::string* why) {
  ERR_clear_error();
  errno = 0;
  int rc = SSL_write_ex(ssl, buf, n, put);
  return step(ssl, rc, why);
}

Identity peer_identity(SSL* ssl) {
  Identity id;
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return id;
  X509_NAME* subject = X509_get_subject_name(cert);
  if (BIO* b = BIO_new(BIO_s_mem())) {
    X509_NAME_print_ex(b, subject, 0, XN_FLAG_RFC2253);
    char* data = nullptr;
    long len = BIO_get_mem_data(b, &data);
    if (len > 0) id.subject.assign(data, static_cast<size_t>(len));
    BIO_free(b);
  }
  auto cn = name_entries(subject, NID_commonName);
  if (!cn.empty()) id.common_name = cn.front();
  id.units = name_entries(subject, NID_organizationalUnitName);
  if (auto* names = static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr))) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
      if (g->type == GEN_DNS) id.dns.push_back(asn1_text(g->d.dNSName));
      if (g->type == GEN_URI) id.uris.push_back(asn1_text(g->d.uniformResourceIdentifier));
      if (g->type == GEN_IPADD) {
        const ASN1_OCTET_STRING* ip = g->d.iPAddress;
        char text[INET6_ADDRSTRLEN] = "";
        int len = ASN1_STRING_length(ip);
        if (len == 4 || len == 16)
          inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip), text, sizeof text);
        id.ips.push_back(text);
      }
    }
    GENERAL_NAMES_free(names);
  }
  if (const ASN1_INTEGER* serial = X509_get0_serialNumber(cert)) {
    if (BIGNUM* bn = ASN1_INTEGER_to_BN(serial, nullptr)) {
      if (char* hex = BN_bn2hex(bn)) {
        id.serial = hex;
        OPENSSL_free(hex);
      }
      BN_free(bn);
    }
  }
  return id;
}

void shutdown(SSL* ssl) {
  ERR_clear_error();
  (void)SSL_shutdown(ssl);
  ERR_clear_error();
}

void free_ssl(SSL* ssl) {
  SSL_free(ssl);
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) return "";
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

}  // namespace weft::tls
