// Unpacking an image layer (a tar stream, plain, gzip or zstd) into a directory that
// becomes one read-only lower layer of a task's overlayfs root.
//
// A layer is hostile input. The unpack runs in a child process chrooted into the
// layer's directory (nothing outside it can be named, whatever libarchive or this code
// gets wrong), and on top of that refuses entries with ".." or absolute paths and never
// writes through a symlink (libarchive's secure extraction flags). Symlinks themselves
// are kept as they are, absolute ones included: they resolve inside the task's root.
//
// OCI whiteouts become overlayfs whiteouts: ".wh.<name>" a character device 0:0 named
// <name>, ".wh..wh..opq" the directory's trusted.overlay.opaque=y. Character and block
// devices are skipped (a task's /dev is weft's, and the overlay is mounted nodev);
// setuid and setgid bits are kept as the image has them (the overlay is mounted nosuid
// and tasks run with no_new_privs, so they grant nothing). Owners are numeric, as OCI
// layers carry them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/fs.h"

#include "common/oci.h"
#include "common/result.h"

namespace weft::image {

// A layer over a limit fails with errnum EFBIG; one that would leave its filesystem with
// less than `reserve_bytes` free (or that met ENOSPC) with errnum ENOSPC. Either way the
// caller removes what was unpacked.
struct UnpackLimits {
  uint64_t max_bytes = uint64_t{32} << 30;  // uncompressed: a decompression bomb stops here
  uint64_t max_entries = 1'000'000;
  uint64_t reserve_bytes = 0;  // free space the unpack never takes (the agent's own state)
};

struct UnpackStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;            // uncompressed file contents
  uint64_t whiteouts = 0;        // ".wh.<name>" and opaque markers
  uint64_t skipped_devices = 0;  // character and block devices
};

// Room on the filesystem of `fd` for `need` more bytes above `reserve_bytes`; an error
// with errnum ENOSPC when there is not (0: no reserve, always room).
Status check_room(int fd, uint64_t need, uint64_t reserve_bytes);

// Unpacks the tar stream on `fd` (compressed as `c`) into `dir`, which must exist and is
// taken as the root: every entry lands beneath it. In this process, relative to `dir`
// (the caller's working directory is not changed): use unpack_layer_confined from a
// daemon. An error names the entry.
Result<UnpackStats> unpack_layer(int fd, const std::string& dir, oci::Compression c,
                                 const UnpackLimits& limits = {});

// The same in a child process chrooted into `dir` (root only), which reads `blob` and
// syncs the layer's files to disk before it answers. On error `dir` may hold part of the
// layer: the caller removes it.
//
// Without blocking: start_unpack_confined forks the child; when its pidfd is readable
// (it ended), finish_unpack_confined(child, false) collects the answer. Dropping an
// unfinished child kills it.
struct UnpackChild {
  pid_t pid = -1;
  Fd pidfd;
  Fd reply;
  UnpackChild() = default;
  UnpackChild(UnpackChild&& o) noexcept
      : pid(std::exchange(o.pid, -1)), pidfd(std::move(o.pidfd)), reply(std::move(o.reply)) {}
  UnpackChild& operator=(UnpackChild&& o) noexcept {
    kill_and_reap();
    pid = std::exchange(o.pid, -1);
    pidfd = std::move(o.pidfd);
    reply = std::move(o.reply);
    return *this;
  }
  ~UnpackChild() { kill_and_reap(); }
  void kill_and_reap();
};
Result<UnpackChild> start_unpack_confined(const std::string& blob, const std::string& dir,
                                          oci::Compression c, const UnpackLimits& limits = {});
Result<UnpackStats> finish_unpack_confined(UnpackChild& child, bool wait);
// Both, blocking until the child ends (tests and tools).
Result<UnpackStats> unpack_layer_confined(const std::string& blob, const std::string& dir,
                                          oci::Compression c, const UnpackLimits& limits = {});

}  // namespace weft::image
