// The content store: a blob enters blobs/ only with the bytes its digest names (and its
// size), a download resumes where an earlier run stopped, and a crash leaves nothing
// half-made that could be used.
#include "agent/image/store.h"
#include "common/strings.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace weft::image {
namespace {

class Store : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-store-" + random_hex(5));
    auto s = BlobStore::open(dir_);
    ASSERT_TRUE(s.ok()) << s.error().str();
    store_ = std::move(s).value();
  }
  void TearDown() override { (void)remove_tree(dir_); }
  std::string dir_;
  std::unique_ptr<BlobStore> store_;
};

TEST_F(Store, ABlobIsStoredOnlyWithTheBytesItsDigestNames) {
  std::string bytes(200'000, 'x');
  oci::Digest d = oci::digest_of(bytes);
  auto in = store_->ingest(d, static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(in.ok()) << in.error().str();
  ASSERT_TRUE((*in)->append(bytes.data(), 1000).ok());
  ASSERT_TRUE((*in)->append(bytes.data() + 1000, bytes.size() - 1000).ok());
  EXPECT_FALSE(store_->has_blob(d)) << "visible before it was verified";
  ASSERT_TRUE((*in)->commit().ok());
  EXPECT_TRUE(store_->has_blob(d));
  auto back = store_->read(d, 1 << 20);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, bytes);

  // The same size, other bytes: refused, and nothing of it stays.
  std::string other(200'000, 'y');
  oci::Digest want = oci::digest_of(std::string(200'000, 'z'));
  auto bad = store_->ingest(want, static_cast<int64_t>(other.size()));
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE((*bad)->append(other.data(), other.size()).ok());
  auto refused = (*bad)->commit();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().str().find("hash to " + oci::digest_of(other).str()), std::string::npos)
      << refused.error().str();
  EXPECT_FALSE(store_->has_blob(want));
  EXPECT_TRUE(list_dir(dir_ + "/partial")->empty());

  // More bytes than the descriptor says: refused as they arrive.
  auto big = store_->ingest(want, 10);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE((*big)->append(other.data(), 11).ok());
  // Fewer: refused at commit.
  auto small = store_->ingest(oci::digest_of("abc"), 4);
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE((*small)->append("abc", 3).ok());
  EXPECT_FALSE((*small)->commit().ok());
}

TEST_F(Store, ADownloadResumesWhereTheLastRunStopped) {
  std::string bytes;
  for (int i = 0; i < 100'000; ++i) bytes += static_cast<char>('a' + i % 26);
  oci::Digest d = oci::digest_of(bytes);
  {
    auto first = store_->ingest(d, static_cast<int64_t>(bytes.size()));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->append(bytes.data(), 40'000).ok());
    // The agent dies here: the Ingest is dropped without commit.
  }
  auto again = store_->ingest(d, static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->offset(), 40'000u);
  ASSERT_TRUE((*again)->append(bytes.data() + 40'000, bytes.size() - 40'000).ok());
  ASSERT_TRUE((*again)->commit().ok());
  EXPECT_TRUE(store_->has_blob(d));

  // A partial file whose bytes are wrong (a server that changed the blob under a
  // resumed download) fails verification and is gone: the next try starts at 0.
  std::string b2(50'000, 'q');
  oci::Digest d2 = oci::digest_of(b2);
  ASSERT_TRUE(write_file(dir_ + "/partial/sha256-" + d2.hex, std::string(100, 'Z')).ok());
  auto resumed = store_->ingest(d2, static_cast<int64_t>(b2.size()));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ((*resumed)->offset(), 100u);
  ASSERT_TRUE((*resumed)->append(b2.data() + 100, b2.size() - 100).ok());
  EXPECT_FALSE((*resumed)->commit().ok());
  auto fresh = store_->ingest(d2, static_cast<int64_t>(b2.size()));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->offset(), 0u);

  // put() checks what it is given.
  EXPECT_FALSE(store_->put(oci::digest_of("one"), "two").ok());
  EXPECT_TRUE(store_->put(oci::digest_of("one"), "one").ok());
}

TEST_F(Store, UnpacksInterruptedByACrashAreRemovedAtOpen) {
  ASSERT_TRUE(mkdir_p(dir_ + "/tmp/deadbeef-1234/usr/bin").ok());
  ASSERT_TRUE(write_file(dir_ + "/tmp/deadbeef-1234/usr/bin/half", "x").ok());
  auto reopened = BlobStore::open(dir_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_TRUE(list_dir(dir_ + "/tmp")->empty());
  EXPECT_FALSE(store_->unpack(oci::digest_of("absent"), oci::Compression::kGzip).ok());
}

}  // namespace
}  // namespace weft::image
