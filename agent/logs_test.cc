#include "agent/logs.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

class LogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-logs-" + random_hex(6));
    ASSERT_TRUE(mkdir_p(dir_).ok());
  }
  void TearDown() override { (void)remove_tree(dir_); }
  void put(unsigned seq, const std::string& data) {
    char name[64];
    snprintf(name, sizeof name, "stdout.%08u.log", seq);
    ASSERT_TRUE(write_file(dir_ + "/" + name, data).ok());
  }
  std::string dir_;
};

TEST_F(LogsTest, ReadsAcrossFilesWithCursor) {
  put(3, "aa\nbb\n");
  put(4, "cc\n");
  auto all = read_log(dir_, "stdout", std::nullopt, 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->data, "aa\nbb\ncc\n");
  EXPECT_EQ(all->next.seq, 4u);
  EXPECT_EQ(all->next.offset, 3u);
  auto none = read_log(dir_, "stdout", all->next, 1000);
  EXPECT_EQ(none->data, "");
  put(4, "cc\ndd\n");
  put(5, "ee\n");
  auto more = read_log(dir_, "stdout", all->next, 1000);
  EXPECT_EQ(more->data, "dd\nee\n");
  auto small = read_log(dir_, "stdout", std::nullopt, 4);
  EXPECT_EQ(small->data, "aa\nb");
}

TEST_F(LogsTest, RotatedAwayCursorSkips) {
  put(7, "new\n");
  auto r = read_log(dir_, "stdout", LogCursor{2, 10}, 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data, "new\n");
  EXPECT_GT(r->skipped, 0u);
}

TEST_F(LogsTest, Tail) {
  put(1, "l1\nl2\n");
  put(2, "l3\nl4\n");
  auto t = read_log(dir_, "stdout", std::nullopt, 1000, 3);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data, "l2\nl3\nl4\n");
  auto t1 = read_log(dir_, "stdout", std::nullopt, 1000, 1);
  EXPECT_EQ(t1->data, "l4\n");
}

TEST_F(LogsTest, StatsCountDropped) {
  put(1, "12345");
  put(2, "678");
  ASSERT_TRUE(write_file(dir_ + "/stdout.dropped", "4096\n").ok());
  auto s = log_stats(dir_, "stdout");
  EXPECT_EQ(s.files, 2u);
  EXPECT_EQ(s.bytes, 8u);
  EXPECT_EQ(s.dropped, 4096u);
}

}  // namespace
}  // namespace weft::agent
