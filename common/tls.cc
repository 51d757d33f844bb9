#include "common/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
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
  SSL_CTX_free(ctx_);
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
  SSL_CTX_free(ctx_);
  ctx_ = ctx;
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
  return step(ssl, SSL_do_handshake(ssl), why);
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
