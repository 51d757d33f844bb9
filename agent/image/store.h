// The machine's content store for images and packages (under the agent's state
// directory, images/):
//
//   blobs/<algorithm>/<hex>     verified blobs (manifests, configs, layers, packages)
//   partial/<algorithm>-<hex>   a download in progress (resumed after a restart; never
//                               read as content)
//   layers/<algorithm>/<hex>/   a layer blob unpacked, read-only to tasks
//   tmp/                        unpacks in progress (emptied at open)
//
// A blob is in blobs/ only once its bytes hashed to its digest and its size matched: a
// download renamed there after verification and fsync. A layer directory appears by a
// rename once fully unpacked. So a crash at any point leaves nothing half-made that
// could be used.
#pragma once

#include <memory>
#include <string>

#include "agent/image/layer.h"
#include "common/fs.h"
#include "common/oci.h"
#include "common/result.h"

namespace weft::image {

class BlobStore {
 public:
  static Result<std::unique_ptr<BlobStore>> open(std::string root);

  std::string blob_path(const oci::Digest& d) const;
  bool has_blob(const oci::Digest& d) const;
  std::string layer_path(const oci::Digest& d) const;
  bool has_layer(const oci::Digest& d) const;

  // Bytes of one blob arriving, hashed as they are written. A partial download left by
  // an earlier run is resumed: its bytes are hashed again first, and offset() says where
  // to continue (an HTTP Range request).
  class Ingest {
   public:
    ~Ingest();
    uint64_t offset() const { return written_; }
    Status append(const void* data, size_t n);
    // Verifies size and digest, makes the bytes durable and moves them into blobs/. On a
    // mismatch the partial file is removed (the next try starts over) and the error says
    // what arrived instead.
    Status commit();
    // Starts over (a server that ignored the Range request sent everything again).
    Status restart();

   private:
    friend class BlobStore;
    Ingest(BlobStore* store, oci::Digest digest, int64_t size);
    BlobStore* store_;
    oci::Digest digest_;
    int64_t size_;
    std::string path_;
    Fd fd_;
    std::unique_ptr<oci::Hasher> hash_;
    uint64_t written_ = 0;
  };
  // `size` < 0: not known in advance (a package without a size). At most one Ingest per
  // digest at a time (the fetcher shares one download between its waiters).
  Result<std::unique_ptr<Ingest>> ingest(const oci::Digest& d, int64_t size);

  // Stores `bytes` (a manifest or config already in memory) after checking them.
  Status put(const oci::Digest& d, std::string_view bytes);
  // A blob's bytes, at most `max` of them (manifests and configs).
  Result<std::string> read(const oci::Digest& d, size_t max);

  // Unpacks the layer blob `d` (which must be in blobs/) into layers/, confined to its
  // directory; returns the layer directory. Already unpacked: returned at once.
  Result<std::string> unpack(const oci::Digest& d, oci::Compression c,
                             const UnpackLimits& limits = {});
  // The same without blocking: begin_unpack starts the confined child (nothing to do
  // when the layer is there: `done` is set); when the child's pidfd is readable,
  // finish_unpack moves the layer into place.
  struct Unpacking {
    oci::Digest digest;
    std::string tmp;
    bool done = false;
    UnpackChild child;
    UnpackStats stats;  // after finish_unpack (zero when it was there already)
  };
  Result<Unpacking> begin_unpack(const oci::Digest& d, oci::Compression c,
                                 const UnpackLimits& limits = {});
  Result<std::string> finish_unpack(Unpacking& u, bool wait = false);
  // Removes a layer directory (the cache's eviction): renamed away first, so a crash
  // midway never leaves a half-removed layer under its name.
  Status remove_layer(const oci::Digest& d);
  Status remove_blob(const oci::Digest& d);

  const std::string& root() const { return root_; }

 private:
  explicit BlobStore(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

}  // namespace weft::image
