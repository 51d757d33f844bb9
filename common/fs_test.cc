#include "common/fs.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(ParseSize, UnitsAndErrors) {
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_EQ(*parse_size("512K"), 512u * 1024);
  EXPECT_EQ(*parse_size("256M"), 256u << 20);
  EXPECT_EQ(*parse_size("1.5G"), 3ull << 29);
  EXPECT_EQ(*parse_size("2MiB"), 2u << 20);
  EXPECT_FALSE(parse_size("").ok());
  EXPECT_FALSE(parse_size("-1M").ok());
  EXPECT_FALSE(parse_size("12Q").ok());
  EXPECT_FALSE(parse_size("1.2.3").ok());
  EXPECT_FALSE(parse_size("max").ok());
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*parse_duration_us("500ms"), 500000u);
  EXPECT_EQ(*parse_duration_us("5s"), 5000000u);
  EXPECT_EQ(*parse_duration_us("2m"), 120000000u);
  EXPECT_EQ(*parse_duration_us("10"), 10000000u);
  EXPECT_FALSE(parse_duration_us("5 parsecs").ok());
  EXPECT_FALSE(parse_duration_us("s").ok());
}

TEST(Split, KeepsEmptyFields) {
  auto v = split("a::b", ':');
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[1], "");
  EXPECT_EQ(trim("  x y \n"), "x y");
}

TEST(ErrorChain, ContextOrder) {
  Error e = errno_error(ENOENT, "open x");
  e = std::move(e).wrap("load config");
  EXPECT_EQ(e.str(), "load config: open x: No such file or directory");
}

}  // namespace
}  // namespace weft
