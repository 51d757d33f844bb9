#include "agent/start_plan.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/fs.h"

namespace weft::agent {
namespace {

TaskSpec spec_of(const char* text) {
  auto s = parse_task_spec(nlohmann::json::parse(text));
  EXPECT_TRUE(s.ok()) << s.error().str();
  return s.ok() ? *s : TaskSpec{};
}

oci::Digest digest(char c) {
  return {"sha256", std::string(64, c)};
}

// A directory for bind sources, removed at the end whatever happens.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/weft-start-plan-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { (void)remove_tree(path); }
};

TEST(StartPlan, AnImageTaskRunsItsImagesDefaultsInAnOverlayOfItsLayersTopFirst) {
  TaskSpec spec = spec_of(R"({"name": "web", "image": "registry.example/web:1",
                              "env": {"MODE": "spec"}})");
  image::LocalImage img;
  img.config.entrypoint = {"/bin/server"};
  img.config.cmd = {"--port", "80"};
  img.config.env = {"MODE=image", "LANG=C"};
  img.config.working_dir = "/srv";
  img.layers = {digest('a'), digest('b'), digest('c')};  // lowest first
  StartPolicy policy;
  StartInputs in{&spec, &policy, &img, nullptr, "/var/lib/weft/images/layers", "/state/tasks/t1"};
  auto plan = plan_start(in);
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  EXPECT_EQ(plan->run_spec.argv, (std::vector<std::string>{"/bin/server", "--port", "80"}));
  EXPECT_EQ(plan->run_spec.env.at("MODE"), "spec");  // the spec's env over the image's
  EXPECT_EQ(plan->run_spec.env.at("LANG"), "C");
  EXPECT_EQ(plan->run_spec.cwd, "/srv");
  ASSERT_TRUE(plan->overlay);
  const OverlayRoot& o = *plan->overlay;
  EXPECT_EQ(o.lower, (std::vector<std::string>{"sha256/" + std::string(64, 'c'),
                                               "sha256/" + std::string(64, 'b'),
                                               "sha256/" + std::string(64, 'a')}));
  EXPECT_EQ(o.upper, "/state/tasks/t1/upper");
  EXPECT_EQ(o.work, "/state/tasks/t1/work");
  EXPECT_EQ(o.rootfs, "/state/tasks/t1/rootfs");
  ASSERT_EQ(plan->image_roots.size(), 3u);
  EXPECT_EQ(plan->image_roots[0], "/var/lib/weft/images/layers/sha256/" + std::string(64, 'c'));
  EXPECT_TRUE(plan->bind_sources.empty());
}

TEST(StartPlan, AnImageWithoutAProgramNeedsTheSpecsArgv) {
  TaskSpec spec = spec_of(R"({"name": "web", "image": "registry.example/web:1"})");
  image::LocalImage img;
  img.layers = {digest('a')};
  StartPolicy policy;
  StartInputs in{&spec, &policy, &img, nullptr, "/layers", "/t"};
  auto plan = plan_start(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().field, "argv");
}

TEST(StartPlan, TooManyLayersForOneOverlayMountAreRefusedNamingTheImage) {
  TaskSpec spec = spec_of(R"({"name": "web", "image": "registry.example/web:1",
                              "argv": ["/bin/true"]})");
  image::LocalImage img;
  for (int i = 0; i < 60; ++i) img.layers.push_back(digest('a' + i % 6));
  StartPolicy policy;
  StartInputs in{&spec, &policy, &img, nullptr, "/layers", "/t"};
  auto plan = plan_start(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().field, "image");
  img.layers.resize(20);  // 20 × 72 bytes fit in a page
  EXPECT_TRUE(plan_start(in).ok());
}

TEST(StartPlan, BindSourcesAreResolvedAndCheckedAgainstTheMachinesPolicy) {
  TempDir dir;
  ASSERT_EQ(::mkdir((dir.path + "/data").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((dir.path + "/data").c_str(), (dir.path + "/link").c_str()), 0);
  std::string text = R"({"name": "t", "argv": ["/bin/true"], "rootfs": ")" + dir.path +
                     R"(", "mounts": [{"source": ")" + dir.path +
                     R"(/link", "target": "/in"}, {"type": "tmpfs", "target": "/tmp"}]})";
  TaskSpec spec = spec_of(text.c_str());
  StartPolicy policy;
  policy.volume_host_paths = {dir.path + "/data"};
  StartInputs in{&spec, &policy, nullptr, nullptr, "/layers", "/t"};
  auto plan = plan_start(in);
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  EXPECT_FALSE(plan->overlay);  // a rootfs of the spec's own
  EXPECT_EQ(plan->bind_sources, (std::vector<std::string>{dir.path + "/data"}));
  EXPECT_TRUE(admit_spec(spec, policy).ok());

  policy.volume_host_paths = {"/nowhere"};  // changed since the task was admitted
  auto refused = plan_start(in);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().field, "mounts[0].source");
  EXPECT_EQ(admit_spec(spec, policy).error().field, "mounts[0].source");
}

TEST(StartPlan, APackageBesideARootIsMountedReadOnlyAtItsTarget) {
  TaskSpec spec = spec_of(R"({"name": "t", "image": "registry.example/base:1",
                              "argv": ["/opt/app/run"],
                              "package": {"url": "https://pkgs.example/app.tar", "sha256": "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", "target": "/opt/app"}})");
  image::LocalImage img, pkg;
  img.layers = {digest('a')};
  pkg.manifest = digest('p');
  StartPolicy policy;
  StartInputs in{&spec, &policy, &img, &pkg, "/layers", "/t"};
  auto plan = plan_start(in);
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  ASSERT_EQ(plan->run_spec.mounts.size(), 1u);
  const MountSpec& m = plan->run_spec.mounts[0];
  EXPECT_EQ(m.kind, MountKind::kBind);
  EXPECT_TRUE(m.readonly);
  EXPECT_EQ(m.target, "/opt/app");
  EXPECT_EQ(plan->bind_sources,
            (std::vector<std::string>{"/layers/sha256/" + std::string(64, 'p')}));
  EXPECT_EQ(plan->overlay->lower.size(), 1u);  // the image's root, the package beside it
}

TEST(StartPlan, APackageAtTheRootIsTheTasksRoot) {
  TaskSpec spec = spec_of(R"({"name": "t", "argv": ["/bin/app"],
                              "package": {"url": "https://pkgs.example/app.tar", "sha256": "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", "target": "/"}})");
  image::LocalImage pkg;
  pkg.manifest = digest('p');
  pkg.layers = {digest('q')};
  StartPolicy policy;
  StartInputs in{&spec, &policy, nullptr, &pkg, "/layers", "/t"};
  auto plan = plan_start(in);
  ASSERT_TRUE(plan.ok()) << plan.error().str();
  ASSERT_TRUE(plan->overlay);
  EXPECT_EQ(plan->overlay->lower, (std::vector<std::string>{"sha256/" + std::string(64, 'q')}));
  EXPECT_TRUE(plan->run_spec.mounts.empty());
}

TEST(StartPlan, AdmissionRefusesUnconfinedTasksAndAMissingRootfsNamingTheField) {
  TaskSpec unconfined = spec_of(R"({"name": "t", "argv": ["/bin/true"], "seccomp": "unconfined"})");
  StartPolicy policy;
  auto refused = admit_spec(unconfined, policy);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().field, "seccomp");
  policy.allow_unconfined = true;
  EXPECT_TRUE(admit_spec(unconfined, policy).ok());

  TaskSpec missing = spec_of(R"({"name": "t", "argv": ["/bin/true"], "rootfs": "/no/such/dir"})");
  auto no_root = admit_spec(missing, policy);
  ASSERT_FALSE(no_root.ok());
  EXPECT_EQ(no_root.error().field, "rootfs");
}

TEST(StartPlan, OverlayDirectoriesAreMadeWithAnUpperEveryoneCanEnter) {
  TempDir dir;
  OverlayRoot o{
      "/layers", {"sha256/x"}, dir.path + "/upper", dir.path + "/work", dir.path + "/rootfs"};
  mode_t old = ::umask(0077);
  Status made = make_overlay_dirs(o);
  ::umask(old);
  ASSERT_TRUE(made.ok()) << made.error().str();
  struct stat st;
  ASSERT_EQ(::stat(o.upper.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_TRUE(path_exists(o.work));
  EXPECT_TRUE(path_exists(o.rootfs));
}

}  // namespace
}  // namespace weft::agent
