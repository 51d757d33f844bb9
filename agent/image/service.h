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
//  - What is here, who holds it and what is evicted when the store is over
//    `cache_max_bytes`: the Cache (agent/image/cache.h), reached through cache().
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

#include "agent/image/cache.h"
#include "agent/image/store.h"
#include "common/event.h"
#include "common/oci.h"
#include "common/registry.h"
#include "common/result.h"

namespace weft::image {

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
  // A package: the tarball at `url` whose SHA-256 is `d`, fetched (resumed, retried),
  // verified, unpacked as a layer. Shares downloads as pull() does; cancel() applies.
  uint64_t pull_package(const std::string& url, const oci::Digest& d, OnProgress progress,
                        Done done);

  // The layer directory of `d` (unpacked) and where the layers are.
  std::string layer_dir(const oci::Digest& d) const { return store_->layer_path(d); }
  std::string layers_root() const { return store_->root() + "/layers"; }

  // What is here: images, packages, layers, holds, refusals, eviction.
  Cache& cache() { return *cache_; }
  const Cache& cache() const { return *cache_; }

  uint64_t blob_downloads() const { return downloads_; }
  uint64_t downloaded_bytes() const { return downloaded_bytes_; }

  struct Pull;
  struct LayerJob;

 private:
  Service(EventLoop& loop, ServiceConfig cfg);
  uint64_t enqueue(const std::string& key, OnProgress progress, Done done,
                   const std::function<void(Pull&)>& init);
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
  // Room on the store's disk for `need` more bytes above the reserve (errnum ENOSPC).
  Status check_room(uint64_t need) const;
  // A layer being fetched or unpacked, or one a pull in progress needs.
  bool busy(const std::string& digest) const;

  EventLoop& loop_;
  ServiceConfig cfg_;
  std::unique_ptr<BlobStore> store_;
  std::unique_ptr<registry::Client> client_;
  std::unique_ptr<Cache> cache_;
  std::map<std::string, std::unique_ptr<Pull>> pulls_;     // by reference
  std::map<std::string, std::unique_ptr<LayerJob>> jobs_;  // by layer digest
  std::map<uint64_t, std::string> tickets_;                // ticket -> reference
  uint64_t next_ticket_ = 1;
  Source enforce_soon_;
  uint64_t downloads_ = 0, downloaded_bytes_ = 0;
};

}  // namespace weft::image
