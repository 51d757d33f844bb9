// The agent's task records survive a reopen, field for field; a record another version
// wrote that no longer parses comes back as a failed task with the reason.
#include "agent/task_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

TEST(TaskStore, RecordsSurviveAReopen) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-ts-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  struct Cleanup {
    std::string dir;
    ~Cleanup() { (void)remove_tree(dir); }
  } cleanup{dir};
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

}  // namespace
}  // namespace weft::agent
