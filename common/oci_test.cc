// Image references, digests and the OCI/Docker documents a registry sends, read as
// hostile input: what is valid is read exactly, anything else is refused naming the
// field.
#include "common/oci.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace weft::oci {
namespace {

using json = nlohmann::json;

const std::string kHex(64, 'a');

TEST(ImageRef, RegistryRepositoryTagAndDigest) {
  auto r = parse_image_ref("registry.example.com:5000/team/app:1.2.3");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->registry, "registry.example.com:5000");
  EXPECT_EQ(r->repository, "team/app");
  EXPECT_EQ(r->tag, "1.2.3");
  EXPECT_FALSE(r->digest);
  EXPECT_EQ(r->str(), "registry.example.com:5000/team/app:1.2.3");

  auto d = parse_image_ref("localhost/app@sha256:" + kHex);
  ASSERT_TRUE(d.ok()) << d.error().str();
  EXPECT_EQ(d->tag, "");
  ASSERT_TRUE(d->digest);
  EXPECT_EQ(d->digest->str(), "sha256:" + kHex);

  auto both = parse_image_ref("127.0.0.1:5000/a/b_c.d-e__f:v1@sha256:" + kHex);
  ASSERT_TRUE(both.ok()) << both.error().str();
  EXPECT_EQ(both->tag, "v1");
  EXPECT_EQ(both->pinned(*both->digest).str(), "127.0.0.1:5000/a/b_c.d-e__f@sha256:" + kHex);

  auto latest = parse_image_ref("docker.io/library/busybox");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->tag, "latest");
}

TEST(ImageRef, BadReferencesNameWhatIsWrong) {
  auto no_registry = parse_image_ref("busybox:1.36");
  ASSERT_FALSE(no_registry.ok());
  EXPECT_NE(no_registry.error().message.find("names no registry"), std::string::npos);
  auto not_registry = parse_image_ref("library/busybox:1.36");
  ASSERT_FALSE(not_registry.ok());
  EXPECT_NE(not_registry.error().message.find("not a registry"), std::string::npos);
  for (const char* bad :
       {"", "r.io/", "r.io/App", "r.io/a//b", "r.io/a/-b", "r.io/a:", "r.io/a:-x",
        "r.io/a@sha256:abc",
        "r.io/a@md5:"
        "0123",
        "r.io/a@sha256:"
        "AAAA",
        "r.io:99999/a", "r.io/a..b", "r.io/a_.b", "-r.io/a", "r.io/a b", "r.io/a\n"})
    EXPECT_FALSE(parse_image_ref(bad).ok()) << bad;
  EXPECT_FALSE(parse_image_ref("r.io/a:" + std::string(129, 't')).ok());
  EXPECT_FALSE(parse_image_ref("r.io/" + std::string(600, 'a')).ok());
}

TEST(Digest, ParseAndHash) {
  EXPECT_TRUE(parse_digest("sha512:" + std::string(128, '0')).ok());
  EXPECT_FALSE(parse_digest("sha256:" + std::string(63, '0')).ok());
  EXPECT_FALSE(parse_digest("sha256" + kHex).ok());
  // sha256("abc"), FIPS 180-2's example.
  EXPECT_EQ(digest_of("abc").str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Hasher h("sha256");
  h.update("a", 1);
  h.update("bc", 2);
  EXPECT_EQ(h.finish(), digest_of("abc"));
}

json descriptor(const std::string& type, char fill = 'b', int64_t size = 100) {
  return {{"mediaType", type}, {"digest", "sha256:" + std::string(64, fill)}, {"size", size}};
}

TEST(Manifest, OciAndDockerImageManifests) {
  json m{{"schemaVersion", 2},
         {"mediaType", kOciManifest},
         {"config", descriptor(kOciConfig, 'c')},
         {"layers",
          {descriptor("application/vnd.oci.image.layer.v1.tar+gzip", '1'),
           descriptor("application/vnd.oci.image.layer.v1.tar+zstd", '2'),
           descriptor("application/vnd.oci.image.layer.v1.tar", '3')}}};
  auto doc = parse_manifest(m.dump(), kOciManifest);
  ASSERT_TRUE(doc.ok()) << doc.error().str();
  ASSERT_FALSE(doc->is_index);
  ASSERT_EQ(doc->manifest.layers.size(), 3u);
  EXPECT_EQ(doc->manifest.layers[0].compression, Compression::kGzip);
  EXPECT_EQ(doc->manifest.layers[1].compression, Compression::kZstd);
  EXPECT_EQ(doc->manifest.layers[2].compression, Compression::kNone);
  EXPECT_EQ(doc->manifest.config.digest.hex, std::string(64, 'c'));

  json d{{"schemaVersion", 2},
         {"mediaType", kDockerManifest},
         {"config", descriptor(kDockerConfig)},
         {"layers", {descriptor("application/vnd.docker.image.rootfs.diff.tar.gzip")}}};
  auto dd = parse_manifest(d.dump(), "application/vnd.docker.distribution.manifest.v2+json; x=y");
  ASSERT_TRUE(dd.ok()) << dd.error().str();
  EXPECT_EQ(dd->manifest.layers[0].compression, Compression::kGzip);
}

TEST(Manifest, HostileManifestsAreRefusedNamingTheField) {
  json good{{"schemaVersion", 2},
            {"config", descriptor(kOciConfig)},
            {"layers", {descriptor("application/vnd.oci.image.layer.v1.tar")}}};
  auto field_of = [](const json& j) {
    auto r = parse_manifest(j.dump(), kOciManifest);
    return r.ok() ? std::string("accepted") : r.error().field + ": " + r.error().message;
  };
  json j = good;
  j["schemaVersion"] = 1;
  EXPECT_EQ(field_of(j).rfind("schemaVersion", 0), 0u) << field_of(j);
  j = good;
  j["layers"][0]["size"] = -5;
  EXPECT_EQ(field_of(j).rfind("layers[0].size", 0), 0u) << field_of(j);
  j = good;
  j["layers"][0]["size"] = 1.5;
  EXPECT_EQ(field_of(j).rfind("layers[0].size", 0), 0u) << field_of(j);
  j = good;
  j["layers"][0]["digest"] = "sha256:xyz";
  EXPECT_EQ(field_of(j).rfind("layers[0].digest", 0), 0u) << field_of(j);
  j = good;
  j["layers"][0]["mediaType"] = "application/vnd.oci.image.layer.nondistributable.v1.tar";
  EXPECT_EQ(field_of(j).rfind("layers[0].mediaType", 0), 0u) << field_of(j);
  j = good;
  j["layers"][0]["urls"] = {"http://elsewhere/blob"};
  EXPECT_EQ(field_of(j).rfind("layers[0].urls", 0), 0u) << field_of(j);
  j = good;
  j["config"]["mediaType"] = "application/octet-stream";
  EXPECT_EQ(field_of(j).rfind("config.mediaType", 0), 0u) << field_of(j);
  j = good;
  j["config"]["size"] = int64_t{1} << 40;
  EXPECT_EQ(field_of(j).rfind("config.size", 0), 0u) << field_of(j);
  j = good;
  j["layers"] = json::array();
  for (int i = 0; i < 129; ++i)
    j["layers"].push_back(descriptor("application/vnd.oci.image.layer.v1.tar"));
  EXPECT_EQ(field_of(j).rfind("layers", 0), 0u) << field_of(j);
  j = good;
  j["mediaType"] = kOciIndex;  // says one thing, sent as another
  EXPECT_EQ(field_of(j).rfind("mediaType", 0), 0u) << field_of(j);
  EXPECT_FALSE(parse_manifest("[", kOciManifest).ok());
  EXPECT_FALSE(parse_manifest(std::string(5000, '['), kOciManifest).ok());
  EXPECT_FALSE(parse_manifest(good.dump(), "text/html").ok());
  EXPECT_FALSE(parse_manifest(std::string(kMaxManifestBytes + 1, ' '), kOciManifest).ok());
}

TEST(Index, ThePlatformOfThisMachineIsChosen) {
  json idx{{"schemaVersion", 2},
           {"mediaType", kOciIndex},
           {"manifests",
            {
                {{"mediaType", kOciManifest},
                 {"digest", "sha256:" + std::string(64, '1')},
                 {"size", 10},
                 {"platform", {{"os", "linux"}, {"architecture", "arm64"}, {"variant", "v8"}}}},
                {{"mediaType", kOciManifest},
                 {"digest", "sha256:" + std::string(64, '2')},
                 {"size", 10},
                 {"platform", {{"os", "linux"}, {"architecture", "amd64"}}}},
                {{"mediaType", kOciManifest},
                 {"digest", "sha256:" + std::string(64, '3')},
                 {"size", 10},
                 {"platform", {{"os", "unknown"}, {"architecture", "unknown"}}}},
                {{"mediaType", kOciManifest},
                 {"digest", "sha256:" + std::string(64, '4')},
                 {"size", 10},
                 {"platform", {{"os", "linux"}, {"architecture", "arm"}, {"variant", "v7"}}}},
            }}};
  auto doc = parse_manifest(idx.dump(), "");
  ASSERT_TRUE(doc.ok()) << doc.error().str();
  ASSERT_TRUE(doc->is_index);
  auto amd = select_platform(doc->entries, {"linux", "amd64", ""});
  ASSERT_TRUE(amd.ok());
  EXPECT_EQ(amd->digest.hex, std::string(64, '2'));
  auto arm64 = select_platform(doc->entries, {"linux", "arm64", "v8"});
  ASSERT_TRUE(arm64.ok());
  EXPECT_EQ(arm64->digest.hex, std::string(64, '1'));
  EXPECT_FALSE(select_platform(doc->entries, {"linux", "arm", "v6"}).ok());
  auto none = select_platform(doc->entries, {"linux", "s390x", ""});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("linux/amd64"), std::string::npos) << none.error().str();
  EXPECT_EQ(none.error().message.find("unknown"), std::string::npos) << none.error().str();
  // This machine's own platform has a GOARCH name.
  EXPECT_FALSE(host_platform().architecture.empty());
}

TEST(ImageConfigDoc, DefaultsAndDiffIds) {
  json c{{"architecture", "amd64"},
         {"os", "linux"},
         {"config",
          {{"Entrypoint", {"/bin/app"}},
           {"Cmd", nullptr},
           {"Env", {"PATH=/usr/bin:/bin", "A=b=c"}},
           {"WorkingDir", "/srv"},
           {"User", "1000:1000"}}},
         {"rootfs", {{"type", "layers"}, {"diff_ids", {"sha256:" + kHex}}}}};
  auto r = parse_image_config(c.dump());
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->entrypoint, std::vector<std::string>{"/bin/app"});
  EXPECT_TRUE(r->cmd.empty());
  EXPECT_EQ(r->env.size(), 2u);
  EXPECT_EQ(r->working_dir, "/srv");
  EXPECT_EQ(r->user, "1000:1000");
  ASSERT_EQ(r->diff_ids.size(), 1u);

  auto bad = [&](const char* ptr, json v) {
    json b = c;
    b[json::json_pointer(ptr)] = std::move(v);
    auto x = parse_image_config(b.dump());
    return x.ok() ? std::string("accepted") : x.error().field;
  };
  EXPECT_EQ(bad("/config/Env/0", "NOEQUALS"), "config.Env[0]");
  EXPECT_EQ(bad("/config/Cmd", "sh -c x"), "config.Cmd");
  EXPECT_EQ(bad("/config/Entrypoint/0", 5), "config.Entrypoint[0]");
  EXPECT_EQ(bad("/config/WorkingDir", "relative"), "config.WorkingDir");
  EXPECT_EQ(bad("/rootfs/type", "other"), "rootfs.type");
  EXPECT_EQ(bad("/rootfs/diff_ids/0", "sha256:zz"), "rootfs.diff_ids[0]");
  EXPECT_EQ(bad("/os", 1), "os");
}

}  // namespace
}  // namespace weft::oci
