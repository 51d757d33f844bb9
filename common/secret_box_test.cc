// Secret values at rest: sealed with the first key, opened with any key of the file,
// bound to their job and field, and refused when the key is not there.
#include "common/secret_box.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft {
namespace {

using json = nlohmann::json;

const std::string kOld = "k1 " + std::string(64, 'a') + "\n";
const std::string kNew = "k2 " + std::string(64, 'b') + "\n";

json job() {
  return {{"name", "web"},
          {"entitlement", "a"},
          {"task",
           {{"argv", {"/bin/true"}},
            {"env", {{"DB_PASSWORD", "hunter2"}, {"EMPTY", ""}}},
            {"files", {{{"path", "/run/secret"}, {"content", "s3cret\n"}}}}}}};
}

TEST(SecretBox, SealsEnvAndFilesAndOpensThemBack) {
  auto box = SecretBox::parse(kOld, "secrets.key");
  ASSERT_TRUE(box.ok()) << box.error().str();
  json sealed = seal_job_secrets(job(), **box);
  std::string text = sealed.dump();
  EXPECT_EQ(text.find("hunter2"), std::string::npos) << text;
  EXPECT_EQ(text.find("s3cret"), std::string::npos) << text;
  EXPECT_TRUE(SecretBox::is_sealed(sealed["task"]["env"]["DB_PASSWORD"].get<std::string>()));
  EXPECT_EQ(sealed["task"]["argv"], job()["task"]["argv"]) << "only secret values are sealed";
  EXPECT_TRUE(job_secrets_current(sealed, **box));
  // Two seals of one value differ (a fresh nonce each time).
  EXPECT_NE(seal_job_secrets(job(), **box), sealed);
  auto opened = open_job_secrets(sealed, box->get());
  ASSERT_TRUE(opened.ok()) << opened.error().str();
  EXPECT_EQ(*opened, job());
  // Unsealed rows (written before a key was configured) open as they are.
  EXPECT_EQ(*open_job_secrets(job(), box->get()), job());
  // Rotation: a new key first seals; the old one still opens what it sealed.
  auto rotated = SecretBox::parse(kNew + kOld, "secrets.key");
  ASSERT_TRUE(rotated.ok());
  EXPECT_FALSE(job_secrets_current(sealed, **rotated));
  EXPECT_EQ(*open_job_secrets(sealed, rotated->get()), job());
  json resealed = seal_job_secrets(*open_job_secrets(sealed, rotated->get()), **rotated);
  EXPECT_TRUE(job_secrets_current(resealed, **rotated));
}

TEST(SecretBox, AValueDoesNotOpenElsewhereOrWithoutItsKey) {
  auto box = SecretBox::parse(kOld, "secrets.key");
  ASSERT_TRUE(box.ok());
  json sealed = seal_job_secrets(job(), **box);
  // Moved to another job, or to another field: refused.
  json moved = sealed;
  moved["name"] = "other";
  EXPECT_FALSE(open_job_secrets(moved, box->get()).ok());
  json swapped = sealed;
  swapped["task"]["env"]["EMPTY"] = sealed["task"]["env"]["DB_PASSWORD"];
  auto e = open_job_secrets(swapped, box->get());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().str().find("web/task.env.EMPTY"), std::string::npos) << e.error().str();
  EXPECT_EQ(e.error().str().find("hunter2"), std::string::npos);
  // Altered: refused.
  json altered = sealed;
  std::string v = altered["task"]["env"]["DB_PASSWORD"];
  v[v.size() - 3] = v[v.size() - 3] == 'A' ? 'B' : 'A';
  altered["task"]["env"]["DB_PASSWORD"] = v;
  EXPECT_FALSE(open_job_secrets(altered, box->get()).ok());
  // Another key file, or none: refused with the key's id.
  auto other = SecretBox::parse(kNew, "secrets.key");
  auto wrong = open_job_secrets(sealed, other->get());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().str().find("'k1'"), std::string::npos) << wrong.error().str();
  EXPECT_FALSE(open_job_secrets(sealed, nullptr).ok());
}

TEST(SecretBox, KeyFilesAreCheckedLineByLine) {
  for (const auto& [text, where] : std::vector<std::pair<std::string, std::string>>{
           {"", "secrets.key"},
           {"# only a comment\n", "secrets.key"},
           {"k1 abc\n", "secrets.key:1"},
           {"\nk1 " + std::string(64, 'g') + "\n", "secrets.key:2"},
           {"bad/id " + std::string(64, 'a') + "\n", "secrets.key:1"},
           {kOld + kOld, "secrets.key:2"}}) {
    auto r = SecretBox::parse(text, "secrets.key");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().field, where) << r.error().str();
  }
  std::string dir = std::filesystem::temp_directory_path() / ("weft-secrets-" + random_hex(4));
  ASSERT_TRUE(mkdir_p(dir).ok());
  ASSERT_TRUE(write_file_atomic(dir + "/open.key", kOld, 0644).ok());
  EXPECT_FALSE(SecretBox::load(dir + "/open.key").ok()) << "a key every user may read";
  ASSERT_TRUE(write_file_atomic(dir + "/ok.key", kOld, 0600).ok());
  EXPECT_TRUE(SecretBox::load(dir + "/ok.key").ok());
  (void)remove_tree(dir);
}

}  // namespace
}  // namespace weft
