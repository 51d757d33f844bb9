#include "common/store.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-store-" + random_hex(6));
    ASSERT_TRUE(mkdir_p(dir_).ok());
  }
  void TearDown() override { (void)remove_tree(dir_); }
  std::string dir_;
};

// A database that cannot grow (sqlite's SQLITE_FULL, here by max_page_count as a full
// disk gives it) keeps ENOSPC: callers tell a full disk from other failures.
TEST_F(StoreTest, AFullDatabaseSaysNoSpace) {
  auto db = Db::open(dir_ + "/s.db");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->exec("CREATE TABLE t (b BLOB)").ok());
  ASSERT_TRUE((*db)->exec("PRAGMA max_page_count = 8").ok());
  Status full = (*db)->exec("INSERT INTO t VALUES (zeroblob(1000000))");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().errnum, ENOSPC) << full.error().str();
  auto st = (*db)->prepare("INSERT INTO t VALUES (zeroblob(1000000))");
  ASSERT_TRUE(st.ok());
  Status step = st->run();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.error().errnum, ENOSPC) << step.error().str();
  EXPECT_NE(step.error().str().find("No space left on device"), std::string::npos);
}

TEST_F(StoreTest, MigratesInOrderAndResumes) {
  std::vector<std::string> v1 = {"CREATE TABLE t (a INTEGER);"};
  {
    auto db = Db::open(dir_ + "/s.db");
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->migrate(v1).ok());
    EXPECT_EQ(*(*db)->schema_version(), 1);
    ASSERT_TRUE((*db)->exec("INSERT INTO t VALUES (5)").ok());
  }
  auto v2 = v1;
  v2.push_back("ALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x';");
  auto db = Db::open(dir_ + "/s.db");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->migrate(v2).ok());
  EXPECT_EQ(*(*db)->schema_version(), 2);
  auto st = (*db)->prepare("SELECT a, b FROM t");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->step());
  EXPECT_EQ(st->col_int(0), 5);
  EXPECT_EQ(st->col_text(1), "x");
  // Older code must refuse a newer schema.
  EXPECT_FALSE((*db)->migrate(v1).ok());
}

TEST_F(StoreTest, FailedMigrationRollsBack) {
  auto db = Db::open(dir_ + "/s.db");
  ASSERT_TRUE(db.ok());
  auto s = (*db)->migrate({"CREATE TABLE t (a INTEGER); CREATE TABLE t (b INTEGER);"});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(*(*db)->schema_version(), 0);
  EXPECT_TRUE((*db)->exec("CREATE TABLE t (a INTEGER)").ok());  // first statement rolled back
}

}  // namespace
}  // namespace weft
