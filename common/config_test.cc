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

// Non-ASCII characters where toml++ 3.3.0 looks for whitespace used to reach its
// __builtin_unreachable() (common/toml.h): now an error like any other. Under the
// sanitizer build (-fno-sanitize-recover) the old behaviour fails this test.
TEST(TomlDoc, NonAsciiWhereWhitespaceMayBeIsAnErrorNotUndefinedBehaviour) {
  // U+00A1, U+2C60, U+3001, U+FB30, U+FEFE (UTF-8): in the blocks of U+00A0, U+3000 and
  // U+FEFF.
  for (const char* c :
       {"\xc2\xa1", "\xe2\xb1\xa0", "\xe3\x80\x81", "\xef\xac\xb0", "\xef\xbb\xbe"}) {
    std::string ch = c;
    for (const std::string& text :
         {"a = 1 " + ch + "\n", ch + " = 1\n", "a = [1," + ch + "2]\n", "[t]" + ch + "\nb = 2\n"}) {
      auto doc = TomlDoc::parse(text, "f.toml");
      ASSERT_FALSE(doc.ok()) << c << " in " << text;
      EXPECT_EQ(doc.error().field.rfind("f.toml:1", 0), 0u) << doc.error().str();
    }
  }
  // Its real whitespace (U+00A0, U+3000, U+FEFF) is still whitespace to it... or not
  // (TOML allows only tab and space): either way an answer, never a crash.
  for (const char* c : {"\xc2\xa0", "\xe3\x80\x80", "\xef\xbb\xbf"}) {
    std::string ch = c;
    (void)TomlDoc::parse("a = 1" + ch + "\n", "f.toml");
  }
  // Inside strings and comments they are plain characters.
  auto fine = TomlDoc::parse("a = \"\xc2\xa1\xe3\x80\x81\" # \xc2\xa1\n", "f.toml");
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
