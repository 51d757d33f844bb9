// Hashing for content digests (OpenSSL's EVP), apart from oci.cc's parsers: what parses
// an image reference (a task spec's validator, weftctl) does not load libcrypto.
#include <openssl/evp.h>

#include "common/oci.h"

namespace weft::oci {

Hasher::Hasher(const std::string& algorithm) : algorithm_(algorithm) {
  auto* c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, algorithm == "sha512" ? EVP_sha512() : EVP_sha256(), nullptr);
  ctx_ = c;
}

Hasher::~Hasher() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

void Hasher::update(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}

Digest Hasher::finish() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &n);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned i = 0; i < n; ++i) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return Digest{algorithm_ == "sha512" ? "sha512" : "sha256", hex};
}

Digest digest_of(std::string_view bytes, const std::string& algorithm) {
  Hasher h(algorithm);
  h.update(bytes.data(), bytes.size());
  return h.finish();
}

}  // namespace weft::oci
