// rpc::Client's TLS: OpenSSL's stream over the connected socket (tls.h). Apart from
// client.cc so that a client without TLS links no OpenSSL.
#include <openssl/ssl.h>

#include "common/rpc/client.h"

namespace weft::rpc {

namespace {

class TlsStream : public ClientStream {
 public:
  TlsStream(SSL* ssl, std::shared_ptr<tls::Context> ctx) : ssl_(ssl), ctx_(std::move(ctx)) {}
  ~TlsStream() override {
    tls::shutdown(ssl_);
    tls::free_ssl(ssl_);
  }
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;
  tls::Want handshake(std::string* why) override { return tls::handshake(ssl_, why); }
  tls::Want read(char* buf, size_t n, size_t* got, std::string* why) override {
    return tls::read(ssl_, buf, n, got, why);
  }
  tls::Want write(const char* buf, size_t n, size_t* put, std::string* why) override {
    return tls::write(ssl_, buf, n, put, why);
  }
  tls::Identity peer_identity() override { return tls::peer_identity(ssl_); }
  bool resumed() override { return SSL_session_reused(ssl_) == 1; }

 private:
  SSL* ssl_;
  std::shared_ptr<tls::Context> ctx_;  // kept while ssl_ lives (its callbacks use it)
};

}  // namespace

ClientTls client_tls(std::shared_ptr<tls::Context> context, std::string server_name) {
  ClientTls t;
  t.server_name = std::move(server_name);
  if (!context) return t;  // no `open`: a tls:// endpoint is refused, saying what is missing
  t.open = [ctx = std::move(context)](
               int fd, const std::string& name) -> Result<std::unique_ptr<ClientStream>> {
    TRY_ASSIGN(SSL * ssl, ctx->new_ssl(fd, name));
    return std::unique_ptr<ClientStream>(new TlsStream(ssl, ctx));
  };
  return t;
}

}  // namespace weft::rpc
