#include "agent/task_dirs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "common/fs.h"

namespace weft::agent {
namespace {

// A state directory, removed at the end whatever happens.
struct ScratchState {
  std::string path;
  ScratchState() {
    char tmpl[] = "/tmp/weft-task-dirs-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~ScratchState() { (void)remove_tree(path); }
};

ino_t inode(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 ? st.st_ino : 0;
}

std::vector<std::string> names(const std::string& dir) {
  auto n = list_dir(dir);
  std::vector<std::string> out = n.ok() ? *n : std::vector<std::string>{};
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TaskDirs, ARemovedTasksDirectoryIsEmptiedAndBecomesTheNextTasks) {
  ScratchState state;
  TaskDirs dirs(state.path, 4);
  ASSERT_TRUE(dirs.open().ok());
  ASSERT_TRUE(dirs.make("t1").ok());
  const std::string d = dirs.path("t1");
  EXPECT_EQ(d, state.path + "/tasks/t1");
  EXPECT_EQ(names(d), std::vector<std::string>{"logs"});
  // What a task's life leaves: output, an exit record, an image task's overlay dirs.
  ASSERT_TRUE(write_file(d + "/logs/stdout.1", "secret output\n").ok());
  ASSERT_TRUE(write_file(d + "/exit", "incarnation=1\n").ok());
  ASSERT_TRUE(mkdir_p(d + "/upper/etc").ok());
  ASSERT_TRUE(write_file(d + "/upper/etc/passwd", "x").ok());
  ino_t dir_ino = inode(d), logs_ino = inode(d + "/logs"), exit_ino = inode(d + "/exit");
  dirs.remove("t1");
  EXPECT_FALSE(path_exists(d));
  EXPECT_EQ(dirs.spares(), 1u);
  ASSERT_TRUE(dirs.make("t2").ok());
  const std::string d2 = dirs.path("t2");
  // The same directory, its logs/ and the exit record's file, with nothing of t1 in them.
  EXPECT_EQ(inode(d2), dir_ino);
  EXPECT_EQ(inode(d2 + "/logs"), logs_ino);
  EXPECT_EQ(inode(d2 + "/exit.tmp"), exit_ino);
  EXPECT_EQ(names(d2), (std::vector<std::string>{"exit.tmp", "logs"}));
  EXPECT_TRUE(names(d2 + "/logs").empty());
  EXPECT_EQ(dirs.spares(), 0u);
  // A restart's make() keeps what is there.
  ASSERT_TRUE(write_file(d2 + "/logs/stdout.1", "mine\n").ok());
  ASSERT_TRUE(dirs.make("t2").ok());
  EXPECT_EQ(read_file(d2 + "/logs/stdout.1").value_or(""), "mine\n");
}

TEST(TaskDirs, SparesAreBoundedAndTheRestDeleted) {
  ScratchState state;
  TaskDirs dirs(state.path, 2);
  ASSERT_TRUE(dirs.open().ok());
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(dirs.make(id).ok());
  for (const char* id : {"a", "b", "c"}) dirs.remove(id);
  EXPECT_EQ(dirs.spares(), 2u);
  EXPECT_EQ(names(state.path + "/spare-tasks").size(), 2u);
  EXPECT_TRUE(names(state.path + "/tasks").empty());
}

TEST(TaskDirs, TheExitRecordsFileIsKeptForTheNextOne) {
  ScratchState state;
  TaskDirs dirs(state.path, 2);
  ASSERT_TRUE(dirs.open().ok());
  ASSERT_TRUE(dirs.make("t").ok());
  ASSERT_TRUE(write_file(dirs.path("t") + "/exit", "incarnation=1\n").ok());
  ino_t ino = inode(dirs.path("t") + "/exit");
  dirs.exit_recorded("t");
  EXPECT_FALSE(path_exists(dirs.path("t") + "/exit"));
  EXPECT_EQ(inode(dirs.path("t") + "/exit.tmp"), ino);
  dirs.exit_recorded("t");  // none: nothing to do
  EXPECT_EQ(inode(dirs.path("t") + "/exit.tmp"), ino);
}

TEST(TaskDirs, OpenTakesStockOfSparesAndDropsWhatIsNotOne) {
  ScratchState state;
  {
    TaskDirs dirs(state.path, 3);
    ASSERT_TRUE(dirs.open().ok());
    for (const char* id : {"a", "b"}) ASSERT_TRUE(dirs.make(id).ok());
    for (const char* id : {"a", "b"}) dirs.remove(id);
  }
  ASSERT_TRUE(write_file(state.path + "/spare-tasks/junk", "x").ok());
  ASSERT_TRUE(mkdir_p(state.path + "/spare-tasks/s12x").ok());
  TaskDirs again(state.path, 3);
  ASSERT_TRUE(again.open().ok());
  EXPECT_EQ(again.spares(), 2u);
  EXPECT_EQ(names(state.path + "/spare-tasks").size(), 2u);
  // New spares are named after the ones there.
  ASSERT_TRUE(again.make("c").ok());
  ASSERT_TRUE(again.make("d").ok());
  ASSERT_TRUE(again.make("e").ok());  // none left: made
  for (const char* id : {"c", "d", "e"}) again.remove(id);
  EXPECT_EQ(again.spares(), 3u);
  EXPECT_EQ(names(state.path + "/spare-tasks").size(), 3u);
}

TEST(TaskDirs, EndedLogsAreKeptByNameBoundedOldestFirst) {
  ScratchState state;
  TaskDirs dirs(state.path, 0);
  ASSERT_TRUE(dirs.open().ok());
  auto end = [&](const std::string& id, const std::string& name) {
    ASSERT_TRUE(dirs.make(id).ok());
    ASSERT_TRUE(write_file(dirs.path(id) + "/logs/stdout.1", name + "\n").ok());
    dirs.keep_logs(id, name, "failed");
    dirs.remove(id);
  };
  end("x", "web.0.1");
  EXPECT_EQ(read_file(dirs.ended_logs("web.0.1") + "/stdout.1").value_or(""), "web.0.1\n");
  EXPECT_EQ(read_file(dirs.ended_logs("web.0.1") + "/state").value_or(""), "failed");
  end("y", "web.0.1");  // the same name again: one entry, the newer output
  EXPECT_EQ(read_file(dirs.ended_logs("web.0.1") + "/stdout.1").value_or(""), "web.0.1\n");
  end("z", "../escape");  // not a safe name: not kept
  EXPECT_EQ(dirs.ended_logs("../escape"), "");
  EXPECT_FALSE(path_exists(state.path + "/escape"));
  for (size_t i = 0; i < TaskDirs::kEndedLogsKept; ++i)
    end("t" + std::to_string(i), "job.0." + std::to_string(i));
  EXPECT_EQ(dirs.ended_logs("web.0.1"), "");  // the oldest went
  EXPECT_NE(dirs.ended_logs("job.0.0"), "");
  EXPECT_EQ(names(state.path + "/ended-logs").size(), TaskDirs::kEndedLogsKept);
}

}  // namespace
}  // namespace weft::agent
