#include "sidekick/profile.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {
namespace {

std::string field_of(const std::string& text) {
  auto p = parse_profile_text(text, "p.toml");
  return p.ok() ? "<ok>" : p.error().field;
}

const Knob* find(const Profile& p, const std::string& id) {
  for (const auto& k : p.knobs)
    if (k.id == id) return &k;
  return nullptr;
}

TEST(ProfileParse, AllFamilies) {
  auto p = parse_profile_text(R"(
description = "x"
[sysctl]
"net.core.somaxconn" = 4096
"vm.swappiness" = { value = 10, best_effort = true }
"vm.max_map_count" = { min = 262144 }
[hugepages]
"2M" = { count = 64, node = 0, deadline = "30s", wait = true }
"1G" = 1
[thp]
enabled = "madvise"
[cpu]
turbo = false
governor = "performance"
[cgroup]
disable = ["cpu"]
[kernel]
cmdline = ["intel_iommu=on"]
[nic."eth*"]
mtu = 9000
channels = { combined = 4 }
rings = { rx = 4096 }
features = { "rx-gro" = false }
[irq."eth*"]
cpus = "0-1"
)",
                              "p.toml");
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(find(*p, "sysctl:net.core.somaxconn")->value, "4096");
  EXPECT_FALSE(find(*p, "sysctl:vm.swappiness")->required);
  EXPECT_EQ(find(*p, "sysctl:vm.max_map_count")->cmp, Comparator::kAtLeast);
  const Knob* hp = find(*p, "hugepages:2048kB/node0");
  ASSERT_NE(hp, nullptr);
  EXPECT_EQ(hp->value, "64");
  EXPECT_EQ(hp->klass, KnobClass::kSlow);
  EXPECT_EQ(hp->deadline_us, 30'000'000u);
  EXPECT_TRUE(hp->wait);
  EXPECT_NE(find(*p, "hugepages:1048576kB"), nullptr);
  EXPECT_EQ(find(*p, "cpu:turbo")->value, "off");
  EXPECT_EQ(find(*p, "cgroup:cpu")->value, "off");
  EXPECT_EQ(find(*p, "kernel:intel_iommu=on")->klass, KnobClass::kReboot);
  EXPECT_EQ(find(*p, "nic:eth*/channels.combined")->value, "4");
  EXPECT_EQ(find(*p, "nic:eth*/rings.rx")->value, "4096");
  EXPECT_EQ(find(*p, "nic:eth*/features.rx-gro")->value, "off");
  EXPECT_EQ(find(*p, "nic:eth*/mtu")->klass, KnobClass::kDisruptive);
  EXPECT_EQ(find(*p, "irq:eth*")->cmp, Comparator::kCpuList);
  EXPECT_EQ(find(*p, "sysctl:net.core.somaxconn")->source, "p.toml:4");
  // Dependency order: cgroup first, huge pages (slow) last; IRQs after NIC settings.
  EXPECT_EQ(p->knobs.front().family, "cgroup");
  EXPECT_EQ(p->knobs.back().family, "hugepages");
}

TEST(ProfileParse, ErrorsNameFileAndLine) {
  EXPECT_EQ(field_of("bogus = 1\n"), "p.toml:1");
  EXPECT_EQ(field_of("[sysctl]\n\"a..b\" = 1\n"), "p.toml:2");
  EXPECT_EQ(field_of("[thp]\nenabled = \"sometimes\"\n"), "p.toml:2");
  EXPECT_EQ(field_of("[thp]\nenable = \"always\"\n"), "p.toml:2");
  EXPECT_EQ(field_of("[hugepages]\n\"3M\" = 4\n"), "p.toml:2");
  EXPECT_EQ(field_of("[hugepages]\n\"2M\" = -1\n"), "p.toml:2");
  EXPECT_EQ(field_of("[cpu]\nturbo = \"yes\"\n"), "p.toml:2");
  EXPECT_EQ(field_of("[cgroup]\ndisable = [\"cpux\"]\n"), "p.toml:2");
  EXPECT_EQ(field_of("[kernel]\ncmdline = [\"a b\"]\n"), "p.toml:2");
  EXPECT_EQ(field_of("[irq.\"eth*\"]\ncpus = \"3-1\"\n"), "p.toml:1");
  EXPECT_EQ(field_of("[nic.\"eth0\"]\nmtu = 10\n"), "p.toml:2");
  EXPECT_EQ(field_of("[sysctl]\n\"x.y\" = { value = 1, min = 2 }\n"), "p.toml:2");
  EXPECT_EQ(field_of("[sysctl]\n\"x.y\" = 1.5e3\n"), "p.toml:2");
  EXPECT_EQ(field_of("[sysctl\n"), "p.toml:1:8");
}

class ProfileDirs : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() / ("weft-prof-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(base_ + "/etc").ok());
    ASSERT_TRUE(mkdir_p(base_ + "/usr").ok());
    path_.dirs = {base_ + "/etc", base_ + "/usr"};
  }
  void TearDown() override { (void)remove_tree(base_); }
  void put(const std::string& dir, const std::string& name, const std::string& text) {
    ASSERT_TRUE(write_file(base_ + "/" + dir + "/" + name + ".toml", text).ok());
  }
  std::string base_;
  ProfilePath path_;
};

TEST_F(ProfileDirs, IncludesLaterWinsAndOverrides) {
  put("usr", "base", "[sysctl]\n\"a.b\" = 1\n\"c.d\" = 2\n");
  put("usr", "mid", "include = [\"base\"]\n[sysctl]\n\"c.d\" = 3\n");
  put("usr", "top", "include = [\"mid\"]\n[sysctl]\n\"e.f\" = 4\n");
  auto p = load_profile(path_, "top");
  ASSERT_TRUE(p.ok()) << p.error().str();
  EXPECT_EQ(p->knobs.size(), 3u);
  for (const auto& k : p->knobs) {
    if (k.key == "c.d") {
      EXPECT_EQ(k.value, "3");
    }
  }
  EXPECT_EQ(p->files.size(), 3u);
  // /etc/weft/profiles.d overrides the shipped file of the same name.
  put("etc", "base", "[sysctl]\n\"a.b\" = 9\n");
  auto q = load_profile(path_, "top");
  ASSERT_TRUE(q.ok());
  for (const auto& k : q->knobs) {
    if (k.key == "a.b") {
      EXPECT_EQ(k.value, "9");
    }
  }
  EXPECT_EQ(list_profiles(path_), (std::vector<std::string>{"base", "mid", "top"}));
}

TEST_F(ProfileDirs, CyclesAndMissingIncludes) {
  put("usr", "a", "include = [\"b\"]\n");
  put("usr", "b", "include = [\"a\"]\n");
  auto p = load_profile(path_, "a");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().str().find("include cycle"), std::string::npos) << p.error().str();
  put("usr", "c", "include = [\"nope\"]\n");
  auto q = load_profile(path_, "c");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().str().find("no profile named 'nope'"), std::string::npos);
  EXPECT_FALSE(load_profile(path_, "../etc/passwd").ok());
}

TEST(ShippedProfiles, AllCompile) {
  ProfilePath path{{WEFT_PROFILES_DIR}};
  auto names = list_profiles(path);
  for (const char* want : {"default", "web", "memcache", "whole-machine", "batch"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const auto& n : names) {
    auto p = load_profile(path, n);
    EXPECT_TRUE(p.ok()) << n << ": " << p.error().str();
  }
  EXPECT_TRUE(load_profile(path, "default")->knobs.empty());
  auto mc = load_profile(path, "memcache");
  ASSERT_TRUE(mc.ok());
  bool has_thp = false, has_irq = false;
  for (const auto& k : mc->knobs) {
    has_thp |= k.family == "thp";  // from web, through include
    has_irq |= k.family == "irq";
  }
  EXPECT_TRUE(has_thp && has_irq);
}

TEST(Comparators, Semantics) {
  EXPECT_TRUE(knob_satisfied(Comparator::kEqual, "4096 87380  6291456", "4096\t87380 6291456"));
  EXPECT_FALSE(knob_satisfied(Comparator::kEqual, "1", "2"));
  EXPECT_TRUE(knob_satisfied(Comparator::kAtLeast, "10", "12"));
  EXPECT_FALSE(knob_satisfied(Comparator::kAtLeast, "10", "9"));
  EXPECT_FALSE(knob_satisfied(Comparator::kAtLeast, "10", ""));
  EXPECT_TRUE(knob_satisfied(Comparator::kCpuList, "0-2,4", "0,1,2,4"));
  EXPECT_FALSE(knob_satisfied(Comparator::kCpuList, "0-2", "0-3"));
  EXPECT_TRUE(knob_satisfied(Comparator::kMask, "f", "0000000f"));
  EXPECT_TRUE(knob_satisfied(Comparator::kMask, "00000001,00000000", "100000000"));
  EXPECT_FALSE(knob_satisfied(Comparator::kMask, "3", "1"));
}

}  // namespace
}  // namespace weft::sidekick
