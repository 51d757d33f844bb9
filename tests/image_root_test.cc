// Image layers unpacked for real (root: the unpack is chrooted, whiteouts are device
// nodes and trusted.* attributes, and the result is mounted as an overlayfs): layers
// assembled here with libarchive, the hostile ones included. Nothing may land outside a
// layer's directory; OCI whiteouts hide what lower layers hold once stacked.
#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "agent/image/layer.h"
#include "agent/image/store.h"
#include "common/fs.h"
#include "common/strings.h"
#include "tests/agent_harness.h"
#include "tests/oci_test_image.h"

namespace weft::image {
namespace {

using testing::Entry;
using testing::make_layer;

class Layers : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = testing::root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    dir_ = std::filesystem::temp_directory_path() / ("weft-layers-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_ + "/outside").ok());
    auto s = BlobStore::open(dir_ + "/store");
    ASSERT_TRUE(s.ok()) << s.error().str();
    store_ = std::move(s).value();
  }
  void TearDown() override {
    if (!mnt_.empty()) ::umount2(mnt_.c_str(), MNT_DETACH);
    if (!dir_.empty()) (void)remove_tree(dir_);
  }
  // Stores the layer as a verified blob and unpacks it through the store.
  Result<std::string> add(const std::vector<Entry>& entries,
                          oci::Compression c = oci::Compression::kGzip,
                          const UnpackLimits& limits = {}) {
    std::string blob = make_layer(entries, c);
    oci::Digest d = oci::digest_of(blob);
    TRY(store_->put(d, blob));
    return store_->unpack(d, c, limits);
  }
  std::string dir_, mnt_;
  std::unique_ptr<BlobStore> store_;
};

TEST_F(Layers, FilesDirectoriesLinksAndModesAreKept) {
  auto layer = add({{"./bin", 'd', "", 0755},
                    {"./bin/busybox", 'f', "#!/bin/sh\necho hi\n", 04755, 0},
                    {"./bin/sh", 'l', "/bin/busybox"},
                    {"./bin/hard", 'h', "bin/busybox"},
                    {"./home/app/data", 'f', "owned", 0600, 1234},
                    {"./run/pipe", 'p', "", 0600},
                    {"./dev/null", 'c', "", 0666}});
  ASSERT_TRUE(layer.ok()) << layer.error().str();
  struct stat st {};
  ASSERT_EQ(::lstat((*layer + "/bin/busybox").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u) << "setuid is kept (the overlay is nosuid)";
  ino_t ino = st.st_ino;
  ASSERT_EQ(::lstat((*layer + "/bin/hard").c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, ino);
  char target[64] = {};
  ASSERT_GT(::readlink((*layer + "/bin/sh").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "/bin/busybox") << "an absolute symlink is kept: it resolves in the task";
  ASSERT_EQ(::lstat((*layer + "/home/app/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(read_file(*layer + "/home/app/data").value_or(""), "owned");
  ASSERT_EQ(::lstat((*layer + "/run/pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(path_exists(*layer + "/dev/null")) << "device nodes are not made";
  // Unpacked once: asked again, the same directory, nothing unpacked twice.
  auto layers = list_dir(dir_ + "/store/layers/sha256");
  ASSERT_TRUE(layers.ok());
  ASSERT_EQ(layers->size(), 1u);
  oci::Digest d = *oci::parse_digest("sha256:" + layers->front());
  auto again = store_->unpack(d, oci::Compression::kGzip);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *layer);
}

TEST_F(Layers, ZstdAndPlainTarLayers) {
  auto z = add({{"etc/os-release", 'f', "ID=test\n"}}, oci::Compression::kZstd);
  ASSERT_TRUE(z.ok()) << z.error().str();
  EXPECT_EQ(read_file(*z + "/etc/os-release").value_or(""), "ID=test\n");
  auto t = add({{"etc/hostname", 'f', "h\n"}}, oci::Compression::kNone);
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(read_file(*t + "/etc/hostname").value_or(""), "h\n");
  // A gzip layer declared as zstd is not a layer.
  std::string gz = make_layer({{"x", 'f', "y"}}, oci::Compression::kGzip);
  oci::Digest d = oci::digest_of(gz);
  ASSERT_TRUE(store_->put(d, gz).ok());
  EXPECT_FALSE(store_->unpack(d, oci::Compression::kZstd).ok());
  EXPECT_FALSE(store_->has_layer(d));
}

// A package (no media type): the compression is told by the first bytes.
TEST_F(Layers, APackagesCompressionIsToldByItsBytes) {
  int i = 0;
  for (auto c : {oci::Compression::kGzip, oci::Compression::kZstd, oci::Compression::kNone}) {
    std::string name = "f" + std::to_string(i++);
    std::string blob = make_layer({{name, 'f', "packaged\n"}}, c);
    oci::Digest d = oci::digest_of(blob);
    ASSERT_TRUE(store_->put(d, blob).ok());
    auto dir = store_->unpack(d, oci::Compression::kAny);
    ASSERT_TRUE(dir.ok()) << name << ": " << dir.error().str();
    EXPECT_EQ(read_file(*dir + "/" + name).value_or(""), "packaged\n");
  }
  // Bytes that are no tar in any of them: refused, nothing unpacked.
  std::string junk = "\x1f\x8b not really gzip";
  oci::Digest d = oci::digest_of(junk);
  ASSERT_TRUE(store_->put(d, junk).ok());
  EXPECT_FALSE(store_->unpack(d, oci::Compression::kAny).ok());
  EXPECT_FALSE(store_->has_layer(d));
}

TEST_F(Layers, EscapesAreRefusedAndNothingLandsOutside) {
  std::string outside = dir_ + "/outside";
  struct Case {
    const char* what;
    std::vector<Entry> entries;
  };
  std::vector<Case> cases = {
      {"dot-dot", {{"../../../../" + outside.substr(1) + "/dotdot", 'f', "x"}}},
      {"dot-dot inside", {{"a/../../outside/inner", 'f', "x"}}},
      {"absolute", {{outside + "/absolute", 'f', "x"}}},
      {"through a symlink", {{"link", 'l', outside}, {"link/through", 'f', "x"}}},
      {"through a relative symlink", {{"up", 'l', "../../.."}, {"up/rel", 'f', "x"}}},
      {"hard link out", {{"hl", 'h', "../../../../etc/passwd"}}},
      {"whiteout through a symlink", {{"wl", 'l', outside}, {"wl/.wh.victim", 'f', ""}}},
  };
  ASSERT_TRUE(write_file(outside + "/victim", "still here").ok());
  for (const auto& c : cases) {
    auto r = add(c.entries);
    EXPECT_FALSE(r.ok()) << c.what << ": accepted";
    if (!r.ok()) {
      EXPECT_NE(r.error().str().find("layer"), std::string::npos) << r.error().str();
    }
  }
  auto names = list_dir(outside);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"victim"}) << "something was written outside";
  EXPECT_EQ(read_file(outside + "/victim").value_or(""), "still here");
  EXPECT_TRUE(list_dir(dir_ + "/store/tmp")->empty()) << "a refused layer left its directory";
  EXPECT_TRUE(list_dir(dir_ + "/store/layers/sha256")->empty());
}

TEST_F(Layers, ADecompressionBombStopsAtTheLimit) {
  std::string big(4 << 20, '\0');
  UnpackLimits small;
  small.max_bytes = 1 << 20;
  auto r = add({{"zeros", 'f', big}}, oci::Compression::kGzip, small);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("larger than"), std::string::npos) << r.error().str();
  UnpackLimits few;
  few.max_entries = 3;
  auto many = add({{"a", 'f', ""}, {"b", 'f', ""}, {"c", 'f', ""}, {"d", 'f', ""}},
                  oci::Compression::kGzip, few);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.error().str().find("entries"), std::string::npos) << many.error().str();
}

// A layer a few KB compressed that unpacks to more than the disk holds (issue 32: it
// was recorded as complete, its tail reading zeros, and the disk stayed full). The
// unpack stops at ENOSPC, or before it when the reserve would be taken, and removes
// what it wrote; a layer that fits still unpacks above the reserve.
TEST_F(Layers, AFullDiskStopsTheUnpackAndLeavesNothing) {
  mnt_ = dir_ + "/small";
  ASSERT_TRUE(mkdir_p(mnt_).ok());
  ASSERT_EQ(::mount("tmpfs", mnt_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=16m"), 0)
      << strerror(errno);
  auto s = BlobStore::open(mnt_ + "/store");
  ASSERT_TRUE(s.ok()) << s.error().str();
  std::unique_ptr<BlobStore> small = std::move(s).value();
  auto unpack = [&](const std::vector<Entry>& entries, uint64_t reserve) {
    std::string blob = make_layer(entries, oci::Compression::kGzip);
    oci::Digest d = oci::digest_of(blob);
    EXPECT_TRUE(small->put(d, blob).ok());
    UnpackLimits limits;
    limits.reserve_bytes = reserve;
    auto r = small->unpack(d, oci::Compression::kGzip, limits);
    (void)small->remove_blob(d);
    return r;
  };
  auto free_bytes = [&] {
    struct statvfs sv {};
    EXPECT_EQ(::statvfs(mnt_.c_str(), &sv), 0);
    return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  };
  uint64_t before = free_bytes();
  std::string filler(40u << 20, 'x');  // compresses to about 40 KB
  // No reserve: the disk fills, the write fails, and that is an error, not zeros.
  auto full = unpack({{"a", 'f', "first"}, {"bomb", 'f', filler}}, 0);
  ASSERT_FALSE(full.ok()) << "a layer bigger than the disk was unpacked";
  EXPECT_EQ(full.error().errnum, ENOSPC) << full.error().str();
  EXPECT_TRUE(list_dir(mnt_ + "/store/tmp")->empty()) << "the partial layer stayed";
  EXPECT_TRUE(list_dir(mnt_ + "/store/layers/sha256")->empty());
  EXPECT_GE(free_bytes() + (64u << 10), before) << "the space came back";
  // With a reserve: refused before the reserve is touched, the reason named.
  auto reserved = unpack({{"ten", 'f', std::string(10u << 20, 'y')}}, 8u << 20);
  ASSERT_FALSE(reserved.ok());
  EXPECT_EQ(reserved.error().errnum, ENOSPC);
  EXPECT_NE(reserved.error().str().find("reserve"), std::string::npos) << reserved.error().str();
  EXPECT_TRUE(list_dir(mnt_ + "/store/tmp")->empty());
  // What fits above the reserve unpacks.
  auto fits = unpack({{"two", 'f', std::string(2u << 20, 'z')}}, 8u << 20);
  ASSERT_TRUE(fits.ok()) << fits.error().str();
  EXPECT_EQ(read_file(*fits + "/two").value_or("").size(), 2u << 20);
}

TEST_F(Layers, WhiteoutsHideLowerLayersUnderOverlayfs) {
  auto lower = add({{"a/x", 'f', "x"}, {"a/y", 'f', "y"}, {"b/z", 'f', "z"}, {"c", 'f', "c"}});
  ASSERT_TRUE(lower.ok()) << lower.error().str();
  auto upper = add({{"a/.wh.x", 'f', ""},
                    {"b/.wh..wh..opq", 'f', ""},
                    {"b/new", 'f', "new"},
                    {".wh.c", 'f', ""}});
  ASSERT_TRUE(upper.ok()) << upper.error().str();
  struct stat st {};
  ASSERT_EQ(::lstat((*upper + "/a/x").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) << "an overlay whiteout";
  mnt_ = dir_ + "/mnt";
  ASSERT_TRUE(mkdir_p(mnt_).ok());
  std::string opts = "lowerdir=" + *upper + ":" + *lower;
  ASSERT_EQ(
      ::mount("overlay", mnt_.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts.c_str()),
      0)
      << strerror(errno);
  EXPECT_FALSE(path_exists(mnt_ + "/a/x")) << "whited out";
  EXPECT_EQ(read_file(mnt_ + "/a/y").value_or(""), "y");
  EXPECT_FALSE(path_exists(mnt_ + "/b/z")) << "the opaque directory hides the lower one";
  EXPECT_EQ(read_file(mnt_ + "/b/new").value_or(""), "new");
  EXPECT_FALSE(path_exists(mnt_ + "/c"));
  ASSERT_EQ(::umount2(mnt_.c_str(), 0), 0);
  mnt_.clear();
}

}  // namespace
}  // namespace weft::image
