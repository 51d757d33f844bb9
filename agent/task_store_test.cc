// The agent's task records survive a reopen, field for field; a record another version
// wrote that no longer parses comes back as a failed task with the reason.
#include "agent/task_store.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

// A directory of the test's own, removed with it.
struct StoreDir {
  std::string path = std::filesystem::temp_directory_path() / ("weft-ts-" + random_hex(5));
  StoreDir() { EXPECT_TRUE(mkdir_p(path).ok()); }
  ~StoreDir() { (void)remove_tree(path); }
};

TEST(TaskStore, RecordsSurviveAReopen) {
  StoreDir tmp;
  const std::string& dir = tmp.path;
  {
    auto st = TaskStore::open(dir + "/agent.db");
    ASSERT_TRUE(st.ok()) << st.error().str();
    TaskRecord t;
    t.id = "ab12";
    t.name = "web";
    auto spec = parse_task_spec({{"name", "web"}, {"argv", {"/bin/true"}}});
    ASSERT_TRUE(spec.ok());
    t.spec = *spec;
    t.state = TaskState::kBackoff;
    t.exit_code = 3;
    t.restarts = 2;
    t.reason = "exit status 3";
    t.warnings = {"no cpu controller"};
    ASSERT_TRUE((*st)->save(t).ok());
    TaskRecord gone = t;
    gone.id = "cd34";
    ASSERT_TRUE((*st)->save(gone).ok());
    ASSERT_TRUE((*st)->erase("cd34").ok());
  }
  auto st = TaskStore::open(dir + "/agent.db");
  ASSERT_TRUE(st.ok());
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok()) << rows.error().str();
  ASSERT_EQ(rows->size(), 1u);
  const TaskRecord& r = (*rows)[0];
  EXPECT_EQ(r.id, "ab12");
  EXPECT_EQ(r.state, TaskState::kBackoff);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(r.reason, "exit status 3");
  EXPECT_EQ(r.spec.argv, std::vector<std::string>{"/bin/true"});
  EXPECT_EQ(r.warnings, std::vector<std::string>{"no cpu controller"});

  // A row whose spec today's validator refuses, and one with a state no version knows.
  {
    auto db = Db::open(dir + "/agent.db");
    ASSERT_TRUE(db.ok());
    for (const char* sql :
         {"INSERT INTO tasks (id, name, spec, state, created_us) VALUES ('old1', 'x', "
          "'{\"name\":\"x\",\"argv\":[]}', 'running', 1)",
          "INSERT INTO tasks (id, name, spec, state, created_us) VALUES ('old2', 'y', "
          "'{\"name\":\"y\",\"argv\":[\"/bin/true\"]}', 'zombie', 1)"}) {
      auto s = (*db)->prepare(sql);
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE(s->run().ok());
    }
  }
  rows = (*st)->load();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 3u);
  for (const auto& row : *rows) {
    if (row.id == "ab12") continue;
    EXPECT_EQ(row.state, TaskState::kFailed) << row.id;
    EXPECT_FALSE(row.reason.empty()) << row.id;
  }
}

// Issue 43: a task's secret values are sealed in agent.db with the agent's own key (made
// at the first start, 0600); a row written before sealing is sealed at the next open;
// without the key a sealed row comes back failed, with the reason, not as plain text.
TEST(TaskStore, SecretsAreSealedWithTheAgentsOwnKey) {
  StoreDir tmp;
  const std::string& dir = tmp.path;
  auto db_holds = [&](const std::string& needle) {
    std::string all;
    for (const char* f : {"/agent.db", "/agent.db-wal"}) all += read_file(dir + f).value_or("");
    return all.find(needle) != std::string::npos;
  };
  TaskRecord t;
  t.id = "ab12";
  t.name = "pay";
  auto spec = parse_task_spec({{"name", "pay"},
                               {"argv", {"/bin/true"}},
                               {"env", {{"STRIPE_KEY", "sk_live_4711"}, {"MODE", "prod"}}}});
  ASSERT_TRUE(spec.ok());
  t.spec = *spec;
  {  // Written by an agent before sealing.
    auto st = TaskStore::open(dir + "/agent.db");
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE((*st)->save(t).ok());
  }
  ASSERT_TRUE(db_holds("sk_live_4711"));
  auto box = SecretBox::load_or_create(dir + "/secrets.key");
  ASSERT_TRUE(box.ok()) << box.error().str();
  struct stat kst {};
  ASSERT_EQ(::stat((dir + "/secrets.key").c_str(), &kst), 0);
  EXPECT_EQ(kst.st_mode & 0777, 0600u);
  std::string key = read_file(dir + "/secrets.key").value_or("");
  {
    auto st = TaskStore::open(dir + "/agent.db", *box);
    ASSERT_TRUE(st.ok());
    auto rows = (*st)->load();  // opened, and sealed again on disk
    ASSERT_TRUE(rows.ok()) << rows.error().str();
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_EQ((*rows)[0].spec.env.at("STRIPE_KEY"), "sk_live_4711");
    TaskRecord again = t;
    again.id = "cd34";
    ASSERT_TRUE((*st)->save(again).ok());
  }
  {  // Checkpointed, nothing of the plain value is left in the files.
    auto db = Db::open(dir + "/agent.db");
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->exec("PRAGMA wal_checkpoint(TRUNCATE); VACUUM;").ok());
  }
  EXPECT_FALSE(db_holds("sk_live_4711"));
  EXPECT_TRUE(db_holds("weft-sealed:v1:"));
  // The same key file next time (never overwritten), and the values come back.
  auto box2 = SecretBox::load_or_create(dir + "/secrets.key");
  ASSERT_TRUE(box2.ok());
  EXPECT_EQ(read_file(dir + "/secrets.key").value_or(""), key);
  {
    auto st = TaskStore::open(dir + "/agent.db", *box2);
    ASSERT_TRUE(st.ok());
    auto rows = (*st)->load();
    ASSERT_TRUE(rows.ok());
    ASSERT_EQ(rows->size(), 2u);
    for (const auto& r : *rows) {
      EXPECT_EQ(r.spec.env.at("STRIPE_KEY"), "sk_live_4711") << r.id;
      EXPECT_EQ(r.spec.env.at("MODE"), "prod") << r.id;
    }
  }
  // Without the key: failed tasks with the reason, not plain text and not an error.
  auto st = TaskStore::open(dir + "/agent.db");
  ASSERT_TRUE(st.ok());
  auto rows = (*st)->load();
  ASSERT_TRUE(rows.ok());
  for (const auto& r : *rows) {
    EXPECT_EQ(r.state, TaskState::kFailed) << r.id;
    EXPECT_NE(r.reason.find("secrets cannot be opened"), std::string::npos) << r.reason;
  }
}

}  // namespace
}  // namespace weft::agent
