// Root tests of tasks that run from OCI images: weft-agent pulls from Debian's
// docker-registry on loopback (images assembled by the test), unpacks the layers and
// runs the task in an overlayfs root. Pull by tag and by digest, the image config's
// defaults, two tasks sharing one download, eviction that spares layers in use, a
// missing image failing the start with the reason, and an agent SIGKILLed mid-fetch.
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "testing/registry_server.h"
#include "tests/agent_harness.h"
#include "tests/oci_test_image.h"

namespace weft::testing {
namespace {

using json = nlohmann::json;

class AgentImages : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(path_exists("/bin/busybox"))
        << "busybox-static is not installed (scripts/setup.sh installs it)";
    reg_ = std::make_unique<RegistryServer>();
    ASSERT_TRUE(reg_->error().empty()) << reg_->error();
    busybox_ =
        make_layer({{"bin", 'd', "", 0755},
                    {"bin/busybox", 'f', *read_file("/bin/busybox"), 0755},
                    {"bin/sh", 'l', "busybox"},
                    {"etc", 'd', "", 0755},
                    {"etc/passwd", 'f', "root:x:0:0::/:/bin/sh\napp:x:1234:1234::/:/bin/sh\n"},
                    {"etc/group", 'f', "root:x:0:\napp:x:1234:\nextra:x:777:app\n"}},
                   oci::Compression::kGzip);
  }
  void TearDown() override {
    agent_.reset();
    reg_.reset();
  }
  // `more`: further [images] keys, then other tables.
  void start_agent(const std::string& more = "") {
    agent_ = std::make_unique<AgentHarness>();
    agent_->append_config("[images]\ninsecure_registries = [\"" + reg_->host() + "\"]\n" + more);
    agent_->start();
  }
  std::string ref(const std::string& repo_tag) const { return reg_->host() + "/" + repo_tag; }
  // An image: busybox and a layer with /marker holding `marker`.
  oci::Digest push_app(const std::string& repo, const std::string& tag, const std::string& marker,
                       const json& config = json::object()) {
    std::string app = make_layer({{"srv", 'd', "", 0755}, {"marker", 'f', marker + "\n"}},
                                 oci::Compression::kGzip);
    return push_image(*reg_, repo, tag, {busybox_, app}, config);
  }
  std::string logs(const std::string& id) {
    return agent_->call("task.logs", {{"id", id}, {"stream", "stdout"}}).value("data", "");
  }
  static bool ended(const json& t) {
    std::string s = t.value("state", "");
    return s == "exited" || s == "failed" || s == "stopped";
  }
  // A gzip layer of 16 MiB that does not compress (xorshift from `seed`): with
  // kSlowDownloads it takes about two seconds to fetch, so a test can act mid-download.
  static std::string noise_layer(uint64_t seed) {
    std::string noise(16u << 20, '\0');
    for (size_t i = 0; i + 8 <= noise.size(); i += 8) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      std::memcpy(&noise[i], &seed, 8);
    }
    return make_layer({{"noise", 'f', noise}}, oci::Compression::kGzip);
  }
  static constexpr const char* kSlowDownloads = "download_rate = \"8M\"\n";
  // Runs `action` once task `id` is part-way through its download (more than the busybox
  // layer and 1 MiB done, not all of it); false if the download ended first.
  bool when_mid_fetch(const std::string& id, const std::function<void()>& action) {
    for (int i = 0; i < 20000; ++i) {
      auto t = agent_->try_call("task.show", {{"id", id}});
      if (t.ok() && t->value("state", "") != "fetching") {
        ADD_FAILURE() << "no longer fetching: " << t->dump();
        return false;
      }
      if (t.ok() && t->contains("fetch")) {
        uint64_t done = (*t)["fetch"]["bytes_done"].get<uint64_t>();
        uint64_t total = (*t)["fetch"]["bytes_total"].get<uint64_t>();
        if (done > busybox_.size() + (1u << 20) && done < total) {
          action();
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  std::unique_ptr<RegistryServer> reg_;
  std::unique_ptr<AgentHarness> agent_;
  std::string busybox_;
};

TEST_F(AgentImages, ATaskRunsFromItsImageWithTheConfigsDefaults) {
  json config{{"Entrypoint", {"/bin/sh", "-c"}},
              {"Cmd",
               {"cat /marker; id -u; id -G; echo $FROM_IMAGE $OVERRIDE; pwd; "
                "touch /written 2>/dev/null || echo read-only"}},
              {"Env", {"FROM_IMAGE=yes", "OVERRIDE=image", "PATH=/bin"}},
              {"WorkingDir", "/srv"},
              {"User", "app"}};
  oci::Digest m = push_app("team/app", "v1", "version one", config);
  start_agent();
  json r = agent_->call(
      "task.run",
      {{"name", "img"}, {"image", ref("team/app:v1")}, {"env", {{"OVERRIDE", "spec"}}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  ASSERT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "version one\n1234\n1234 777\nyes spec\n/srv\nread-only\n");
  EXPECT_EQ(t["image_manifest"], m.str());
  // The task's writable layer is its own: the image's layers never change, and it goes
  // with the task.
  std::string task_dir = agent_->dir() + "/state/tasks/" + id;
  EXPECT_TRUE(path_exists(task_dir + "/upper"));
  agent_->call("task.remove", {{"id", id}});
  EXPECT_FALSE(path_exists(task_dir));

  // By digest, argv from the spec, as root: the write lands in its upper directory only.
  std::string by_digest = ref("team/app@" + m.str());
  r = agent_->call("task.run",
                   {{"name", "img2"},
                    {"image", by_digest},
                    {"user", "0"},
                    {"argv", {"/bin/sh", "-c", "echo x > /written && cat /written /marker"}}});
  id = r.value("id", "");
  t = agent_->wait_task(id, ended, 30000);
  ASSERT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "x\nversion one\n");
  EXPECT_EQ(read_file(agent_->dir() + "/state/tasks/" + id + "/upper/written").value_or(""), "x\n");
  json ls = agent_->call("image.ls", json::object());
  ASSERT_EQ(ls["images"].size(), 1u) << ls.dump();
  EXPECT_EQ(ls["blob_downloads"], 2);  // two layers, fetched once
  auto layers = list_dir(agent_->dir() + "/state/images/layers/sha256");
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(layers->size(), 2u);
  for (const auto& l : *layers)
    EXPECT_FALSE(path_exists(agent_->dir() + "/state/images/layers/sha256/" + l + "/written"));
}

TEST_F(AgentImages, TwoTasksOfOneImageShareOneDownload) {
  push_app("team/shared", "v1", "shared");
  start_agent();
  std::vector<std::string> ids;
  for (const char* name : {"a", "b"}) {
    json r = agent_->call("task.run", {{"name", name},
                                       {"image", ref("team/shared:v1")},
                                       {"argv", {"/bin/sh", "-c", "cat /marker; sleep 100"}}});
    ids.push_back(r.value("id", ""));
    ASSERT_FALSE(ids.back().empty()) << r.dump();
  }
  for (const auto& id : ids) {
    agent_->wait_task(
        id, [&](const json&) { return logs(id) == "shared\n"; }, 30000);
    EXPECT_EQ(logs(id), "shared\n");
  }
  json ls = agent_->call("image.ls", json::object());
  EXPECT_EQ(ls["blob_downloads"], 2) << ls.dump();  // not four
  ASSERT_EQ(ls["images"].size(), 1u);
  EXPECT_EQ(ls["images"][0]["used_by"].size(), 2u);
  // In use: not removable.
  auto rm = agent_->try_call("image.rm", {{"image", ref("team/shared:v1")}});
  EXPECT_FALSE(rm.ok());
  for (const auto& id : ids) {
    agent_->call("task.stop", {{"id", id}, {"grace", 0}});
    agent_->wait_state(id, "stopped");
  }
  json pruned = agent_->call("image.prune", json::object());
  EXPECT_EQ(pruned["removed"].size(), 1u) << pruned.dump();
  EXPECT_EQ(agent_->call("image.ls", json::object())["images"].size(), 0u);
}

TEST_F(AgentImages, EvictionSparesTheLayersATaskUses) {
  push_app("team/held", "v1", "held");
  // A second image with layers of its own (another busybox copy differs by a file).
  std::string other = make_layer({{"bin", 'd', "", 0755},
                                  {"bin/busybox", 'f', *read_file("/bin/busybox"), 0755},
                                  {"bin/sh", 'l', "busybox"},
                                  {"other", 'f', "other\n"}},
                                 oci::Compression::kGzip);
  push_image(*reg_, "team/other", "v1", {other}, json::object());
  start_agent("cache_max = \"3M\"\n");  // less than the two images, more than any one layer
  json r = agent_->call("task.run", {{"name", "held"},
                                     {"image", ref("team/held:v1")},
                                     {"argv", {"/bin/sh", "-c", "cat /marker; sleep 100"}}});
  std::string id = r.value("id", "");
  agent_->wait_task(
      id, [&](const json&) { return logs(id) == "held\n"; }, 30000);
  ASSERT_EQ(logs(id), "held\n");
  // Pulling another image takes the cache over its limit: the unused image goes, the
  // running task's layers stay.
  json pulled = agent_->call("image.pull", {{"image", ref("team/other:v1")}, {"wait", true}});
  ASSERT_TRUE(pulled.contains("manifest")) << pulled.dump();
  json ls;
  for (int i = 0; i < 100; ++i) {
    ls = agent_->call("image.ls", json::object());
    if (ls["evictions"].get<int>() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(ls["evictions"].get<int>(), 1) << ls.dump();
  ASSERT_EQ(ls["images"].size(), 1u) << ls.dump();
  EXPECT_EQ(ls["images"][0]["refs"][0], ref("team/held:v1"));
  json t = agent_->call("task.show", {{"id", id}});
  EXPECT_EQ(t["state"], "running");
  // Stopped, the task holds nothing: the next pull may evict its image.
  agent_->call("task.stop", {{"id", id}, {"grace", 0}});
  agent_->wait_state(id, "stopped");
  agent_->call("image.pull", {{"image", ref("team/other:v1")}, {"wait", true}});
  auto held_listed = [&] {
    for (const auto& img : ls["images"])
      if (img["refs"][0] == ref("team/held:v1")) return true;
    return false;
  };
  for (int i = 0; i < 100; ++i) {
    ls = agent_->call("image.ls", json::object());
    if (!held_listed()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(held_listed()) << ls.dump();
  EXPECT_LE(ls["size"].get<uint64_t>(), 3u << 20) << ls.dump();  // back under the limit
}

TEST_F(AgentImages, HostPathsTmpfsAndFilesFromTheSpec) {
  push_app("team/vol", "v1", "vol");
  std::string data = std::filesystem::temp_directory_path() / ("weft-vol-" + random_hex(4));
  ASSERT_TRUE(mkdir_p(data + "/allowed").ok());
  ASSERT_TRUE(mkdir_p(data + "/outside").ok());
  ASSERT_TRUE(write_file(data + "/allowed/hello", "hello\n").ok());
  ASSERT_EQ(::symlink((data + "/outside").c_str(), (data + "/allowed/escape").c_str()), 0);
  start_agent("[volumes]\nallowed_host_paths = [\"" + data + "/allowed\"]\n");
  json spec{{"name", "vol"},
            {"image", ref("team/vol:v1")},
            {"user", "app"},
            {"mounts",
             {{{"source", data + "/allowed"}, {"target", "/data"}},
              {{"type", "tmpfs"}, {"target", "/scratch"}, {"size", "1M"}}}},
            {"files", {{{"path", "/etc/app/secret"}, {"content", "s3cret"}}}},
            {"argv",
             {"/bin/sh", "-c",
              "cat /data/hello; (echo x > /data/y) 2>/dev/null || echo ro; echo t > /scratch/t && "
              "cat /scratch/t; cat /etc/app/secret; echo; stat -c '%a %u' /etc/app/secret; "
              "(echo z > /etc/app/secret) 2>/dev/null || echo ro2; grep -c weft-files "
              "/proc/self/mountinfo"}}};
  json r = agent_->call("task.run", spec);
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  EXPECT_EQ(logs(id), "hello\nro\nt\ns3cret\n400 1234\nro2\n0\n") << t.dump();
  EXPECT_FALSE(path_exists(data + "/allowed/y"));
  // Nothing of the file's content on the machine's disk beside the spec.
  EXPECT_FALSE(path_exists(agent_->dir() + "/state/tasks/" + id + "/upper/.weft-files"));

  // A path the machine does not allow, and one that leaves the allowed tree by a link.
  for (const std::string& bad : {data + "/outside", data + "/allowed/escape"}) {
    json b = spec;
    b["name"] = "bad";
    b["mounts"] = {{{"source", bad}, {"target", "/data"}}};
    auto refused = agent_->try_call("task.run", b);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("mounts[0].source"), std::string::npos)
        << refused.error().str();
  }
  (void)remove_tree(data);
}

// The packaged unit runs the agent with UMask=0027. What it makes for an image (each
// layer's root, the directories a tar implies, the task's upper directory, which is the
// merged root) must not take it: a task's user must be able to enter its own / and read
// the image. (Found in the QEMU guest: "weft-init: cannot change to /".)
TEST_F(AgentImages, TheAgentsUmaskDoesNotLockTheTasksUserOutOfItsImage) {
  std::string tool = make_layer({{"opt/tool/hello", 'f', "implied parents\n"}},  // no opt/
                                oci::Compression::kGzip);
  std::string app = make_layer({{"marker", 'f', "umask\n"}}, oci::Compression::kGzip);
  push_image(*reg_, "team/umask", "v1", {busybox_, tool, app},
             {{"Env", {"PATH=/bin"}}, {"User", "app"}});
  mode_t before = ::umask(027);
  start_agent();
  ::umask(before);
  json r = agent_->call("task.run", {{"name", "umask"},
                                     {"image", ref("team/umask:v1")},
                                     {"argv",
                                      {"/bin/sh", "-c",
                                       "cd / && cat /marker /opt/tool/hello && id -u && "
                                       "stat -c %a / /opt"}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  ASSERT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "umask\nimplied parents\n1234\n755\n755\n");
}

TEST_F(AgentImages, AMountTargetThroughAnImagesSymlinkIsRefused) {
  // The image points /mnt at the host-looking /etc: a mount there must not follow it.
  std::string evil = make_layer({{"mnt", 'l', "/etc"}}, oci::Compression::kGzip);
  push_image(*reg_, "team/evil", "v1", {busybox_, evil}, json::object());
  start_agent();
  json r = agent_->call("task.run", {{"name", "evil"},
                                     {"image", ref("team/evil:v1")},
                                     {"mounts", {{{"type", "tmpfs"}, {"target", "/mnt/x"}}}},
                                     {"argv", {"/bin/sh", "-c", "echo ran"}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t.value("reason", "").find("symlinks are refused"), std::string::npos) << t.dump();
  EXPECT_EQ(logs(id), "");
  EXPECT_FALSE(path_exists("/etc/x"));
}

TEST_F(AgentImages, AnImageThatCannotBeFetchedFailsTheStartWithTheReason) {
  start_agent();
  json r = agent_->call("task.run", {{"name", "missing"}, {"image", ref("team/none:v1")}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty());
  json t = agent_->wait_task(id, ended, 30000);
  EXPECT_EQ(t["state"], "failed");
  std::string reason = t.value("reason", "");
  EXPECT_NE(reason.find("image " + ref("team/none:v1")), std::string::npos) << reason;
  EXPECT_NE(reason.find("404"), std::string::npos) << reason;
  EXPECT_TRUE(agent_->task_cgroups().empty());
}

// Issue 32: an image the agent refuses for what it is (here 129 layers, past what one
// overlay mount stacks) fails the start before anything runs, marked as a refusal that
// would be the same on any machine (the control plane then holds the index with the
// reason instead of pulling the image on machine after machine); an image that cannot
// be fetched (above) is not marked so.
TEST_F(AgentImages, AnImageWithTooManyLayersIsRefusedAsItWouldBeAnywhere) {
  start_agent();
  std::string layer = make_layer({{"f", 'f', "x"}}, oci::Compression::kGzip);
  oci::Digest ld = reg_->push_blob("team/tall", layer);
  std::string cfg = json{{"architecture", oci::host_platform().architecture},
                         {"os", "linux"},
                         {"rootfs", {{"type", "layers"}, {"diff_ids", json::array()}}}}
                        .dump();
  oci::Digest cd = reg_->push_blob("team/tall", cfg);
  json layers = json::array();
  for (size_t i = 0; i < oci::kMaxLayers + 1; ++i)
    layers.push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                      {"digest", ld.str()},
                      {"size", layer.size()}});
  json m{{"schemaVersion", 2},
         {"mediaType", oci::kOciManifest},
         {"config", {{"mediaType", oci::kOciConfig}, {"digest", cd.str()}, {"size", cfg.size()}}},
         {"layers", layers}};
  reg_->push_manifest("team/tall", "v1", m.dump(), oci::kOciManifest);
  json r = agent_->call("task.run", {{"name", "tall"}, {"image", ref("team/tall:v1")}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  EXPECT_EQ(t["state"], "failed");
  std::string reason = t.value("reason", "");
  EXPECT_NE(reason.find("more than " + std::to_string(oci::kMaxLayers) + " layers"),
            std::string::npos)
      << reason;
  EXPECT_EQ(t.value("failed_in_setup", false), true) << t.dump(2);
  json missing = agent_->call("task.run", {{"name", "missing"}, {"image", ref("team/none:v1")}});
  json m2 = agent_->wait_task(missing.value("id", ""), ended, 30000);
  EXPECT_EQ(m2["state"], "failed");
  EXPECT_EQ(m2.value("failed_in_setup", false), false) << m2.dump(2);
}

TEST_F(AgentImages, AnAgentKilledMidFetchResumesAndNeverUsesAPartialBlob) {
  // A large incompressible layer fetched at a paced rate, so the kill lands mid-download.
  std::string big = noise_layer(88172645463325252ull);
  std::string app = make_layer({{"marker", 'f', "resumed\n"}}, oci::Compression::kGzip);
  push_image(*reg_, "team/big", "v1", {busybox_, big, app}, json::object());
  start_agent(kSlowDownloads);
  json r = agent_->call(
      "task.run",
      {{"name", "big"}, {"image", ref("team/big:v1")}, {"argv", {"/bin/sh", "-c", "cat /marker"}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty());
  std::string store = agent_->dir() + "/state/images";
  oci::Digest big_d = oci::digest_of(big);
  // Frozen the moment it is seen mid-download (so that a test starved of the CPU for a
  // while cannot see the download end between the look and the kill), then killed.
  ASSERT_TRUE(when_mid_fetch(id, [&] {
    ::kill(agent_->pid(), SIGSTOP);
    // Nothing partial is content: the big blob is not in blobs/ yet.
    EXPECT_FALSE(path_exists(store + "/blobs/sha256/" + big_d.hex));
    agent_->kill9();
  })) << "the download finished before the agent could be killed";
  agent_->start();
  json t = agent_->wait_task(id, ended, 60000);
  ASSERT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "resumed\n");
  EXPECT_TRUE(path_exists(store + "/blobs/sha256/" + big_d.hex));
  EXPECT_FALSE(path_exists(store + "/partial/sha256-" + big_d.hex));
}

// Issue 32: a layer of a few hundred KB that unpacks to more than the agent's disk.
// The unpack stops short of the reserve and removes what it wrote, so the agent's own
// state is still written; the layer is refused for a while, across a restart, instead
// of being fetched and unpacked again and again; `image prune` forgets the refusal.
TEST_F(AgentImages, AnImageThatWouldFillTheDiskIsRefusedAndNotPulledAgain) {
  std::string bomb =
      make_layer({{"bomb", 'f', std::string(150u << 20, 'b')}}, oci::Compression::kGzip);
  ASSERT_LT(bomb.size(), 1u << 20);
  push_image(*reg_, "team/bomb", "v1", {busybox_, bomb}, json::object());
  oci::Digest bomb_d = oci::digest_of(bomb);
  agent_ = std::make_unique<AgentHarness>();
  agent_->state_on_tmpfs(96u << 20);
  agent_->append_config("[images]\ninsecure_registries = [\"" + reg_->host() +
                        "\"]\nreserve = \"24M\"\n");
  agent_->start();
  std::string store = agent_->dir() + "/state/images";
  auto free_bytes = [&] {
    struct statvfs sv {};
    EXPECT_EQ(::statvfs(store.c_str(), &sv), 0);
    return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  };
  auto run_bomb = [&] {
    json r = agent_->call(
        "task.run",
        {{"name", "bomb"}, {"image", ref("team/bomb:v1")}, {"argv", {"/bin/sh", "-c", "true"}}});
    std::string id = r.value("id", "");
    EXPECT_FALSE(id.empty()) << r.dump();
    return agent_->wait_task(id, ended, 60000);
  };
  json t = run_bomb();
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t.value("reason", "").find("reserve"), std::string::npos) << t.dump();
  EXPECT_GE(free_bytes(), 24u << 20) << "the reserve was taken";
  EXPECT_FALSE(path_exists(store + "/layers/sha256/" + bomb_d.hex));
  auto tmp = list_dir(store + "/tmp");
  ASSERT_TRUE(tmp.ok());
  for (const auto& n : *tmp)  // (busybox may still be unpacking)
    EXPECT_NE(n.rfind(bomb_d.hex.substr(0, 16), 0), 0u) << "the partial layer stayed: " << n;
  // The agent's own state is still written: a task runs and is recorded.
  json ok = agent_->call("task.run", {{"name", "after"}, {"argv", {"/bin/sh", "-c", "echo fine"}}});
  std::string ok_id = ok.value("id", "");
  ASSERT_FALSE(ok_id.empty()) << ok.dump();
  EXPECT_EQ(agent_->wait_task(ok_id, ended, 15000)["state"], "exited");
  json ls = agent_->call("image.ls", json::object());
  ASSERT_EQ(ls["refused"].size(), 1u) << ls.dump();
  EXPECT_EQ(ls["refused"][0]["layer"], bomb_d.str());
  // After a restart the refusal holds: nothing fetched, nothing unpacked, the reason told.
  agent_->kill9();
  agent_->start();
  EXPECT_EQ(agent_->wait_task(ok_id, ended, 15000)["state"], "exited") << "the record survived";
  t = run_bomb();
  EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_NE(t.value("reason", "").find("was refused"), std::string::npos) << t.dump();
  ls = agent_->call("image.ls", json::object());
  EXPECT_EQ(ls["blob_downloads"], 0) << "the refused image was fetched again: " << ls.dump();
  EXPECT_GE(free_bytes(), 24u << 20);
  // The operator makes room and prunes: the refusal is forgotten.
  agent_->call("image.prune", json::object());
  EXPECT_TRUE(agent_->call("image.ls", json::object())["refused"].empty());
}

// A package (a tarball by URL and SHA-256): here the registry serves the bytes at a
// plain blob URL, so the agent fetches it as any http server's file.
TEST_F(AgentImages, APackageIsTheTasksRootOrMountedBesideAnImage) {
  push_app("team/base", "v1", "base");
  oci::Digest root_pkg = reg_->push_blob("team/pkg", busybox_);
  std::string tool = make_layer({{"bin", 'd', "", 0755}, {"bin/hello", 'f', "hello from tool\n"}},
                                oci::Compression::kZstd);
  oci::Digest tool_pkg = reg_->push_blob("team/pkg", tool);
  auto url = [&](const oci::Digest& d) {
    return "http://" + reg_->host() + "/v2/team/pkg/blobs/" + d.str();
  };
  start_agent();
  // image.pull takes an image, a package or both; bad parameters name the field.
  for (const auto& [params, field] : std::vector<std::pair<json, std::string>>{
           {json::object(), "image"},
           {{{"image", "no-registry"}}, "image"},
           {{{"image", 7}}, "image"},
           {{{"package", {{"url", url(tool_pkg)}, {"sha256", "abc"}}}}, "package.sha256"},
           {{{"package", {{"url", "file:///etc/shadow"}, {"sha256", tool_pkg.hex}}}},
            "package.url"}}) {
    auto bad = agent_->try_call("image.pull", params);
    ASSERT_FALSE(bad.ok()) << params.dump();
    EXPECT_NE(bad.error().str().find(field), std::string::npos) << bad.error().str();
  }
  json pulled = agent_->call(
      "image.pull",
      {{"package", {{"url", url(tool_pkg)}, {"sha256", tool_pkg.hex}}}, {"wait", true}});
  EXPECT_EQ(pulled["package"], tool_pkg.str()) << pulled.dump();
  // The package is the root: users resolve in its /etc/passwd; the root is writable
  // for the task only (its own upper directory).
  json r = agent_->call(
      "task.run", {{"name", "pkgroot"},
                   {"package", {{"url", url(root_pkg)}, {"sha256", root_pkg.hex}}},
                   {"user", "app"},
                   {"argv", {"/bin/sh", "-c", "id -u; (echo w > /w) 2>/dev/null || echo ro"}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty()) << r.dump();
  json t = agent_->wait_task(id, ended, 30000);
  EXPECT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "1234\nro\n") << t.dump();  // not root: "/" is not its to write
  // Beside an image, read-only at its target (zstd, found from its first bytes).
  r = agent_->call(
      "task.run",
      {{"name", "pkgbeside"},
       {"image", ref("team/base:v1")},
       {"package", {{"url", url(tool_pkg)}, {"sha256", tool_pkg.hex}, {"target", "/opt/tool"}}},
       {"argv",
        {"/bin/sh", "-c",
         "cat /marker /opt/tool/bin/hello; (echo x > /opt/tool/x) 2>/dev/null || "
         "echo ro; sleep 100"}}});
  std::string beside = r.value("id", "");
  ASSERT_FALSE(beside.empty()) << r.dump();
  agent_->wait_task(
      beside, [&](const json&) { return logs(beside) == "base\nhello from tool\nro\n"; }, 30000);
  EXPECT_EQ(logs(beside), "base\nhello from tool\nro\n");
  // The record survives the agent (cache.json): packages listed, the running task's held.
  agent_->kill9();
  agent_->start();
  json ls = agent_->call("image.ls", json::object());
  int packages = 0;
  for (const auto& img : ls["images"]) {
    if (img["kind"] != "package") continue;
    ++packages;
    if (img["digest"] == tool_pkg.str()) {
      EXPECT_EQ(img["refs"][0], url(tool_pkg));
      EXPECT_EQ(img["used_by"].size(), 1u) << img.dump();
    }
  }
  EXPECT_EQ(packages, 2) << ls.dump();
  // In use: not removable, by URL or digest.
  EXPECT_FALSE(agent_->try_call("image.rm", {{"image", url(tool_pkg)}}).ok());
  // Bytes that do not hash to the spec's SHA-256 are never used. (A SHA-256 already here
  // is used whatever the URL: the bytes are what the spec pins.)
  std::string other = oci::digest_of("not the tool's bytes").hex;
  r = agent_->call("task.run", {{"name", "pkgbad"},
                                {"package", {{"url", url(tool_pkg)}, {"sha256", other}}},
                                {"argv", {"/bin/true"}}});
  std::string bad = r.value("id", "");
  ASSERT_FALSE(bad.empty()) << r.dump();
  t = agent_->wait_task(bad, ended, 30000);
  EXPECT_EQ(t["state"], "failed");
  EXPECT_NE(t.value("reason", "").find("package " + url(tool_pkg)), std::string::npos) << t.dump();
  std::string store = agent_->dir() + "/state/images";
  EXPECT_FALSE(path_exists(store + "/blobs/sha256/" + other));
  EXPECT_FALSE(path_exists(store + "/layers/sha256/" + other));
  agent_->call("task.stop", {{"id", beside}, {"grace", 0}});
  agent_->wait_state(beside, "stopped");
  json pruned = agent_->call("image.prune", json::object());
  EXPECT_EQ(pruned["removed"].size(), 3u) << pruned.dump();  // base image and two packages
  EXPECT_EQ(agent_->call("image.ls", json::object())["images"].size(), 0u);
  EXPECT_TRUE(agent_->task_cgroups().empty());  // nothing left running
}

// The registry dies mid-download while the agent runs: the agent retries with backoff
// and resumes where the bytes stopped (a Range request), never from zero.
TEST_F(AgentImages, ARegistryDownMidDownloadIsResumedByTheRunningAgent) {
  std::string big = noise_layer(0x9E3779B97F4A7C15ull);
  std::string app = make_layer({{"marker", 'f', "after the outage\n"}}, oci::Compression::kGzip);
  push_image(*reg_, "team/outage", "v1", {busybox_, big, app}, json::object());
  start_agent(kSlowDownloads);
  json r = agent_->call("task.run", {{"name", "outage"},
                                     {"image", ref("team/outage:v1")},
                                     {"argv", {"/bin/sh", "-c", "cat /marker"}}});
  std::string id = r.value("id", "");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(when_mid_fetch(id, [&] { reg_->stop(); }))
      << "the download finished before the registry could be stopped";
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  // Still fetching while the registry is away: not failed at the first refusal.
  EXPECT_EQ(agent_->call("task.show", {{"id", id}})["state"], "fetching");
  reg_->start();
  ASSERT_TRUE(reg_->error().empty()) << reg_->error();
  json t = agent_->wait_task(id, ended, 60000);
  ASSERT_EQ(t["state"], "exited") << t.dump();
  EXPECT_EQ(logs(id), "after the outage\n");
  json ls = agent_->call("image.ls", json::object());
  EXPECT_EQ(ls["blob_downloads"], 3) << ls.dump();
  // Resumed, not restarted: no more bytes came than the layers hold.
  EXPECT_LE(ls["downloaded_bytes"].get<uint64_t>(), busybox_.size() + big.size() + app.size())
      << ls.dump();
}

}  // namespace
}  // namespace weft::testing
