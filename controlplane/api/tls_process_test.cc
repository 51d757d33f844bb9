// weft-controlplane as a process over the network: mutual TLS, identities, roles and
// audit (issue 13).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <random>
#include <sstream>

#include "common/toml.h"

#include "common/fs.h"
#include "common/job_file.h"
#include "common/job_spec.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"
#include "common/services.h"
#include "common/task_report.h"
#include "common/task_spec.h"
#include "common/tls.h"
#include "examples/shard_controller/shard_manager.h"
#include "testing/cp_process.h"
#include "testing/fake_machine.h"
#include "testing/process.h"
#include "testing/registry_server.h"

// In weft::testing: the fixture, the fake machine and spawn_process are its own.
namespace weft::testing {
namespace {

// ---- over the network: mutual TLS, identities, roles, audit (issue 13)

// The control plane listening with mutual TLS on 127.0.0.1, a CA from scripts/weft-pki,
// and certificates for machines, each role, and nobody in particular.
class ControlPlaneTls : public ControlPlane {
 protected:
  void SetUp() override {
    ControlPlane::SetUp();
    pki_ = dir_ + "/pki";
    std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
    std::string cmds = tool + " ca " + pki_ + " && " + tool + " issue " + pki_ +
                       " cp --dns cp.test --ip 127.0.0.1";
    for (const char* spec :
         {"m1 --ou machine", "m2 --ou machine", "viewer --ou viewer", "alice --ou operator",
          "bob --ou operator", "root --ou admin", "stranger", "leaver --ou operator"})
      cmds += " && " + tool + " issue " + pki_ + " " + spec;
    ASSERT_EQ(std::system(("(" + cmds + ") >/dev/null").c_str()), 0) << cmds;
    port_ = free_tcp_port();  // reserved for this test
    ASSERT_NE(port_, 0);
    ASSERT_TRUE(write_file(dir_ + "/cp.toml",
                           "socket = \"" + dir_ + "/cp.sock\"\nstate_dir = \"" + dir_ +
                               "/state\"\nlisten = \"127.0.0.1:" + std::to_string(port_) +
                               "\"\nheartbeat_interval = \"200ms\"\nmissed_heartbeats = 3\n"
                               "log_level = \"debug\"\ntls_ca = \"" +
                               pki_ + "/ca.pem\"\ntls_cert = \"" + pki_ +
                               "/cp.pem\"\ntls_key = \"" + pki_ + "/cp.key\"\ntls_crl = \"" + pki_ +
                               "/crl.pem\"\n" + secrets_line())
                    .ok());
  }
  rpc::ClientTls tls_as(const std::string& who) {
    auto ctx = tls::Context::create(
        {pki_ + "/ca.pem", pki_ + "/" + who + ".pem", pki_ + "/" + who + ".key", ""},
        tls::Role::kClient);
    EXPECT_TRUE(ctx.ok()) << ctx.error().str();
    return rpc::client_tls(ctx.ok() ? *ctx : nullptr);
  }
  std::string tcp() const { return "tls://127.0.0.1:" + std::to_string(port_); }
  // One call over TLS with `who`'s certificate.
  Result<json> call_as(const std::string& who, const std::string& m, const json& p = {}) {
    auto t = tls_as(who);
    TRY_ASSIGN(auto c, rpc::Client::connect(tcp(), rpc::kDefaultMaxLine, &t));
    return c->call(m, p.is_null() ? json::object() : p, 5000);
  }
  static json job(const std::string& name, const std::string& ent) {
    return {{"name", name},
            {"entitlement", ent},
            {"count", 1},
            {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
            {"task", {{"argv", {"/bin/sleep", "infinity"}}, {"env", {{"TOKEN", "hunter2"}}}}}};
  }
  std::string pki_;
  uint16_t port_ = 0;
};

// The field a refusal names (the message over the wire starts with it).
std::string field_named(const Result<json>& r) {
  if (r.ok()) return "";
  std::string m = r.error().str();
  return m.substr(0, m.find(':'));
}

bool denied(const Result<json>& r) {
  return !r.ok() && r.error().code == rpc::kPermissionDenied;
}

TEST_F(ControlPlaneTls, EachCertificateMayDoWhatItsRoleAllows) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine m1("m1", "r1"), m2("m2", "r2");
  auto t1 = tls_as("m1"), t2 = tls_as("m2");
  ASSERT_TRUE(m1.connect(tcp(), &t1)) << m1.error().str();
  ASSERT_TRUE(m2.connect(tcp(), &t2)) << m2.error().str();
  // Both stay alive while the test makes one TLS handshake after another (on a loaded
  // machine, under the sanitizers, longer than the 600 ms a silent machine has).
  m1.keep_alive();
  m2.keep_alive();
  // A machine certificate speaks for its own machine only, and reads nothing.
  FakeMachine impostor("m2", "r1");
  EXPECT_FALSE(impostor.connect(tcp(), &t1));
  EXPECT_EQ(impostor.error().code, rpc::kPermissionDenied) << impostor.error().str();
  EXPECT_TRUE(denied(m1.call("machine.report", {{"machine", "m2"}, {"tasks", json::object()}})));
  // Nor whether another id exists: the certificate is checked first.
  EXPECT_TRUE(denied(m1.call("machine.report", {{"machine", "ghost"}, {"tasks", json::object()}})));
  EXPECT_TRUE(denied(m1.call("health.report", {{"machine", "m2"}, {"verdict", "failed"}})));
  EXPECT_TRUE(denied(m1.call("job.ls", json::object())));
  // Operators, viewers and strangers make no machine calls.
  EXPECT_TRUE(denied(call_as("alice", "machine.heartbeat", {{"machine", "m1"}})));
  EXPECT_TRUE(denied(call_as("stranger", "job.ls")));

  // The admin creates two entitlements, each with its owner; only admins may.
  EXPECT_TRUE(denied(call_as("alice", "entitlement.create",
                             {{"name", "a"}, {"quota", 1}, {"owners", {"CN=alice"}}})));
  ASSERT_TRUE(
      call_as("root", "entitlement.create", {{"name", "a"}, {"quota", 1}, {"owners", {"CN=alice"}}})
          .ok());
  ASSERT_TRUE(call("entitlement.create", {{"name", "b"}, {"quota", 1}, {"owners", {"CN=bob"}}})
                  .ok());  // the Unix socket is admin
  auto bad_owner = call("entitlement.create", {{"name", "c"}, {"quota", 1}, {"owners", {"x"}}});
  EXPECT_FALSE(bad_owner.ok());
  EXPECT_NE(bad_owner.error().str().find("owners[0]"), std::string::npos)
      << bad_owner.error().str();

  // Operators run jobs in the entitlements they own, and only there.
  auto made = call_as("alice", "job.create", job("web", "a"));
  ASSERT_TRUE(made.ok()) << made.error().str();
  EXPECT_TRUE(denied(call_as("alice", "job.create", job("api", "b"))));
  EXPECT_TRUE(call_as("bob", "job.create", job("api", "b")).ok());
  EXPECT_TRUE(denied(call_as("bob", "job.stop", {{"name", "web"}})));
  EXPECT_TRUE(denied(call_as("bob", "job.scale", {{"name", "web"}, {"count", 2}})));
  EXPECT_TRUE(denied(call_as("viewer", "job.create", job("x", "a"))));
  EXPECT_TRUE(denied(call_as("viewer", "job.stop", {{"name", "web"}})));
  EXPECT_TRUE(denied(call_as("viewer", "machine.drain", {{"machine", "m1"}})));
  EXPECT_TRUE(denied(call_as("alice", "machine.drain", {{"machine", "m1"}})));

  // Reads: viewers and non-owners see the job without its secrets.
  for (const char* who : {"viewer", "bob"}) {
    auto shown = call_as(who, "job.show", {{"name", "web"}});
    ASSERT_TRUE(shown.ok()) << who << ": " << shown.error().str();
    EXPECT_EQ((*shown)["spec"]["task"]["env"]["TOKEN"], "(hidden)") << who;
    EXPECT_EQ(shown->dump().find("hunter2"), std::string::npos) << who;
  }
  for (const char* who : {"alice", "root"}) {
    auto shown = call_as(who, "job.show", {{"name", "web"}});
    ASSERT_TRUE(shown.ok()) << who;
    EXPECT_EQ((*shown)["spec"]["task"]["env"]["TOKEN"], "hunter2") << who;
  }
  for (const char* m : {"job.ls", "task.ls", "machine.ls", "entitlement.ls", "audit.ls"})
    EXPECT_TRUE(call_as("viewer", m).ok()) << m;

  // Owners change with entitlement.update (admins): bob now owns a as well.
  EXPECT_TRUE(
      denied(call_as("bob", "entitlement.update", {{"name", "a"}, {"owners", {"CN=bob"}}})));
  ASSERT_TRUE(
      call_as("root", "entitlement.update", {{"name", "a"}, {"owners", {"OU=operator"}}}).ok());
  EXPECT_TRUE(call_as("bob", "job.scale", {{"name", "web"}, {"count", 1}}).ok());

  // Plaintext to the TLS port gets nothing.
  auto plain = rpc::Client::connect("127.0.0.1:" + std::to_string(port_));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->call("job.ls", json::object(), 2000).ok());

  // The audit log has every change and every refusal, with who and a digest.
  auto audit = call_as("viewer", "audit.ls");
  ASSERT_TRUE(audit.ok());
  auto has = [&](const std::string& who, const std::string& method, const std::string& target,
                 const std::string& result) {
    for (const auto& e : (*audit)["entries"])
      if (e["who"].get<std::string>().find(who) != std::string::npos && e["method"] == method &&
          e["target"] == target && e["result"].get<std::string>().rfind(result, 0) == 0 &&
          e["params_sha256"].get<std::string>().size() == 64)
        return true;
    return false;
  };
  EXPECT_TRUE(has("CN=alice", "job.create", "web", "ok")) << audit->dump(1);
  EXPECT_TRUE(has("CN=alice", "job.create", "api", "denied"));
  EXPECT_TRUE(has("CN=bob", "job.stop", "web", "denied"));
  EXPECT_TRUE(has("CN=viewer", "machine.drain", "m1", "denied"));
  EXPECT_TRUE(has("uid ", "entitlement.create", "b", "ok"));
  EXPECT_TRUE(has("CN=root", "entitlement.update", "a", "ok"));
  EXPECT_TRUE(has("uid ", "entitlement.create", "c", "error"));
  // Reads and machine calls are not audited.
  for (const auto& e : (*audit)["entries"]) {
    EXPECT_NE(e["method"], "job.show");
    EXPECT_NE(e["method"], "machine.register");
  }
  // And it survives a restart; --since filters by time.
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  auto again = call("audit.ls", {{"since_wall_us", 1}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["entries"].size(), (*audit)["entries"].size());
  auto none = call("audit.ls", {{"since_wall_us", int64_t{4'000'000'000'000'000}}});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)["entries"].empty());
}

// Issue 32, finding 1: an operator's job asked for the sockets' group (its task then
// called the control plane's Unix socket as an admin), for /etc/shadow's group and for
// the host's pid namespace, and got them. A spec asks of the host only what its
// entitlement's admin granted; root and the sockets' group are never granted; what is
// granted and what the job runs survive a restart; viewers see no secret file.
TEST_F(ControlPlaneTls, AnOperatorsJobGetsOnlyWhatItsEntitlementGrants) {
  start();
  if (HasFatalFailure()) return;
  FakeMachine m1("m1", "r1");
  auto t1 = tls_as("m1");
  ASSERT_TRUE(m1.connect(tcp(), &t1)) << m1.error().str();
  m1.keep_alive();
  ASSERT_TRUE(
      call("entitlement.create", {{"name", "a"}, {"quota", 1}, {"owners", {"CN=alice"}}}).ok());
  auto with = [](json task) {
    json j = job("web", "a");
    task["argv"] = {"/bin/sleep", "infinity"};
    j["task"] = task;
    return j;
  };
  struct Ask {
    json task;
    std::string field;
  } asks[] = {
      {{{"group", "weft"}}, "task.group"},
      {{{"group", "shadow"}}, "task.group"},
      {{{"user", "root"}}, "task.user"},
      {{{"user", "nobody"}}, "task.user"},
      {{{"namespaces", {{"pid", false}}}}, "task.namespaces.pid"},
      {{{"seccomp", "unconfined"}}, "task.seccomp"},
      {{{"rootfs", "/"}}, "task.rootfs"},
  };
  for (const auto& a : asks) {
    auto r = call_as("alice", "job.create", with(a.task));
    ASSERT_FALSE(r.ok()) << a.task.dump();
    EXPECT_EQ(field_named(r), a.field) << r.error().str();
  }
  // An admin grants named exceptions, never root or the sockets' group.
  EXPECT_TRUE(denied(call_as("alice", "entitlement.update",
                             {{"name", "a"}, {"grants", {{"groups", {"shadow"}}}}})));
  auto never = call_as("root", "entitlement.update",
                       {{"name", "a"}, {"grants", {{"groups", {"video", "weft"}}}}});
  ASSERT_FALSE(never.ok());
  EXPECT_EQ(field_named(never), "grants.groups[1]") << never.error().str();
  auto granted =
      call_as("root", "entitlement.update",
              {{"name", "a"}, {"grants", {{"groups", {"video"}}, {"host_namespaces", {"pid"}}}}});
  ASSERT_TRUE(granted.ok()) << granted.error().str();
  EXPECT_EQ((*granted)["grants"]["groups"], json({"video"}));
  EXPECT_EQ((*granted)["owners"], json({"CN=alice"}));  // grants alone: owners kept
  auto privileged =
      call_as("root", "entitlement.update", {{"name", "a"}, {"grants", {{"privileged", true}}}});
  ASSERT_TRUE(privileged.ok());
  for (const char* g : {"weft", "0"}) {
    auto r = call_as("alice", "job.create", with({{"group", g}}));
    ASSERT_FALSE(r.ok()) << g;
    EXPECT_EQ(field_named(r), "task.group") << r.error().str();
  }
  ASSERT_TRUE(
      call_as("root", "entitlement.update",
              {{"name", "a"}, {"grants", {{"groups", {"video"}}, {"host_namespaces", {"pid"}}}}})
          .ok());
  auto ok = call_as("alice", "job.create",
                    with({{"group", "video"},
                          {"namespaces", {{"pid", false}}},
                          {"image", "registry.example/app@sha256:" + std::string(64, 'a')},
                          {"files", {{{"path", "/run/secret"}, {"content", "s3cr3t"}}}}}));
  ASSERT_TRUE(ok.ok()) << ok.error().str();
  // An update that asks for more than the grants is refused, the job unchanged.
  auto more = call_as("alice", "job.update", with({{"group", "video"}, {"user", "nobody"}}));
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(field_named(more), "task.user");
  // A viewer sees neither the environment nor the secret file.
  auto shown = call_as("viewer", "job.show", {{"name", "web"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->dump().find("s3cr3t"), std::string::npos) << shown->dump();
  EXPECT_EQ((*shown)["spec"]["task"]["files"][0]["content"], "(hidden)");
  EXPECT_EQ(
      (*call_as("alice", "job.show", {{"name", "web"}}))["spec"]["task"]["files"][0]["content"],
      "s3cr3t");
  // Grants are stored: after a restart they still hold, and still bound.
  stop(SIGKILL);
  start();
  if (HasFatalFailure()) return;
  auto ent = call("entitlement.show", {{"name", "a"}});
  ASSERT_TRUE(ent.ok());
  EXPECT_EQ((*ent)["grants"]["host_namespaces"], json({"pid"})) << ent->dump();
  auto after = call_as("alice", "job.update", with({{"group", "shadow"}}));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(field_named(after), "task.group");
  // Malformed grants name their field, and change nothing.
  auto bad =
      call("entitlement.update",
           {{"name", "a"}, {"owners", {"CN=bob"}}, {"grants", {{"host_namespaces", {"net"}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(field_named(bad), "grants.host_namespaces[0]");
  EXPECT_EQ((*call("entitlement.show", {{"name", "a"}}))["owners"], json({"CN=alice"}));
}

// A TaskController that speaks TLS (rpc::Server on loopback, its own loop in a thread)
// with the certificate `name` of the test's CA; it acknowledges every pending operation.
class TlsController {
 public:
  TlsController(const std::string& pki, const std::string& name) {
    std::promise<uint16_t> bound;
    auto port = bound.get_future();
    thread_ = std::thread([this, pki, name, &bound] {
      auto loop = EventLoop::create();
      auto ctx = tls::Context::create(
          {pki + "/ca.pem", pki + "/" + name + ".pem", pki + "/" + name + ".key", ""},
          tls::Role::kServer);
      if (!loop.ok() || !ctx.ok()) {
        bound.set_value(0);
        return;
      }
      rpc::Dispatcher d;
      d.add("taskcontrol.plan", [this](const json& p, const rpc::CallContext&) -> Result<json> {
        ++plans_;
        json ack = json::array();
        for (const auto& op : p.value("pending", json::array())) ack.push_back(op["op"]);
        return json{{"seq", p["seq"]}, {"ack", ack}};
      });
      rpc::Server server(**loop, &d);
      server.set_tls(*ctx);
      if (!server.listen_tcp("127.0.0.1", 0).ok()) {
        bound.set_value(0);
        return;
      }
      bound.set_value(server.tcp_port());
      while (!stopping_) (void)(*loop)->run_once(20'000);
    });
    port_ = port.get();
  }
  ~TlsController() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return port_; }
  int plans() const { return plans_; }

 private:
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> plans_{0};
  uint16_t port_ = 0;
};

// Issue 32 (7): controller sessions were plaintext and unauthenticated: a fake
// controller on the address acknowledged everything, and all four tasks restarted at
// once with max_unavailable = 1. With TLS, the control plane speaks to a TCP controller
// only over mutual TLS and only to the certificate name the job gives; what any
// controller acknowledges restarts at most max_unavailable tasks at a time.
TEST_F(ControlPlaneTls, TaskControllersAreSpokenToOverMutualTlsByNameAndBounded) {
  std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
  ASSERT_EQ(std::system(("(" + tool + " issue " + pki_ + " ctl-good && " + tool + " issue " + pki_ +
                         " ctl-evil) >/dev/null")
                            .c_str()),
            0);
  start();
  if (HasFatalFailure()) return;
  auto ms = fake_machines(4);
  for (auto& m : ms) ASSERT_TRUE(m->connect(sock())) << m->error().str();
  TlsController good(pki_, "ctl-good"), evil(pki_, "ctl-evil");
  FakeController plain;
  plain.set_policy([](const json& p) {
    json ack = json::array();
    for (const auto& op : p["pending"]) ack.push_back(op["op"]);
    return ack;
  });
  ASSERT_NE(good.port(), 0);
  ASSERT_NE(evil.port(), 0);
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 4}}).ok());
  auto job = [](const std::string& name, uint16_t port, const std::string& identity,
                const std::string& argv1) {
    json controller{{"address", "127.0.0.1:" + std::to_string(port)},
                    {"timeout_ms", 1000},
                    {"when_unreachable", "wait"}};
    if (!identity.empty()) controller["identity"] = identity;
    return json{{"name", name},
                {"entitlement", "a"},
                {"count", 4},
                {"max_unavailable", 1},
                {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
                {"task_controller", controller},
                {"task", {{"argv", {"/bin/sleep", argv1}}}}};
  };
  // Without a name to check, refused.
  auto nameless = call("job.create", job("kv", evil.port(), "", "1000"));
  ASSERT_FALSE(nameless.ok());
  EXPECT_EQ(field_named(nameless), "task_controller.identity") << nameless.error().str();
  auto pump = [&](int ms_total, const std::function<bool()>& pred) {
    for (int i = 0; i < ms_total / 50 && !pred(); ++i) {
      for (auto& m : ms) m->report();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
  };
  auto stops = [&] {
    int n = 0;
    for (auto& m : ms) n += m->stops();
    return n;
  };
  auto running = [&] {
    size_t n = 0;
    for (auto& m : ms) n += m->running().size();
    return n;
  };
  // A job whose controller address is served by another certificate of the same CA,
  // and one served in plaintext: neither is spoken to, nothing restarts.
  ASSERT_TRUE(call("job.create", job("kv", evil.port(), "ctl-good", "1000")).ok());
  ASSERT_TRUE(call("job.create", job("kw", plain.port(), "ctl-good", "1000")).ok());
  ASSERT_TRUE(pump(5000, [&] { return running() == 8; }));
  for (const auto& [name, port] : {std::pair{"kv", evil.port()}, {"kw", plain.port()}}) {
    auto u = call("job.update", job(name, port, "ctl-good", "2000"));
    ASSERT_TRUE(u.ok()) << u.error().str() << "\n" << read_file(dir_ + "/cp.log").value_or("");
  }
  pump(3000, [] { return false; });
  EXPECT_EQ(stops(), 0) << "an impostor's acknowledgement restarted tasks";
  EXPECT_EQ(evil.plans(), 0) << "the plan went to a controller of another name";
  EXPECT_TRUE(plain.plans().empty()) << "the plan went in plaintext";
  auto shown = call("job.show", {{"name", "kv"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ((*shown)["task_controller"]["unreachable"], true) << shown->dump();
  // The right controller acknowledges every restart: they go one at a time.
  ASSERT_TRUE(call("job.stop", {{"name", "kw"}}).ok());
  ASSERT_TRUE(call("job.update", job("kv", good.port(), "ctl-good", "3000")).ok());
  int most_down = 0;
  bool done = pump(20000, [&] {
    auto r = call("job.show", {{"name", "kv"}});
    if (!r.ok()) return false;
    int down = 0, current = 0;
    for (const auto& t : (*r)["tasks"]) {
      std::string st = t["state"];
      if (t["generation"] == (*r)["generation"] && st == "running") ++current;
      if (st == "stopping" || st == "starting" || st == "pending") ++down;
    }
    most_down = std::max(most_down, down);
    return current == 4;
  });
  EXPECT_TRUE(done) << call("job.show", {{"name", "kv"}})->dump();
  EXPECT_GT(good.plans(), 0);
  EXPECT_LE(most_down, 1) << "more than max_unavailable tasks down at once";
}

// Issue 32 (11): --check-config read only the names of the TLS files: /etc/passwd as
// the CA passed, and the daemon then failed to start. It reads them as the start does.
TEST_F(ControlPlaneTls, CheckConfigReadsTheTlsFilesAsTheStartWould) {
  auto check = [&](const std::string& conf) {
    std::string out = dir_ + "/check.out";
    int rc = std::system(
        (std::string(WEFT_CONTROLPLANE_BIN) + " --check-config -c " + conf + " >" + out + " 2>&1")
            .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  auto [ok_rc, ok_out] = check(dir_ + "/cp.toml");
  EXPECT_EQ(ok_rc, 0) << ok_out;
  std::string text = read_file(dir_ + "/cp.toml").value();
  std::string bad = text;
  bad.replace(bad.find(pki_ + "/ca.pem"), (pki_ + "/ca.pem").size(), "/etc/passwd");
  ASSERT_TRUE(write_file(dir_ + "/bad.toml", bad).ok());
  auto [bad_rc, bad_out] = check(dir_ + "/bad.toml");
  EXPECT_EQ(bad_rc, 2) << bad_out;
  EXPECT_NE(bad_out.find("tls_ca"), std::string::npos) << bad_out;
}

TEST_F(ControlPlaneTls, ASecondSessionDoesNotTakeAConnectedMachine) {
  start();
  if (HasFatalFailure()) return;
  auto t1 = tls_as("m1");
  FakeMachine real("m1", "r1"), second("m1", "r1");
  ASSERT_TRUE(real.connect(tcp(), &t1)) << real.error().str();
  real.report();
  // A second session with the same certificate while the first one talks: refused.
  EXPECT_FALSE(second.connect(tcp(), &t1));
  EXPECT_EQ(second.error().code, rpc::kConflict) << second.error().str();
  real.report();
  auto shown = call("machine.show", {{"machine", "m1"}});
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ((*shown)["connected"], true);
  // The real machine still gets its commands: a job lands on it.
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 1}}).ok());
  ASSERT_TRUE(call("job.create", job("web", "a")).ok());
  for (int i = 0; i < 250 && real.running().empty(); ++i) {
    real.report();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(real.running().size(), 1u);
  // A session that closed leaves at once: the next one registers.
  real.disconnect();
  FakeMachine back("m1", "r1");
  for (int i = 0; i < 50 && !back.connect(tcp(), &t1); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(back.error().code, 0) << back.error().str();
  // One that fell silent (no FIN: a machine that lost power) is replaced after the
  // dead-machine timeout (3 x 200 ms here), and closed.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  FakeMachine after("m1", "r1");
  ASSERT_TRUE(after.connect(tcp(), &t1)) << after.error().str();
  EXPECT_FALSE(back.call("machine.heartbeat", {{"machine", "m1"}}).ok());
}

TEST_F(ControlPlaneTls, CertificatesRotateAndRevokeOnReloadWithoutRestartingTasks) {
  start();
  if (HasFatalFailure()) return;
  auto t1 = tls_as("m1");
  FakeMachine m1("m1", "r1");
  ASSERT_TRUE(m1.connect(tcp(), &t1)) << m1.error().str();
  ASSERT_TRUE(call("entitlement.create", {{"name", "a"}, {"quota", 1}}).ok());
  ASSERT_TRUE(call("job.create", job("web", "a")).ok());
  for (int i = 0; i < 250 && m1.running().empty(); ++i) {
    m1.report();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(m1.starts(), 1) << read_file(dir_ + "/cp.log").value_or("");
  // The machine heartbeats on its own while the test issues certificates (openssl, which
  // on a loaded machine takes longer than the 600 ms after which a silent machine is
  // dead and its task replaced: what this test checks does not happen).
  m1.keep_alive();
  auto before = rpc::Client::connect(tcp(), rpc::kDefaultMaxLine, &t1);
  ASSERT_TRUE(before.ok());
  std::string old_serial = (*before)->server_identity().serial;
  // A new control-plane certificate, and the leaver's revoked; then SIGHUP.
  std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
  ASSERT_EQ(std::system(("(" + tool + " issue " + pki_ + " cp --dns cp.test --ip 127.0.0.1 && " +
                         tool + " revoke " + pki_ + " leaver) >/dev/null")
                            .c_str()),
            0);
  EXPECT_TRUE(call_as("leaver", "job.ls").ok());  // not yet: the old CRL is loaded
  // A client that keeps its context resumes its session from a ticket...
  auto keeper = tls_as("leaver");
  for (bool expect_resumed : {false, true}) {
    auto c = rpc::Client::connect(tcp(), rpc::kDefaultMaxLine, &keeper);
    ASSERT_TRUE(c.ok()) << c.error().str();
    EXPECT_TRUE((*c)->call("job.ls", json::object()).ok());  // the ticket arrives meanwhile
    EXPECT_EQ((*c)->resumed(), expect_resumed);
  }
  kill(pid_, SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The machine's session carries on; its task was never restarted.
  m1.stop_keep_alive();
  for (int i = 0; i < 5; ++i) {
    m1.report();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(m1.call("machine.heartbeat", {{"machine", "m1"}}).ok());
  EXPECT_EQ(m1.starts(), 1);
  EXPECT_EQ(m1.stops(), 0);
  // New handshakes get the new certificate; the revoked one is refused, logged why.
  auto after = rpc::Client::connect(tcp(), rpc::kDefaultMaxLine, &t1);
  ASSERT_TRUE(after.ok());
  EXPECT_NE((*after)->server_identity().serial, old_serial);
  EXPECT_FALSE(call_as("leaver", "job.ls").ok());
  // ...but not past a reload: the ticket key is new, the revoked certificate is checked.
  auto resumed = rpc::Client::connect(tcp(), rpc::kDefaultMaxLine, &keeper);
  EXPECT_FALSE(resumed.ok() && (*resumed)->call("job.ls", json::object()).ok());
  std::string log = read_file(dir_ + "/cp.log").value_or("");
  EXPECT_NE(log.find("revoked"), std::string::npos)
      << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
}

TEST_F(ControlPlaneTls, WeftctlOverTlsTakesFlagsEnvironmentOrItsConfigFile) {
  start();
  if (HasFatalFailure()) return;
  auto t1 = tls_as("m1");
  FakeMachine m1("m1", "r1");
  ASSERT_TRUE(m1.connect(tcp(), &t1)) << m1.error().str();
  ASSERT_TRUE(
      call("entitlement.create", {{"name", "a"}, {"quota", 1}, {"owners", {"CN=alice"}}}).ok());
  ASSERT_TRUE(call("job.create", job("web", "a")).ok());
  auto run = [&](const std::string& env, const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc = std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " + env +
                          " " WEFTCTL_BIN " " + args + " >" + out + " 2>&1")
                             .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  auto id = [&](const std::string& who) {
    return "--tls-ca " + pki_ + "/ca.pem --tls-cert " + pki_ + "/" + who + ".pem --tls-key " +
           pki_ + "/" + who + ".key";
  };
  // Flags.
  auto [rc1, out1] = run("", "--controlplane " + tcp() + " " + id("viewer") + " job ls");
  EXPECT_EQ(rc1, 0) << out1;
  EXPECT_NE(out1.find("web"), std::string::npos) << out1;
  auto [rc2, out2] = run("", "--controlplane " + tcp() + " " + id("viewer") + " job stop web");
  EXPECT_EQ(rc2, 1) << out2;
  EXPECT_NE(out2.find("needs the operator role"), std::string::npos) << out2;
  // No certificate for a tls:// endpoint: a clear error naming what to give.
  auto [rc3, out3] = run("", "--controlplane " + tcp() + " job ls");
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("--tls-cert"), std::string::npos) << out3;
  // The environment.
  std::string env = "WEFT_CONTROLPLANE=" + tcp() + " WEFT_TLS_CA=" + pki_ +
                    "/ca.pem WEFT_TLS_CERT=" + pki_ + "/alice.pem WEFT_TLS_KEY=" + pki_ +
                    "/alice.key";
  auto [rc4, out4] = run(env, "job show web --json");
  EXPECT_EQ(rc4, 0) << out4;
  EXPECT_NE(out4.find("hunter2"), std::string::npos) << out4;  // alice owns it
  // The config file (~/.config/weft/weftctl.toml), overridden by a flag.
  ASSERT_TRUE(mkdir_p(dir_ + "/.config/weft").ok());
  ASSERT_TRUE(write_file(dir_ + "/.config/weft/weftctl.toml",
                         "controlplane = \"" + tcp() + "\"\ntls_ca = \"" + pki_ +
                             "/ca.pem\"\ntls_cert = \"" + pki_ + "/root.pem\"\ntls_key = \"" +
                             pki_ + "/root.key\"\n")
                  .ok());
  auto [rc5, out5] = run("", "machine drain nosuch");
  EXPECT_NE(out5.find("unknown machine"), std::string::npos) << out5;  // admin: allowed
  auto [rc6, out6] = run("", "audit ls --since 1h");
  EXPECT_EQ(rc6, 0) << out6;
  EXPECT_NE(out6.find("CN=viewer"), std::string::npos) << out6;
  EXPECT_NE(out6.find("denied"), std::string::npos) << out6;
  auto [rc7, out7] = run("", "--tls-cert " + pki_ + "/viewer.pem --tls-key " + pki_ +
                                 "/viewer.key job show web --json");
  EXPECT_EQ(rc7, 0) << out7;
  EXPECT_EQ(out7.find("hunter2"), std::string::npos) << out7;
  // A config file with a mistake names its line.
  ASSERT_TRUE(write_file(dir_ + "/.config/weft/weftctl.toml", "controlplane = 1\n").ok());
  auto [rc8, out8] = run("", "job ls");
  EXPECT_EQ(rc8, 2);
  EXPECT_NE(out8.find("weftctl.toml:1"), std::string::npos) << out8;
}

// Issue 48: `weftctl task exec` reaches the task's machine for an operator of the task's
// entitlement, never for a viewer or another entitlement's operator, and every call,
// refusals included, is audited with its command line. The bytes both ways go through
// the control plane (the fake machine's agent echoes its command line, keeps the input,
// and exits 3 once its input ended).
TEST_F(ControlPlaneTls, TaskExecIsForOperatorsOfItsEntitlementAndAudited) {
  start();
  if (HasFatalFailure()) return;
  auto t1 = tls_as("m1");
  FakeMachine m1("m1", "r1");
  ASSERT_TRUE(m1.connect(tcp(), &t1)) << m1.error().str();
  m1.keep_alive();
  ASSERT_TRUE(
      call("entitlement.create", {{"name", "a"}, {"quota", 1}, {"owners", {"CN=alice"}}}).ok());
  ASSERT_TRUE(
      call("entitlement.create", {{"name", "b"}, {"quota", 1}, {"owners", {"CN=bob"}}}).ok());
  ASSERT_TRUE(call("job.create", job("web", "a")).ok());
  std::string task;
  for (int i = 0; i < 500 && task.empty(); ++i) {
    auto shown = call("job.show", {{"name", "web"}});
    if (shown.ok() && (*shown)["tasks"].size() == 1 && (*shown)["tasks"][0]["state"] == "running")
      task = (*shown)["tasks"][0]["id"];
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(task.empty()) << call("job.show", {{"name", "web"}})->dump(2);
  ASSERT_TRUE(write_file(dir_ + "/typed", "typed line\n").ok());
  auto run = [&](const std::string& who, const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc = std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ +
                          " " WEFTCTL_BIN " --controlplane " + tcp() + " --tls-ca " + pki_ +
                          "/ca.pem --tls-cert " + pki_ + "/" + who + ".pem --tls-key " + pki_ +
                          "/" + who + ".key " + args + " <" + dir_ + "/typed >" + out + " 2>&1")
                             .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  // Alice runs a command in her task: its output, its exit status, and her input there.
  auto [rc, out] = run("alice", "task exec -T " + task + " -- sh -c 'echo hi'");
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("ran: sh -c echo hi"), std::string::npos) << out;
  EXPECT_EQ(m1.exec_input(), "typed line\n");
  auto events = m1.events();
  EXPECT_NE(std::find(events.begin(), events.end(), "exec " + task), events.end());
  // A viewer and another entitlement's operator are refused before any machine hears.
  auto [rc_viewer, out_viewer] = run("viewer", "task exec -T " + task + " -- id");
  EXPECT_EQ(rc_viewer, 1) << out_viewer;
  EXPECT_NE(out_viewer.find("needs the operator role"), std::string::npos) << out_viewer;
  auto [rc_bob, out_bob] = run("bob", "task exec -T " + task + " -- cat /etc/shadow");
  EXPECT_EQ(rc_bob, 1) << out_bob;
  EXPECT_EQ(m1.events().size(), events.size());
  // A bad request names its field; an unknown task says so.
  EXPECT_EQ(field_named(call_as("alice", "task.exec", {{"id", task}, {"command", json::array()}})),
            "command");
  EXPECT_EQ(
      field_named(call_as("alice", "task.exec", {{"id", task}, {"command", {"sh"}}, {"rows", 0}})),
      "rows");
  EXPECT_EQ(field_named(call_as("alice", "task.exec", {{"id", "web.0.9"}, {"command", {"sh"}}})),
            "id");
  // Every call is in the audit log with its command line, refusals included.
  auto audit = call("audit.ls");
  ASSERT_TRUE(audit.ok());
  auto has = [&](const std::string& who, const std::string& target, const std::string& result) {
    for (const auto& e : (*audit)["entries"])
      if (e["who"].get<std::string>().find(who) != std::string::npos &&
          e["method"] == "task.exec" && e["target"] == target &&
          e["result"].get<std::string>().rfind(result, 0) == 0)
        return true;
    return false;
  };
  EXPECT_TRUE(has("CN=alice", task + " -- sh -c \"echo hi\"", "ok")) << audit->dump(1);
  EXPECT_TRUE(has("CN=viewer", task + " -- id", "denied")) << audit->dump(1);
  EXPECT_TRUE(has("CN=bob", task + " -- cat /etc/shadow", "denied")) << audit->dump(1);
}

}  // namespace
}  // namespace weft::testing
