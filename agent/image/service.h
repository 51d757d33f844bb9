// The machine's image service (docs/images.md): pulls OCI images for tasks on the
// agent's event loop, keeps them in the content store (agent/image/store.h) and bounds
// the store's size.
//
//  - A pull resolves the reference (a tag is asked of the registry; a digest is used as
//    it is), picks the machine's platform from an index, stores the manifest and config,
//    then fetches and unpacks every layer not already there. Pulls of one image, and of
//    different images sharing a layer, share that layer's one download and one unpack.
//  - Nothing blocks the loop: downloads go through the registry client, unpacks run in
//    a confined child process watched by its pidfd.
//  - The cache: every layer has a size and a last use; while the store is over
//    `cache_max_bytes`, the layer used least recently that no task holds is removed
//    (with the images that need it). Layers a task holds are never removed. The record
//    (cache.json) is replaced atomically, so it survives restarts and crashes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/image/store.h"
#include "common/event.h"
#include "common/oci.h"
#include "common/registry.h"
#include "common/result.h"

namespace weft::image {

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

struct ServiceConfig {
  registry::Config registry;
  uint64_t cache_max_bytes = uint64_t{20} << 30;
  // Free space on the store's disk that downloads and unpacks never take, so that the
  // agent's own state can always be written (images.reserve).
  uint64_t reserve_bytes = uint64_t{1} << 30;
  UnpackLimits limits;
};

struct PullProgress {
  uint64_t done = 0, total = 0;  // bytes of layer blobs
};

class Service {
 public:
  static Result<std::unique_ptr<Service>> open(EventLoop& loop, std::string root,
                                               ServiceConfig cfg);
  ~Service();

  using Done = std::function<void(Result<LocalImage>)>;
  using OnProgress = std::function<void(const PullProgress&)>;
  // Makes `ref` (canonical, common/oci.h) local; `done` runs on the loop, never from
  // inside the call. Returns a ticket for cancel().
  uint64_t pull(const std::string& ref, OnProgress progress, Done done);
  // The caller no longer waits (the download goes on for other waiters, or stops when
  // none is left: its partial bytes stay for a later resume).
  void cancel(uint64_t ticket);
  // Where the pull behind `ticket` is now, to the byte received (the OnProgress calls
  // come only when a layer starts or ends); nothing when the ticket is done or unknown.
  std::optional<PullProgress> progress(uint64_t ticket);
  // Already local: the image `ref` names (a tag as last pulled), every layer unpacked.
  std::optional<LocalImage> local(const std::string& ref) const;

  // A package: the tarball at `url` whose SHA-256 is `d`, fetched (resumed, retried),
  // verified, unpacked as a layer. Shares downloads as pull() does; cancel() applies.
  uint64_t pull_package(const std::string& url, const oci::Digest& d, OnProgress progress,
                        Done done);
  std::optional<LocalImage> local_package(const oci::Digest& d) const;

  // The layer directory of `d` (unpacked) and where the layers are.
  std::string layer_dir(const oci::Digest& d) const { return store_->layer_path(d); }
  std::string layers_root() const { return store_->root() + "/layers"; }

  // A task holds an image's layers (and its package's) while it may run: they are never
  // evicted. release() lets go of everything the holder held.
  void hold(const std::string& holder, const LocalImage& img);
  void release(const std::string& holder);

  // weftctl image ls | rm | prune.
  nlohmann::json list() const;
  // Removes an image (by reference or manifest digest) and the layers no other image
  // needs; refused while a task holds it.
  Result<nlohmann::json> remove(const std::string& what);
  // Removes every image no task holds, and every layer no image needs; forgets the
  // layers refused for their size (the operator made room: they may be tried again).
  nlohmann::json prune();
  // Layers refused for their size, with the reason and when they may be tried again.
  nlohmann::json refused() const;

  uint64_t blob_downloads() const { return downloads_; }
  uint64_t downloaded_bytes() const { return downloaded_bytes_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t size_bytes() const;

  struct Pull;
  struct LayerJob;

 private:
  Service(EventLoop& loop, ServiceConfig cfg);
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
  uint64_t enqueue(const std::string& key, OnProgress progress, Done done,
                   const std::function<void(Pull&)>& init);
  Status load();
  void save();
  void start_pull(Pull& p);
  void on_manifest(const std::string& key, Result<registry::FetchedManifest> m, bool from_index);
  void on_config(const std::string& key, Status s);
  void fetch_layers(Pull& p);
  void start_layer(Pull& p, const oci::Layer& l);
  void on_blob(const std::string& digest, Status s);
  void start_unpack(LayerJob& j);
  void on_unpacked(const std::string& digest);
  void layer_done(const std::string& digest, const Status& s);
  void maybe_finish(Pull& p);
  void fail(const std::string& key, const Error& e);
  void report_progress(Pull& p);
  PullProgress progress_of(const Pull& p) const;
  void enforce_limit();
  void drop_image(const std::string& manifest);
  void drop_layer(const std::string& digest);
  bool layer_held(const std::string& digest) const;
  bool image_held(const std::string& manifest) const;
  void collect_unreferenced_layers();
  // Room on the store's disk for `need` more bytes above the reserve (errnum ENOSPC).
  Status check_room(uint64_t need) const;
  void refuse(const std::string& digest, const Error& e);

  EventLoop& loop_;
  ServiceConfig cfg_;
  std::unique_ptr<BlobStore> store_;
  std::unique_ptr<registry::Client> client_;
  std::map<std::string, ImageRec> images_;                 // by manifest digest
  std::map<std::string, std::string> refs_;                // reference -> manifest digest
  std::map<std::string, LayerRec> layers_;                 // by layer digest
  std::map<std::string, std::set<std::string>> holds_;     // holder -> manifest digests
  std::map<std::string, std::unique_ptr<Pull>> pulls_;     // by reference
  std::map<std::string, std::unique_ptr<LayerJob>> jobs_;  // by layer digest
  std::map<std::string, CacheRecord::Refusal> refused_;    // by layer digest
  std::map<uint64_t, std::string> tickets_;                // ticket -> reference
  uint64_t next_ticket_ = 1;
  Source enforce_soon_;
  uint64_t downloads_ = 0, downloaded_bytes_ = 0, evictions_ = 0;
};

}  // namespace weft::image
