#include "common/task_spec.h"
#include "common/exec_request.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

using json = nlohmann::json;

std::string field_of(const json& j) {
  auto r = parse_task_spec(j);
  return r.ok() ? "<ok>" : r.error().field;
}

TEST(Spec, MinimalDefaults) {
  auto s = parse_task_spec({{"name", "web"}, {"argv", {"sleep", "1"}}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->cwd, "");  // "/" or the image's working directory
  EXPECT_TRUE(s->ns.pid);
  EXPECT_EQ(s->ns.network, NetworkMode::kHost);
  EXPECT_EQ(s->restart.policy, RestartPolicy::kNever);
  EXPECT_EQ(s->stop_signal, 15);
  EXPECT_EQ(s->stop_grace_us, 10'000'000u);
}

TEST(Spec, FullRoundTrip) {
  json j = {
      {"name", "web"},
      {"argv", {"python3", "-m", "http.server"}},
      {"env", {{"A", "1"}}},
      {"resources",
       {{"cpu", 0.5},
        {"cpu_weight", 200},
        {"memory_max", "256M"},
        {"memory_high", "200M"},
        {"pids_max", 64},
        {"io_max", {{{"device", "8:0"}, {"rbps", "10M"}, {"wiops", 100}}}},
        {"hugetlb", {{"2M", "64M"}}},
        {"cpuset_cpus", "0-1"}}},
      {"namespaces", {{"network", "private"}}},
      {"hostname", "h1"},
      {"restart",
       {{"policy", "on-failure"}, {"delay", "500ms"}, {"max_delay", "30s"}, {"max_restarts", 5}}},
      {"stop_signal", "SIGINT"},
      {"stop_grace", 3},
      {"logs", {{"max_file_size", "1M"}, {"max_files", 3}}}};
  auto s = parse_task_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(*s->resources.memory_max, 256u << 20);
  EXPECT_EQ(s->resources.hugetlb.at("2MB"), 64u << 20);
  EXPECT_EQ(s->restart.delay_us, 500000u);
  EXPECT_EQ(s->stop_signal, 2);
  EXPECT_EQ(s->stop_grace_us, 3'000'000u);
  auto again = parse_task_spec(to_json(*s));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(to_json(*again), to_json(*s));
}

TEST(Spec, ImagesMountsAndFiles) {
  json j = {{"name", "app"},
            {"image", "registry.example.com:5000/team/app:v1"},
            {"mounts",
             {{{"source", "/srv/data"}, {"target", "/data"}},
              {{"type", "tmpfs"}, {"target", "/tmp"}, {"size", "16M"}, {"mode", "0700"}}}},
            {"files", {{{"path", "/etc/app.conf"}, {"content", "k=v"}, {"mode", "0440"}}}}};
  auto s = parse_task_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_TRUE(s->argv.empty());  // the image's entrypoint and cmd
  ASSERT_EQ(s->mounts.size(), 2u);
  EXPECT_TRUE(s->mounts[0].readonly);  // bind mounts are read-only unless asked
  EXPECT_EQ(s->mounts[1].size, 16u << 20);
  EXPECT_EQ(s->mounts[1].mode, 0700u);
  EXPECT_EQ(s->files[0].mode, 0440u);
  auto again = parse_task_spec(to_json(*s));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(to_json(*again), to_json(*s));

  auto with = [&](const char* k, json v) {
    json x = j;
    x[k] = v;
    return field_of(x);
  };
  EXPECT_EQ(with("image", "no-registry"), "image");
  EXPECT_EQ(with("image", "r.io/a@sha256:nothex"), "image");
  EXPECT_EQ(with("rootfs", "/srv/root"), "image");  // one root only
  EXPECT_EQ(with("namespaces", {{"mount", false}}), "image");
  EXPECT_EQ(with("mounts", {{{"source", "/x"}, {"target", "rel"}}}), "mounts[0].target");
  EXPECT_EQ(with("mounts", {{{"source", "/x"}, {"target", "/a/../b"}}}), "mounts[0].target");
  EXPECT_EQ(with("mounts", {{{"source", "/x"}, {"target", "/proc/sys"}}}), "mounts[0].target");
  EXPECT_EQ(with("mounts", {{{"source", "/x"}, {"target", "/"}}}), "mounts[0].target");
  EXPECT_EQ(with("mounts", {{{"source", "rel"}, {"target", "/d"}}}), "mounts[0].source");
  EXPECT_EQ(with("mounts", {{{"source", "/a:b"}, {"target", "/d"}}}), "mounts[0].source");
  EXPECT_EQ(with("mounts", {{{"type", "tmpfs"}, {"source", "/x"}, {"target", "/d"}}}),
            "mounts[0].source");
  EXPECT_EQ(with("mounts", {{{"type", "nfs"}, {"target", "/d"}}}), "mounts[0].type");
  EXPECT_EQ(with("mounts", {{{"type", "tmpfs"}, {"target", "/d"}, {"size", "1"}}}),
            "mounts[0].size");
  EXPECT_EQ(
      with("mounts", {{{"source", "/x"}, {"target", "/d"}}, {{"source", "/y"}, {"target", "/d"}}}),
      "mounts[1].target");
  EXPECT_EQ(with("files", {{{"path", "/etc/x"}}}), "files[0].content");
  EXPECT_EQ(with("files", {{{"path", "/etc/x"}, {"content", "a"}, {"mode", "4755"}}}),
            "files[0].mode");
  EXPECT_EQ(with("files", {{{"path", "/etc/x"}, {"content", "a"}, {"mode", "rw"}}}),
            "files[0].mode");
  EXPECT_EQ(with("files", {{{"path", "/etc/x"}, {"content", std::string((1u << 20) + 1, 'a')}}}),
            "files[0].content");
  EXPECT_EQ(with("files", {{{"path", "/data/x"}, {"content", "a"}}}), "files");  // under a mount
  // On the host's root there is nowhere of the task's own to mount.
  EXPECT_EQ(field_of({{"name", "t"}, {"argv", {"true"}}, {"mounts", j["mounts"]}}), "mounts");
  EXPECT_EQ(field_of({{"name", "t"}, {"argv", {"true"}}, {"files", j["files"]}}), "files");
  EXPECT_EQ(field_of({{"name", "t"}, {"argv", json::array()}}), "argv");  // no image
}

TEST(Spec, Packages) {
  const std::string hex(64, 'a');
  json root = {{"name", "p"},
               {"argv", {"/bin/app"}},
               {"package", {{"url", "https://pkgs.example.com/app-1.2.tar.gz"}, {"sha256", hex}}}};
  auto s = parse_task_spec(root);
  ASSERT_TRUE(s.ok()) << s.error().str();
  ASSERT_TRUE(s->package);
  EXPECT_EQ(s->package->target, "/");  // the package is the task's root
  EXPECT_EQ(s->package->sha256, hex);
  auto again = parse_task_spec(to_json(*s));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(to_json(*again), to_json(*s));
  // "sha256:" and upper case are accepted, stored plain and lower case.
  json upper = root;
  upper["package"]["sha256"] = "sha256:" + std::string(64, 'A');
  auto u = parse_task_spec(upper);
  ASSERT_TRUE(u.ok()) << u.error().str();
  EXPECT_EQ(u->package->sha256, hex);
  // Beside an image, at a directory; mounts and files may go on a package root.
  json beside = {
      {"name", "p"},
      {"image", "r.io/team/base:v1"},
      {"package", {{"url", "http://10.0.0.1/t.tar"}, {"sha256", hex}, {"target", "/opt/t"}}}};
  EXPECT_TRUE(parse_task_spec(beside).ok());
  json files = root;
  files["files"] = {{{"path", "/etc/app.conf"}, {"content", "k=v"}}};
  EXPECT_TRUE(parse_task_spec(files).ok());

  auto pkg = [&](json base, const char* k, json v) {
    base["package"][k] = v;
    return field_of(base);
  };
  EXPECT_EQ(pkg(root, "url", "ftp://x/y.tar"), "package.url");
  EXPECT_EQ(pkg(root, "url", "file:///etc/shadow"), "package.url");
  EXPECT_EQ(pkg(root, "url", "https://user:pw@x/y.tar"), "package.url");  // no secrets in specs
  EXPECT_EQ(pkg(root, "url", "https:///y.tar"), "package.url");
  EXPECT_EQ(pkg(root, "url", "https://x/a b.tar"), "package.url");
  EXPECT_EQ(pkg(root, "sha256", "abc"), "package.sha256");
  EXPECT_EQ(pkg(root, "sha256", std::string(64, 'g')), "package.sha256");
  EXPECT_EQ(pkg(root, "target", "opt"), "package.target");
  EXPECT_EQ(pkg(root, "target", "/proc/x"), "package.target");
  EXPECT_EQ(pkg(root, "bogus", 1), "package.bogus");
  EXPECT_EQ(pkg(beside, "target", "/"), "package.target");  // one root only
  json no_argv = root;
  no_argv.erase("argv");
  EXPECT_EQ(field_of(no_argv), "argv");  // a tarball has no entrypoint
  json no_mnt = root;
  no_mnt["namespaces"] = {{"mount", false}};
  EXPECT_EQ(field_of(no_mnt), "package");
  json clash = beside;
  clash["mounts"] = {{{"type", "tmpfs"}, {"target", "/opt/t/cache"}}};
  EXPECT_EQ(field_of(clash), "package.target");
  EXPECT_EQ(field_of({{"name", "p"}, {"argv", {"x"}}, {"package", "https://x/y.tar"}}), "package");
}

TEST(Spec, ErrorsNameTheField) {
  json base = {{"name", "t"}, {"argv", {"true"}}};
  EXPECT_EQ(field_of({{"argv", {"true"}}}), "name");
  EXPECT_EQ(field_of({{"name", "bad name"}, {"argv", {"true"}}}), "name");
  EXPECT_EQ(field_of({{"name", "t"}, {"argv", json::array()}}), "argv");
  EXPECT_EQ(field_of({{"name", "t"}, {"argv", {"a", 3}}}), "argv[1]");
  auto with = [&](const char* k, json v) {
    json j = base;
    j[k] = v;
    return field_of(j);
  };
  EXPECT_EQ(with("bogus", 1), "bogus");
  EXPECT_EQ(with("cwd", "relative"), "cwd");
  EXPECT_EQ(with("resources", {{"memory_max", "lots"}}), "resources.memory_max");
  EXPECT_EQ(with("resources", {{"cpu", -1}}), "resources.cpu");
  EXPECT_EQ(with("resources", {{"memory_max", "100M"}, {"memory_high", "200M"}}),
            "resources.memory_high");
  EXPECT_EQ(with("resources", {{"io_max", {{{"device", "sda"}}}}}), "resources.io_max[0].device");
  EXPECT_EQ(with("resources", {{"hugetlb", {{"3K", "1M"}}}}), "resources.hugetlb.3K");
  EXPECT_EQ(with("resources", {{"cpuset_cpus", "3-1"}}), "resources.cpuset_cpus");
  EXPECT_EQ(with("resources", {{"pids_max", 0}}), "resources.pids_max");
  EXPECT_EQ(with("resources", {{"nope", 0}}), "resources.nope");
  EXPECT_EQ(with("namespaces", {{"network", "overlay"}}), "namespaces.network");
  EXPECT_EQ(with("restart", {{"policy", "sometimes"}}), "restart.policy");
  EXPECT_EQ(with("restart", {{"delay", "10s"}, {"max_delay", "1s"}}), "restart.max_delay");
  EXPECT_EQ(with("stop_signal", "SIGNOPE"), "stop_signal");
  EXPECT_EQ(with("logs", {{"max_file_size", 10}}), "logs.max_file_size");
  EXPECT_EQ(with("env", {{"A=B", "x"}}), "env.A=B");
  // The host's root is not a root of the task's own (pivot_root fails on it, anywhere).
  EXPECT_EQ(with("rootfs", "/"), "rootfs");
  EXPECT_EQ(with("rootfs", "//"), "rootfs");
  json rootfs_without_mount = base;
  rootfs_without_mount["rootfs"] = "/srv/root";
  rootfs_without_mount["namespaces"] = {{"mount", false}};
  EXPECT_EQ(field_of(rootfs_without_mount), "rootfs");
}

TEST(Spec, OwnerIsControlPlaneOrAbsent) {
  auto s = parse_task_spec({{"name", "w.0.1"}, {"argv", {"true"}}, {"owner", "controlplane"}});
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->owner, "controlplane");
  EXPECT_EQ(parse_task_spec(to_json(*s))->owner, "controlplane");
  auto plain = parse_task_spec({{"name", "w"}, {"argv", {"true"}}});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(to_json(*plain).contains("owner"));
  auto bad = parse_task_spec({{"name", "w"}, {"argv", {"true"}}, {"owner", "me"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "owner");
}

TEST(Spec, ReadinessChecks) {
  auto with = [](json check) {
    return parse_task_spec({{"name", "w"}, {"argv", {"true"}}, {"readiness", check}});
  };
  auto http = with({{"type", "http"},
                    {"port", 8080},
                    {"path", "/ready?x=1"},
                    {"interval", "250ms"},
                    {"timeout", 2},
                    {"failure_threshold", 5}});
  ASSERT_TRUE(http.ok()) << http.error().str();
  ASSERT_TRUE(http->readiness.has_value());
  EXPECT_EQ(http->readiness->kind, ReadinessKind::kHttp);
  EXPECT_EQ(http->readiness->port, 8080);
  EXPECT_EQ(http->readiness->path, "/ready?x=1");
  EXPECT_EQ(http->readiness->interval_us, 250'000u);
  EXPECT_EQ(http->readiness->timeout_us, 2'000'000u);
  EXPECT_EQ(http->readiness->failure_threshold, 5u);
  EXPECT_EQ(http->readiness->success_threshold, 1u);
  auto again = parse_task_spec(to_json(*http));  // the stored form reads back the same
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(to_json(*again), to_json(*http));
  auto exec = with({{"type", "exec"}, {"command", {"/bin/check", "--quick"}}});
  ASSERT_TRUE(exec.ok()) << exec.error().str();
  EXPECT_EQ(exec->readiness->command.size(), 2u);
  EXPECT_EQ(to_json(*parse_task_spec(to_json(*exec))), to_json(*exec));
  EXPECT_TRUE(with({{"type", "tcp"}, {"port", 1}}).ok());
  EXPECT_FALSE(parse_task_spec({{"name", "w"}, {"argv", {"true"}}})->readiness.has_value());

  struct Bad {
    json check;
    const char* field;
  };
  for (const Bad& b : std::vector<Bad>{
           {{{"type", "grpc"}, {"port", 1}}, "readiness.type"},
           {{{"port", 1}}, "readiness.type"},
           {{{"type", "tcp"}}, "readiness.port"},
           {{{"type", "tcp"}, {"port", 0}}, "readiness.port"},
           {{{"type", "tcp"}, {"port", 70000}}, "readiness.port"},
           {{{"type", "tcp"}, {"port", 1}, {"path", "/"}}, "readiness.path"},
           {{{"type", "http"}, {"port", 1}, {"path", "/a b"}}, "readiness.path"},
           {{{"type", "http"}, {"port", 1}, {"path", "/a\r\nHost: x"}}, "readiness.path"},
           {{{"type", "http"}, {"port", 1}, {"path", "ready"}}, "readiness.path"},
           {{{"type", "exec"}}, "readiness.command"},
           {{{"type", "exec"}, {"command", {"check"}}}, "readiness.command[0]"},
           {{{"type", "exec"}, {"command", json::array()}}, "readiness.command"},
           {{{"type", "exec"}, {"command", {"/bin/x", 3}}}, "readiness.command[1]"},
           {{{"type", "exec"}, {"command", {"/bin/x"}}, {"port", 2}}, "readiness.port"},
           {{{"type", "tcp"}, {"port", 1}, {"command", {"/bin/x"}}}, "readiness.command"},
           {{{"type", "tcp"}, {"port", 1}, {"interval", "10ms"}}, "readiness.interval"},
           {{{"type", "tcp"}, {"port", 1}, {"timeout", "2m"}}, "readiness.timeout"},
           {{{"type", "tcp"}, {"port", 1}, {"success_threshold", 0}},
            "readiness.success_threshold"},
           {{{"type", "tcp"}, {"port", 1}, {"failure_threshold", 101}},
            "readiness.failure_threshold"},
           {{{"type", "tcp"}, {"port", 1}, {"probe", 1}}, "readiness.probe"},
       }) {
    auto r = with(b.check);
    ASSERT_FALSE(r.ok()) << b.check.dump();
    EXPECT_EQ(r.error().field, b.field) << b.check.dump() << ": " << r.error().str();
  }
  auto not_object = parse_task_spec({{"name", "w"}, {"argv", {"true"}}, {"readiness", "tcp"}});
  ASSERT_FALSE(not_object.ok());
  EXPECT_EQ(not_object.error().field, "readiness");
}

TEST(Spec, Signals) {
  EXPECT_EQ(*parse_signal("SIGTERM"), 15);
  EXPECT_EQ(*parse_signal("kill"), 9);
  EXPECT_EQ(*parse_signal("10"), 10);
  EXPECT_FALSE(parse_signal("99").ok());
  EXPECT_EQ(signal_name(9), "SIGKILL");
}

TEST(Spec, HugepageSizeNames) {
  EXPECT_EQ(normalize_hugepage_size("2M"), "2MB");
  EXPECT_EQ(normalize_hugepage_size("2048K"), "2MB");
  EXPECT_EQ(normalize_hugepage_size("1G"), "1GB");
  EXPECT_EQ(normalize_hugepage_size("64K"), "64KB");
  EXPECT_EQ(normalize_hugepage_size("junk"), "");
}

TEST(TaskSpec, PortsAreNamedCheckedAndGivenNumbers) {
  auto spec = parse_task_spec({{"name", "t"},
                               {"argv", {"/bin/true"}},
                               {"ports", {{"http", 0}, {"admin", 9100}, {"grpc-tls", 0}}},
                               {"readiness", {{"type", "tcp"}, {"port", "http"}}}});
  ASSERT_TRUE(spec.ok()) << spec.error().str();
  // Ports 20000-20001 are held by another task; 9100 is free.
  std::set<uint16_t> held = {20000, 20001};
  auto holder = [&](uint16_t p) { return held.count(p) ? std::string("other") : std::string(); };
  uint16_t next = 0;
  ASSERT_TRUE(resolve_task_ports(&*spec, 20000, 20009, holder, &next).ok());
  EXPECT_EQ(spec->ports.at("admin"), 9100);
  uint16_t http = spec->ports.at("http"), grpc = spec->ports.at("grpc-tls");
  EXPECT_NE(http, grpc);
  for (uint16_t p : {http, grpc}) {
    EXPECT_GE(p, 20002);
    EXPECT_LE(p, 20009);
  }
  EXPECT_EQ(spec->readiness->port, http);
  EXPECT_EQ(spec->env.at("WEFT_PORT_HTTP"), std::to_string(http));
  EXPECT_EQ(spec->env.at("WEFT_PORT_GRPC_TLS"), std::to_string(grpc));
  EXPECT_EQ(spec->env.at("WEFT_PORT_ADMIN"), "9100");
  // What is stored is read back the same (numbers now, the check still names its port).
  auto back = parse_task_spec(to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->ports, spec->ports);
  EXPECT_EQ(back->readiness->port, http);
  // A fixed port another task holds is refused, naming the port and the holder.
  auto taken = parse_task_spec({{"name", "u"}, {"argv", {"/bin/true"}}, {"ports", {{"x", 20000}}}});
  ASSERT_TRUE(taken.ok());
  auto refused = resolve_task_ports(&*taken, 20000, 20009, holder);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().field, "ports.x");
  EXPECT_NE(refused.error().message.find("held by task other"), std::string::npos);
  // A full range is refused too.
  auto full = parse_task_spec({{"name", "v"}, {"argv", {"/bin/true"}}, {"ports", {{"x", 0}}}});
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(resolve_task_ports(&*full, 20000, 20001, holder).ok());

  for (const auto& [bad, field] :
       std::vector<std::pair<json, std::string>>{{{{"HTTP", 80}}, "ports.HTTP"},
                                                 {{{"http", 70000}}, "ports.http"},
                                                 {{{"a", 80}, {"b", 80}}, "ports.b"},
                                                 {{{"1x", 80}}, "ports.1x"},
                                                 {json::array(), "ports"}}) {
    auto e = parse_task_spec({{"name", "t"}, {"argv", {"/bin/true"}}, {"ports", bad}});
    ASSERT_FALSE(e.ok()) << bad.dump();
    EXPECT_EQ(e.error().field, field) << bad.dump();
  }
  auto named = parse_task_spec(
      {{"name", "t"}, {"argv", {"/bin/true"}}, {"readiness", {{"type", "tcp"}, {"port", "nope"}}}});
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.error().field, "readiness.port");
  auto private_net = parse_task_spec({{"name", "t"},
                                      {"argv", {"/bin/true"}},
                                      {"namespaces", {{"network", "private"}}},
                                      {"ports", {{"http", 0}}}});
  ASSERT_FALSE(private_net.ok());
  EXPECT_EQ(private_net.error().field, "ports");
  // On the machine's bridge the ports are published: fine, and said back as written.
  auto bridged = parse_task_spec({{"name", "t"},
                                  {"argv", {"/bin/true"}},
                                  {"namespaces", {{"network", "bridge"}}},
                                  {"ports", {{"http", 0}}}});
  ASSERT_TRUE(bridged.ok()) << bridged.error().str();
  EXPECT_EQ(bridged->ns.network, NetworkMode::kBridge);
  EXPECT_TRUE(bridged->ns.own_network());
  EXPECT_EQ(to_json(*bridged)["namespaces"]["network"], "bridge");
  auto again = parse_task_spec(to_json(*bridged));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(again->ns.network, NetworkMode::kBridge);
}

}  // namespace
// `weftctl task exec`'s request: one reader for the control plane and the agent.
TEST(ExecRequest, ReadsWhatWeftctlSendsAndNamesTheFieldOfAMistake) {
  ExecRequest r;
  r.task = "web.0.1";
  r.command = {"sh", "-c", "echo hi"};
  r.options.tty = true;
  r.options.rows = 50;
  r.options.cols = 132;
  r.term = "xterm-256color";
  auto back = parse_exec_request(exec_request_json(r));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->task, "web.0.1");
  EXPECT_EQ(back->command, r.command);
  EXPECT_TRUE(back->options.tty);
  EXPECT_EQ(back->options.rows, 50);
  EXPECT_EQ(back->options.cols, 132);
  EXPECT_EQ(back->term, "xterm-256color");
  auto field = [](const json& p) {
    auto x = parse_exec_request(p);
    return x.ok() ? std::string("ok") : x.error().str().substr(0, x.error().str().find(':'));
  };
  const json ok{{"id", "web.0.1"}, {"command", {"id"}}};
  EXPECT_EQ(field(ok), "ok");
  auto with = [&](const char* k, json v) {
    json p = ok;
    p[k] = std::move(v);
    return p;
  };
  EXPECT_EQ(field(json::array()), "params must be an object");
  EXPECT_EQ(field(with("id", "")), "id");
  EXPECT_EQ(field(with("id", 7)), "id");
  EXPECT_EQ(field(with("command", json::array())), "command");
  EXPECT_EQ(field(with("command", {""})), "command");
  EXPECT_EQ(field(with("command", {"sh", 1})), "command");
  EXPECT_EQ(field(with("command", {std::string("a\0b", 3)})), "command");
  EXPECT_EQ(field(with("command", json(std::vector<std::string>(257, "x")))), "command");
  EXPECT_EQ(field(with("command", {std::string(70000, 'x')})), "command");
  EXPECT_EQ(field(with("tty", "yes")), "tty");
  EXPECT_EQ(field(with("rows", 0)), "rows");
  EXPECT_EQ(field(with("cols", 1001)), "cols");
  EXPECT_EQ(field(with("cols", -3)), "cols");
  EXPECT_EQ(field(with("term", "xterm; rm -rf /")), "term");
}

}  // namespace weft
