#include "agent/identity.h"
#include "agent/task_root.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "agent/init/args.h"
#include "agent/init/argv.h"

namespace weft::agent {
namespace {

// weft-init's parser reads back what the agent builds: the two ends of the contract
// (agent/init/argv.h, agent/init/args.h).
weft_init::Args parsed(std::vector<std::string>& argv, std::vector<char*>& ptrs) {
  ptrs.clear();
  for (auto& s : argv) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  weft_init::Args a;
  EXPECT_TRUE(weft_init::parse_args(static_cast<int>(argv.size()), ptrs.data(), &a));
  return a;
}

TEST(InitArgv, ATaskStartIsReadBackByWeftInit) {
  auto s = parse_task_spec(nlohmann::json::parse(R"({
    "name": "t", "argv": ["echo", "hi"], "env": {"X": "1"}, "hostname": "box", "cwd": "/srv",
    "rootfs": "/srv/root",
    "namespaces": {"network": "private"},
    "mounts": [{"type": "bind", "source": "/data", "target": "/in", "readonly": true},
               {"type": "tmpfs", "target": "/scratch", "size": "1M"}],
    "logs": {"max_file_size": "4K", "max_files": 3}})"));
  ASSERT_TRUE(s.ok()) << s.error().str();
  Identity id;
  id.set = true;
  id.uid = 1234;
  id.gid = 1235;
  id.groups = {7, 8};
  auto argv = init_argv(*s, id, InitStart{4, nullptr, {"/resolved/data"}, false});
  std::vector<char*> ptrs;
  weft_init::Args a = parsed(argv, ptrs);
  EXPECT_EQ(a.task_dir_fd, 3);
  EXPECT_EQ(a.incarnation, 4u);
  EXPECT_EQ(a.join_pid, -1);
  EXPECT_EQ(a.uid, 1234);
  EXPECT_EQ(a.gid, 1235);
  ASSERT_EQ(a.ngroups, 2);
  EXPECT_EQ(a.groups[0], 7u);
  EXPECT_EQ(a.groups[1], 8u);
  EXPECT_STREQ(a.cwd, "/srv");
  EXPECT_STREQ(a.hostname, "box");
  EXPECT_STREQ(a.rootfs, "/srv/root");
  EXPECT_FALSE(a.mount_proc);  // a root of its own brings its own /proc
  EXPECT_TRUE(a.lo_up);        // a private network: weft-init brings lo up
  EXPECT_TRUE(a.seccomp);
  ASSERT_EQ(a.nbinds, 1);
  EXPECT_STREQ(a.binds[0], "ro:/resolved/data:/in");  // the resolved source, not the spec's
  ASSERT_EQ(a.ntmpfs, 1);
  EXPECT_STREQ(a.tmpfs[0], "1048576:1777:rw:/scratch");
  EXPECT_EQ(a.log_max_bytes, 4096u);
  EXPECT_EQ(a.log_max_files, 3u);
  std::vector<std::string> env;
  for (int i = 0; i < a.nenv; ++i) env.emplace_back(a.env[i]);
  EXPECT_EQ(a.env[a.nenv], nullptr);
  EXPECT_NE(std::find(env.begin(), env.end(), "X=1"), env.end());
  EXPECT_NE(std::find(env.begin(), env.end(), "HOSTNAME=box"), env.end());
  ASSERT_NE(a.argv, nullptr);
  EXPECT_STREQ(a.argv[0], "echo");
  EXPECT_STREQ(a.argv[1], "hi");
  EXPECT_EQ(a.argv[2], nullptr);
}

TEST(InitArgv, AnImageRootAndAPreparedNamespaceAreReadBack) {
  auto s = parse_task_spec({{"name", "t"},
                            {"argv", {"/bin/app"}},
                            {"namespaces", {{"network", "private"}}},
                            {"seccomp", "unconfined"}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  OverlayRoot o{"/layers", {"sha256/top", "sha256/base"}, "/t/upper", "/t/work", "/t/rootfs"};
  auto argv = init_argv(*s, Identity{}, InitStart{1, &o, {}, /*lo_up=*/true});
  std::vector<char*> ptrs;
  weft_init::Args a = parsed(argv, ptrs);
  EXPECT_EQ(a.uid, -1);  // no identity: weft-init keeps the agent's
  EXPECT_EQ(a.ngroups, -1);
  EXPECT_STREQ(a.rootfs, "/t/rootfs");
  EXPECT_STREQ(a.overlay_layers, "/layers");
  EXPECT_STREQ(a.overlay_lower, "sha256/top:sha256/base");
  EXPECT_STREQ(a.overlay_upper, "/t/upper");
  EXPECT_STREQ(a.overlay_work, "/t/work");
  EXPECT_FALSE(a.mount_proc);  // the image root gets its /proc from the rootfs path
  EXPECT_FALSE(a.private_mounts);
  EXPECT_FALSE(a.lo_up);  // up already
  EXPECT_FALSE(a.seccomp);
}

TEST(InitArgv, ATaskOnTheHostsRootGetsItsOwnProcAndPrivateMounts) {
  auto s = parse_task_spec({{"name", "t"}, {"argv", {"/bin/true"}}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  auto argv = init_argv(*s, Identity{}, InitStart{1});
  std::vector<char*> ptrs;
  weft_init::Args a = parsed(argv, ptrs);
  EXPECT_EQ(a.rootfs, nullptr);
  EXPECT_TRUE(a.mount_proc);
  EXPECT_TRUE(a.private_mounts);
  EXPECT_FALSE(a.lo_up);  // the host's network
}

TEST(InitArgv, AJoinedCheckCarriesTheTasksIdentityAndItsCommand) {
  auto s =
      parse_task_spec({{"name", "t"},
                       {"argv", {"/bin/app"}},
                       {"env", {{"X", "1"}}},
                       {"hostname", "box"},
                       {"readiness", {{"type", "exec"}, {"command", {"/bin/check", "--deep"}}}}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  Identity id;
  id.set = true;
  id.uid = 1000;
  id.gid = 1000;
  auto argv = init_argv(*s, id, InitJoin{4321, s->readiness->command});
  std::vector<char*> ptrs;
  weft_init::Args a = parsed(argv, ptrs);
  EXPECT_EQ(a.join_pid, 4321);
  EXPECT_EQ(a.task_dir_fd, -1);
  EXPECT_EQ(a.uid, 1000);
  EXPECT_EQ(a.hostname, nullptr);  // the task's UTS namespace has it already
  std::vector<std::string> env;
  for (int i = 0; i < a.nenv; ++i) env.emplace_back(a.env[i]);
  EXPECT_NE(std::find(env.begin(), env.end(), "X=1"), env.end());
  EXPECT_EQ(std::find(env.begin(), env.end(), "HOSTNAME=box"), env.end());
  EXPECT_STREQ(a.argv[0], "/bin/check");
  EXPECT_STREQ(a.argv[1], "--deep");
}

TEST(InitArgv, WeftInitRefusesAMalformedCommandLine) {
  auto refused = [](std::vector<std::string> argv) {
    std::vector<char*> ptrs;
    for (auto& s : argv) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    weft_init::Args a;
    return !weft_init::parse_args(static_cast<int>(argv.size()), ptrs.data(), &a);
  };
  EXPECT_TRUE(refused({"weft-init", "--task-dir-fd", "3"}));        // no "--"
  EXPECT_TRUE(refused({"weft-init", "--task-dir-fd", "3", "--"}));  // no program
  EXPECT_TRUE(refused({"weft-init", "--no-such-option", "x", "--", "/bin/true"}));
  EXPECT_TRUE(refused({"weft-init", "--uid"}));  // no value
  std::vector<std::string> many = {"weft-init"};
  for (int i = 0; i < 34; ++i) many.insert(many.end(), {"--bind", "ro:/a:/b"});
  many.insert(many.end(), {"--", "/bin/true"});
  EXPECT_TRUE(refused(many));  // past the 33 binds weft-init holds
  EXPECT_FALSE(refused({"weft-init", "--task-dir-fd", "3", "--", "/bin/true"}));
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
