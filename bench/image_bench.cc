// Tasks from an OCI image (issue 17), side by side with crun on an unpacked bundle.
//
//   sudo build/bench/image_bench [--layer-mb N] [--layers N] [--cold N] [--warm N]
//                                [--burst N]
//
// A registry (Debian's docker-registry) on loopback serves an image of a busybox layer
// and `layers` layers of `layer-mb` MiB of incompressible bytes each (~100 MB by
// default). Each start is timed until the task's own program has run (it writes to a
// fifo the benchmark waits on, bind-mounted into the task), with the same CLI wrapper
// on both sides:
//  - cold: `weftctl task run` of the image with an empty cache (fetch + verify +
//    unpack + start);
//  - warm: the same with the image cached;
//  - crun: `crun run -d` of a bundle whose rootfs holds the same files, unpacked
//    beforehand (crun has no fetch: what it starts from is what weft's warm start has);
//  - `burst` tasks of the image at once on an empty cache: one download per layer, the
//    time until every task ran, and the pull's throughput against the loopback link's
//    (the same blobs fetched by curl, one after another).
// Needs root. Removes every task, cgroup, container and file it makes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "agent/image/layer.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/paths.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "tests/oci_test_image.h"

using json = nlohmann::json;
using namespace weft;
using namespace weft::bench;

namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "image_bench: %s\n", m.c_str());
  std::exit(1);
}

std::string noise(size_t bytes, uint64_t seed) {
  std::string s(bytes, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= s.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&s[i], &x, 8);
  }
  return s;
}

class ImageBench {
 public:
  ImageBench() {
    dir_ = std::filesystem::temp_directory_path() / ("weft-image-bench-" + random_hex(4));
    (void)mkdir_p(dir_ + "/fifos");
    chmod((dir_ + "/fifos").c_str(), 0777);
    cg_root_ =
        HostPaths().cgroup2_mount().value_or("/sys/fs/cgroup") + "/weft-bench-" + random_hex(4);
    sock_ = dir_ + "/agent.sock";
  }
  ~ImageBench() {
    stop_agent();
    remove_cgroup_tree(cg_root_);
    (void)remove_tree(dir_);
  }

  void make_image(int layers, size_t layer_mb) {
    if (!reg_.error().empty()) die(reg_.error());
    auto bb = read_file("/bin/busybox");
    auto marker = read_file(START_MARKER_BIN);
    if (!bb.ok() || !marker.ok()) die("needs /bin/busybox (busybox-static) and start_marker");
    blobs_.push_back(testing::make_layer({{"bin", 'd', "", 0755},
                                          {"bin/busybox", 'f', *bb, 0755},
                                          {"bin/sh", 'l', "busybox"},
                                          {"bin/start_marker", 'f', *marker, 0755},
                                          {"fifos", 'd', "", 0777}},
                                         oci::Compression::kGzip));
    for (int i = 0; i < layers; ++i)
      blobs_.push_back(testing::make_layer(
          {{"data" + std::to_string(i), 'f', noise(layer_mb << 20, static_cast<uint64_t>(i + 1))}},
          oci::Compression::kGzip));
    for (const auto& b : blobs_) image_bytes_ += b.size();
    testing::push_image(reg_, "bench/app", "v1", blobs_, json::object());
    image_ = reg_.host() + "/bench/app:v1";
    // crun's bundle: the same files, unpacked once.
    std::string rootfs = dir_ + "/bundle/rootfs";
    (void)mkdir_p(rootfs);
    for (const auto& b : blobs_) {
      std::string f = dir_ + "/layer.tgz";
      (void)write_file(f, b);
      auto r = image::unpack_layer_confined(f, rootfs, oci::Compression::kGzip);
      if (!r.ok()) die("unpack for crun: " + r.error().str());
    }
    ::unlink((dir_ + "/layer.tgz").c_str());
  }

  void start_agent() {
    (void)write_file(
        dir_ + "/agent.toml",
        "socket = \"" + sock_ + "\"\nstate_dir = \"" + dir_ + "/state\"\ncgroup_root = \"" +
            cg_root_ + "\"\ninit_path = \"" + WEFT_INIT_BIN +
            "\"\nmetrics_listen = \"\"\n[images]\ninsecure_registries = [\"" + reg_.host() +
            "\"]\n[volumes]\nallowed_host_paths = [\"" + dir_ + "/fifos\"]\n");
    agent_ = start_agent_process(WEFT_AGENT_BIN, dir_, sock_);
    if (agent_ < 0) die("agent did not start; see " + dir_ + "/agent.log");
  }
  void stop_agent() { kill_process(agent_); }
  json call(const std::string& m, const json& p) {
    auto c = rpc::Client::connect(sock_);
    if (!c.ok()) die(c.error().str());
    auto r = (*c)->call(m, p, 600'000);
    if (!r.ok()) die(m + ": " + r.error().str());
    return *r;
  }
  // Stops and removes every task, then (cold) empties the image cache.
  void clear(bool cache) {
    json ls = call("task.ls", json::object());
    for (const auto& t : ls["tasks"]) call("task.stop", {{"id", t["id"]}, {"grace", 0}});
    for (int i = 0; i < 3000; ++i) {
      bool live = false;
      json now = call("task.ls", json::object());
      for (const auto& t : now["tasks"]) {
        std::string st = t["state"];
        live |= !(st == "exited" || st == "failed" || st == "stopped");
      }
      if (!live) break;
      usleep(10000);
    }
    json ended = call("task.ls", json::object());
    for (const auto& t : ended["tasks"]) call("task.remove", {{"id", t["id"]}});
    if (cache) call("image.prune", json::object());
  }

  // The wrapper both CLIs run under (crun needs the cgroup2 tree at /sys/fs/cgroup).
  std::vector<std::string> wrapped(std::vector<std::string> cmd) {
    cmd.insert(cmd.begin(), {"unshare", "-m", dir_ + "/crun-ns.sh"});
    return cmd;
  }
  std::vector<std::string> weft_cmd(const std::string& name) {
    json spec{
        {"name", name},
        {"image", image_},
        {"user", "65534"},
        {"namespaces", {{"network", "private"}}},
        {"mounts", {{{"source", dir_ + "/fifos"}, {"target", "/fifos"}, {"readonly", false}}}},
        {"argv", {"/bin/start_marker", "/fifos/" + name}}};
    std::string f = dir_ + "/spec-" + name + ".json";
    (void)write_file(f, spec.dump());
    return wrapped({WEFTCTL_BIN, "--agent", sock_, "task", "run", "--spec", f});
  }
  void crun_setup() {
    (void)write_file(dir_ + "/crun-ns.sh",
                     "#!/bin/sh\nmount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup "
                     "&& exec \"$@\"\n");
    chmod((dir_ + "/crun-ns.sh").c_str(), 0755);
    std::string b = dir_ + "/bundle";
    if (system(("cd " + b + " && crun spec >/dev/null").c_str()) != 0)
      die("crun spec failed (is crun installed?)");
    auto cfg = json::parse(*read_file(b + "/config.json"));
    cfg["process"]["terminal"] = false;
    cfg["process"].erase("rlimits");
    cfg["process"]["user"] = {{"uid", 65534}, {"gid", 65534}};
    cfg["process"]["noNewPrivileges"] = true;
    cfg["root"] = {{"path", b + "/rootfs"}, {"readonly", false}};
    cfg["linux"].erase("resources");
    cfg["linux"].erase("cgroupsPath");
    json mounts = json::array();
    for (const auto& m : cfg["mounts"]) {
      std::string d = m["destination"];
      if (d == "/proc" || d == "/dev" || d == "/dev/pts" || d == "/dev/shm") mounts.push_back(m);
    }
    mounts.push_back({{"destination", "/fifos"},
                      {"type", "bind"},
                      {"source", dir_ + "/fifos"},
                      {"options", {"rbind", "nosuid", "nodev"}}});
    cfg["mounts"] = mounts;
    crun_config_ = cfg;
  }
  std::vector<std::string> crun_cmd(const std::string& id) {
    std::string b = dir_ + "/bundles/" + id;
    (void)mkdir_p(b);
    json cfg = crun_config_;
    cfg["process"]["args"] = {"/bin/start_marker", "/fifos/" + id};
    (void)write_file(b + "/config.json", cfg.dump());
    crun_ids_.push_back(id);
    return wrapped({"crun", "--root", dir_ + "/crun-state", "run", "-d", "--bundle", b, id});
  }
  void crun_clear() {
    for (const auto& id : crun_ids_)
      (void)timed_exec(wrapped({"crun", "--root", dir_ + "/crun-state", "delete", "-f", id}));
    crun_ids_.clear();
  }

  // Runs every command at once; the ms until each one's program wrote to its fifo.
  std::vector<double> until_running(const std::vector<std::vector<std::string>>& cmds,
                                    const std::vector<std::string>& names) {
    std::vector<int> fds;
    for (const auto& n : names) {
      std::string f = dir_ + "/fifos/" + n;
      ::unlink(f.c_str());
      if (mkfifo(f.c_str(), 0666) < 0) die("mkfifo");
      chmod(f.c_str(), 0666);
      fds.push_back(open(f.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    }
    std::vector<double> out(cmds.size(), -1);
    std::vector<pid_t> pids(cmds.size());
    uint64_t t0 = now_monotonic_us();
    for (size_t i = 0; i < cmds.size(); ++i) {
      std::vector<char*> a;
      for (const auto& x : cmds[i]) a.push_back(const_cast<char*>(x.c_str()));
      a.push_back(nullptr);
      pids[i] = fork();
      if (pids[i] == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        execvp(a[0], a.data());
        _exit(127);
      }
    }
    size_t left = cmds.size();
    while (left > 0 && now_monotonic_us() - t0 < 600'000'000) {
      std::vector<pollfd> pf;
      for (int fd : fds) pf.push_back({fd, POLLIN, 0});
      if (poll(pf.data(), pf.size(), 100) <= 0) continue;
      for (size_t i = 0; i < pf.size(); ++i)
        if ((pf[i].revents & POLLIN) && out[i] < 0) {
          out[i] = ms_since(t0);
          --left;
          fds[i] = -fds[i] - 1;  // polled no more
          close(-fds[i] - 1);
        }
    }
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i] >= 0) close(fds[i]);
    for (const auto& n : names) ::unlink((dir_ + "/fifos/" + n).c_str());
    return out;
  }
  double one(const std::vector<std::string>& cmd, const std::string& name) {
    double ms = until_running({cmd}, {name})[0];
    if (ms < 0) die(name + ": the task's program did not run");
    return ms;
  }

  // The loopback link's limit: every blob fetched by curl, one after another.
  double curl_mb_per_s() {
    uint64_t t0 = now_monotonic_us();
    for (const auto& b : blobs_) {
      std::string url = "http://" + reg_.host() + "/v2/bench/app/blobs/" + oci::digest_of(b).str();
      if (timed_exec({"curl", "-sf", "-o", "/dev/null", url}) < 0) die("curl " + url);
    }
    return static_cast<double>(image_bytes_) / 1048576.0 / (ms_since(t0) / 1000.0);
  }

  void run(int cold, int warm, int burst) {
    crun_setup();
    start_agent();
    std::vector<double> c, w, r;
    for (int i = 0; i < cold; ++i) {
      c.push_back(one(weft_cmd("cold" + std::to_string(i)), "cold" + std::to_string(i)));
      clear(true);
    }
    one(weft_cmd("prime"), "prime");  // the cache holds the image from here on
    clear(false);
    for (int i = 0; i < warm; ++i) {
      std::string n = "warm" + std::to_string(i), id = "crun" + std::to_string(i);
      w.push_back(one(weft_cmd(n), n));
      r.push_back(one(crun_cmd(id), id));
    }
    clear(true);
    crun_clear();
    // Many tasks of one image at once, on an empty cache.
    json before = call("image.ls", json::object());
    std::vector<std::vector<std::string>> cmds;
    std::vector<std::string> names;
    for (int i = 0; i < burst; ++i) {
      names.push_back("burst" + std::to_string(i));
      cmds.push_back(weft_cmd(names.back()));
    }
    auto b = until_running(cmds, names);
    for (double x : b)
      if (x < 0) die("a task of the burst did not run");
    json after = call("image.ls", json::object());
    clear(true);
    double link = curl_mb_per_s();

    Stats cs = stats_of(c), ws = stats_of(w), rs = stats_of(r), bs = stats_of(b);
    std::printf("image: %zu layers, %.1f MiB compressed (%s)\n", blobs_.size(),
                static_cast<double>(image_bytes_) / 1048576.0, image_.c_str());
    std::printf("\nuntil the task's own program runs (same wrapper, program, files, user):\n");
    row("weft cold (fetch + verify + unpack + start)", cs);
    row("weft warm (image cached)", ws);
    row("crun run -d (bundle unpacked beforehand)", rs);
    std::printf("  weft warm / crun:  p50 %.2fx  p99 %.2fx\n", ws.p50 / rs.p50, ws.p99 / rs.p99);
    std::printf("  weft cold / crun:  p50 %.2fx\n", cs.p50 / rs.p50);
    std::printf("  cold pull throughput: %.0f MiB/s (p50; loopback link by curl: %.0f MiB/s)\n",
                static_cast<double>(image_bytes_) / 1048576.0 / (cs.p50 / 1000.0), link);
    row((std::to_string(burst) + " tasks of the image at once, cold").c_str(), bs);
    uint64_t downloads =
        after.value("blob_downloads", uint64_t{0}) - before.value("blob_downloads", uint64_t{0});
    uint64_t bytes = after.value("downloaded_bytes", uint64_t{0}) -
                     before.value("downloaded_bytes", uint64_t{0});
    std::printf(
        "  layer downloads: %lu for %zu layers (%.1f MiB); all %d ran after %.0f ms: "
        "%.0f MiB/s\n",
        downloads, blobs_.size(), static_cast<double>(bytes) / 1048576.0, burst, bs.max,
        static_cast<double>(image_bytes_) / 1048576.0 / (bs.max / 1000.0));
  }

 private:
  testing::RegistryServer reg_;
  std::string dir_, cg_root_, sock_, image_;
  std::vector<std::string> blobs_;
  std::vector<std::string> crun_ids_;
  size_t image_bytes_ = 0;
  json crun_config_;
  pid_t agent_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tasks from an OCI image: cold and warm starts, side by side with crun"};
  int layers = 4, layer_mb = 25, cold = 5, warm = 20, burst = 10;
  app.add_option("--layers", layers, "layers of incompressible bytes");
  app.add_option("--layer-mb", layer_mb, "MiB per layer");
  app.add_option("--cold", cold, "cold starts");
  app.add_option("--warm", warm, "warm starts (and crun starts)");
  app.add_option("--burst", burst, "tasks started at once on an empty cache");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) die("needs root");
  ImageBench b;
  b.make_image(layers, static_cast<size_t>(layer_mb));
  b.run(cold, warm, burst);
  return 0;
}
