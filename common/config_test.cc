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

// A line of dotted keys once overflowed the stack in toml++ (fuzz_job found it).
TEST(TomlDoc, DeeplyDottedKeysAreRefusedBeforeParsing) {
  std::string deep;
  for (int i = 0; i < 200000; ++i) deep += i ? ".a" : "a";
  auto r = TomlDoc::parse("x = 1\n" + deep + " = 1\n", "job.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("job.toml:2"), std::string::npos) << r.error().str();
  auto header = TomlDoc::parse("[" + deep + "]\n", "p.toml");
  EXPECT_FALSE(header.ok());
  // Dots in strings, comments and multi-line strings are not keys.
  std::string many(200, '.');
  auto fine = TomlDoc::parse("a = \"" + many + "\" # " + many + "\nb = \"\"\"\n" + many +
                                 "\n\"\"\"\nc = '" + many + "'\nd.e.f = 1.5\n",
                             "ok.toml");
  EXPECT_TRUE(fine.ok()) << fine.error().str();
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
