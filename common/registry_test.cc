// The distribution client against a real registry on loopback (Debian's docker-registry):
// manifests by tag and by digest, a multi-platform index, blobs streamed and resumed,
// and a registry that serves bytes other than the digest names (refused), is missing
// what is asked, or is down; and against a registry that wants authentication (a test
// server: Bearer tokens from its token service, Basic).
#include "common/registry.h"

#include <gtest/gtest.h>

#include <microhttpd.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/clock.h"
#include "common/fs.h"
#include "testing/registry_server.h"

namespace weft::registry {
namespace {

using json = nlohmann::json;

// Bytes into memory, hashed by the test afterwards.
struct StringSink : BlobSink {
  std::string bytes;
  int restarts = 0;
  std::optional<uint64_t> known_size;
  uint64_t offset() const override { return bytes.size(); }
  std::optional<uint64_t> size() const override { return known_size; }
  Status restart() override {
    bytes.clear();
    ++restarts;
    return {};
  }
  Status append(const void* d, size_t n) override {
    bytes.append(static_cast<const char*>(d), n);
    return {};
  }
};

class Registry : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(server_.error(), "");
    auto loop = EventLoop::create();
    ASSERT_TRUE(loop.ok());
    loop_ = std::move(loop).value();
    Config cfg;
    cfg.insecure.insert(server_.host());
    cfg.first_backoff_us = 50'000;
    cfg.attempts = 3;
    auto c = Client::create(*loop_, cfg);
    ASSERT_TRUE(c.ok()) << c.error().str();
    client_ = std::move(c).value();
  }
  // An image of `layers` (their bytes) under repo:tag; returns the manifest's bytes.
  std::string push_image(const std::string& repo, const std::string& tag,
                         const std::vector<std::string>& layers, const std::string& arch) {
    json config{{"architecture", arch},
                {"os", "linux"},
                {"config", {{"Cmd", {"/bin/sh"}}}},
                {"rootfs", {{"type", "layers"}, {"diff_ids", json::array()}}}};
    json m{{"schemaVersion", 2}, {"mediaType", oci::kOciManifest}, {"layers", json::array()}};
    for (const auto& l : layers) {
      oci::Digest d = server_.push_blob(repo, l);
      m["layers"].push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                             {"digest", d.str()},
                             {"size", l.size()}});
      config["rootfs"]["diff_ids"].push_back(d.str());
    }
    std::string cbytes = config.dump();
    oci::Digest cd = server_.push_blob(repo, cbytes);
    m["config"] = {{"mediaType", oci::kOciConfig}, {"digest", cd.str()}, {"size", cbytes.size()}};
    std::string mbytes = m.dump();
    server_.push_manifest(repo, tag, mbytes, oci::kOciManifest);
    return mbytes;
  }
  Result<FetchedManifest> manifest(const std::string& ref) {
    auto r = oci::parse_image_ref(ref);
    if (!r.ok()) return std::move(r).error();
    std::optional<Result<FetchedManifest>> got;
    client_->manifest(*r, [&](Result<FetchedManifest> m) { got = std::move(m); });
    run_until([&] { return got.has_value(); });
    if (!got) return make_error("no answer");
    return std::move(*got);
  }
  Status blob(const std::string& ref, const oci::Digest& d, StringSink* sink) {
    std::optional<Status> got;
    client_->blob(*oci::parse_image_ref(ref), d, sink, [&](Status s) { got = std::move(s); });
    run_until([&] { return got.has_value(); });
    if (!got) return make_error("no answer");
    return *got;
  }
  template <class F>
  void run_until(F done) {
    uint64_t start = now_monotonic_us();
    while (!done() && now_monotonic_us() - start < 15'000'000) (void)loop_->run_once(10'000);
  }
  weft::testing::RegistryServer server_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Client> client_;
};

TEST_F(Registry, ManifestsByTagAndByDigestAndBlobs) {
  std::string layer(300'000, 'L');
  for (size_t i = 0; i < layer.size(); i += 7) layer[i] = static_cast<char>(i);
  std::string mbytes = push_image("team/app", "v1", {layer}, "amd64");
  auto byTag = manifest(server_.host() + "/team/app:v1");
  ASSERT_TRUE(byTag.ok()) << byTag.error().str();
  EXPECT_EQ(byTag->bytes, mbytes);
  EXPECT_EQ(byTag->digest, oci::digest_of(mbytes)) << "the tag resolves to the manifest's digest";
  EXPECT_EQ(byTag->media_type, oci::kOciManifest);
  auto doc = oci::parse_manifest(byTag->bytes, byTag->media_type);
  ASSERT_TRUE(doc.ok()) << doc.error().str();
  ASSERT_EQ(doc->manifest.layers.size(), 1u);

  auto byDigest = manifest(server_.host() + "/team/app@" + byTag->digest.str());
  ASSERT_TRUE(byDigest.ok()) << byDigest.error().str();
  EXPECT_EQ(byDigest->bytes, mbytes);

  StringSink sink;
  ASSERT_TRUE(blob(server_.host() + "/team/app", doc->manifest.layers[0].blob.digest, &sink).ok());
  EXPECT_EQ(oci::digest_of(sink.bytes), doc->manifest.layers[0].blob.digest);

  // Resumed: the sink holds the first 100,000 bytes; a Range request brings the rest.
  StringSink half;
  half.bytes = layer.substr(0, 100'000);
  ASSERT_TRUE(blob(server_.host() + "/team/app", doc->manifest.layers[0].blob.digest, &half).ok());
  EXPECT_EQ(half.restarts, 0) << "the registry honoured the Range request";
  EXPECT_EQ(half.bytes, layer);
}

// An agent killed after a blob's last byte and before its commit resumes with all of it.
// Of unknown size, the Range past the end is refused with 416, which this registry sends
// with the blob's length as its Content-Length and a short body: still the 416, not a
// broken transfer to retry. Of known size, nothing is asked (the registry is down).
TEST_F(Registry, AResumeOfAWholeBlobSucceeds) {
  std::string layer(200'000, 'W');
  for (size_t i = 0; i < layer.size(); i += 5) layer[i] = static_cast<char>(i * 7);
  push_image("team/whole", "v1", {layer}, "amd64");
  oci::Digest d = oci::digest_of(layer);
  StringSink unsized;
  unsized.bytes = layer;
  Status s = blob(server_.host() + "/team/whole", d, &unsized);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(unsized.bytes, layer);
  EXPECT_EQ(unsized.restarts, 0);
  server_.stop();
  StringSink sized;
  sized.bytes = layer;
  sized.known_size = layer.size();
  s = blob(server_.host() + "/team/whole", d, &sized);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(sized.bytes, layer);
  // Short of its size, it is asked for, and a registry that is down is an error.
  sized.bytes.pop_back();
  EXPECT_FALSE(blob(server_.host() + "/team/whole", d, &sized).ok());
}

TEST_F(Registry, AMultiPlatformIndexGivesThisMachinesManifest) {
  std::string amd = push_image("multi", "amd64-only", {"amd64 layer"}, "amd64");
  std::string arm = push_image("multi", "arm64-only", {"arm64 layer"}, "arm64");
  json idx{{"schemaVersion", 2},
           {"mediaType", oci::kOciIndex},
           {"manifests",
            {{{"mediaType", oci::kOciManifest},
              {"digest", oci::digest_of(arm).str()},
              {"size", arm.size()},
              {"platform", {{"os", "linux"}, {"architecture", "arm64"}, {"variant", "v8"}}}},
             {{"mediaType", oci::kOciManifest},
              {"digest", oci::digest_of(amd).str()},
              {"size", amd.size()},
              {"platform", {{"os", "linux"}, {"architecture", "amd64"}}}}}}};
  server_.push_manifest("multi", "v2", idx.dump(), oci::kOciIndex);
  auto got = manifest(server_.host() + "/multi:v2");
  ASSERT_TRUE(got.ok()) << got.error().str();
  auto doc = oci::parse_manifest(got->bytes, got->media_type);
  ASSERT_TRUE(doc.ok()) << doc.error().str();
  ASSERT_TRUE(doc->is_index);
  auto pick = oci::select_platform(doc->entries, {"linux", "amd64", ""});
  ASSERT_TRUE(pick.ok());
  auto m = manifest(server_.host() + "/multi@" + pick->digest.str());
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(m->bytes, amd);
}

TEST_F(Registry, BytesOtherThanTheDigestNamesAreRefused) {
  std::string mbytes = push_image("corrupt", "v1", {std::string(50'000, 'c')}, "amd64");
  auto doc = oci::parse_manifest(mbytes, oci::kOciManifest);
  ASSERT_TRUE(doc.ok());
  oci::Digest layer = doc->manifest.layers[0].blob.digest;
  // The registry's disk is corrupted under it: same size, other bytes.
  ASSERT_TRUE(write_file(server_.blob_file(layer), std::string(50'000, 'X')).ok());
  StringSink sink;
  ASSERT_TRUE(blob(server_.host() + "/corrupt", layer, &sink).ok());
  EXPECT_NE(oci::digest_of(sink.bytes), layer) << "what the store's verification refuses";
  // A manifest asked by digest is checked by the client itself.
  oci::Digest md = oci::digest_of(mbytes);
  std::string other = mbytes + " ";  // still JSON (the registry reads it), other bytes
  ASSERT_TRUE(write_file(server_.blob_file(md), other).ok());
  auto m = manifest(server_.host() + "/corrupt@" + md.str());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().str().find("hash to"), std::string::npos) << m.error().str();
}

TEST_F(Registry, MissingImagesAndADownRegistrySayWhat) {
  auto missing = manifest(server_.host() + "/nothing:here");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().str().find("not found"), std::string::npos) << missing.error().str();
  server_.stop();
  auto start = now_monotonic_us();
  auto down = manifest(server_.host() + "/team/app:v1");
  ASSERT_FALSE(down.ok());
  EXPECT_NE(down.error().str().find("after 3 tries"), std::string::npos) << down.error().str();
  EXPECT_GE(now_monotonic_us() - start, 150'000u) << "retried with backoff (50 + 100 ms)";
}

TEST(RegistryParsing, ChallengesAndCredentials) {
  auto c = parse_challenge(
      R"(Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull")");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->scheme, "bearer");
  EXPECT_EQ(c->params["realm"], "https://auth.example.com/token");
  EXPECT_EQ(c->params["scope"], "repository:a/b:pull");
  auto b = parse_challenge("Basic realm=basic-realm");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scheme, "basic");
  EXPECT_EQ(b->params["realm"], "basic-realm");
  EXPECT_FALSE(parse_challenge(R"(Bearer realm="unterminated)").ok());

  auto creds = parse_credentials(
      "# registry user password\nregistry.example.com:5000 puller s3cret\n\nlocalhost u p\n",
      "/etc/weft/registry-credentials");
  ASSERT_TRUE(creds.ok()) << creds.error().str();
  EXPECT_EQ((*creds)["registry.example.com:5000"].password, "s3cret");
  auto bad = parse_credentials("a.io user\n", "creds");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "creds:1");
  auto twice = parse_credentials("a.io u p\na.io u q\n", "creds");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().field, "creds:2");
}

// A registry that wants authentication, on loopback in libmicrohttpd's own thread: a
// Bearer challenge naming its own token service (which wants the configured user's
// password), or a Basic challenge. One manifest, team/app:v1.
class AuthServer {
 public:
  explicit AuthServer(bool basic) : basic_(basic) {
    daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, nullptr, nullptr, &serve, this,
                               MHD_OPTION_END);
    if (!daemon_) return;
    const MHD_DaemonInfo* i = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
    port_ = i ? i->port : 0;
  }
  ~AuthServer() {
    if (daemon_) MHD_stop_daemon(daemon_);
  }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  static constexpr const char* kManifest = R"({"schemaVersion":2})";
  // The token the registry takes now; a new one comes from each token request.
  void revoke() {
    std::lock_guard<std::mutex> l(mu_);
    current_ = "revoked";
  }
  void set_expires_in(int s) {
    std::lock_guard<std::mutex> l(mu_);
    expires_in_ = s;
  }
  int token_requests() {
    std::lock_guard<std::mutex> l(mu_);
    return token_requests_;
  }

 private:
  static MHD_Result reply(MHD_Connection* c, unsigned code, const std::string& body,
                          const char* header = nullptr, const std::string& value = "") {
    MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                      MHD_RESPMEM_MUST_COPY);
    if (header) MHD_add_response_header(r, header, value.c_str());
    MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
  }
  static MHD_Result serve(void* cls, MHD_Connection* c, const char* url, const char*, const char*,
                          const char*, size_t*, void**) {
    auto* self = static_cast<AuthServer*>(cls);
    std::lock_guard<std::mutex> l(self->mu_);
    const char* a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    std::string auth = a ? a : "";
    std::string password = "Basic " + base64_encode("ops:s3cret");
    std::string path = url;
    if (path == "/token") {
      if (auth != password) return reply(c, 401, "{}");
      ++self->token_requests_;
      self->current_ = "tok-" + std::to_string(self->token_requests_);
      return reply(c, 200,
                   json{{"token", self->current_}, {"expires_in", self->expires_in_}}.dump());
    }
    if (path != "/v2/team/app/manifests/v1") return reply(c, 404, "{}");
    if (self->basic_) {
      if (auth == password) return reply(c, 200, kManifest);
      return reply(c, 401, "{}", "WWW-Authenticate", "Basic realm=\"test\"");
    }
    if (auth == "Bearer " + self->current_) return reply(c, 200, kManifest);
    return reply(c, 401, "{}", "WWW-Authenticate",
                 "Bearer realm=\"http://127.0.0.1:" + std::to_string(self->port_) +
                     "/token\",service=\"test\",scope=\"repository:team/app:pull\"");
  }
  bool basic_;
  MHD_Daemon* daemon_ = nullptr;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::string current_ = "none yet";
  int expires_in_ = 300;
  int token_requests_ = 0;
};

class RegistryAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loop = EventLoop::create();
    ASSERT_TRUE(loop.ok());
    loop_ = std::move(loop).value();
  }
  std::unique_ptr<Client> client(const AuthServer& s, const std::string& password) {
    Config cfg;
    cfg.insecure.insert(s.host());
    cfg.attempts = 1;
    if (!password.empty()) cfg.credentials[s.host()] = {"ops", password};
    auto c = Client::create(*loop_, cfg);
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(c).value() : nullptr;
  }
  Result<FetchedManifest> manifest(Client& c, const AuthServer& s) {
    std::optional<Result<FetchedManifest>> got;
    c.manifest(*oci::parse_image_ref(s.host() + "/team/app:v1"),
               [&](Result<FetchedManifest> m) { got = std::move(m); });
    uint64_t start = now_monotonic_us();
    while (!got && now_monotonic_us() - start < 15'000'000) (void)loop_->run_once(10'000);
    if (!got) return make_error("no answer");
    return std::move(*got);
  }
  std::unique_ptr<EventLoop> loop_;
};

TEST_F(RegistryAuth, BearerTokensAreAskedForCachedUntilTheyExpireAndRenewedWhenRefused) {
  AuthServer s(/*basic=*/false);
  ASSERT_NE(s.host(), "127.0.0.1:0");
  auto c = client(s, "s3cret");
  ASSERT_TRUE(c);
  auto m = manifest(*c, s);
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(m->bytes, AuthServer::kManifest);
  EXPECT_EQ(s.token_requests(), 1);
  ASSERT_TRUE(manifest(*c, s).ok());
  EXPECT_EQ(s.token_requests(), 1);  // the cached token
  // The registry stops taking it (revoked, rotated): one new token, and the pull goes on.
  s.revoke();
  m = manifest(*c, s);
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(s.token_requests(), 2);
  // A token that lives 2 s is not sent after 90% of that, even though the registry would
  // still take it.
  s.set_expires_in(2);
  s.revoke();
  ASSERT_TRUE(manifest(*c, s).ok());
  EXPECT_EQ(s.token_requests(), 3);
  ASSERT_TRUE(manifest(*c, s).ok());
  EXPECT_EQ(s.token_requests(), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(1900));
  ASSERT_TRUE(manifest(*c, s).ok());
  EXPECT_EQ(s.token_requests(), 4);
  // A wrong password: the token service's refusal is the error.
  auto wrong = client(s, "guess");
  auto refused = manifest(*wrong, s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().str().find("token service refused"), std::string::npos)
      << refused.error().str();
}

TEST_F(RegistryAuth, BasicChallengesAreAnsweredWithTheConfiguredPassword) {
  AuthServer s(/*basic=*/true);
  auto none = client(s, "");
  auto refused = manifest(*none, s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().str().find("wants a password"), std::string::npos)
      << refused.error().str();
  auto wrong = client(s, "guess");
  refused = manifest(*wrong, s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().str().find("unauthorized even with credentials"), std::string::npos)
      << refused.error().str();
  auto right = client(s, "s3cret");
  auto m = manifest(*right, s);
  ASSERT_TRUE(m.ok()) << m.error().str();
  EXPECT_EQ(m->bytes, AuthServer::kManifest);
}

}  // namespace
}  // namespace weft::registry
