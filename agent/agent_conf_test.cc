#include "agent/agent_conf.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/paths.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

TEST(AgentConfig, ParsesAndDefaults) {
  auto c = parse_agent_config(
      "socket = \"/run/x.sock\"\nstate_dir = \"/var/lib/x\"\ncontrol_plane = \"cp:7000\"\n"
      "insecure_control_plane = true\n[labels]\ndc = \"ash\"\nrack = \"r12\"\n",
      "agent.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->socket, "/run/x.sock");
  EXPECT_EQ(c->labels.at("rack"), "r12");
  EXPECT_EQ(c->socket_group, "weft");
  auto sd = parse_agent_config("cgroup_root = \"systemd:system.slice/weft-tasks.service\"\n",
                               "agent.toml");
  ASSERT_TRUE(sd.ok()) << sd.error().str();
  auto packaged = load_agent_config(WEFT_SOURCE_DIR "/packaging/agent.toml");
  ASSERT_TRUE(packaged.ok()) << packaged.error().str();  // the shipped file is valid
  // A TCP control plane is unauthenticated: refused unless the operator says so.
  auto tcp = parse_agent_config("control_plane = \"cp:7000\"\n", "agent.toml");
  ASSERT_FALSE(tcp.ok());
  EXPECT_NE(tcp.error().str().find("control_plane_tls"), std::string::npos);
  // With the TLS keys a TCP control plane is fine; one key alone names the missing one.
  auto tls = parse_agent_config(
      "control_plane = \"cp.example:7070\"\ncontrol_plane_tls_ca = \"/etc/weft/ca.pem\"\n"
      "control_plane_tls_cert = \"/etc/weft/m1.pem\"\ncontrol_plane_tls_key = "
      "\"/etc/weft/m1.key\"\ncontrol_plane_name = \"cp.example\"\n",
      "agent.toml");
  ASSERT_TRUE(tls.ok()) << tls.error().str();
  EXPECT_EQ(tls->control_plane_tls.server_name, "cp.example");
  EXPECT_EQ(tls->control_plane_tls.files.key_file, "/etc/weft/m1.key");
  auto half = parse_agent_config(
      "control_plane = \"cp:7070\"\ncontrol_plane_tls_ca = \"/etc/weft/ca.pem\"\n", "agent.toml");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.error().str().find("control_plane_tls_cert"), std::string::npos)
      << half.error().str();
  EXPECT_TRUE(
      parse_agent_config("control_plane = \"unix:/run/weft/cp.sock\"\n", "agent.toml").ok());
  auto d = parse_agent_config("", "agent.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->socket, "/run/weft/agent.sock");
}

TEST(AgentConfig, ErrorsNameLine) {
  auto bad_key = parse_agent_config("socket = \"/x\"\nsoket = \"/y\"\n", "agent.toml");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_EQ(bad_key.error().field, "agent.toml:2");
  auto rel = parse_agent_config("\n\nstate_dir = \"relative\"\n", "agent.toml");
  ASSERT_FALSE(rel.ok());
  EXPECT_EQ(rel.error().field, "agent.toml:3");
  auto type = parse_agent_config("socket = 5\n", "agent.toml");
  ASSERT_FALSE(type.ok());
  EXPECT_EQ(type.error().field, "agent.toml:1");
  auto level = parse_agent_config("log_level = \"loud\"\n", "agent.toml");
  EXPECT_FALSE(level.ok());
  // Issue 32 (11): the kernel's own trees are never a path tasks may mount; the image
  // cache's reserve is a size.
  for (const char* p : {"/proc", "/sys/fs/cgroup", "/dev/", "/boot", "/srv/../proc"}) {
    auto kernel = parse_agent_config(
        std::string("[volumes]\nallowed_host_paths = [\"") + p + "\"]\n", "agent.toml");
    ASSERT_FALSE(kernel.ok()) << p;
    EXPECT_EQ(kernel.error().field, "agent.toml:2") << kernel.error().str();
  }
  EXPECT_TRUE(parse_agent_config(
                  "[volumes]\nallowed_host_paths = [\"/srv/data\", \"/processes\"]\n", "agent.toml")
                  .ok());
  auto reserve = parse_agent_config("[images]\nreserve = \"2G\"\n", "agent.toml");
  ASSERT_TRUE(reserve.ok()) << reserve.error().str();
  EXPECT_EQ(reserve->image_reserve, uint64_t{2} << 30);
  EXPECT_FALSE(parse_agent_config("[images]\nreserve = \"lots\"\n", "agent.toml").ok());
  // Download pacing: bytes a second, a size of at least 64K.
  auto rate = parse_agent_config("[images]\ndownload_rate = \"100M\"\n", "agent.toml");
  ASSERT_TRUE(rate.ok()) << rate.error().str();
  EXPECT_EQ(rate->registry.max_download_rate, 100u << 20);
  auto slow = parse_agent_config("[images]\ndownload_rate = \"1K\"\n", "agent.toml");
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.error().field, "agent.toml:2");
  EXPECT_NE(slow.error().str().find("images.download_rate"), std::string::npos);
  // Network namespaces kept ready: 4 by default, 0 to 64.
  EXPECT_EQ(parse_agent_config("", "agent.toml")->netns_pool, 4u);
  EXPECT_EQ(parse_agent_config("netns_pool = 0\n", "agent.toml")->netns_pool, 0u);
  for (const char* bad : {"netns_pool = 65\n", "netns_pool = -1\n", "netns_pool = \"4\"\n"}) {
    auto pool = parse_agent_config(std::string("# pool\n") + bad, "agent.toml");
    ASSERT_FALSE(pool.ok()) << bad;
    EXPECT_EQ(pool.error().field, "agent.toml:2") << bad;
  }
  // Sandboxes kept ready: 2 by default, 0 to 64.
  EXPECT_EQ(parse_agent_config("", "agent.toml")->sandbox_pool, 2u);
  EXPECT_EQ(parse_agent_config("sandbox_pool = 0\n", "agent.toml")->sandbox_pool, 0u);
  EXPECT_EQ(parse_agent_config("sandbox_pool = 64\n", "agent.toml")->sandbox_pool, 64u);
  for (const char* bad : {"sandbox_pool = 65\n", "sandbox_pool = -1\n", "sandbox_pool = 2.5\n"}) {
    auto pool = parse_agent_config(std::string("# sandboxes\n") + bad, "agent.toml");
    ASSERT_FALSE(pool.ok()) << bad;
    EXPECT_EQ(pool.error().field, "agent.toml:2") << bad;
    EXPECT_NE(pool.error().str().find("sandbox_pool"), std::string::npos) << pool.error().str();
  }
}

class ResolveConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("weft-conf-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(root_ + "/proc/self").ok());
    ASSERT_TRUE(mkdir_p(root_ + "/etc").ok());
    ASSERT_TRUE(write_file(root_ + "/proc/self/mountinfo",
                           "31 22 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
                    .ok());
    ASSERT_TRUE(write_file(root_ + "/etc/machine-id", "abc123\n").ok());
    cfg_.host_root = root_;
    cfg_.init_path = "/bin/true";
  }
  void TearDown() override { (void)remove_tree(root_); }
  std::string root_;
  AgentConfig cfg_;
};

TEST_F(ResolveConfig, UnderSystemdUsesOwnDelegatedCgroup) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/cgroup", "0::/system.slice/weft-agent.service\n").ok());
  ASSERT_TRUE(resolve_agent_config(&cfg_, true).ok());
  EXPECT_EQ(cfg_.cgroup_root, root_ + "/sys/fs/cgroup/system.slice/weft-agent.service");
  EXPECT_EQ(cfg_.machine_id, "abc123");
  EXPECT_TRUE(cfg_.agent_in_root);
}

TEST_F(ResolveConfig, RestartedAgentIsAlreadyInItsLeaf) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/cgroup", "0::/system.slice/weft-agent.service/agent\n").ok());
  ASSERT_TRUE(resolve_agent_config(&cfg_, true).ok());
  EXPECT_EQ(cfg_.cgroup_root, root_ + "/sys/fs/cgroup/system.slice/weft-agent.service");
}

TEST_F(ResolveConfig, WithoutSystemdUsesWeftUnderTheMount) {
  ASSERT_TRUE(resolve_agent_config(&cfg_, false).ok());
  EXPECT_EQ(cfg_.cgroup_root, root_ + "/sys/fs/cgroup/weft");
}

TEST_F(ResolveConfig, SystemdUnitPath) {
  ASSERT_TRUE(
      write_file(root_ + "/proc/self/cgroup", "0::/system.slice/weft-agent.service\n").ok());
  cfg_.cgroup_root = "systemd:system.slice/weft-tasks.service";
  ASSERT_TRUE(resolve_agent_config(&cfg_, true).ok());
  EXPECT_EQ(cfg_.cgroup_root, root_ + "/sys/fs/cgroup/system.slice/weft-tasks.service");
  EXPECT_FALSE(cfg_.agent_in_root);  // stays in weft-agent.service
  cfg_.cgroup_root = "systemd:../x";
  EXPECT_FALSE(resolve_agent_config(&cfg_, true).ok());
}

TEST_F(ResolveConfig, MissingInitIsAnError) {
  cfg_.init_path = root_ + "/no-init";
  auto s = resolve_agent_config(&cfg_, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().str().find("weft-init"), std::string::npos);
}

// Finding 13: a plain directory is not a cgroup root.
TEST(AgentConfig, CgroupRootMustBeOnCgroup2) {
  auto etc = check_cgroup2_dir("/etc");
  ASSERT_FALSE(etc.ok());
  EXPECT_EQ(etc.error().field, "cgroup_root");
  EXPECT_FALSE(check_cgroup2_dir("/etc/weft-does-not-exist/x").ok());
  auto mount = HostPaths().cgroup2_mount();
  if (mount.ok()) {
    EXPECT_TRUE(check_cgroup2_dir(*mount).ok());
    EXPECT_TRUE(check_cgroup2_dir(*mount + "/weft-not-yet-made/tasks").ok());
  }
}

TEST(AgentConfig, DiscoveryKeysAndTheirErrors) {
  auto ok = parse_agent_config(
      "port_range = \"21000-21999\"\ndns_listen = \"127.0.0.1:8600\"\ndns_ttl = \"5s\"\n"
      "advertise_address = \"fd00::7\"\ntask_uids = \"4000000-4000999\"\n",
      "agent.toml");
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(ok->port_first, 21000);
  EXPECT_EQ(ok->port_last, 21999);
  EXPECT_EQ(ok->dns_ttl_s, 5u);
  EXPECT_EQ(ok->task_uid_first, 4000000);
  EXPECT_FALSE(ok->dns_all_services);  // told of the jobs its clients ask for
  auto all = parse_agent_config("dns_services = \"all\"\n", "agent.toml");
  ASSERT_TRUE(all.ok()) << all.error().str();
  EXPECT_TRUE(all->dns_all_services);
  for (const char* bad :
       {"port_range = \"80-90\"", "port_range = \"30000-20000\"", "port_range = \"20000-\"",
        "port_range = \"-20000\"", "port_range = \"20000-70000\"", "port_range = \"2x-30000\"",
        "dns_listen = \"unix:/run/x\"", "dns_listen = \"127.0.0.1\"", "dns_ttl = \"2h\"",
        "advertise_address = \"host.example\"", "task_uids = \"1000-2000\"",
        "dns_services = \"some\"", "dns_services = 1"}) {
    auto e = parse_agent_config(std::string(bad) + "\n", "agent.toml");
    ASSERT_FALSE(e.ok()) << bad;
    std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(e.error().str().find("agent.toml:1"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find(key), std::string::npos) << e.error().str();
  }
}

TEST(AgentConfig, TheBridgeTableAndItsErrors) {
  auto none = parse_agent_config("", "agent.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->bridge, "");  // no [bridge]: no bridge
  auto defaults = parse_agent_config("[bridge]\n", "agent.toml");
  ASSERT_TRUE(defaults.ok()) << defaults.error().str();
  EXPECT_EQ(defaults->bridge, "weft0");
  EXPECT_EQ(defaults->bridge_net, 0x0a590000u);  // 10.89.0.0
  EXPECT_EQ(defaults->bridge_prefix, 16);
  auto ok = parse_agent_config(
      "[bridge]\nname = \"br-tasks\"\nsubnet = \"172.30.8.0/24\"\nhost_ports = [8600, 53]\n",
      "agent.toml");
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  EXPECT_EQ(ok->bridge, "br-tasks");
  EXPECT_EQ(ok->bridge_net, 0xac1e0800u);
  EXPECT_EQ(ok->bridge_prefix, 24);
  EXPECT_EQ(ok->bridge_host_ports, (std::vector<uint16_t>{8600, 53}));
  for (const char* bad :
       {"name = \"\"", "name = \"lo\"", "name = \"a-name-far-too-long\"", "name = \"0br\"",
        "name = \"br/x\"", "subnet = \"10.89.0.0\"", "subnet = \"10.89.0.1/16\"",
        "subnet = \"10.89.0.0/30\"", "subnet = \"10.89.0.0/4\"", "subnet = \"fd00::/64\"",
        "subnet = \"10.89.0.0/16x\"", "host_ports = [0]", "host_ports = [70000]",
        "host_ports = \"8600\"", "host_ports = [\"dns\"]", "mtu = 1400"}) {
    auto e = parse_agent_config(std::string("[bridge]\n") + bad + "\n", "agent.toml");
    ASSERT_FALSE(e.ok()) << bad;
    std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(e.error().str().find("agent.toml:2"), std::string::npos) << e.error().str();
    EXPECT_NE(e.error().str().find(key), std::string::npos) << e.error().str();
  }
}

}  // namespace
}  // namespace weft::agent

namespace weft::agent {
namespace {

// reserved_ports: ports and ranges; anything else is refused naming the file and line.
TEST(AgentConfig, ReservedPortsAreCheckedAndExpanded) {
  auto c = parse_agent_config("reserved_ports = [22, \"2379-2380\"]\n", "agent.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->reserved_ports, (std::set<uint16_t>{22, 2379, 2380}));
  for (const char* bad : {"[0]", "[70000]", "[\"9-3\"]", "[\"x\"]", "22", "[1.5]"}) {
    auto e = parse_agent_config(std::string("\nreserved_ports = ") + bad + "\n", "agent.toml");
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().str().find("agent.toml:2"), std::string::npos) << e.error().str();
  }
}

}  // namespace
}  // namespace weft::agent
