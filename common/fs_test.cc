#include "common/fs.h"
#include "common/base64.h"
#include "common/strings.h"
#include "common/units.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <filesystem>
#include <limits>

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
// Finding 6: mkdir_p creates what is missing and leaves what exists as it is (a socket
// under /tmp once stripped /tmp's sticky bit).
TEST(Fs, MkdirPLeavesExistingDirectoriesAlone) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-fs-" + random_hex(5));
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);
  ASSERT_TRUE(mkdir_p(dir + "/a/b", 0750).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  ASSERT_EQ(::stat((dir + "/a/b").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_TRUE(write_file(dir + "/f", "x").ok());
  EXPECT_FALSE(mkdir_p(dir + "/f/g").ok());  // a file in the way is an error
  EXPECT_TRUE(mkdir_p(dir + "/a/b").ok());   // again: nothing to do
  (void)remove_tree(dir);
}

// Finding 13: input files are read bounded; a device or a huge file is refused.
TEST(Fs, ReadFileBoundedRefusesDevicesAndHugeFiles) {
  EXPECT_FALSE(read_file_bounded("/dev/zero", 1 << 20).ok());
  std::string dir = std::filesystem::temp_directory_path() / ("weft-fs-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  ASSERT_TRUE(write_file(dir + "/big", std::string(5000, 'x')).ok());
  EXPECT_FALSE(read_file_bounded(dir + "/big", 4096).ok());
  auto ok = read_file_bounded(dir + "/big", 5000);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 5000u);
  (void)remove_tree(dir);
}

TEST(Fs, DurationsAreCapped) {
  EXPECT_FALSE(parse_duration_us("1e300h").ok());
  EXPECT_FALSE(parse_duration_us("200000000h").ok());
  EXPECT_TRUE(parse_duration_us("87600h").ok());
  EXPECT_FALSE(seconds_to_us(-1).ok());
  EXPECT_FALSE(seconds_to_us(1e300).ok());
  EXPECT_FALSE(seconds_to_us(std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_EQ(*seconds_to_us(1.5), 1'500'000u);
}

}  // namespace weft

namespace weft {
namespace {

TEST(Base64, RoundTripsAndRefusesGarbage) {
  EXPECT_EQ(base64_encode("user:pa ss"), "dXNlcjpwYSBzcw==");
  EXPECT_EQ(base64_encode(""), "");
  for (std::string s : {std::string(""), std::string("a"), std::string("ab"), std::string("abc"),
                        std::string("\0\xff\x10", 3)}) {
    auto back = base64_decode(base64_encode(s));
    ASSERT_TRUE(back.ok()) << back.error().str();
    EXPECT_EQ(*back, s);
  }
  EXPECT_FALSE(base64_decode("abc").ok());   // not a multiple of 4
  EXPECT_FALSE(base64_decode("ab!=").ok());  // outside the alphabet
  // Hostile input: white space, padding inside, bits after the data, too much padding.
  EXPECT_EQ(base64_decode("QQ==").value_or("?"), "A");
  for (std::string bad :
       {std::string(" QQ="), std::string("QQ=\n"), std::string("Q=Q="), std::string("QR=="),
        std::string("Q==="), std::string("===="), std::string("QUJD\0QUJ", 8)})
    EXPECT_FALSE(base64_decode(bad).ok()) << bad;
}

}  // namespace
}  // namespace weft
