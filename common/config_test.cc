#include "common/config.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(TomlDoc, UnknownKeyNamesFileAndLine) {
  auto doc = TomlDoc::parse("socket = \"/x\"\n\nsockte = \"/y\"\n", "agent.toml");
  ASSERT_TRUE(doc.ok());
  auto s = doc->only_keys(doc->root(), "", {"socket"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().field, "agent.toml:3");
  EXPECT_NE(s.error().message.find("sockte"), std::string::npos);
}

TEST(TomlDoc, SyntaxErrorHasLine) {
  auto doc = TomlDoc::parse("a = 1\nb = = 2\n", "f.toml");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.error().field.rfind("f.toml:2:", 0), 0u) << doc.error().field;
}

TEST(TomlDoc, TypedGetters) {
  auto doc = TomlDoc::parse("n = 3\nb = true\ns = 4\n[labels]\ndc = \"ash\"\nrack = 7\n", "f.toml");
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(**doc->get_int(doc->root(), "n"), 3);
  EXPECT_TRUE(**doc->get_bool(doc->root(), "b"));
  EXPECT_FALSE(doc->get_string(doc->root(), "s").ok());
  EXPECT_FALSE(doc->get_string(doc->root(), "missing")->has_value());
  auto labels = doc->get_string_map(doc->root(), "labels");
  ASSERT_FALSE(labels.ok());  // rack is not a string
  EXPECT_EQ(labels.error().field, "f.toml:6");
}

}  // namespace
}  // namespace weft
