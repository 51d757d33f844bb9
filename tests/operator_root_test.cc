// What an operator does every day, through the real daemons (issue 36): a task's output
// read from anywhere through the control plane, as each role; entitlements that change;
// the web view. Three machines (network namespaces with their own agent, sidekick and
// hcs), mutual TLS, weftctl run as an operator, a viewer, a log reader and an admin.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "common/fs.h"
#include "common/rpc/protocol.h"
#include "common/strings.h"
#include "testing/sanitizers.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"

namespace weft::testing {
namespace {

json job_params(const std::string& name, const std::string& ent, int count,
                const std::string& script) {
  return {{"name", name},
          {"entitlement", ent},
          {"count", count},
          {"max_unavailable", 1},
          {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
          {"task", {{"argv", {"/bin/sh", "-c", script}}}}};
}

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

class Operator : public ::testing::Test {
 protected:
  Operator() : Operator(ClusterOptions{.machines = 3}) {}
  explicit Operator(ClusterOptions opts) : c_(std::move(opts)) {}
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.setup()) << c_.logs();
    // People: alice runs the web entitlement's jobs, bob is an operator of another team,
    // vic a viewer, olga on call (a viewer the access.logs grant lets read logs).
    std::string pki = c_.dir() + "/pki";
    std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
    std::string cmds = tool + " issue " + pki + " alice --ou operator && " + tool + " issue " +
                       pki + " bob --ou operator && " + tool + " issue " + pki +
                       " vic --ou viewer && " + tool + " issue " + pki + " olga --ou oncall && " +
                       tool + " issue " + pki + " ada --ou admin";
    ASSERT_EQ(std::system(("(" + cmds + ") >/dev/null").c_str()), 0);
    c_.set_cp_extra(
        "web_listen = \"127.0.0.1:9480\"\n[access]\nviewer = [\"OU=viewer\", \"OU=oncall\"]\n"
        "logs = [\"OU=oncall\"]\n");
    c_.start_cp();
    for (int i = 0; i < c_.machines(); ++i) c_.start_machine(i);
    ASSERT_TRUE(c_.wait_all_ready()) << c_.cp("machine.ls")->dump(2) << c_.logs();
  }
  // weftctl as `who` over mutual TLS from machine 0's network namespace; its output and
  // exit status.
  std::pair<int, std::string> weftctl(const std::string& who, const std::string& args,
                                      int timeout_s = 20) {
    std::string pki = c_.dir() + "/pki/";
    std::string cmd = "sh -c 'timeout " + std::to_string(timeout_s) + " " + WEFTCTL_BIN +
                      " --controlplane tls://10.77.0.1:7070 --tls-ca " + pki +
                      "ca.pem --tls-cert " + pki + who + ".pem --tls-key " + pki + who + ".key " +
                      args + "; echo \"rc=$?\"'";
    auto r = c_.run_in(0, cmd);
    if (!r.ok()) return {-1, r.error().str()};
    std::string out = *r;
    size_t at = out.rfind("rc=");
    if (at == std::string::npos) return {-1, out};
    return {std::atoi(out.c_str() + at + 3), out.substr(0, at)};
  }
  // What weftctl's bash completion (as the packages install it) offers after `words`,
  // names asked of this control plane (its Unix socket).
  std::set<std::string> complete(const std::string& words) {
    std::string script = c_.dir() + "/weftctl.bash";
    std::string bindir = std::string(WEFTCTL_BIN).substr(0, std::string(WEFTCTL_BIN).rfind('/'));
    std::string cmd = std::string(WEFTCTL_BIN) + " completion bash > " + script +
                      " && PATH=" + bindir + ":$PATH WEFT_CONTROLPLANE=" + c_.dir() +
                      "/cp.sock bash -c 'source " + script + "; COMP_WORDS=(weftctl " + words +
                      " \"\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _weftctl_bash; printf "
                      "\"%s\\n\" \"${COMPREPLY[@]}\"'";
    std::set<std::string> out;
    FILE* f = ::popen(cmd.c_str(), "r");
    if (!f) return out;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      std::string w(line);
      if (!w.empty() && w.back() == '\n') w.pop_back();
      if (!w.empty()) out.insert(w);
    }
    ::pclose(f);
    return out;
  }
  json wait_running(const std::string& job, size_t count) {
    json r = c_.wait_cp("job.show", {{"name", job}}, [&](const json& j) {
      size_t n = 0;
      for (const auto& t : j["tasks"]) n += t["state"] == "running";
      return n == count;
    });
    EXPECT_FALSE(r.is_null()) << job << ": " << c_.cp("job.show", {{"name", job}})->dump(2)
                              << c_.logs();
    return r;
  }
  // Alice's entitlement web and its job "shell" of `count` tasks that sleep, running: the
  // job.show of it (null if it did not start).
  json alices_shells(int count) {
    EXPECT_TRUE(
        c_.cp("entitlement.create", {{"name", "web"}, {"quota", 3}, {"owners", {"CN=alice"}}})
            .ok());
    EXPECT_TRUE(c_.cp("job.create", job_params("shell", "web", count, "exec sleep 600")).ok());
    return wait_running("shell", static_cast<size_t>(count));
  }
  ClusterHarness c_;
};

TEST_F(Operator, ATasksOutputIsReadFromAnywhereByThoseAllowed) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 3}, {"owners", {"CN=alice"}}}).ok());
  ASSERT_TRUE(c_.cp("job.create",
                    job_params("chatty", "web", 2,
                               "echo started; echo to-stderr >&2; i=0; while [ $i -lt 3000 ]; do "
                               "echo tick $i; i=$((i+1)); sleep 0.1; done"))
                  .ok());
  json show = wait_running("chatty", 2);
  ASSERT_FALSE(show.is_null());
  std::string t0;
  for (const auto& t : show["tasks"])
    if (t["index"] == 0 && t["state"] == "running") t0 = t["id"];
  ASSERT_FALSE(t0.empty()) << show.dump(2);

  // An admin (the Unix socket): by job and index, from the task's machine.
  json r = c_.wait_cp(
      "task.logs", {{"job", "chatty"}, {"index", 0}, {"stream", "stdout"}},
      [](const json& j) { return j.value("data", "").find("tick 1\n") != std::string::npos; });
  ASSERT_FALSE(r.is_null()) << c_.cp("task.logs", {{"job", "chatty"}, {"index", 0}})->dump()
                            << c_.logs();
  EXPECT_EQ(r["task"], t0);
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["data"].get<std::string>().rfind("started\ntick 0\n", 0), 0u) << r.dump();
  EXPECT_GE(c_.machine_index(r["machine"]), 0) << r.dump();
  EXPECT_TRUE(r["cursor"].is_object());

  // The owner, from another machine, by weftctl: stderr of index 1.
  auto [rc, out] = weftctl("alice", "job logs chatty --index 1 --stream stderr");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "to-stderr\n");
  // The on-call reader (granted by access.logs), by task id.
  std::tie(rc, out) = weftctl("olga", "task logs --cluster " + t0 + " --stream stdout --tail 2");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(count_of(out, "tick "), 2u) << out;
  // Not an owner, and a viewer: refused, with the reason.
  for (const char* who : {"bob", "vic"}) {
    std::tie(rc, out) = weftctl(who, "job logs chatty");
    EXPECT_NE(rc, 0) << who << ": " << out;
    EXPECT_NE(out.find("may not read the logs of " + t0), std::string::npos) << out;
    EXPECT_EQ(out.find("started"), std::string::npos) << out;
  }
  // Audited: alice's read, and bob's refusal.
  json audit = *c_.cp("audit.ls", {{"limit", 100}});
  bool alice_read = false, bob_refused = false;
  for (const auto& a : audit["entries"]) {
    if (a["method"] != "task.logs") continue;
    std::string who = a.value("who", ""), result = a.value("result", "");
    alice_read |= who.find("CN=alice") != std::string::npos && result == "ok";
    bob_refused |= who.find("CN=bob") != std::string::npos && result.rfind("denied", 0) == 0;
  }
  EXPECT_TRUE(alice_read) << audit.dump(2);
  EXPECT_TRUE(bob_refused) << audit.dump(2);

  // Follow: new output arrives as the task writes it (a long poll through the control
  // plane), for as long as weftctl runs.
  json now = *c_.cp("task.logs", {{"task", t0}, {"stream", "stdout"}, {"tail", 1}});
  std::smatch m;
  std::string last = now["data"].get<std::string>();
  ASSERT_TRUE(std::regex_search(last, m, std::regex("tick ([0-9]+)"))) << last;
  int before = std::stoi(m[1]);
  std::tie(rc, out) = weftctl("alice", "job logs chatty -f --stream stdout --tail 1", 3);
  EXPECT_EQ(rc, 124) << out;  // still following when timeout stopped it
  EXPECT_NE(out.find("tick " + std::to_string(before + 10) + "\n"), std::string::npos) << out;

  // A reply is at most 256 KiB, whatever is asked for.
  r = *c_.cp("task.logs", {{"task", t0}, {"max_bytes", 100'000'000}});
  EXPECT_LE(r["data"].get<std::string>().size(), 256u * 1024);
  // Bad input names the field.
  auto bad = c_.cp("task.logs", {{"task", t0}, {"cursor", "x"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("cursor"), std::string::npos) << bad.error().str();
  bad = c_.cp("task.logs", {{"task", "nosuch.0.1"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, rpc::kNotFound);
  // Out-of-range cursors and indexes are refused with the field named, not read from the
  // start (a file offset past INT64_MAX; an index below 0, also beside a task's id).
  bad = c_.cp("task.logs", {{"task", t0}, {"cursor", {{"seq", 1}, {"offset", UINT64_MAX}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, rpc::kInvalidParams);
  EXPECT_NE(bad.error().str().find("cursor.offset"), std::string::npos) << bad.error().str();
  for (json p : {json{{"job", "chatty"}, {"index", -1}}, json{{"task", t0}, {"index", -1}}}) {
    bad = c_.cp("task.logs", p);
    ASSERT_FALSE(bad.ok()) << p.dump();
    EXPECT_EQ(bad.error().code, rpc::kInvalidParams) << p.dump();
    EXPECT_NE(bad.error().str().find("index"), std::string::npos) << bad.error().str();
  }
}

TEST_F(Operator, FollowingATaskThatEndsPrintsAllOfItAndStops) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 3}, {"owners", {"CN=alice"}}}).ok());
  // It ends after 3 s, and is replaced: weftctl follows the one it started with to its
  // end, though the control plane has the agent forget it once it ended.
  ASSERT_TRUE(c_.cp("job.create", job_params("brief", "web", 1,
                                             "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; "
                                             "sleep 0.3; done"))
                  .ok());
  json show = wait_running("brief", 1);
  ASSERT_FALSE(show.is_null());
  std::string first = show["tasks"][0]["id"];
  int m = c_.machine_index(show["tasks"][0]["machine"]);
  ASSERT_GE(m, 0);
  auto [rc, out] = weftctl("alice", "job logs brief -f --stream stdout", 30);
  EXPECT_EQ(rc, 0) << out;
  for (int i = 1; i <= 10; ++i)
    EXPECT_EQ(count_of(out, "line " + std::to_string(i) + "\n"), 1u) << i << ": " << out;
  // Its output stays readable after its machine forgot the task (the control plane's
  // answer to the report of its end lets the agent drop it).
  for (int i = 0; i < 100 && c_.agent(m, "task.show", {{"id", first}}).ok(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto gone = c_.agent(m, "task.show", {{"id", first}});
  ASSERT_FALSE(gone.ok()) << "the agent still has " << first;
  auto r = c_.cp("task.logs", {{"task", first}, {"stream", "stdout"}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(count_of((*r)["data"], "line "), 10u) << r->dump();
  EXPECT_EQ((*r)["state"], "exited") << r->dump();
}

// Issue 48: `weftctl task exec` runs a command inside a running task (its pid namespace,
// its uid), with pipes (input in, stdout and stderr apart, its exit status) and with a
// terminal; a viewer and another team's operator are refused; each call is audited with
// its command line; a caller that goes away takes its command and the command's cgroup.
TEST_F(Operator, ACommandRunsInsideATaskWithPipesAndWithATerminal) {
  json show = alices_shells(1);
  ASSERT_FALSE(show.is_null());
  const std::string t0 = show["tasks"][0]["id"];
  const int m = c_.machine_index(show["tasks"][0]["machine"]);
  ASSERT_GE(m, 0);
  // The task's own program, as its agent runs it: its cgroup and its uid.
  std::string agent_id;
  auto ls = c_.agent(m, "task.ls");
  ASSERT_TRUE(ls.ok());
  for (const auto& t : (*ls)["tasks"])
    if (t["name"] == t0) agent_id = t["id"];
  ASSERT_FALSE(agent_id.empty()) << ls->dump(2);
  const std::string cgroup = c_.task_cgroup(m, agent_id);
  // "Running" is said once weft-init started the program: its shell may not yet have
  // exec'd sleep on a loaded machine, so look until it has (at most 10 s).
  std::string task_uid;
  for (int i = 0; i < 100 && task_uid.empty(); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (const auto& pid : split(read_file(cgroup + "/cgroup.procs").value_or(""), '\n')) {
      if (pid.empty() || read_file("/proc/" + pid + "/comm").value_or("") != "sleep\n") continue;
      for (const auto& line : split(read_file("/proc/" + pid + "/status").value_or(""), '\n'))
        if (line.rfind("Uid:", 0) == 0) task_uid = split(trim(line.substr(4)), '\t').at(0);
    }
  }
  ASSERT_FALSE(task_uid.empty()) << read_file(cgroup + "/cgroup.procs").value_or("no cgroup");

  // Pipes.
  ASSERT_TRUE(write_file(c_.dir() + "/in", "piped in\n").ok());
  auto [rc, out] = weftctl("alice", "task exec -T " + t0 +
                                        " -- sh -c \"cat; cat /proc/1/comm; id -u; echo oops >&2; "
                                        "exit 7\" <" +
                                        c_.dir() + "/in 2>" + c_.dir() + "/err");
  EXPECT_EQ(rc, 7) << out << c_.logs();
  EXPECT_EQ(out, "piped in\nweft-init\n" + task_uid + "\n");
  EXPECT_EQ(read_file(c_.dir() + "/err").value_or(""), "oops\n");

  // A terminal: the command's stdin is one, of the default size; ^D ends nothing here.
  ASSERT_TRUE(
      write_file(c_.dir() + "/typed", "test -t 0 && echo TTY-$((2+3))\nstty size\nexit 5\n").ok());
  auto [rc_tty, out_tty] =
      weftctl("alice", "task exec -t " + t0 + " -- sh <" + c_.dir() + "/typed");
  EXPECT_EQ(rc_tty, 5) << out_tty << c_.logs();
  EXPECT_NE(out_tty.find("TTY-5\r\n"), std::string::npos) << out_tty;
  EXPECT_NE(out_tty.find("24 80\r\n"), std::string::npos) << out_tty;

  // Refused to a viewer and to another entitlement's operator.
  auto [rc_vic, out_vic] = weftctl("vic", "task exec -T " + t0 + " -- id");
  EXPECT_EQ(rc_vic, 1) << out_vic;
  EXPECT_NE(out_vic.find("needs the operator role"), std::string::npos) << out_vic;
  auto [rc_bob, out_bob] = weftctl("bob", "task exec -T " + t0 + " -- id");
  EXPECT_EQ(rc_bob, 1) << out_bob;

  // A caller that goes away (weftctl killed): its command is killed, its cgroup removed.
  auto [rc_gone, out_gone] =
      weftctl("alice", "task exec -T " + t0 + " -- sleep 1000 </dev/null", 2);
  EXPECT_EQ(rc_gone, 124) << out_gone;
  auto exec_cgroups = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(cgroup))
      n += e.is_directory() && e.path().filename().string().rfind("weft-exec-", 0) == 0;
    return n;
  };
  for (int i = 0; i < 100 && exec_cgroups() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(exec_cgroups(), 0u);

  // The audit log has each call with its command line.
  auto audit = c_.cp("audit.ls");
  ASSERT_TRUE(audit.ok());
  auto has = [&](const std::string& who, const std::string& target, const std::string& result) {
    for (const auto& e : (*audit)["entries"])
      if (e["method"] == "task.exec" &&
          e["who"].get<std::string>().find(who) != std::string::npos && e["target"] == target &&
          e["result"].get<std::string>().rfind(result, 0) == 0)
        return true;
    return false;
  };
  EXPECT_TRUE(has("CN=alice",
                  t0 + " -- sh -c \"cat; cat /proc/1/comm; id -u; echo oops >&2; exit 7\"", "ok"))
      << audit->dump(1);
  EXPECT_TRUE(has("CN=alice", t0 + " -- sh", "ok")) << audit->dump(1);
  EXPECT_TRUE(has("CN=vic", t0 + " -- id", "denied")) << audit->dump(1);
  EXPECT_TRUE(has("CN=bob", t0 + " -- id", "denied")) << audit->dump(1);
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "shell"}}).ok());
}

// A line-protocol client on a plain socket that reads only when told to: it can leave
// what the control plane sends unread, as a hostile client would.
class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool send(const json& msg) {
    std::string line = msg.dump() + "\n";
    return ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
  }
  // The next line, or nullopt past the deadline.
  bool eof() const { return eof_; }
  std::optional<json> next(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        json j = json::parse(buf_.substr(0, nl), nullptr, false);
        buf_.erase(0, nl + 1);
        return j;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0)
        return std::nullopt;
      char chunk[65536];
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n <= 0) {
        eof_ = true;
        return std::nullopt;
      }
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

uint64_t rss_kib(pid_t pid) {
  for (const auto& line :
       split(read_file("/proc/" + std::to_string(pid) + "/status").value_or(""), '\n'))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(trim(line.substr(6)));
  return 0;
}

// The exec flood below: six execs' windows of output reach the control plane at once.
// Unoptimised and instrumented (the sanitizer tree), relaying them held its loop up
// for 2.5 s on a loaded machine, and the agents, hearing nothing for three 500 ms
// heartbeats, rightly went to look for another replica (ending their execs). What this
// test asserts is the memory bound, not the heartbeat: 2 s heartbeats.
class OperatorExecFlood : public Operator {
 protected:
  OperatorExecFlood() : Operator(ClusterOptions{.machines = 3, .heartbeat = "2s"}) {}
};

// Issue 59: a client acknowledging exec output it never read made the control plane
// hold up to 64 MiB an exec (three execs took it from 27 to 219 MB in 4 s). Now an
// acknowledgement beyond what was sent ends the exec, and what reaches the agent is at
// most what has left the control plane: it holds one window an exec, whatever is said.
TEST_F(OperatorExecFlood, AnExecClientThatAcknowledgesWhatItNeverReadGetsNoMoreThanItsWindow) {
  json show = alices_shells(2);  // two tasks: an agent runs at most 4 execs a task
  ASSERT_FALSE(show.is_null());
  const std::string t0 = show["tasks"][0]["id"], t1 = show["tasks"][1]["id"];
  const pid_t cp = c_.cp_pid();
  const uint64_t before = rss_kib(cp);
  ASSERT_GT(before, 0u);

  // Two liars of three execs each of an endless output, reading only the answers that
  // start them: one says it read 2^63 bytes every 5 ms, the other 64 KiB more every 5 ms.
  auto start_execs = [&](RawClient& c, const std::string& task, std::vector<uint64_t>& execs) {
    for (int i = 1; i <= 3; ++i)
      ASSERT_TRUE(c.send({{"jsonrpc", "2.0"},
                          {"id", i},
                          {"method", "task.exec"},
                          {"params", {{"id", task}, {"command", {"cat", "/dev/zero"}}}}}));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (execs.size() < 3) {
      auto m = c.next(deadline);
      ASSERT_TRUE(m) << "no answer to task.exec";
      if (m->contains("id") && m->contains("error")) FAIL() << m->dump() << c_.logs();
      if (m->contains("id") && m->contains("result")) execs.push_back((*m)["result"]["exec"]);
    }
  };
  RawClient huge(c_.cp_socket()), stepping(c_.cp_socket());
  ASSERT_TRUE(huge.ok() && stepping.ok());
  std::vector<uint64_t> huge_execs, stepping_execs;
  start_execs(huge, t0, huge_execs);
  ASSERT_FALSE(HasFatalFailure());
  start_execs(stepping, t1, stepping_execs);
  ASSERT_FALSE(HasFatalFailure());
  uint64_t peak = 0, step = 0;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(4);
       std::chrono::steady_clock::now() < end;) {
    step += 64 * 1024;
    for (uint64_t e : huge_execs)
      huge.send({{"jsonrpc", "2.0"},
                 {"method", "task.exec.input"},
                 {"params", {{"exec", e}, {"ack", uint64_t{1} << 63}}}});
    for (uint64_t e : stepping_execs)
      stepping.send({{"jsonrpc", "2.0"},
                     {"method", "task.exec.input"},
                     {"params", {{"exec", e}, {"ack", step}}}});
    peak = std::max(peak, rss_kib(cp));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Six windows of 256 KiB (as base64 in JSON) are a few MiB; the flaw took ~190 MiB.
  // (Not under AddressSanitizer: its quarantine keeps freed buffers resident.)
  if (!kUnderAsan) {
    EXPECT_LT(peak, before + 32 * 1024) << "RSS from " << before << " KiB to " << peak << " KiB";
  }
  // Each of the liars' execs was ended, and told why.
  for (RawClient* c : {&huge, &stepping}) {
    std::set<uint64_t> ended;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ended.size() < 3) {
      auto m = c->next(deadline);
      ASSERT_TRUE(m) << "ended: " << ended.size() << " of 3, " << (c->eof() ? "closed" : "silent")
                     << c_.logs();
      if ((*m).value("method", "") != "task.exec.exit") continue;
      EXPECT_NE((*m)["params"].value("error", "").find("acknowledged"), std::string::npos)
          << m->dump() << c_.logs();
      ended.insert((*m)["params"]["exec"].get<uint64_t>());
    }
  }
  // The control plane is not holding them, and serves on.
  auto audit = c_.cp("audit.ls");
  ASSERT_TRUE(audit.ok()) << audit.error().str();
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "shell"}}).ok());
}

// Machines of an entitlement, from machine.ls: id -> its row.
std::map<std::string, json> machines_of(ClusterHarness& c, const std::string& ent) {
  std::map<std::string, json> out;
  json ls = *c.cp("machine.ls");
  for (const auto& m : ls["machines"])
    if (m["entitlement"] == ent) out[m["machine"]] = m;
  return out;
}

TEST_F(Operator, AnEntitlementChangesQuotaAndProfileAndIsRemovedWhenEmpty) {
  ASSERT_TRUE(c_.cp("entitlement.create",
                    {{"name", "web"}, {"quota", 1}, {"profile", "dev"}, {"owners", {"CN=alice"}}})
                  .ok());
  // Bad input names the field, and changes nothing.
  auto bad = c_.cp("entitlement.update", {{"name", "web"}, {"quota", 0}, {"profile", "web"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("quota"), std::string::npos) << bad.error().str();
  bad = c_.cp("entitlement.update", {{"name", "web"}, {"profile", "nosuch"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("profile"), std::string::npos) << bad.error().str();
  EXPECT_EQ((*c_.cp("entitlement.show", {{"name", "web"}}))["profile"], "dev");
  // Only admins change capacity.
  auto [rc, out] = weftctl("alice", "entitlement update web --quota 3");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("admin"), std::string::npos) << out;

  std::tie(rc, out) = weftctl("ada", "entitlement update web --quota 3");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("quota 3"), std::string::npos) << out;
  ASSERT_TRUE(c_.cp("job.create", job_params("site", "web", 2, "exec sleep 600")).ok());
  json show = wait_running("site", 2);
  ASSERT_FALSE(show.is_null());
  std::set<std::string> ids;
  for (const auto& t : show["tasks"]) ids.insert(t["id"]);
  // Completion names what the control plane has.
  EXPECT_EQ(complete("job show"), std::set<std::string>{"site"});
  EXPECT_EQ(complete("entitlement rm"), std::set<std::string>{"web"});
  EXPECT_EQ(complete("machine assign"), (std::set<std::string>{"m0", "m1", "m2"}));
  // Two machines run its tasks: the quota may not go below them.
  bad = c_.cp("entitlement.update", {{"name", "web"}, {"quota", 1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, rpc::kConflict) << bad.error().str();
  EXPECT_NE(bad.error().str().find("2 of the entitlement's machines run tasks"), std::string::npos)
      << bad.error().str();

  // A new profile rolls over its machines one at a time; the tasks keep running (no
  // restart, same ids).
  std::tie(rc, out) =
      weftctl("ada", "entitlement update web --profile web --max-unavailable 1 --timeout 60", 70);
  EXPECT_EQ(rc, 0) << out << c_.logs();
  EXPECT_NE(out.find("profile web applied on every machine of web"), std::string::npos) << out;
  auto web = machines_of(c_, "web");
  ASSERT_EQ(web.size(), 2u) << c_.cp("machine.ls")->dump(1) << out;
  for (const auto& [id, m] : web) EXPECT_EQ(m["profile"], "web") << m.dump();
  show = *c_.cp("job.show", {{"name", "site"}});
  std::set<std::string> after;
  for (const auto& t : show["tasks"])
    if (t["state"] == "running") after.insert(t["id"]);
  EXPECT_EQ(after, ids) << show.dump(2);

  // A named machine: the free one is given to web, and stays though it runs nothing.
  std::string free_machine;
  for (int i = 0; i < c_.machines(); ++i)
    if (!web.count(c_.machine_id(i))) free_machine = c_.machine_id(i);
  ASSERT_FALSE(free_machine.empty());
  std::tie(rc, out) = weftctl("ada", "machine assign " + free_machine + " web");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(machines_of(c_, "web").size(), 3u);
  json e = *c_.cp("entitlement.show", {{"name", "web"}});
  EXPECT_EQ(e["machines"].size(), 3u) << e.dump(2);
  // At its quota (3): no fourth; and the quota may not drop below the assigned one and
  // the two busy ones.
  bad = c_.cp("entitlement.update", {{"name", "web"}, {"quota", 2}});
  EXPECT_FALSE(bad.ok());
  // Not removable while it has jobs, then while a machine is assigned to it.
  std::tie(rc, out) = weftctl("ada", "entitlement rm web");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("still has jobs (site)"), std::string::npos) << out;
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "site"}}).ok());
  ASSERT_FALSE(c_.wait_cp("job.ls", json::object(), [](const json& j) {
                   return j["jobs"].empty();
                 }).is_null());
  std::tie(rc, out) = weftctl("ada", "entitlement rm web");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("machine " + free_machine + " is assigned to web"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("ada", "machine release " + free_machine);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(free_machine + " is in the free pool"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("ada", "entitlement rm web");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(machines_of(c_, "web").empty());
  // Durable: a restarted control plane has no such entitlement, and its audit log has
  // every change.
  c_.kill_cp(SIGTERM);
  c_.start_cp();
  json ls = c_.wait_cp("entitlement.ls", json::object(), [](const json&) { return true; });
  ASSERT_FALSE(ls.is_null());
  EXPECT_TRUE(ls["entitlements"].empty()) << ls.dump(2);
  json audit = *c_.cp("audit.ls", {{"limit", 200}});
  std::set<std::string> methods;
  for (const auto& a : audit["entries"])
    if (a["who"].get<std::string>().find("CN=ada") != std::string::npos && a["result"] == "ok")
      methods.insert(a["method"]);
  for (const char* m :
       {"entitlement.update", "machine.assign", "machine.release", "entitlement.rm"})
    EXPECT_TRUE(methods.count(m)) << m << ": " << audit.dump(2);
}

// A profile roll survives a SIGKILL of the control plane (controlplane/store/notes.h):
// with every sidekick held (SIGSTOP), the roll has one machine applying and two
// waiting; the restarted control plane shows the same, keeps the waiting two at the old
// profile, and once the sidekicks go on finishes the roll one machine at a time (before
// the roll was kept, the remaining machines all switched at once).
TEST_F(Operator, AProfileRollGoesOnWhereItWasAfterTheControlPlaneIsKilled) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "roll"}, {"quota", 3}, {"profile", "dev"}}).ok());
  for (int i = 0; i < c_.machines(); ++i)
    ASSERT_TRUE(
        c_.cp("machine.assign", {{"machine", c_.machine_id(i)}, {"entitlement", "roll"}}).ok());
  ASSERT_FALSE(c_.wait_cp("machine.ls", json::object(),
                          [&](const json&) {
                            auto m = machines_of(c_, "roll");
                            if (m.size() != 3) return false;
                            for (const auto& [id, row] : m)
                              if (row["state"] != "ok") return false;
                            return true;
                          })
                   .is_null())
      << c_.cp("machine.ls")->dump(2);
  struct Resume {  // the sidekicks go on, whatever the test's end
    ClusterHarness& c;
    ~Resume() {
      for (int i = 0; i < c.machines(); ++i) c.signal_sidekick(i, SIGCONT);
    }
  } resume{c_};
  for (int i = 0; i < c_.machines(); ++i) c_.signal_sidekick(i, SIGSTOP);
  auto updated =
      c_.cp("entitlement.update", {{"name", "roll"}, {"profile", "web"}, {"max_unavailable", 1}});
  ASSERT_TRUE(updated.ok()) << updated.error().str();
  auto roll_of = [&]() -> json {
    auto r = c_.cp("entitlement.show", {{"name", "roll"}});
    return r.ok() && r->contains("profile_roll") ? (*r)["profile_roll"] : json();
  };
  json before = roll_of();
  ASSERT_TRUE(before.is_object()) << c_.cp("entitlement.show", {{"name", "roll"}})->dump(2);
  ASSERT_EQ(before["applying"].size(), 1u) << before.dump();
  ASSERT_EQ(before["waiting"].size(), 2u) << before.dump();
  // An acknowledged write after it: the roll's note is durable.
  ASSERT_TRUE(c_.cp("rebalance.pause", {{"name", "roll"}, {"paused", false}}).ok());
  c_.kill_cp(SIGKILL);
  c_.start_cp();
  json after = roll_of();
  EXPECT_EQ(after, before) << "the roll goes on where it was";
  for (const auto& [id, row] : machines_of(c_, "roll")) {
    const bool waiting = std::find(before["waiting"].begin(), before["waiting"].end(), id) !=
                         before["waiting"].end();
    EXPECT_EQ(row["desired_profile"], waiting ? "dev" : "web") << id << ": " << row.dump();
  }
  // The sidekicks go on: the roll ends, never more than one machine applying at once.
  for (int i = 0; i < c_.machines(); ++i) c_.signal_sidekick(i, SIGCONT);
  size_t most = 0;
  json done = c_.wait_cp(
      "entitlement.show", {{"name", "roll"}},
      [&](const json& e) {
        if (!e.contains("profile_roll")) return true;
        most = std::max(most, e["profile_roll"]["applying"].size());
        return e["profile_roll"].value("done", false);
      },
      60000);
  ASSERT_FALSE(done.is_null()) << roll_of().dump() << c_.logs();
  EXPECT_LE(most, 1u);
  json ok = c_.wait_cp("machine.ls", json::object(), [&](const json&) {
    for (const auto& [id, row] : machines_of(c_, "roll"))
      if (row["profile"] != "web") return false;
    return true;
  });
  EXPECT_FALSE(ok.is_null()) << c_.cp("machine.ls")->dump(2);
}

// What a shell command writes to its standard output.
std::string output_of(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

// Headless Chromium (Debian's) in the control plane's network namespace, on its loopback
// web view: `args` (--dump-dom or --screenshot=...) and the page; its standard output.
std::string chromium(const ClusterHarness& c, const std::string& args) {
  std::string profile = c.dir() + "/chromium";
  return output_of("timeout 60 ip netns exec " + c.hub_netns() +
                   " chromium --headless --no-sandbox --disable-gpu --no-first-run "
                   "--disable-dev-shm-usage --user-data-dir=" +
                   profile + " " + args + " http://127.0.0.1:9480/ 2>/dev/null");
}

TEST_F(Operator, TheWebViewShowsTheFleetInABrowser) {
  ASSERT_EQ(std::system("command -v chromium >/dev/null"), 0)
      << "chromium is not installed (scripts/setup.sh --test installs it)";
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "batch"}, {"quota", 1}}).ok());
  ASSERT_TRUE(c_.cp("job.create", job_params("site", "web", 2, "exec sleep 600")).ok());
  ASSERT_FALSE(wait_running("site", 2).is_null());
  ASSERT_TRUE(c_.cp("job.create", job_params("crunch", "batch", 1, "exec sleep 600")).ok());
  ASSERT_FALSE(wait_running("crunch", 1).is_null());
  auto ev = c_.cp(
      "maintenance.schedule",
      {{"machine", "m0"}, {"start", "+2h"}, {"duration", "4h"}, {"reason", "firmware <update>"}});
  ASSERT_TRUE(ev.ok()) << ev.error().str();

  // What the browser built from the page: every machine, entitlement, job and event.
  std::string dom = chromium(c_, "--dump-dom");
  ASSERT_NE(dom.find("weft fleet"), std::string::npos) << dom.substr(0, 2000);
  // In service: ok, or degraded (another test's OOM kill is host-wide).
  auto in_service = [](const std::string& page) {
    return count_of(page, "class=\"machine state-ok\"") +
           count_of(page, "class=\"machine state-degraded\"");
  };
  EXPECT_EQ(in_service(dom), 3u) << dom;
  EXPECT_EQ(count_of(dom, "data-entitlement=\"web\" x="), 2u) << dom;
  EXPECT_EQ(count_of(dom, "data-entitlement=\"batch\" x="), 1u) << dom;
  EXPECT_EQ(count_of(dom, "<tr class=\"entitlement\""), 2u) << dom;
  EXPECT_NE(dom.find("<td class=\"used\">2 / 2</td>"), std::string::npos) << dom;
  EXPECT_EQ(count_of(dom, "<tr class=\"job\""), 2u) << dom;
  EXPECT_NE(dom.find("data-job=\"site\"><td>site</td><td>web</td><td class=\"ready\">2 / 2</td>"),
            std::string::npos)
      << dom;
  EXPECT_EQ(count_of(dom, "<tr class=\"maintenance\""), 1u) << dom;
  EXPECT_NE(dom.find("firmware &lt;update&gt;"), std::string::npos) << dom;  // escaped
  EXPECT_EQ(dom.find("<script"), std::string::npos);

  // A screenshot of it: a real PNG of the window's size (kept in docs/ as the picture).
  std::string png = c_.dir() + "/fleet.png";
  chromium(c_, "--window-size=1280,1000 --hide-scrollbars --screenshot=" + png);
  auto img = read_file(png);
  ASSERT_TRUE(img.ok()) << "no screenshot";
  ASSERT_GT(img->size(), 10'000u);
  ASSERT_EQ(img->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](size_t at) {
    const auto* b = reinterpret_cast<const unsigned char*>(img->data() + at);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  };
  EXPECT_EQ(be32(16), 1280u);  // IHDR width
  EXPECT_EQ(be32(20), 1000u);  // and height
  if (const char* keep = std::getenv("WEFT_WEB_VIEW_SCREENSHOT")) (void)write_file(keep, *img);

  // A viewer's certificate gets the same page over mutual TLS (weftctl web).
  auto [rc, out] = weftctl("vic", "web");
  EXPECT_EQ(rc, 0) << out.substr(0, 500);
  EXPECT_EQ(in_service(out), 3u) << out.substr(0, 500);
  // What tasks use (issue 48): asked of the agents while pages are looked at; a later
  // page has both jobs' figures, with what they reserved.
  std::string usage;
  for (int i = 0; i < 20; ++i) {
    usage = weftctl("vic", "web").second;
    if (usage.find("data-job=\"crunch\"><td>crunch</td><td>batch</td><td>1</td>") !=
        std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_NE(usage.find("<tr class=\"usage-job\" data-job=\"site\"><td>site</td><td>web</td>"
                       "<td>2</td><td class=\"cpu\">"),
            std::string::npos)
      << usage;
  EXPECT_NE(usage.find("/ 0.20</td>"), std::string::npos) << usage;  // site's 2 × 100 m
  EXPECT_EQ(count_of(usage, "<tr class=\"usage-machine\""), 3u) << usage;

  // Issue 43 (7): only the host names it is configured for. A page an attacker's DNS
  // name rebinds to 127.0.0.1 sends its own name: refused, with nothing of the fleet.
  auto get_as = [&](const std::string& host) {
    return output_of("ip netns exec " + c_.hub_netns() +
                     " bash -c 'exec 3<>/dev/tcp/127.0.0.1/9480 && printf \"GET / "
                     "HTTP/1.1\\r\\nHost: " +
                     host + "\\r\\nConnection: close\\r\\n\\r\\n\" >&3 && timeout 5 cat <&3'");
  };
  for (const char* evil : {"rebind.attacker.example", "rebind.attacker.example:9480", "m0"}) {
    std::string page = get_as(evil);
    EXPECT_EQ(page.rfind("HTTP/1.1 421", 0), 0u) << evil << ": " << page.substr(0, 300);
    EXPECT_EQ(page.find("weft fleet"), std::string::npos) << evil;
  }
  for (const char* ok : {"127.0.0.1:9480", "localhost:9480", "LOCALHOST"}) {
    std::string page = get_as(ok);
    EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << ok << ": " << page.substr(0, 300);
    EXPECT_NE(page.find("weft fleet"), std::string::npos) << ok;
  }
}

// Issue 43 (2): a task's output belongs to the entitlement it ran in. bob's payroll
// printed a secret and was stopped; alice made her own payroll in her entitlement; the
// old task's output is bob's to read (its entitlement's owner), never alice's, though
// her job carries the name now.
TEST_F(Operator, AGoneTasksOutputStaysWithTheEntitlementItRanIn) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "pay-b"}, {"quota", 1}, {"owners", {"CN=bob"}}}).ok());
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "pay-a"}, {"quota", 1}, {"owners", {"CN=alice"}}})
          .ok());
  ASSERT_TRUE(c_.cp("job.create",
                    job_params("payroll", "pay-b", 1, "echo bobs-secret-4711; exec sleep 600"))
                  .ok());
  json show = wait_running("payroll", 1);
  ASSERT_FALSE(show.is_null());
  std::string old = show["tasks"][0]["id"];
  bool printed = false;
  for (int i = 0; i < 100 && !printed; ++i) {
    auto r = c_.cp("task.logs", {{"task", old}, {"stream", "stdout"}});
    printed =
        r.ok() && (*r)["data"].get<std::string>().find("bobs-secret-4711") != std::string::npos;
    if (!printed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(printed) << c_.cp("job.show", {{"name", "payroll"}})->dump(2) << c_.logs();
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "payroll"}}).ok());
  ASSERT_FALSE(c_.wait_cp("job.ls", json::object(), [](const json& j) {
                   return j["jobs"].empty();
                 }).is_null());
  ASSERT_TRUE(c_.cp("job.create", job_params("payroll", "pay-a", 1, "exec sleep 600")).ok());
  ASSERT_FALSE(wait_running("payroll", 1).is_null());

  auto [rc, out] = weftctl("alice", "task logs --cluster " + old);
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(out.find("bobs-secret-4711"), std::string::npos) << out;
  EXPECT_NE(out.find("may not read"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("bob", "task logs --cluster " + old);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("bobs-secret-4711"), std::string::npos) << out;
  json audit = *c_.cp("audit.ls", {{"limit", 200}});
  bool refused = false;
  for (const auto& a : audit["entries"])
    refused = refused || (a["method"] == "task.logs" &&
                          a["who"].get<std::string>().find("CN=alice") != std::string::npos &&
                          a["result"] != "ok");
  EXPECT_TRUE(refused) << audit.dump(2);

  // The host's network is a grant of the entitlement (weftctl entitlement grant).
  json host = job_params("hostnet", "pay-a", 1, "exec sleep 600");
  host["task"]["namespaces"] = {{"network", "host"}};
  auto no = c_.cp("job.create", host);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.error().str().find("host_network"), std::string::npos) << no.error().str();
  std::tie(rc, out) = weftctl("ada", "entitlement grant pay-a --host-network --low-ports");
  EXPECT_EQ(rc, 0) << out;
  json e = *c_.cp("entitlement.show", {{"name", "pay-a"}});
  EXPECT_EQ(e["grants"], (json{{"host_network", true}, {"low_ports", true}})) << e.dump(2);
  ASSERT_TRUE(c_.cp("job.create", host).ok());
  ASSERT_FALSE(wait_running("hostnet", 1).is_null());
}

// Issue 43 (6): one identity cannot take every log read. alice holds as many follows as
// she may (16), and more are refused with the reason; bob, the owner of another
// entitlement, still reads.
TEST_F(Operator, OneIdentityCannotTakeEveryLogRead) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 1}, {"owners", {"CN=alice"}}}).ok());
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "ops"}, {"quota", 1}, {"owners", {"CN=bob"}}}).ok());
  ASSERT_TRUE(c_.cp("job.create", job_params("quiet", "web", 1, "echo hi; exec sleep 600")).ok());
  ASSERT_TRUE(
      c_.cp("job.create", job_params("tool", "ops", 1, "echo bobs-line; exec sleep 600")).ok());
  ASSERT_FALSE(wait_running("quiet", 1).is_null());
  ASSERT_FALSE(wait_running("tool", 1).is_null());
  std::string pki = c_.dir() + "/pki/";
  auto as = [&](const std::string& who) {
    return std::string(WEFTCTL_BIN) + " --controlplane tls://10.77.0.1:7070 --tls-ca " + pki +
           "ca.pem --tls-cert " + pki + who + ".pem --tls-key " + pki + who + ".key ";
  };
  std::string outs = c_.dir() + "/follows";
  ASSERT_TRUE(mkdir_p(outs).ok());
  // 24 follows of a task that prints nothing more: each holds a read (a long poll).
  std::string script = "for i in $(seq 24); do (timeout 12 " + as("alice") +
                       "job logs quiet -f --stream stdout >" + outs + "/$i 2>&1; echo rc=$? >>" +
                       outs + "/$i) & done; sleep 6; " + as("bob") +
                       "job logs tool --stream stdout; echo bob-rc=$?; wait";
  auto r = c_.run_in(0, "bash -c '" + script + "'");
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_NE(r->find("bobs-line"), std::string::npos) << *r;
  EXPECT_NE(r->find("bob-rc=0"), std::string::npos) << *r;
  int refused = 0, held = 0;
  for (int i = 1; i <= 24; ++i) {
    std::string o = read_file(outs + "/" + std::to_string(i)).value_or("");
    if (o.find("the most one identity may") != std::string::npos) ++refused;
    if (o.find("rc=124") != std::string::npos) ++held;  // still following at the timeout
  }
  EXPECT_EQ(held, 16) << "follows that held a read to the end";
  EXPECT_EQ(refused, 8);
}

}  // namespace
}  // namespace weft::testing
