// What a machine has of images (docs/images.md): the record of its images, packages and
// layers (cache.json in the content store), which tasks hold them, the layers refused
// for their size, and the eviction of the least recently used layer no task holds while
// the store is over its limit. The pulls that fill it are image::Service's.
//
// The record is replaced atomically, so it survives restarts and crashes; at open, the
// store is the truth (a recorded layer that is not there is forgotten, one that is there
// unrecorded is counted).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/image/store.h"
#include "common/oci.h"
#include "common/result.h"

namespace weft::image {

// The largest image config read (a config is small; a larger one is refused).
inline constexpr size_t kMaxConfigBytes = 4u << 20;

// An image whose every layer is unpacked on this machine. A package (a tarball named by
// URL and SHA-256) is kept as an image of one layer, its own digest, with no config.
struct LocalImage {
  oci::Digest manifest;  // the platform manifest
  oci::ImageConfig config;
  std::vector<oci::Digest> layers;  // lowest first
};

// cache.json as read at open. Hostile (a shared disk, a bug, another version): every
// entry is checked and a bad one skipped; parsing never throws.
struct CacheRecord {
  struct Layer {
    uint64_t size = 0, last_used_us = 0;
  };
  struct Image {
    std::set<std::string> refs;
    std::optional<oci::Digest> config;  // images; none for a package
    std::vector<oci::Digest> layers;
    uint64_t last_used_us = 0;
    bool package = false;
  };
  // A layer refused for its size (over the cache's limit, or more than the disk has
  // above the reserve): not fetched or unpacked again until `until_us`.
  struct Refusal {
    std::string reason;
    uint64_t until_us = 0;
    uint32_t times = 0;  // refusals in a row: each holds twice as long, up to a day
  };
  std::map<std::string, Layer> layers;     // by layer digest
  std::map<std::string, Image> images;     // by manifest digest (a package: its own)
  std::map<std::string, Refusal> refused;  // by layer digest
};
CacheRecord parse_cache_record(std::string_view text);

class Cache {
 public:
  // `busy(d)`: layer `d` is being fetched or unpacked, or a pull in progress needs it
  // (never evicted).
  Cache(BlobStore& store, uint64_t max_bytes, std::function<bool(const std::string&)> busy)
      : store_(store), max_bytes_(max_bytes), busy_(std::move(busy)) {}
  // Reads cache.json (hostile: a bad entry is skipped) and reconciles it with the store.
  Status load();

  // Already local: the image `ref` names (a tag as last pulled), every layer unpacked.
  std::optional<LocalImage> local(const std::string& ref) const;
  std::optional<LocalImage> local_package(const oci::Digest& d) const;
  uint64_t size_bytes() const;
  uint64_t evictions() const { return evictions_; }

  // What a pull made: an unpacked layer of `size` bytes (blob and files); a package
  // fetched from `url`; an image pulled by `ref` (a tag moves to it).
  void add_layer(const std::string& digest, uint64_t size);
  void add_package(const std::string& url, const oci::Digest& d);
  void add_image(const std::string& ref, const oci::Digest& manifest,
                 const oci::Digest& config_digest, oci::ImageConfig config,
                 std::vector<oci::Digest> layers);
  // Marks a recorded image and its layers used now, records the cache, and returns it.
  std::optional<LocalImage> use(const oci::Digest& manifest);

  // A task holds an image's layers (and its package's) while it may run: they are never
  // evicted. release() lets go of everything the holder held.
  void hold(const std::string& holder, const LocalImage& img);
  void release(const std::string& holder);

  // A layer refused for its size (ENOSPC, EFBIG): not fetched or unpacked again until the
  // refusal ends (ten minutes, doubling with each refusal in a row, at most a day).
  void refuse(const std::string& digest, const Error& e);
  const CacheRecord::Refusal* refusal(const std::string& digest) const;
  // A layer that came after all: its refusal is forgotten.
  void accept(const std::string& digest);

  // weftctl image ls | rm | prune, and the refused layers with when they may be tried.
  nlohmann::json list() const;
  // Removes an image (by reference or manifest digest) and the layers no other image
  // needs; refused while a task holds it.
  Result<nlohmann::json> remove(const std::string& what);
  // Removes every image no task holds, and every layer no image needs; forgets the
  // layers refused for their size (the operator made room: they may be tried again).
  nlohmann::json prune();
  nlohmann::json refused() const;

  // Evicts the least recently used layers no task holds while over the limit.
  void enforce_limit();

 private:
  struct ImageRec {
    std::set<std::string> refs;
    oci::Digest config_digest;
    oci::ImageConfig config;
    std::vector<oci::Digest> layers;
    uint64_t last_used_us = 0;
    bool package = false;  // refs are URLs; no config
  };
  struct LayerRec {
    uint64_t size = 0;  // blob and unpacked files
    uint64_t last_used_us = 0;
  };
  void save();
  void drop_image(const std::string& manifest);
  void drop_layer(const std::string& digest);
  bool layer_held(const std::string& digest) const;
  bool image_held(const std::string& manifest) const;
  void collect_unreferenced_layers();

  BlobStore& store_;
  uint64_t max_bytes_;
  std::function<bool(const std::string&)> busy_;
  std::map<std::string, ImageRec> images_;               // by manifest digest
  std::map<std::string, std::string> refs_;              // reference -> manifest digest
  std::map<std::string, LayerRec> layers_;               // by layer digest
  std::map<std::string, std::set<std::string>> holds_;   // holder -> manifest digests
  std::map<std::string, CacheRecord::Refusal> refused_;  // by layer digest
  uint64_t evictions_ = 0;
};

}  // namespace weft::image
