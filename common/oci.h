// OCI images as weft reads them: image references, digests, and the JSON documents of
// the OCI image spec (and Docker's schema 2, which registries still serve): image
// manifests, image indexes (one manifest per platform) and image configurations.
//
// Everything here is hostile input (a registry is the network, an image is someone
// else's build): every parser checks every type and bound, names the offending field,
// and never throws. One parser for every component: weftctl and the control plane read
// references with it, the agent reads what the registry sends.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace weft::oci {

// "sha256:<64 lowercase hex>" (or sha512:<128>): what a blob's bytes hash to.
struct Digest {
  std::string algorithm;  // "sha256" or "sha512"
  std::string hex;        // lowercase
  std::string str() const { return algorithm + ":" + hex; }
  bool operator==(const Digest&) const = default;
  bool operator<(const Digest& o) const { return str() < o.str(); }
};
Result<Digest> parse_digest(std::string_view s);

// Hashes bytes as they come, for the digest they must match.
class Hasher {
 public:
  explicit Hasher(const std::string& algorithm);  // "sha256" or "sha512"
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t n);
  Digest finish();  // once

 private:
  std::string algorithm_;
  void* ctx_ = nullptr;  // EVP_MD_CTX
};
Digest digest_of(std::string_view bytes, const std::string& algorithm = "sha256");

// "<registry>/<repository>[:<tag>][@<digest>]". The registry is always named (a host
// with a dot or a port, or "localhost"): which registry a fleet pulls from is not left
// to a default. A reference with a digest names exactly those bytes; with a tag only it
// is resolved to a digest once, when a job is created or updated.
struct ImageRef {
  std::string registry;    // "registry.example.com:5000"
  std::string repository;  // "team/app"
  std::string tag;         // "" when only a digest is given
  std::optional<Digest> digest;
  std::string str() const;  // canonical form
  // The same image pinned to `d`: "<registry>/<repository>@<d>" (the tag dropped).
  ImageRef pinned(const Digest& d) const;
};
Result<ImageRef> parse_image_ref(std::string_view s);

// Media types weft understands.
inline constexpr const char* kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr const char* kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr const char* kOciConfig = "application/vnd.oci.image.config.v1+json";
inline constexpr const char* kDockerManifest =
    "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr const char* kDockerList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr const char* kDockerConfig = "application/vnd.docker.container.image.v1+json";
// What a registry is asked for (Accept): every manifest and index type above.
std::string manifest_accept_header();

// kAny: told by the first bytes (gzip, zstd, else none): a package, whose URL has no
// media type.
enum class Compression { kNone, kGzip, kZstd, kAny };

struct Descriptor {
  std::string media_type;
  Digest digest;
  int64_t size = 0;
};

struct Layer {
  Descriptor blob;
  Compression compression = Compression::kNone;
};

struct Platform {
  std::string os = "linux";
  std::string architecture;  // GOARCH: amd64, arm64, arm, 386, ppc64le, s390x, riscv64
  std::string variant;       // arm: v6, v7; arm64: v8 (may be empty)
};
// This machine's platform (uname's machine mapped to GOARCH names).
Platform host_platform();

struct Manifest {
  Descriptor config;
  std::vector<Layer> layers;  // lowest first
};

struct IndexEntry {
  Descriptor manifest;
  Platform platform;
  bool has_platform = false;
};

// A manifest or an index, as the registry sent it. `media_type` is the response's
// Content-Type (or the document's own mediaType when that is empty).
struct ManifestDoc {
  bool is_index = false;
  Manifest manifest;                // !is_index
  std::vector<IndexEntry> entries;  // is_index
};
Result<ManifestDoc> parse_manifest(std::string_view body, std::string_view media_type = "");

// The index entry for `p`: same os and architecture; a variant that matches wins over
// an entry without one; anything else is refused, naming what the index offers.
Result<Descriptor> select_platform(const std::vector<IndexEntry>& entries, const Platform& p);

// What the image's configuration says a container runs: the defaults a task spec may
// override. `diff_ids` are the uncompressed layers' digests, lowest first.
struct ImageConfig {
  Platform platform;
  std::vector<std::string> entrypoint, cmd, env;
  std::string working_dir;
  std::string user;
  std::vector<Digest> diff_ids;
};
Result<ImageConfig> parse_image_config(std::string_view body);

// Bounds on what a registry may send: past them the document is refused.
inline constexpr size_t kMaxManifestBytes = 4u << 20;  // the distribution spec's advice
inline constexpr size_t kMaxConfigBytes = 8u << 20;
inline constexpr size_t kMaxLayers = 128;         // overlayfs stacks this many lower layers
inline constexpr size_t kMaxIndexEntries = 1024;  // platforms and attestations
inline constexpr int64_t kMaxBlobBytes = int64_t{64} << 30;

}  // namespace weft::oci
