#include "agent/image/store.h"
#include "common/strings.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weft::image {

namespace {

Status fsync_dir(const std::string& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || ::fsync(d.get()) != 0) return sys_error("fsync " + dir);
  return {};
}

}  // namespace

Result<std::unique_ptr<BlobStore>> BlobStore::open(std::string root) {
  for (const char* sub :
       {"blobs/sha256", "blobs/sha512", "partial", "layers/sha256", "layers/sha512", "tmp"})
    TRY(mkdir_p(root + "/" + sub, 0700));
  // Unpacks a crash interrupted: never renamed into layers/, so nothing uses them.
  if (auto names = list_dir(root + "/tmp"); names.ok())
    for (const auto& n : *names) (void)remove_tree(root + "/tmp/" + n);
  return std::unique_ptr<BlobStore>(new BlobStore(std::move(root)));
}

std::string BlobStore::blob_path(const oci::Digest& d) const {
  return root_ + "/blobs/" + d.algorithm + "/" + d.hex;
}

bool BlobStore::has_blob(const oci::Digest& d) const {
  return path_exists(blob_path(d));
}

std::string BlobStore::layer_path(const oci::Digest& d) const {
  return root_ + "/layers/" + d.algorithm + "/" + d.hex;
}

bool BlobStore::has_layer(const oci::Digest& d) const {
  return path_exists(layer_path(d));
}

BlobStore::Ingest::Ingest(BlobStore* store, oci::Digest digest, int64_t size)
    : store_(store), digest_(std::move(digest)), size_(size) {
  path_ = store_->root_ + "/partial/" + digest_.algorithm + "-" + digest_.hex;
}

BlobStore::Ingest::~Ingest() = default;

Result<std::unique_ptr<BlobStore::Ingest>> BlobStore::ingest(const oci::Digest& d, int64_t size) {
  std::unique_ptr<Ingest> in(new Ingest(this, d, size));
  in->hash_ = std::make_unique<oci::Hasher>(d.algorithm);
  in->fd_ = Fd(::open(in->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!in->fd_.valid()) return sys_error("open " + in->path_);
  // Resume: what an earlier run wrote is hashed again (it is verified with the rest).
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(in->fd_.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read " + in->path_);
    }
    if (n == 0) break;
    in->hash_->update(buf, static_cast<size_t>(n));
    in->written_ += static_cast<uint64_t>(n);
  }
  if (size >= 0 && in->written_ > static_cast<uint64_t>(size)) TRY(in->restart());
  return in;
}

Status BlobStore::Ingest::restart() {
  if (::ftruncate(fd_.get(), 0) != 0 || ::lseek(fd_.get(), 0, SEEK_SET) != 0)
    return sys_error("truncate " + path_);
  hash_ = std::make_unique<oci::Hasher>(digest_.algorithm);
  written_ = 0;
  return {};
}

Status BlobStore::Ingest::append(const void* data, size_t n) {
  if (size_ >= 0 && written_ + n > static_cast<uint64_t>(size_))
    return make_error("blob " + digest_.str() + " is larger than the " + std::to_string(size_) +
                      " bytes its descriptor says");
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    ssize_t w = ::write(fd_.get(), p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      return sys_error("write " + path_);
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  hash_->update(data, n);
  uint64_t before = written_;
  written_ += n;
  // Writeback starts every 8 MiB without waiting for it, so the fsync at commit has
  // little left to do (commit runs on the agent's loop).
  constexpr uint64_t kChunk = 8u << 20;
  if (before / kChunk != written_ / kChunk) {
    uint64_t from = (before / kChunk) * kChunk;
    (void)::sync_file_range(fd_.get(), static_cast<off_t>(from),
                            static_cast<off_t>(written_ - from), SYNC_FILE_RANGE_WRITE);
  }
  return {};
}

Status BlobStore::Ingest::commit() {
  oci::Digest got = hash_->finish();
  hash_ = std::make_unique<oci::Hasher>(digest_.algorithm);  // finish() is once
  auto discard = [&](std::string why) {
    ::unlink(path_.c_str());
    written_ = 0;
    return make_error("blob " + digest_.str() + " refused: " + why);
  };
  if (size_ >= 0 && written_ != static_cast<uint64_t>(size_))
    return discard(std::to_string(written_) + " bytes arrived, " + std::to_string(size_) +
                   " expected");
  if (got != digest_) return discard("its bytes hash to " + got.str());
  if (::fsync(fd_.get()) != 0) return sys_error("fsync " + path_);
  if (::fchmod(fd_.get(), 0400) != 0) return sys_error("chmod " + path_);
  std::string final_path = store_->blob_path(digest_);
  if (::rename(path_.c_str(), final_path.c_str()) != 0) return sys_error("rename " + path_);
  return fsync_dir(dirname_of(final_path));
}

Status BlobStore::put(const oci::Digest& d, std::string_view bytes) {
  if (has_blob(d)) return {};
  TRY_ASSIGN(auto in, ingest(d, static_cast<int64_t>(bytes.size())));
  TRY(in->restart());
  TRY(in->append(bytes.data(), bytes.size()));
  return in->commit();
}

Result<std::string> BlobStore::read(const oci::Digest& d, size_t max) {
  return read_file_bounded(blob_path(d), max);
}

Result<BlobStore::Unpacking> BlobStore::begin_unpack(const oci::Digest& d, oci::Compression c,
                                                     const UnpackLimits& limits) {
  Unpacking u;
  u.digest = d;
  if (path_exists(layer_path(d))) {
    u.done = true;
    return u;
  }
  if (!has_blob(d)) return make_error("layer " + d.str() + " is not in the store");
  u.tmp = root_ + "/tmp/" + d.hex.substr(0, 16) + "-" + random_hex(4);
  TRY(mkdir_p(u.tmp, 0755));
  // The layer's root, unless the tar sets it: 0755 whatever the agent's umask, so that a
  // task's user can enter its own /.
  if (::chmod(u.tmp.c_str(), 0755) != 0) {
    Error e = sys_error("chmod " + u.tmp);
    (void)remove_tree(u.tmp);
    return e;
  }
  auto child = start_unpack_confined(blob_path(d), u.tmp, c, limits);
  if (!child.ok()) {
    (void)remove_tree(u.tmp);
    return std::move(child).error().wrap("unpack layer " + d.str());
  }
  u.child = std::move(child).value();
  return u;
}

Result<std::string> BlobStore::finish_unpack(Unpacking& u, bool wait) {
  std::string dest = layer_path(u.digest);
  if (u.done) return dest;
  auto st = finish_unpack_confined(u.child, wait);
  u.done = true;
  if (!st.ok()) {
    (void)remove_tree(u.tmp);
    return std::move(st).error().wrap("unpack layer " + u.digest.str());
  }
  u.stats = *st;
  // The layer's root takes the image's mode for "/" if it had one; it must be
  // traversable for tasks that are not root.
  struct stat sb {};
  if (::stat(u.tmp.c_str(), &sb) == 0 && (sb.st_mode & 0111) == 0) ::chmod(u.tmp.c_str(), 0755);
  if (::rename(u.tmp.c_str(), dest.c_str()) != 0) {
    int e = errno;
    (void)remove_tree(u.tmp);
    if (e == EEXIST || e == ENOTEMPTY) return dest;  // unpacked meanwhile by another
    return errno_error(e, "rename " + u.tmp);
  }
  TRY(fsync_dir(dirname_of(dest)));
  return dest;
}

Result<std::string> BlobStore::unpack(const oci::Digest& d, oci::Compression c,
                                      const UnpackLimits& limits) {
  TRY_ASSIGN(Unpacking u, begin_unpack(d, c, limits));
  return finish_unpack(u, true);
}

Status BlobStore::remove_layer(const oci::Digest& d) {
  std::string dir = layer_path(d);
  if (!path_exists(dir)) return {};
  std::string away = root_ + "/tmp/rm-" + d.hex.substr(0, 16) + "-" + random_hex(4);
  if (::rename(dir.c_str(), away.c_str()) != 0) return sys_error("rename " + dir);
  (void)fsync_dir(dirname_of(dir));
  return remove_tree(away);
}

Status BlobStore::remove_blob(const oci::Digest& d) {
  if (::unlink(blob_path(d).c_str()) != 0 && errno != ENOENT)
    return sys_error("remove " + blob_path(d));
  return {};
}

}  // namespace weft::image
