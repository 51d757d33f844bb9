// weft-test-slowfs: a slow disk for the tests (issue 61). This kernel has no device-mapper
// (no delay target) and its cgroup v2 has no io controller (no io.max), so a test gets a
// slow disk from FUSE instead: a pass-through of BACKING at MOUNTPOINT whose fsync and
// fdatasync first wait as many milliseconds as DELAY_FILE says (read at each call; no
// file or "0": no wait). Everything else goes straight to BACKING, errors (ENOSPC of a
// full backing filesystem, say) included. Run as root, in the foreground:
//
//   weft-test-slowfs BACKING MOUNTPOINT DELAY_FILE
//
// It serves until MOUNTPOINT is unmounted (or it gets SIGTERM). Test code only: it is not
// packaged.
#define FUSE_USE_VERSION 31

#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

int g_root = -1;           // BACKING, opened
std::string g_delay_file;  // DELAY_FILE

// A FUSE path ("/a/b") as a path relative to BACKING ("a/b"; "." for the root).
const char* rel(const char* path) {
  while (*path == '/') ++path;
  return *path ? path : ".";
}

int err(int rc) {
  return rc < 0 ? -errno : rc;
}

void hold_fsync() {
  FILE* f = std::fopen(g_delay_file.c_str(), "re");
  if (!f) return;
  long ms = 0;
  if (std::fscanf(f, "%ld", &ms) != 1) ms = 0;
  std::fclose(f);
  if (ms > 0 && ms <= 600'000) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void* fs_init(fuse_conn_info*, fuse_config* cfg) {
  cfg->use_ino = 1;
  // What the backing filesystem says, at once: no cached attributes or names.
  cfg->attr_timeout = 0;
  cfg->entry_timeout = 0;
  cfg->negative_timeout = 0;
  return nullptr;
}

int fs_getattr(const char* path, struct stat* st, fuse_file_info* fi) {
  if (fi) return err(::fstat(static_cast<int>(fi->fh), st));
  return err(::fstatat(g_root, rel(path), st, AT_SYMLINK_NOFOLLOW));
}

int fs_access(const char* path, int mask) {
  return err(::faccessat(g_root, rel(path), mask, 0));
}

int fs_readlink(const char* path, char* buf, size_t size) {
  ssize_t n = ::readlinkat(g_root, rel(path), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int fs_readdir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*,
               fuse_readdir_flags) {
  int fd = ::openat(g_root, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return -e;
  }
  while (dirent* e = ::readdir(d)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(e->d_type) << 12;
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0))) break;
  }
  ::closedir(d);
  return 0;
}

int fs_mknod(const char* path, mode_t mode, dev_t dev) {
  return err(::mknodat(g_root, rel(path), mode, dev));
}
int fs_mkdir(const char* path, mode_t mode) {
  return err(::mkdirat(g_root, rel(path), mode));
}
int fs_unlink(const char* path) {
  return err(::unlinkat(g_root, rel(path), 0));
}
int fs_rmdir(const char* path) {
  return err(::unlinkat(g_root, rel(path), AT_REMOVEDIR));
}
int fs_symlink(const char* to, const char* path) {
  return err(::symlinkat(to, g_root, rel(path)));
}
int fs_link(const char* from, const char* to) {
  return err(::linkat(g_root, rel(from), g_root, rel(to), 0));
}
int fs_rename(const char* from, const char* to, unsigned int flags) {
  return err(::renameat2(g_root, rel(from), g_root, rel(to), flags));
}
int fs_chmod(const char* path, mode_t mode, fuse_file_info* fi) {
  if (fi) return err(::fchmod(static_cast<int>(fi->fh), mode));
  return err(::fchmodat(g_root, rel(path), mode, 0));
}
int fs_chown(const char* path, uid_t uid, gid_t gid, fuse_file_info* fi) {
  if (fi) return err(::fchown(static_cast<int>(fi->fh), uid, gid));
  return err(::fchownat(g_root, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW));
}
int fs_truncate(const char* path, off_t size, fuse_file_info* fi) {
  if (fi) return err(::ftruncate(static_cast<int>(fi->fh), size));
  int fd = ::openat(g_root, rel(path), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = err(::ftruncate(fd, size));
  ::close(fd);
  return rc;
}
int fs_utimens(const char* path, const struct timespec tv[2], fuse_file_info* fi) {
  if (fi) return err(::futimens(static_cast<int>(fi->fh), tv));
  return err(::utimensat(g_root, rel(path), tv, AT_SYMLINK_NOFOLLOW));
}
int fs_create(const char* path, mode_t mode, fuse_file_info* fi) {
  int fd = ::openat(g_root, rel(path), fi->flags | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}
int fs_open(const char* path, fuse_file_info* fi) {
  int fd = ::openat(g_root, rel(path), fi->flags | O_CLOEXEC);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}
int fs_read(const char*, char* buf, size_t size, off_t off, fuse_file_info* fi) {
  ssize_t n = ::pread(static_cast<int>(fi->fh), buf, size, off);
  return n < 0 ? -errno : static_cast<int>(n);
}
int fs_write(const char*, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  ssize_t n = ::pwrite(static_cast<int>(fi->fh), buf, size, off);
  return n < 0 ? -errno : static_cast<int>(n);
}
int fs_statfs(const char*, struct statvfs* st) {
  return err(::fstatvfs(g_root, st));
}
int fs_flush(const char*, fuse_file_info* fi) {
  // close() of a duplicate: what a close of the file would report, the file kept open.
  int fd = ::dup(static_cast<int>(fi->fh));
  if (fd < 0) return -errno;
  return err(::close(fd));
}
int fs_release(const char*, fuse_file_info* fi) {
  ::close(static_cast<int>(fi->fh));
  return 0;
}
int fs_fsync(const char*, int datasync, fuse_file_info* fi) {
  hold_fsync();
  int fd = static_cast<int>(fi->fh);
  return err(datasync ? ::fdatasync(fd) : ::fsync(fd));
}
int fs_fallocate(const char*, int mode, off_t off, off_t len, fuse_file_info* fi) {
  return err(::fallocate(static_cast<int>(fi->fh), mode, off, len));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: weft-test-slowfs BACKING MOUNTPOINT DELAY_FILE\n");
    return 2;
  }
  g_root = ::open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (g_root < 0) {
    std::fprintf(stderr, "weft-test-slowfs: open %s: %s\n", argv[1], std::strerror(errno));
    return 1;
  }
  g_delay_file = argv[3];
  ::umask(0);  // modes as the callers ask (the kernel applied theirs)
  fuse_operations ops{};
  ops.init = fs_init;
  ops.getattr = fs_getattr;
  ops.access = fs_access;
  ops.readlink = fs_readlink;
  ops.readdir = fs_readdir;
  ops.mknod = fs_mknod;
  ops.mkdir = fs_mkdir;
  ops.unlink = fs_unlink;
  ops.rmdir = fs_rmdir;
  ops.symlink = fs_symlink;
  ops.link = fs_link;
  ops.rename = fs_rename;
  ops.chmod = fs_chmod;
  ops.chown = fs_chown;
  ops.truncate = fs_truncate;
  ops.utimens = fs_utimens;
  ops.create = fs_create;
  ops.open = fs_open;
  ops.read = fs_read;
  ops.write = fs_write;
  ops.statfs = fs_statfs;
  ops.flush = fs_flush;
  ops.release = fs_release;
  ops.fsync = fs_fsync;
  ops.fallocate = fs_fallocate;
  // Foreground, threads (a held fsync holds only its caller), every user of the mount
  // (the daemons run as root; tasks' users read what the agent hands them), and the
  // kernel's own permission checks.
  std::string mountpoint = argv[2];
  char* fargv[] = {argv[0],
                   const_cast<char*>("-f"),
                   const_cast<char*>("-o"),
                   const_cast<char*>("allow_other,default_permissions,fsname=weft-slowfs"),
                   mountpoint.data(),
                   nullptr};
  return fuse_main(5, fargv, &ops, nullptr);
}
