// An entitlement's grants: what a job's task spec may ask of the host (docs/security.md).
#include "common/task_grants.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

using json = nlohmann::json;

// A job's task as the control plane checks it: without namespaces.network it has a
// network of its own ("own", which job.create writes into the spec).
TaskSpec spec(const json& j) {
  json t = j;
  t["name"] = "t";
  if (!t.contains("argv")) t["argv"] = {"/bin/true"};
  if (!t["namespaces"].contains("network")) t["namespaces"]["network"] = "own";
  auto s = parse_task_spec(t);
  EXPECT_TRUE(s.ok()) << s.error().str();
  return s.ok() ? *s : TaskSpec{};
}

std::string refused_field(const json& task, const TaskGrants& g = {}) {
  auto s = check_task_grants(spec(task), g, "web");
  return s.ok() ? "" : s.error().field;
}

TEST(TaskGrants, TheRestrictedDefaultRefusesEveryHostPrivilegeByItsField) {
  EXPECT_EQ(refused_field(json::object()), "");
  EXPECT_EQ(refused_field({{"env", {{"A", "1"}}},
                           {"image", "registry.example/app@sha256:" + std::string(64, 'a')},
                           {"files", {{{"path", "/s"}, {"content", "x"}}}}}),
            "");
  EXPECT_EQ(refused_field({{"user", "postgres"}}), "task.user");
  EXPECT_EQ(refused_field({{"user", "65534"}}), "task.user");  // nobody: shared with the host
  EXPECT_EQ(refused_field({{"group", "shadow"}}), "task.group");
  EXPECT_EQ(refused_field({{"namespaces", {{"pid", false}}}}), "task.namespaces.pid");
  EXPECT_EQ(refused_field({{"namespaces", {{"mount", false}}}}), "task.namespaces.mount");
  EXPECT_EQ(refused_field({{"rootfs", "/srv/root"}}), "task.rootfs");
  EXPECT_EQ(refused_field({{"image", "registry.example/app@sha256:" + std::string(64, 'a')},
                           {"mounts", {{{"source", "/srv/data"}, {"target", "/data"}}}}}),
            "task.mounts[0].source");
  EXPECT_EQ(refused_field({{"seccomp", "unconfined"}}), "task.seccomp");
  // Issue 43: the host's network is a grant; a network of its own (bridge or private) is
  // not, and neither is a fixed port from 1024 up.
  EXPECT_EQ(refused_field({{"namespaces", {{"network", "host"}}}}), "task.namespaces.network");
  EXPECT_EQ(refused_field({{"namespaces", {{"network", "bridge"}}}}), "");
  EXPECT_EQ(refused_field({{"namespaces", {{"network", "private"}}}}), "");
  EXPECT_EQ(refused_field({{"ports", {{"http", 8080}}}}), "");
  EXPECT_EQ(refused_field({{"ports", {{"http", 80}}}}), "task.ports.http");
  auto net = check_task_grants(spec({{"namespaces", {{"network", "host"}}}}), {}, "web");
  ASSERT_FALSE(net.ok());
  EXPECT_NE(net.error().message.find("grants.host_network"), std::string::npos)
      << net.error().message;
  auto low = check_port_grants({{"ssh", 22}}, {}, "web", "ports.");
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.error().field, "ports.ssh");
  EXPECT_NE(low.error().message.find("port 22 is below 1024"), std::string::npos);
  // A tmpfs mount is the task's own, not the host's.
  EXPECT_EQ(refused_field({{"image", "registry.example/app@sha256:" + std::string(64, 'a')},
                           {"mounts", {{{"type", "tmpfs"}, {"target", "/scratch"}}}}}),
            "");
  auto s = check_task_grants(spec({{"user", "postgres"}}), {}, "web");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("entitlement web does not grant"), std::string::npos)
      << s.error().message;
  EXPECT_NE(s.error().message.find("grants.users"), std::string::npos);
}

TEST(TaskGrants, NamedExceptionsGrantExactlyWhatTheyName) {
  auto g = parse_task_grants({{"users", {"postgres"}},
                              {"groups", {"video"}},
                              {"host_namespaces", {"pid"}},
                              {"host_paths", {"/srv/data"}},
                              {"seccomp_unconfined", true},
                              {"host_network", true},
                              {"low_ports", true}});
  ASSERT_TRUE(g.ok()) << g.error().str();
  EXPECT_EQ(refused_field({{"namespaces", {{"network", "host"}}}, {"ports", {{"http", 80}}}}, *g),
            "");
  EXPECT_FALSE(parse_task_grants({{"host_network", "yes"}}).ok());
  EXPECT_EQ(refused_field({{"user", "postgres"}, {"group", "video"}}, *g), "");
  EXPECT_EQ(refused_field({{"user", "mysql"}}, *g), "task.user");
  EXPECT_EQ(refused_field({{"namespaces", {{"pid", false}}}}, *g), "");
  EXPECT_EQ(refused_field({{"namespaces", {{"ipc", false}}}}, *g), "task.namespaces.ipc");
  EXPECT_EQ(refused_field({{"rootfs", "/srv/data/root"}}, *g), "");
  EXPECT_EQ(refused_field({{"rootfs", "/srv/database"}}, *g), "task.rootfs");  // not under
  EXPECT_EQ(refused_field({{"rootfs", "/srv/data/../../etc"}}, *g), "task.rootfs");
  EXPECT_EQ(refused_field({{"seccomp", "unconfined"}}, *g), "");
  // Privileged: everything that can be granted.
  TaskGrants all;
  all.privileged = true;
  EXPECT_EQ(refused_field({{"user", "postgres"}, {"namespaces", {{"pid", false}}}}, all), "");
  // Round trip.
  auto again = parse_task_grants(to_json(*g));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *g);
}

TEST(TaskGrants, RootAndTheSocketsGroupAreNeverGranted) {
  TaskGrants all;
  all.privileged = true;
  EXPECT_EQ(refused_field({{"user", "root"}}, all), "task.user");
  EXPECT_EQ(refused_field({{"user", "0"}}, all), "task.user");
  EXPECT_EQ(refused_field({{"user", "000"}}, all), "task.user");
  EXPECT_EQ(refused_field({{"group", "weft"}}, all), "task.group");
  EXPECT_EQ(refused_field({{"group", "0"}}, all), "task.group");
  EXPECT_EQ(check_task_grants(spec({{"group", "ops"}}), all, "web", "ops").error().field,
            "task.group");
  // Nor can an admin write them into a grant.
  EXPECT_EQ(parse_task_grants({{"users", {"root"}}}).error().field, "grants.users[0]");
  EXPECT_EQ(parse_task_grants({{"groups", {"video", "weft"}}}).error().field, "grants.groups[1]");
  EXPECT_EQ(parse_task_grants({{"groups", {"0"}}}).error().field, "grants.groups[0]");
}

TEST(TaskGrants, MalformedGrantsNameTheirField) {
  EXPECT_EQ(parse_task_grants(json::array()).error().field, "grants");
  EXPECT_EQ(parse_task_grants({{"users", "postgres"}}).error().field, "grants.users");
  EXPECT_EQ(parse_task_grants({{"users", {1}}}).error().field, "grants.users[0]");
  EXPECT_EQ(parse_task_grants({{"users", {"a b"}}}).error().field, "grants.users[0]");
  EXPECT_EQ(parse_task_grants({{"host_namespaces", {"net"}}}).error().field,
            "grants.host_namespaces[0]");
  EXPECT_EQ(parse_task_grants({{"host_paths", {"relative"}}}).error().field,
            "grants.host_paths[0]");
  EXPECT_EQ(parse_task_grants({{"host_paths", {"/srv/../etc"}}}).error().field,
            "grants.host_paths[0]");
  EXPECT_EQ(parse_task_grants({{"privileged", "yes"}}).error().field, "grants.privileged");
  EXPECT_EQ(parse_task_grants({{"hostNetwork", true}}).error().field, "grants.hostNetwork");
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back("u" + std::to_string(i));
  EXPECT_EQ(parse_task_grants({{"users", many}}).error().field, "grants.users");
}

}  // namespace
}  // namespace weft
