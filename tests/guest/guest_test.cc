// The system-test guest as test results: boots the guest once (tests/guest/run-guest.sh)
// with the freshly built .deb and reports each check the guest ran as one test.
// WEFT_SKIP_GUEST=1 skips the boot for quick local runs; CI never sets it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "testing/registry_server.h"
#include "tests/oci_test_image.h"

namespace {

struct CheckResult {
  bool pass = false;
  std::string detail;
  std::vector<std::string> log;
};

std::map<std::string, CheckResult>* g_results = nullptr;
std::string g_problem;  // why there are no results

class GuestBoot : public ::testing::Environment {
 public:
  void SetUp() override {
    if (std::getenv("WEFT_SKIP_GUEST")) return;
    if (geteuid() != 0) {
      g_problem = "the guest needs root to build its image";
      return;
    }
    std::string deb =
        std::getenv("WEFT_GUEST_DEB") ? std::getenv("WEFT_GUEST_DEB") : WEFT_DEFAULT_DEB;
    if (!weft::path_exists(deb)) {
      g_problem = "no package at " + deb + " (scripts/package.sh builds it)";
      return;
    }
    // The image check's registry: an image pushed here to a docker-registry on loopback,
    // whose storage the guest serves on its own loopback (the guest has no network).
    std::string registry;
    {
      weft::testing::RegistryServer reg;
      auto busybox = weft::read_file("/bin/busybox");
      if (!reg.error().empty() || !busybox.ok()) {
        g_problem = "no registry to push the guest's image to: " + reg.error();
        return;
      }
      using weft::testing::make_layer;
      std::string base =
          make_layer({{"bin", 'd', "", 0755},
                      {"bin/busybox", 'f', *busybox, 0755},
                      {"bin/sh", 'l', "busybox"},
                      {"bin/cat", 'l', "busybox"},
                      {"bin/sleep", 'l', "busybox"},
                      {"etc", 'd', "", 0755},
                      {"etc/passwd", 'f', "root:x:0:0::/:/bin/sh\napp:x:1234:1234::/:/bin/sh\n"},
                      {"etc/group", 'f', "root:x:0:\napp:x:1234:\n"}},
                     weft::oci::Compression::kGzip);
      std::string app = make_layer({{"marker", 'f', "served by the guest's registry\n"}},
                                   weft::oci::Compression::kGzip);
      weft::testing::push_image(reg, "team/app", "v1", {base, app},
                                {{"Entrypoint", {"/bin/sh", "-c"}},
                                 {"Cmd", {"cat /marker; sleep 3600"}},
                                 {"Env", {"PATH=/bin"}},
                                 {"User", "app"}});  // root tasks are off by default
      reg.stop();
      registry = "/var/tmp/weft-guest-registry-" + std::to_string(getpid());
      std::string copy = "cp -a '" + reg.storage() + "/storage' '" + registry + "'";
      if (std::system(copy.c_str()) != 0) {
        g_problem = "could not copy the registry's storage";
        return;
      }
    }
    std::string console = "/tmp/weft-guest-console-" + std::to_string(getpid()) + ".log";
    std::string cmd = "WEFT_GUEST_REGISTRY='" + registry + "' " + std::string(WEFT_GUEST_DIR) +
                      "/run-guest.sh '" + deb + "' '" + console + "'";
    int rc = std::system(cmd.c_str());
    (void)weft::remove_tree(registry);
    auto text = weft::read_file(console);
    ::unlink(console.c_str());
    if (!text.ok()) {
      g_problem = "guest run failed (exit " + std::to_string(rc) + "), no console log";
      return;
    }
    g_results = new std::map<std::string, CheckResult>();
    std::string last;
    bool done = false;
    for (const auto& line : weft::split(*text, '\n')) {
      auto at = line.find("WEFT-");
      if (at == std::string::npos) continue;
      std::string l = line.substr(at);
      if (l.rfind("WEFT-CHECK ", 0) == 0) {
        auto parts = weft::split(l.substr(11), ' ');
        if (parts.size() < 2) continue;
        CheckResult r;
        r.pass = parts[1] == "PASS";
        for (size_t i = 2; i < parts.size(); ++i) r.detail += (i > 2 ? " " : "") + parts[i];
        last = parts[0];
        (*g_results)[last] = r;
      } else if (l.rfind("WEFT-LOG ", 0) == 0 && !last.empty()) {
        (*g_results)[last].log.push_back(l.substr(9));
      } else if (l.rfind("WEFT-GUEST-DONE", 0) == 0) {
        done = true;
      } else if (l.rfind("WEFT-GUEST ", 0) == 0) {
        g_problem += l.substr(11) + " ";
      }
    }
    if (!done) g_problem += "the guest did not finish its checks (timeout or crash); ";
    std::printf("guest: %zu checks reported\n", g_results->size());
  }
};

[[maybe_unused]] auto* const kBoot = ::testing::AddGlobalTestEnvironment(new GuestBoot);

// Every check checks.sh runs, in order.
const char* const kChecks[] = {
    "install",
    "secrets-key-made",
    "units-active",
    "units-verify",
    "weftctl-agent",
    "socket-mode",
    "status-text",
    "profile-switch",
    "profile-drift-and-reapply",
    "profile-off-restores",
    "oom-killed",
    "pids-contained",
    "cpu-throttled",
    "limits-written",
    "restart-keeps-tasks",
    "kill-agent-collects-exit",
    "watchdog-restart",
    "hcs-active",
    "hcs-psi-trigger",
    "hcs-bpf-loaded",
    "hcs-liveness-ok",
    "hcs-oom-memcg",
    "hcs-liveness-failed",
    "pki-dir-private",
    "cluster-job-runs",
    "cluster-tls",
    "journald-fields",
    "logs-through-cp",
    "completion-installed",
    "cluster-profile",
    "metrics-endpoints",
    "cluster-job-stop",
    "secrets-sealed-at-rest",
    "cluster-image-job",
    "maintenance-reboot",
    "remove-keeps-state",
    "purge-removes-everything",
};

// A check the guest ran that kChecks does not name would pass unseen; refuse that.
TEST(GuestChecks, EveryReportedCheckIsListed) {
  if (std::getenv("WEFT_SKIP_GUEST")) GTEST_SKIP() << "WEFT_SKIP_GUEST is set";
  ASSERT_NE(g_results, nullptr) << g_problem;
  for (const auto& result : *g_results) {
    const std::string& name = result.first;
    bool listed = std::any_of(std::begin(kChecks), std::end(kChecks),
                              [&name](const char* c) { return name == c; });
    EXPECT_TRUE(listed) << "the guest reported check '" << name << "' which kChecks does not list";
  }
}

class Guest : public ::testing::TestWithParam<const char*> {};

TEST_P(Guest, Check) {
  if (std::getenv("WEFT_SKIP_GUEST")) GTEST_SKIP() << "WEFT_SKIP_GUEST is set";
  ASSERT_NE(g_results, nullptr) << g_problem;
  auto it = g_results->find(GetParam());
  ASSERT_NE(it, g_results->end()) << "check did not run in the guest. " << g_problem;
  std::string log;
  for (const auto& l : it->second.log) log += "\n  " + l;
  EXPECT_TRUE(it->second.pass) << it->second.detail << log;
}

INSTANTIATE_TEST_SUITE_P(InGuest, Guest, ::testing::ValuesIn(kChecks), [](const auto& p) {
  std::string n = p.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
