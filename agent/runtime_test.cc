#include "agent/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace weft::agent {
namespace {

TEST(InitArgv, CarriesSpec) {
  auto s = parse_task_spec({{"name", "t"},
                            {"argv", {"echo", "hi"}},
                            {"env", {{"X", "1"}}},
                            {"hostname", "box"},
                            {"namespaces", {{"network", "private"}}}});
  ASSERT_TRUE(s.ok());
  Identity id;
  auto a = build_init_argv(*s, id, 4);
  auto has = [&](const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); };
  EXPECT_TRUE(has("--proc"));
  EXPECT_TRUE(has("--lo"));
  EXPECT_TRUE(has("X=1"));
  EXPECT_TRUE(has("box"));
  EXPECT_FALSE(has("--uid"));
  auto dd = std::find(a.begin(), a.end(), "--");
  ASSERT_NE(dd, a.end());
  EXPECT_EQ(*(dd + 1), "echo");
  EXPECT_EQ(*(dd + 2), "hi");
}

TEST(Identity, ResolvesUsersAndRejectsUnknown) {
  auto root = resolve_identity("root", "");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->uid, 0);
  EXPECT_EQ(root->gid, 0);
  auto bad = resolve_identity("no-such-user-weft", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "user");
  auto badg = resolve_identity("", "no-such-group-weft");
  ASSERT_FALSE(badg.ok());
  EXPECT_EQ(badg.error().field, "group");
  auto num = resolve_identity("65534", "65534");
  ASSERT_TRUE(num.ok());
  EXPECT_EQ(num->uid, 65534);
  EXPECT_EQ(num->gid, 65534);
}

}  // namespace
}  // namespace weft::agent
