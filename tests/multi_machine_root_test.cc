// The cluster end to end on this host (issue 6): weft-controlplane and four machines,
// each a network namespace with its own weft-agent, weft-sidekick and weft-hcs over TCP
// and its own cgroup subtree. Tasks really run; machines really die.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/fs.h"
#include "common/job_file.h"
#include "common/rpc/protocol.h"
#include "tests/agent_harness.h"
#include "tests/cluster_harness.h"
#include "tests/cpu_record.h"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

json job_params(const std::string& name, const std::string& ent, int count, int cpu_milli,
                const std::string& marker = "v1") {
  return {{"name", name},
          {"entitlement", ent},
          {"count", count},
          {"max_unavailable", 1},
          {"per_task", {{"cpu_milli", cpu_milli}, {"mem_mb", 16}}},
          {"task", {{"argv", {"/bin/sh", "-c", "echo " + marker + "; exec sleep 600"}}}}};
}

// Running tasks of a job by index, from the control plane.
std::map<int, json> running_by_index(const json& show) {
  std::map<int, json> out;
  for (const auto& t : show["tasks"])
    if (t["state"] == "running") out[t["index"].get<int>()] = t;
  return out;
}

class MultiMachine : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = root_test_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(c_.start_all());
  }
  // The SRV records machine `machine`'s agent answers for `name` (one query, drill):
  // (port, target) each. An answer that is not NOERROR or NXDOMAIN (no answer at all, a
  // refusal) is a record "none" that no test expects.
  std::vector<std::pair<int, std::string>> dns_srv(int machine, const std::string& name) {
    std::vector<std::pair<int, std::string>> out;
    auto r = c_.run_in(machine, "drill -p 8600 @127.0.0.1 " + name + " SRV");
    if (!r.ok() || (r->find("rcode: NOERROR") == std::string::npos &&
                    r->find("rcode: NXDOMAIN") == std::string::npos)) {
      out.push_back({-1, "none"});
      return out;
    }
    std::istringstream in(*r);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == ';') continue;
      std::istringstream f(line);
      std::string rname, ttl, cls, type, prio, weight, port, target;
      if (f >> rname >> ttl >> cls >> type >> prio >> weight >> port >> target && type == "SRV")
        out.push_back({std::stoi(port), target});
    }
    return out;
  }
  // Waits until the job has `count` running tasks (optionally all at generation gen).
  json wait_running(const std::string& job, size_t count, uint64_t gen = 0, int ms = 30000) {
    json r = c_.wait_cp(
        "job.show", {{"name", job}},
        [&](const json& j) {
          auto run = running_by_index(j);
          if (run.size() != count) return false;
          for (const auto& [i, t] : run)
            if (gen && t["generation"] != gen) return false;
          return true;
        },
        ms);
    EXPECT_FALSE(r.is_null()) << job << " never had " << count
                              << " running tasks: " << c_.cp("job.show", {{"name", job}})->dump(2)
                              << c_.logs();
    return r;
  }
  // The agent on the task's machine runs it for real.
  void expect_agent_runs(const json& task) {
    int m = c_.machine_index(task["machine"]);
    ASSERT_GE(m, 0);
    auto t = c_.agent(m, "task.show", {{"id", task["id"]}});
    ASSERT_TRUE(t.ok()) << t.error().str();
    EXPECT_EQ((*t)["state"], "running") << t->dump(2);
  }
  // Every task id the agents run, with the machine it runs on.
  std::multimap<std::string, int> agents_running() {
    std::multimap<std::string, int> out;
    for (int i = 0; i < c_.machines(); ++i) {
      if (!c_.machine_running(i)) continue;
      auto r = c_.agent(i, "task.ls");
      if (!r.ok()) continue;
      for (const auto& t : (*r)["tasks"])
        if (t["state"] == "running") out.emplace(t["name"].get<std::string>(), i);
    }
    return out;
  }
  ClusterHarness c_;
};

// Issue 13: the harness runs every machine session over mutual TLS; the machines are
// ready (SetUp), so their agents, sidekicks and hcs authenticated the control plane and
// it them (it accepts nothing else on its TCP port).
TEST_F(MultiMachine, EveryMachineSessionIsMutualTls) {
  EXPECT_NE(c_.logs().find("tls=mutual"), std::string::npos) << c_.logs();
  json ls = *c_.cp("machine.ls");
  ASSERT_EQ(ls["machines"].size(), static_cast<size_t>(c_.machines()));
  for (const auto& m : ls["machines"]) {
    EXPECT_EQ(m["connected"], true) << m.dump();
    EXPECT_EQ(m["sidekick_connected"], true) << m.dump();
  }
}

TEST_F(MultiMachine, DeployKillReplaceDrainAndReturn) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "web"}, {"quota", 4}, {"profile", "dev"}}).ok());
  auto created = c_.cp("job.create", job_params("site", "web", 3, 500));
  ASSERT_TRUE(created.ok()) << created.error().str();
  json show = wait_running("site", 3);
  ASSERT_FALSE(show.is_null());
  // Spread across fault domains: three racks, three machines.
  std::set<std::string> hosts;
  for (const auto& [i, t] : running_by_index(show)) {
    hosts.insert(t["machine"].get<std::string>());
    expect_agent_runs(t);
  }
  EXPECT_EQ(hosts.size(), 3u);
  // Machines that joined the entitlement run its profile, applied by their sidekick.
  json ls = *c_.cp("machine.ls");
  for (const auto& m : ls["machines"])
    if (m["entitlement"] == "web") {
      EXPECT_EQ(m["profile"], "dev") << m.dump();
    }

  // Power loss on the machine running task 0: replaced on another machine.
  json victim = running_by_index(show)[0];
  int dead = c_.machine_index(victim["machine"]);
  auto t0 = Clock::now();
  c_.kill_machine(dead);
  json after = c_.wait_cp("job.show", {{"name", "site"}}, [&](const json& j) {
    auto run = running_by_index(j);
    return run.size() == 3 && run[0]["machine"] != victim["machine"];
  });
  ASSERT_FALSE(after.is_null()) << c_.cp("job.show", {{"name", "site"}})->dump(2) << c_.logs();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(secs, 10.0) << "failure to replacement running took " << secs << " s";
  std::cout << "[ failover ] machine m" << dead << " killed; task 0 running again on "
            << running_by_index(after)[0]["machine"] << " after " << secs << " s\n";
  expect_agent_runs(running_by_index(after)[0]);
  json m_dead = c_.wait_cp("machine.show", {{"machine", c_.machine_id(dead)}},
                           [](const json& j) { return j["state"] == "dead"; });
  EXPECT_FALSE(m_dead.is_null());

  // The machine comes back (its tasks died with it): no task runs twice, and it serves.
  c_.start_machine(dead);
  EXPECT_FALSE(c_.wait_cp("machine.show", {{"machine", c_.machine_id(dead)}}, [](const json& j) {
                   // in service (degraded too: another test's OOM kill is host-wide)
                   return (j["state"] == "ok" || j["state"] == "degraded") &&
                          j["connected"] == true;
                 }).is_null());
  std::this_thread::sleep_for(std::chrono::seconds(2));  // a few reports
  auto running = agents_running();
  for (const auto& [i, t] : running_by_index(*c_.cp("job.show", {{"name", "site"}})))
    EXPECT_EQ(running.count(t["id"].get<std::string>()), 1u) << t.dump();
  EXPECT_EQ(running.size(), 3u);

  // Drain a machine that runs a task: the task moves, make-before-break (index 1 always
  // has a copy running or draining), and the machine takes nothing new.
  json now = *c_.cp("job.show", {{"name", "site"}});
  json moving = running_by_index(now)[1];
  std::string drained = moving["machine"];
  ASSERT_TRUE(c_.cp("machine.drain", {{"machine", drained}}).ok());
  int gaps = 0;
  json moved = c_.wait_cp("job.show", {{"name", "site"}}, [&](const json& j) {
    int serving = 0;
    for (const auto& t : j["tasks"])
      serving += t["index"] == 1 && (t["state"] == "running" || t["state"] == "draining");
    gaps += serving == 0;
    auto run = running_by_index(j);
    if (run.size() != 3) return false;
    for (const auto& [i, t] : run)
      if (t["machine"] == drained) return false;
    return true;
  });
  EXPECT_EQ(gaps, 0) << "index 1 had no running copy during the drain";
  ASSERT_FALSE(moved.is_null()) << c_.cp("job.show", {{"name", "site"}})->dump(2);
  // The old copy is stopped on the drained machine.
  int di = c_.machine_index(drained);
  json gone = c_.wait_cp("job.show", {{"name", "site"}}, [&](const json&) {
    auto t = c_.agent(di, "task.show", {{"id", moving["id"]}});
    // Stopped, or already forgotten once the control plane heard of its end.
    return t.ok() ? (*t)["state"] != "running" : t.error().code == rpc::kNotFound;
  });
  EXPECT_FALSE(gone.is_null());
  auto ms = (*c_.cp("machine.show", {{"machine", drained}}));
  EXPECT_EQ(ms["state"], "drained");
  EXPECT_EQ(ms["tasks"], 0);

  ASSERT_TRUE(c_.cp("job.stop", {{"name", "site"}}).ok());
  EXPECT_FALSE(c_.wait_cp("job.ls", json::object(), [](const json& j) {
                   return j["jobs"].empty();
                 }).is_null());
  EXPECT_TRUE(agents_running().empty());
}

// Paper Fig. 7: an entitlement takes free machines as its jobs need them and gives them
// back when they stop.
TEST_F(MultiMachine, EntitlementGrowsAndShrinks) {
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", "batch"}, {"quota", 3}, {"profile", "web"}}).ok());
  auto pool = [&] {
    auto r = c_.cp("entitlement.show", {{"name", "batch"}});
    return r.ok() ? (*r)["machines"].size() : size_t{999};
  };
  EXPECT_EQ(pool(), 0u);
  // Machines have 2 cores (or as many as this host has): one whole-machine task each.
  auto info = c_.agent(0, "agent.info");
  ASSERT_TRUE(info.ok());
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  ASSERT_TRUE(c_.cp("job.create", job_params("a", "batch", 1, cores * 1000)).ok());
  wait_running("a", 1);
  EXPECT_EQ(pool(), 1u);
  ASSERT_TRUE(c_.cp("job.create", job_params("b", "batch", 2, cores * 1000)).ok());
  wait_running("b", 2);
  EXPECT_EQ(pool(), 3u);  // grew to its quota
  // Over the quota: refused, nothing placed.
  auto over = c_.cp("job.create", job_params("c", "batch", 1, cores * 1000));
  EXPECT_FALSE(over.ok());
  // Every machine of the entitlement switched to its profile before its task started.
  json batch = *c_.cp("entitlement.show", {{"name", "batch"}});
  for (const auto& m : batch["machines"]) EXPECT_EQ(m["profile"], "web") << m.dump();
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "b"}}).ok());
  json shrunk = c_.wait_cp("entitlement.show", {{"name", "batch"}},
                           [](const json& j) { return j["machines"].size() == 1; });
  EXPECT_FALSE(shrunk.is_null()) << c_.cp("entitlement.show", {{"name", "batch"}})->dump(2);
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "a"}}).ok());
  EXPECT_FALSE(c_.wait_cp("entitlement.show", {{"name", "batch"}}, [](const json& j) {
                   return j["machines"].empty();
                 }).is_null());
}

// SIGKILL of the control plane in the middle of a rolling update: after the restart the
// update carries on to the end, no task runs twice, and the tasks it had not reached
// were never restarted.
TEST_F(MultiMachine, ControlPlaneRestartMidUpdate) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "web"}, {"quota", 4}}).ok());
  ASSERT_TRUE(c_.cp("job.create", job_params("site", "web", 4, 250)).ok());
  json v1 = wait_running("site", 4);
  ASSERT_FALSE(v1.is_null());
  std::set<std::string> v1_ids;
  for (const auto& [i, t] : running_by_index(v1)) v1_ids.insert(t["id"].get<std::string>());
  ASSERT_TRUE(c_.cp("job.update", job_params("site", "web", 4, 250, "v2")).ok());
  // Wait until the update is under way (one new-generation task running), then kill.
  json mid = c_.wait_cp("job.show", {{"name", "site"}}, [](const json& j) {
    for (const auto& t : j["tasks"])
      if (t["generation"] == 2 && t["state"] == "running") return true;
    return false;
  });
  ASSERT_FALSE(mid.is_null());
  c_.kill_cp(SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  c_.start_cp();
  json done = wait_running("site", 4, 2, 60000);
  ASSERT_FALSE(done.is_null());
  // Exactly one running copy per index on the machines, all of generation 2.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto running = agents_running();
  EXPECT_EQ(running.size(), 4u);
  for (const auto& [i, t] : running_by_index(*c_.cp("job.show", {{"name", "site"}}))) {
    EXPECT_EQ(running.count(t["id"].get<std::string>()), 1u);
    EXPECT_EQ(v1_ids.count(t["id"].get<std::string>()), 0u);
    // A new task, started once: no agent restarted it.
    auto a = c_.agent(c_.machine_index(t["machine"]), "task.show", {{"id", t["id"]}});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ((*a)["restarts"], 0);
  }
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "site"}}).ok());
}

// Job "web" of `count` tasks in entitlement e, each serving "served-by-<its port>" over
// HTTP on its named port "http" (ready once that answers); `before` runs first, in the
// same shell ($d is the served directory).
json web_job(int count, const std::string& before) {
  return {{"name", "web"},
          {"entitlement", "e"},
          {"count", count},
          {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
          {"ports", {{"http", 0}}},
          {"task",
           {{"argv",
             {"/bin/sh", "-c",
              "d=$(mktemp -d); echo served-by-$WEFT_PORT_HTTP > $d/index.html; " + before +
                  "exec /bin/busybox httpd -f -p $WEFT_PORT_HTTP -h $d"}},
            {"readiness", {{"type", "http"}, {"port", "http"}, {"path", "/"}}}}}};
}

// Issue 33: a job's named ports and service discovery on real machines. Each task gets a
// port of its machine's range (WEFT_PORT_HTTP), is published once its readiness check
// on that named port passes, and is found through the DNS every agent answers (SRV, then
// the target's address) and reached there from another machine. With the control plane
// killed, the agents keep answering from their copies; a stopped job leaves every copy.
TEST_F(MultiMachine, AServiceIsFoundByDnsOnEveryMachineAndReachedOnItsPort) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  auto created = c_.cp("job.create", web_job(2, ""));
  ASSERT_TRUE(created.ok()) << created.error().str();
  json svc = c_.wait_cp("service.show", {{"job", "web"}},
                        [](const json& j) { return j["endpoints"].size() == 2; });
  ASSERT_FALSE(svc.is_null()) << c_.cp("job.show", {{"name", "web"}})->dump(2) << c_.logs();
  // Issue 43: a job that names no network gets one of its own (the host's is a grant),
  // said in its status; on these machines, which have a bridge, that is the bridge.
  auto shown_job = c_.cp("job.show", {{"name", "web"}});
  ASSERT_TRUE(shown_job.ok());
  EXPECT_EQ((*shown_job)["network"], "own") << shown_job->dump(2);
  for (const auto& ep : svc["endpoints"]) {
    auto t = c_.agent(c_.machine_index(ep["machine"]), "task.show", {{"id", ep["task"]}});
    ASSERT_TRUE(t.ok()) << t.error().str();
    EXPECT_EQ((*t)["spec"]["namespaces"]["network"], "bridge") << t->dump(2);
  }
  auto srv = [&](int machine) { return dns_srv(machine, "_http._tcp.web.e.weft"); };
  auto wait_srv = [&](int machine, size_t n) {
    std::vector<std::pair<int, std::string>> got;
    for (int i = 0; i < 200; ++i) {
      got = srv(machine);
      if (got.size() == n) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return got;
  };
  for (int m = 0; m < c_.machines(); ++m)
    ASSERT_EQ(wait_srv(m, 2).size(), 2u) << "machine " << m << c_.logs();
  // Over TCP too (drill -t), as a resolver asks when an answer did not fit in UDP.
  auto tcp = c_.run_in(1, "drill -t -p 8600 @127.0.0.1 _http._tcp.web.e.weft SRV");
  ASSERT_TRUE(tcp.ok()) << tcp.error().str();
  size_t srv_lines = 0;
  for (size_t at = tcp->find("\tSRV\t"); at != std::string::npos; at = tcp->find("\tSRV\t", at + 1))
    ++srv_lines;
  EXPECT_EQ(srv_lines, 2u) << *tcp;
  // From machine 3: the SRV target's address, then an HTTP request to it.
  auto records = srv(3);
  ASSERT_FALSE(records.empty());
  auto a = c_.run_in(3, "drill -p 8600 @127.0.0.1 " + records[0].second + " A");
  ASSERT_TRUE(a.ok()) << a.error().str();
  std::string addr;
  {
    std::istringstream in(*a);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == ';') continue;
      std::istringstream f(line);
      std::string name, ttl, cls, type, value;
      if (f >> name >> ttl >> cls >> type >> value && type == "A") addr = value;
    }
  }
  ASSERT_EQ(addr.rfind("10.77.0.", 0), 0u) << *a;
  auto page = c_.run_in(
      3, "busybox wget -qO- http://" + addr + ":" + std::to_string(records[0].first) + "/");
  ASSERT_TRUE(page.ok()) << page.error().str();
  EXPECT_EQ(*page, "served-by-" + std::to_string(records[0].first) + "\n");
  // The control plane gone: every agent still answers.
  c_.kill_cp(SIGKILL);
  for (int m = 0; m < c_.machines(); ++m) EXPECT_EQ(srv(m).size(), 2u) << "machine " << m;
  c_.start_cp();
  ASSERT_TRUE(c_.wait_all_ready()) << c_.logs();
  // Still there once the restarted control plane rebuilt its table from the reports.
  for (int m = 0; m < c_.machines(); ++m) EXPECT_EQ(wait_srv(m, 2).size(), 2u) << "machine " << m;
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "web"}}).ok());
  for (int m = 0; m < c_.machines(); ++m)
    EXPECT_TRUE(wait_srv(m, 0).empty()) << "machine " << m << ": " << srv(m).size();
}

// Issue 46 (docs/services.md "Interest"): an agent is told only of the jobs its DNS
// clients ask for. The first query for a job waits while the agent asks the control
// plane, and is answered with the job's endpoints; the job's changes then reach that
// agent and no other; a name asked before its job exists is answered once it does.
TEST_F(MultiMachine, AnAgentIsToldOnlyOfTheServicesItsClientsAskFor) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  auto job = [](const std::string& name, int count) {
    return json{{"name", name},           {"entitlement", "e"},
                {"count", count},         {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
                {"ports", {{"http", 0}}}, {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  };
  ASSERT_TRUE(c_.cp("job.create", job("web", 2)).ok());
  ASSERT_TRUE(c_.cp("job.create", job("api", 1)).ok());
  for (const char* name : {"web", "api"})
    ASSERT_FALSE(c_.wait_cp("service.show", {{"job", name}},
                            [&](const json& j) {
                              return j["endpoints"].size() ==
                                     (std::string(name) == "web" ? 2u : 1u);
                            })
                     .is_null())
        << c_.logs();
  auto jobs_of = [&]() {
    std::map<std::string, json> out;
    auto ls = c_.cp("service.ls", json::object());
    if (ls.ok())
      for (const auto& a : (*ls)["agents"]) out[a["machine"]] = a["jobs"];
    return out;
  };
  // No DNS client asked anything yet: no agent is told of any job.
  auto before = jobs_of();
  ASSERT_EQ(before.size(), static_cast<size_t>(c_.machines()));
  for (const auto& [m, n] : before) EXPECT_EQ(n, 0) << m;
  // The first query on machine 1 is answered with both endpoints (it waited).
  EXPECT_EQ(dns_srv(1, "_http._tcp.web.e.weft").size(), 2u) << c_.logs();
  auto after = jobs_of();
  EXPECT_EQ(after[c_.machine_id(1)], 1);
  for (int m : {0, 2, 3}) EXPECT_EQ(after[c_.machine_id(m)], 0) << m;
  // web's changes reach machine 1.
  ASSERT_TRUE(c_.cp("job.scale", {{"name", "web"}, {"count", 3}}).ok());
  size_t seen = 0;
  for (int i = 0; i < 100 && seen != 3; ++i) {
    seen = dns_srv(1, "_http._tcp.web.e.weft").size();
    if (seen != 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(seen, 3u);
  // A job that does not exist yet: no record (after at most the wait), then its records
  // once it is created, pushed to the agent that was asked.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(dns_srv(2, "_http._tcp.later.e.weft").empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  ASSERT_TRUE(c_.cp("job.create", job("later", 1)).ok());
  seen = 0;
  for (int i = 0; i < 300 && seen != 1; ++i) {
    seen = dns_srv(2, "_http._tcp.later.e.weft").size();
    if (seen != 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(seen, 1u) << c_.logs();
  after = jobs_of();
  EXPECT_EQ(after[c_.machine_id(2)], 1);
  EXPECT_EQ(after[c_.machine_id(0)], 0);
  // weftctl's summary: every agent answers for the jobs its clients asked for, none is
  // behind what it was sent.
  std::string summary;
  for (int i = 0; i < 50; ++i) {
    std::string cmd =
        std::string(WEFTCTL_BIN) + " --controlplane " + c_.dir() + "/cp.sock service ls 2>&1";
    summary.clear();
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) summary.append(buf, n);
      EXPECT_EQ(::pclose(f), 0) << summary;
    }
    if (summary.find(" 0 behind") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(summary.find(std::to_string(c_.machines()) +
                         " agent(s) answer DNS (0 for every job, the others for the jobs their "
                         "clients asked for); 0 behind what they were sent"),
            std::string::npos)
      << summary;
  for (const char* name : {"web", "api", "later"})
    ASSERT_TRUE(c_.cp("job.stop", {{"name", name}}).ok());
}

// Issue 33: a task with namespaces.network = "bridge" has an address of its own on its
// machine's bridge; its named ports are published on the machine's address, so that
// discovery's answer (machine address, port) reaches it from another machine and from
// its own. From inside, it reaches other machines (masqueraded) and another task's
// published port (through the machine, or directly), but not the machine itself
// (beyond the port agent.toml allows), not its gateway, and not another task's port
// that is not published. An agent
// restart keeps its address and its ports; a stop removes its rule and its veth.
TEST_F(MultiMachine, ABridgeTaskIsReachedOnItsMachinesAddressAndReachesOnlyWhatItMay) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  json job = web_job(1, "/bin/busybox httpd -p 18090 -h $d; ");  // a port it does not publish
  job["task"]["namespaces"] = {{"network", "bridge"}};
  auto created = c_.cp("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  json svc = c_.wait_cp("service.show", {{"job", "web"}},
                        [](const json& j) { return j["endpoints"].size() == 1; });
  ASSERT_FALSE(svc.is_null()) << c_.cp("job.show", {{"name", "web"}})->dump(2) << c_.logs();
  const json& ep = svc["endpoints"][0];
  int mi = c_.machine_index(ep["machine"]);
  ASSERT_GE(mi, 0);
  int other = (mi + 1) % c_.machines();
  std::string addr = ep["address"];
  int port = ep["ports"]["http"];
  EXPECT_EQ(addr, c_.machine_address(mi));  // the machine's address, not the bridge's
  std::string url = "http://" + addr + ":" + std::to_string(port) + "/";
  std::string served = "served-by-" + std::to_string(port) + "\n";
  for (int from : {other, mi}) {
    auto page = c_.run_in(from, "timeout 5 busybox wget -qO- " + url);
    ASSERT_TRUE(page.ok()) << "from machine " << from << ": " << page.error().str() << c_.logs();
    EXPECT_EQ(*page, served) << "from machine " << from;
  }
  std::string task_id = ep["task"];
  auto shown = c_.agent(mi, "task.show", {{"id", task_id}});
  ASSERT_TRUE(shown.ok()) << shown.error().str();
  std::string web_ip = (*shown).value("bridge_address", "");
  ASSERT_EQ(web_ip.rfind("10.89.0.", 0), 0u) << shown->dump(2);

  // Servers on the host network: the task's own machine (one port allowed to bridge
  // tasks, one not) and another machine.
  std::string www = c_.dir() + "/www";
  ASSERT_TRUE(mkdir_p(www).ok());
  ASSERT_TRUE(write_file(www + "/index.html", "host\n").ok());
  std::vector<pid_t> servers;
  for (auto [m, p] : {std::pair{mi, 18081}, std::pair{mi, 18083}, std::pair{other, 18082}})
    servers.push_back(
        c_.start_in(m, {"/bin/busybox", "httpd", "-f", "-p", std::to_string(p), "-h", www},
                    c_.dir() + "/httpd-" + std::to_string(p) + ".log"));
  struct Stop {
    std::vector<pid_t>& pids;
    ~Stop() {
      for (pid_t p : pids) ClusterHarness::stop_in(p);
    }
  } stop_servers{servers};
  for (auto [m, p] : {std::pair{mi, 18081}, std::pair{mi, 18083}, std::pair{other, 18082}}) {
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      auto r =
          c_.run_in(m, "timeout 2 busybox wget -qO- http://127.0.0.1:" + std::to_string(p) + "/");
      up = r.ok() && *r == "host\n";
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(up) << "the test's server on port " << p;
  }
  // A bridge task on the same machine tries each route; each line says what it reached.
  std::string me = c_.machine_address(mi);
  auto route = [](const std::string& name, const std::string& u) {
    return "if timeout 3 busybox wget -qO- " + u + " >/dev/null 2>&1; then echo " + name +
           "=reached; else echo " + name + "=blocked; fi; ";
  };
  // Issue 43 (3): from its own published port (WEFT_PORT_SRC), the probe opens a
  // connection to the web task's unpublished port: blocked too.
  std::string from_published =
      "if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 3 busybox nc -w 2 -p $WEFT_PORT_SRC " +
      web_ip +
      " 18090 2>/dev/null | grep -q served-by; then echo sport=reached; else echo "
      "sport=blocked; fi; ";
  std::string script = route("outside", "http://" + c_.machine_address(other) + ":18082/") +
                       route("published", url) + route("allowed", "http://" + me + ":18083/") +
                       route("host", "http://" + me + ":18081/") +
                       route("gateway", "http://10.89.0.1:18081/") +
                       route("peer", "http://" + web_ip + ":" + std::to_string(port) + "/") +
                       route("unpublished", "http://" + web_ip + ":18090/") + from_published +
                       "echo done; sleep 600";
  // Twice: as the machine's br_netfilter is (bridged frames pass the ip hooks, as on
  // hosts with Docker or Kubernetes), and the other way (a plain Debian host).
  auto run_probe = [&](const std::string& name) {
    auto probe = c_.agent(mi, "task.run",
                          {{"name", name},
                           {"argv", {"/bin/sh", "-c", script}},
                           {"ports", {{"src", 0}}},
                           {"namespaces", {{"network", "bridge"}}}});
    ASSERT_TRUE(probe.ok()) << probe.error().str();
    std::string probe_id = (*probe)["id"];
    std::string out;
    for (int i = 0; i < 400 && out.find("done") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto l = c_.agent(mi, "task.logs", {{"id", probe_id}, {"stream", "stdout"}});
      if (l.ok()) out = l->value("data", "");
    }
    EXPECT_EQ(out,
              "outside=reached\npublished=reached\nallowed=reached\nhost=blocked\n"
              "gateway=blocked\npeer=reached\nunpublished=blocked\nsport=blocked\ndone\n")
        << name << "\n"
        << c_.run_in(mi, "nft list ruleset").value_or("") << c_.logs();
    auto shown_probe = c_.agent(mi, "task.show", {{"id", probe_id}});
    ASSERT_TRUE(shown_probe.ok());
    EXPECT_NE((*shown_probe).value("bridge_address", ""), web_ip);
    ASSERT_TRUE(c_.agent(mi, "task.stop", {{"id", probe_id}}).ok());
  };
  // The bridge has no IPv6 address a task could reach the machine's "::" listeners at.
  EXPECT_EQ(c_.run_in(mi, "ip -6 -o addr show dev weft0").value_or("?"), "");
  const std::string knob = "/proc/sys/net/bridge/bridge-nf-call-iptables";
  auto was = c_.run_in(mi, "cat " + knob);
  ASSERT_TRUE(was.ok()) << was.error().str();
  run_probe("probe-a");
  std::string flipped = was->rfind("1", 0) == 0 ? "0" : "1";
  ASSERT_TRUE(c_.run_in(mi, "sh -c 'echo " + flipped + " > " + knob + "'").ok());
  run_probe("probe-b");

  // The agent restarted (its tasks keep running): the same address, still reached.
  c_.stop_machine(mi);
  c_.start_machine(mi);
  ASSERT_TRUE(c_.wait_all_ready()) << c_.logs();
  auto again = c_.agent(mi, "task.show", {{"id", task_id}});
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ((*again).value("bridge_address", ""), web_ip);
  auto page = c_.run_in(other, "timeout 5 busybox wget -qO- " + url);
  ASSERT_TRUE(page.ok()) << page.error().str() << c_.logs();
  EXPECT_EQ(*page, served);

  // Stopped: its rule and its veth are gone. (The table is read with nft, which must
  // work: an absence read from a failed command would pass whatever the agent did.)
  auto table = [&] {
    auto r = c_.run_in(mi, "nft list table ip weft_weft0");
    EXPECT_TRUE(r.ok()) << "nft list table: " << r.error().str();
    return r.value_or("?");
  };
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "web"}}).ok());
  std::string rules, links;
  for (int i = 0; i < 200; ++i) {
    rules = table();
    links = c_.run_in(mi, "ip -o link show master weft0").value_or("?");
    if (rules.find("dport " + std::to_string(port)) == std::string::npos && links.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(rules.find("dport " + std::to_string(port)), std::string::npos) << rules;
  EXPECT_EQ(links, "");

  // A crash: the machine loses power with a local bridge task running. The agent that
  // comes back finds the task gone, and the table keeps nothing of it.
  auto local = c_.agent(mi, "task.run",
                        {{"name", "local"},
                         {"argv", {"/bin/sleep", "600"}},
                         {"ports", {{"p", 0}}},
                         {"namespaces", {{"network", "bridge"}}}});
  ASSERT_TRUE(local.ok()) << local.error().str();
  auto local_shown = c_.agent(mi, "task.show", {{"id", (*local)["id"]}});
  ASSERT_TRUE(local_shown.ok()) << local_shown.error().str();
  std::string local_port = std::to_string((*local_shown)["spec"]["ports"]["p"].get<int>());
  rules = table();
  ASSERT_NE(rules.find("tcp dport " + local_port + " dnat"), std::string::npos) << rules;
  c_.kill_machine(mi);
  c_.start_machine(mi);
  ASSERT_TRUE(c_.wait_all_ready()) << c_.logs();
  rules = table();
  EXPECT_EQ(rules.find("dport " + local_port), std::string::npos) << rules;
  EXPECT_NE(rules.find("masquerade"), std::string::npos) << rules;  // the table is back
  EXPECT_EQ(c_.run_in(mi, "ip -o link show master weft0").value_or("?"), "");
}

// Issue 12: a start the agent refuses (here: a user the machine does not have, a rule
// only the machine can check) shows as failed with the agent's message within a
// heartbeat, and is not retried in a loop; an update with a fixed spec runs.
// Issue 43 (1): a job's fixed port is published on every address of its machine (for a
// bridge task by DNAT, in front of the machine's own listeners), so a port the machine
// serves itself is never a task's. Below 1024 needs a grant; the agent's own DNS port is
// never placed, and the error names the port; a port a process of the machine listens
// on is refused by the agent with the port named, and the machine's own server still
// answers there from another machine.
// Autoscaling on an application's own metric, end to end: each task of a bridge job
// serves Prometheus text on its named port (busybox httpd, a file), every agent reads it
// from inside the task's network namespace (task.usage with a scrape), and the control
// plane grows the job to its max since each task reports twice its target.
TEST_F(MultiMachine, AJobScalesOnItsOwnMetricReadOnItsBridge) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  json job{{"name", "api"},
           {"entitlement", "e"},
           {"count", 1},
           {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
           {"ports", {{"http", 0}}},
           {"autoscale",
            {{"min", 1},
             {"max", 3},
             {"metric", "app"},
             {"app_metric", {{"port", "http"}, {"path", "/metrics"}, {"name", "api_in_flight"}}},
             {"target", 1}}},
           {"task",
            {{"argv",
              {"/bin/sh", "-c",
               "d=$(mktemp -d); printf '# TYPE api_in_flight gauge\\napi_in_flight{w=\"a\"} "
               "1.5\\napi_in_flight{w=\"b\"} 0.5\\n' > $d/metrics; "
               "exec /bin/busybox httpd -f -p $WEFT_PORT_HTTP -h $d"}},
             {"namespaces", {{"network", "bridge"}}},
             {"readiness", {{"type", "http"}, {"port", "http"}, {"path", "/metrics"}}}}}};
  auto created = c_.cp("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  // 2 a task against a target of 1: 1 -> 2 -> 3 (its max).
  ASSERT_FALSE(wait_running("api", 3, 0, 60000).is_null())
      << c_.cp("job.autoscale", {{"name", "api"}})->dump(2) << c_.logs();
  json shown = c_.wait_cp(
      "job.autoscale", {{"name", "api"}},
      [](const json& j) {
        return j["measured"].is_object() && j["measured"]["tasks_measured"] == 3;
      },
      30000);
  ASSERT_FALSE(shown.is_null()) << c_.cp("job.autoscale", {{"name", "api"}})->dump(2);
  EXPECT_DOUBLE_EQ(shown["measured"]["load_per_task"].get<double>(), 2.0) << shown.dump(2);
  EXPECT_EQ(shown["unit"], "api_in_flight");
  EXPECT_EQ(shown["count"], 3);
  EXPECT_EQ(shown["decision"]["desired"], 3) << shown.dump(2);  // held at its max
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "api"}}).ok());
}

// `top` through the control plane against the cgroups' own counters (weftctl top): a
// task that spins shows the CPU its cgroup counted over one of the agent's intervals (1 s
// here), its memory is memory.current, and its job's row sums its tasks.
TEST_F(MultiMachine, TopIsWhatTheCgroupsCounted) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  json job = job_params("burn", "e", 1, 500);
  job["task"]["argv"] = {"/bin/sh", "-c", "while :; do :; done"};
  ASSERT_TRUE(c_.cp("job.create", job).ok());
  json shown = wait_running("burn", 1);
  ASSERT_FALSE(shown.is_null());
  const json task = running_by_index(shown).at(0);
  const int machine = c_.machine_index(task["machine"].get<std::string>());
  ASSERT_GE(machine, 0) << task.dump();
  // Its cgroup is named with the agent's own id of the task (agent/sandbox_pool.h).
  auto local = c_.agent(machine, "task.show", {{"id", task["id"]}});
  ASSERT_TRUE(local.ok()) << local.error().str();
  const std::string cgroup = c_.task_cgroup(machine, (*local)["id"].get<std::string>());
  ASSERT_TRUE(path_exists(cgroup + "/cpu.stat")) << cgroup << " " << local->dump();
  // The agent samples every second: two samples before its first figure.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  CpuRecord record(cgroup);
  record.record_for(3.0);
  auto top = c_.cp("top", {{"of", "tasks"}, {"job", "burn"}});
  record.sample();
  double mem_now = std::stod(read_file(cgroup + "/memory.current").value_or("0"));
  ASSERT_TRUE(top.ok()) << top.error().str();
  ASSERT_EQ((*top)["rows"].size(), 1u) << top->dump();
  const json& row = (*top)["rows"][0];
  ASSERT_TRUE(row.contains("cpu_milli")) << top->dump();
  EXPECT_EQ(row["task"], task["id"]);
  EXPECT_EQ(row["cpu_request_milli"], 500);
  double reported = row["cpu_milli"].get<double>();
  EXPECT_GT(record.mean_millicores(), 50) << "the spinning task hardly ran";
  EXPECT_LE(record.closest(reported, 1.0), std::max(60.0, 0.1 * reported))
      << "no second of the cgroup's own record used what top says: " << top->dump();
  EXPECT_NEAR(row["mem_bytes"].get<double>(), mem_now, 0.25 * mem_now + 65536) << top->dump();
  // The job's row: its one task's figures.
  auto jobs = c_.cp("top", {{"job", "burn"}});
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ((*jobs)["rows"].size(), 1u);
  EXPECT_EQ((*jobs)["rows"][0]["tasks"], 1);
  EXPECT_EQ((*jobs)["rows"][0]["measured"], 1);
  EXPECT_TRUE((*jobs)["silent"].empty()) << jobs->dump();
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "burn"}}).ok());
}

TEST_F(MultiMachine, AJobNeverTakesAPortTheMachineServesItself) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "e"}, {"quota", 4}}).ok());
  json low = job_params("low", "e", 1, 100);
  low["ports"] = {{"web", 80}};
  auto r = c_.cp("job.create", low);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("ports.web"), std::string::npos) << r.error().str();
  EXPECT_NE(r.error().str().find("low_ports"), std::string::npos) << r.error().str();

  json dns = job_params("dnsgrab", "e", 1, 100);
  dns["ports"] = {{"dns", 8600}};  // every agent's dns_listen here
  r = c_.cp("job.create", dns);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("port 8600 is taken"), std::string::npos) << r.error().str();
  EXPECT_FALSE(c_.cp("job.show", {{"name", "dnsgrab"}}).ok());  // nothing half-made

  // The machines' own server on 2222 (an sshd, say), started after they registered.
  std::string www = c_.dir() + "/own";
  ASSERT_TRUE(mkdir_p(www).ok());
  ASSERT_TRUE(write_file(www + "/index.html", "the-machines-own\n").ok());
  std::vector<pid_t> servers;
  struct Stop {
    std::vector<pid_t>& pids;
    ~Stop() {
      for (pid_t p : pids) ClusterHarness::stop_in(p);
    }
  } stop_servers{servers};
  for (int m = 0; m < c_.machines(); ++m)
    servers.push_back(c_.start_in(m, {"/bin/busybox", "httpd", "-f", "-p", "2222", "-h", www},
                                  c_.dir() + "/own-" + std::to_string(m) + ".log"));
  auto own_page = [&](int from, int to) {
    return c_
        .run_in(from, "timeout 3 busybox wget -qO- http://" + c_.machine_address(to) + ":2222/")
        .value_or("");
  };
  for (int m = 0; m < c_.machines(); ++m) {
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      up = own_page(m, m) == "the-machines-own\n";
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(up) << "the machine's own server on 2222, machine " << m;
  }
  json ssh = job_params("sshgrab", "e", 1, 100);
  ssh["ports"] = {{"ssh", 2222}};
  ssh["task"]["argv"] = {"/bin/sh", "-c", "exec /bin/busybox httpd -f -p 2222 -h /"};
  r = c_.cp("job.create", ssh);
  if (r.ok()) {
    // Placed (the machines registered before their server started): the agent refuses.
    json failed = c_.wait_cp(
        "job.show", {{"name", "sshgrab"}},
        [](const json& j) {
          for (const auto& t : j["tasks"])
            if (t["state"] == "failed" &&
                t["message"].get<std::string>().find("port 2222 is the machine's own") !=
                    std::string::npos)
              return true;
          return false;
        },
        10000);
    EXPECT_FALSE(failed.is_null()) << c_.cp("job.show", {{"name", "sshgrab"}})->dump(2);
    ASSERT_TRUE(c_.cp("job.stop", {{"name", "sshgrab"}}).ok());
  } else {
    EXPECT_NE(r.error().str().find("port 2222"), std::string::npos) << r.error().str();
  }
  std::cout << "[ own port ] a job asking for 2222: "
            << (r.ok() ? "placed, and refused by the agent" : r.error().str()) << "\n";
  EXPECT_TRUE(agents_running().empty());
  // From another machine, 2222 on every machine is still the machine's own.
  for (int m = 0; m < c_.machines(); ++m)
    EXPECT_EQ(own_page((m + 1) % c_.machines(), m), "the-machines-own\n") << "machine " << m;
  // A machine that registers again tells the control plane of its listener: the job is
  // then not placed there at all.
  c_.stop_machine(0);
  c_.start_machine(0);
  ASSERT_TRUE(c_.wait_all_ready()) << c_.logs();
  json pinned = ssh;
  pinned["name"] = "sshgrab2";
  pinned["count"] = 4;  // one per machine: machine 0 cannot take one
  r = c_.cp("job.create", pinned);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().str().find("port 2222 is taken"), std::string::npos) << r.error().str();
}

TEST_F(MultiMachine, ARefusedStartFailsWithTheAgentsMessage) {
  // A named user is a host privilege: granted to this entitlement by its admin.
  ASSERT_TRUE(c_.cp("entitlement.create",
                    {{"name", "web"}, {"quota", 4}, {"grants", {{"users", {"no-such-user-weft"}}}}})
                  .ok());
  json bad = job_params("site", "web", 2, 250);
  bad["task"]["user"] = "no-such-user-weft";
  auto t0 = Clock::now();
  auto created = c_.cp("job.create", bad);
  ASSERT_TRUE(created.ok()) << created.error().str();
  json failed = c_.wait_cp(
      "job.show", {{"name", "site"}},
      [](const json& j) {
        int n = 0;
        for (const auto& t : j["tasks"])
          n += t["state"] == "failed" &&
               t["message"].get<std::string>().find("no-such-user-weft") != std::string::npos;
        return n == 2;
      },
      10000);
  ASSERT_FALSE(failed.is_null()) << c_.cp("job.show", {{"name", "site"}})->dump(2) << c_.logs();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cout << "[ refused ] both starts failed with the agent's message after " << secs << " s\n";
  EXPECT_LT(secs, 0.5) << "a refusal must show within one heartbeat (500 ms here)";
  for (const auto& t : failed["tasks"])
    EXPECT_NE(t["message"].get<std::string>().find("user"), std::string::npos) << t.dump();
  // Six heartbeats later: still the same two tasks, nothing retried anywhere.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  json later = *c_.cp("job.show", {{"name", "site"}});
  EXPECT_EQ(later["tasks"].size(), 2u) << later.dump(2);
  for (const auto& t : later["tasks"]) EXPECT_EQ(t["state"], "failed") << t.dump();
  EXPECT_TRUE(agents_running().empty());
  // The fix is an update: both indices start under the new spec at once.
  ASSERT_TRUE(c_.cp("job.update", job_params("site", "web", 2, 250, "v2")).ok());
  EXPECT_FALSE(wait_running("site", 2, 2).is_null());
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "site"}}).ok());
}

// Issue 32 (10): a task that fails before its program runs, the same way on every
// machine, was replaced about 100 times in 10 s and its MESSAGE stayed empty. The
// agent's reason reaches MESSAGE; after kSetupFailuresHeld (3) such failures in a row
// the index is held until the job's spec changes.
TEST_F(MultiMachine, ATaskThatCannotStartAnywhereIsHeldWithTheAgentsReason) {
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "web"}, {"quota", 4}}).ok());
  json bad = job_params("site", "web", 1, 250);
  bad["task"]["argv"] = {"/no/such/program"};
  ASSERT_TRUE(c_.cp("job.create", bad).ok());
  auto held = [](const json& j) {
    for (const auto& t : j["tasks"])
      if (t["state"] == "failed" &&
          t["message"].get<std::string>().find("3 times in a row") != std::string::npos)
        return true;
    return false;
  };
  json show = c_.wait_cp("job.show", {{"name", "site"}}, held, 20000);
  ASSERT_FALSE(show.is_null()) << c_.cp("job.show", {{"name", "site"}})->dump(2) << c_.logs();
  for (const auto& t : show["tasks"]) {
    EXPECT_EQ(t["state"], "failed") << t.dump();
    EXPECT_NE(t["message"].get<std::string>().find("/no/such/program"), std::string::npos)
        << "the agent's reason is the MESSAGE: " << t.dump();
  }
  size_t tries = show["tasks"].size();
  EXPECT_LE(tries, 3u) << show.dump(2);
  // Three seconds (six heartbeats) later: not one more try.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  json later = *c_.cp("job.show", {{"name", "site"}});
  EXPECT_EQ(later["tasks"].size(), tries) << later.dump(2);
  // The fix is an update: the index starts under the new spec.
  ASSERT_TRUE(c_.cp("job.update", job_params("site", "web", 1, 250, "v2")).ok());
  EXPECT_FALSE(wait_running("site", 1, 2).is_null());
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "site"}}).ok());
}

// Issue 32 (6): a machine lent to an entitlement that never gets ready (here: its
// weft-sidekick has no such profile) held its task in `pending` forever with an empty
// MESSAGE. After prepare_timeout the machine is marked
// unprepared with the reason, its task placed elsewhere with that reason as MESSAGE,
// and the machine goes back to the free pool. An entitlement's profile is a profile
// name that some machine has.
TEST(MultiMachinePrepare, AMachineThatNeverPreparesGivesItsTasksBack) {
  std::string why = root_test_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  ClusterOptions o;
  o.machines = 2;
  o.prepare_timeout = "2s";
  o.lacks_profile[0] = "dev";
  ClusterHarness c(o);
  ASSERT_TRUE(c.setup()) << c.logs();
  c.start_cp();
  for (int i = 0; i < c.machines(); ++i) c.start_machine(i);
  ASSERT_TRUE(c.wait_all_ready()) << c.logs();
  for (const auto& [profile, words] : std::vector<std::pair<std::string, std::string>>{
           {"../../../etc/passwd", "not a profile name"}, {"nope", "no machine"}}) {
    auto r = c.cp("entitlement.create", {{"name", "bad"}, {"quota", 1}, {"profile", profile}});
    ASSERT_FALSE(r.ok()) << profile;
    EXPECT_EQ(r.error().str().rfind("profile: ", 0), 0u) << r.error().str();
    EXPECT_NE(r.error().str().find(words), std::string::npos) << r.error().str();
  }
  ASSERT_TRUE(c.cp("entitlement.create", {{"name", "web"}, {"quota", 2}, {"profile", "dev"}}).ok());
  ASSERT_TRUE(c.cp("job.create", job_params("site", "web", 2, 250)).ok());
  auto settled = [](const json& j) {
    int running = 0;
    bool told = false;
    for (const auto& t : j["tasks"]) {
      running += t["state"] == "running";
      told |= t["state"] == "lost" &&
              t["message"].get<std::string>().find("has no profile 'dev'") != std::string::npos;
    }
    return running == 2 && told;
  };
  json show = c.wait_cp("job.show", {{"name", "site"}}, settled, 20000);
  ASSERT_FALSE(show.is_null()) << c.cp("job.show", {{"name", "site"}})->dump(2) << c.logs();
  for (const auto& t : show["tasks"])
    if (t["state"] == "running") {
      EXPECT_EQ(t["machine"], "m1") << t.dump();
    }
  json m0;
  auto ls = c.cp("machine.ls");
  ASSERT_TRUE(ls.ok());
  for (const auto& m : (*ls)["machines"])
    if (m["machine"] == "m0") m0 = m;
  EXPECT_EQ(m0["state"], "unprepared") << m0.dump();
  EXPECT_NE(m0["unprepared"].get<std::string>().find("'dev' not applied"), std::string::npos)
      << m0.dump();
  EXPECT_EQ(m0["entitlement"], "") << "the machine went back to the free pool: " << m0.dump();
  ASSERT_TRUE(c.cp("job.stop", {{"name", "site"}}).ok());
}

// docs/jobs.md's example job, taken from the page itself, runs on the cluster: the
// guide cannot show a job that fails (the old one's `limits` was refused by every agent).
TEST_F(MultiMachine, TheJobsGuideExampleRuns) {
  std::string doc = read_file(std::string(WEFT_SOURCE_DIR) + "/docs/jobs.md").value_or("");
  size_t open = doc.find("```toml\n");
  ASSERT_NE(open, std::string::npos) << "docs/jobs.md shows no job";
  open += 8;
  size_t close = doc.find("```", open);
  ASSERT_NE(close, std::string::npos);
  auto job = parse_job_file(doc.substr(open, close - open), "docs/jobs.md");
  ASSERT_TRUE(job.ok()) << job.error().str();
  ASSERT_TRUE(
      c_.cp("entitlement.create", {{"name", (*job)["entitlement"]}, {"quota", c_.machines()}})
          .ok());
  auto created = c_.cp("job.create", *job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  size_t count = (*job)["count"].get<size_t>();
  json show = wait_running((*job)["name"], count);
  ASSERT_FALSE(show.is_null());
  // Spread: every machine runs some of it before any runs a third.
  std::map<std::string, int> per;
  for (const auto& [i, t] : running_by_index(show)) {
    per[t["machine"].get<std::string>()]++;
    expect_agent_runs(t);
  }
  EXPECT_EQ(per.size(), std::min<size_t>(count, static_cast<size_t>(c_.machines())));
  for (const auto& [m, n] : per) EXPECT_LE(n, 2) << m;
  ASSERT_TRUE(c_.cp("job.stop", {{"name", (*job)["name"]}}).ok());
}

// Issue 48: a batch job on real machines. Ten completions, three at a time; the first
// task to finish fails (exit 3) and is retried; the rest exit 0 and are not replaced.
// Each task writes when its program started and ended: at no moment did more than three
// run.
TEST_F(MultiMachine, ABatchJobRunsTenCompletionsThreeAtATimeAndRetriesAFailure) {
  std::string d = c_.dir() + "/batch";
  ASSERT_TRUE(mkdir_p(d).ok());
  ASSERT_EQ(::chmod(d.c_str(), 0777), 0);  // the tasks' user writes here
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "etl"}, {"quota", 4}}).ok());
  std::string script = "f=$(mktemp " + d + "/run.XXXXXX); date +%s%N > $f.start; sleep 1; " +
                       "date +%s%N > $f.end; if mkdir " + d +
                       "/failed-once 2>/dev/null; then exit 3; fi; exit 0";
  json job{{"name", "crunch"},
           {"entitlement", "etl"},
           {"kind", "batch"},
           {"batch", {{"completions", 10}, {"parallelism", 3}, {"max_failures", 2}}},
           {"per_task", {{"cpu_milli", 250}, {"mem_mb", 16}}},
           {"task", {{"argv", {"/bin/sh", "-c", script}}}}};
  auto created = c_.cp("job.create", job);
  ASSERT_TRUE(created.ok()) << created.error().str();
  json done = c_.wait_cp(
      "job.show", {{"name", "crunch"}},
      [](const json& j) { return j["batch"].value("outcome", "running") != "running"; }, 90000);
  ASSERT_FALSE(done.is_null()) << c_.cp("job.show", {{"name", "crunch"}})->dump(2) << c_.logs();
  const json& b = done["batch"];
  EXPECT_EQ(b["outcome"], "succeeded") << done.dump(2);
  EXPECT_EQ(b["succeeded"], 10);
  EXPECT_EQ(b["failed"], 1);
  // Eleven programs ran (ten completions and the failure), never more than three at once.
  std::vector<std::pair<int64_t, int>> edges;
  int started = 0;
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    std::string f = e.path().filename();
    if (f.size() < 6 || f.substr(f.size() - 6) != ".start") continue;
    ++started;
    std::string base = e.path().string();
    base.resize(base.size() - 6);
    auto from = read_file(base + ".start"), to = read_file(base + ".end");
    ASSERT_TRUE(from.ok() && to.ok()) << base;
    edges.push_back({std::stoll(*from), +1});
    edges.push_back({std::stoll(*to), -1});
  }
  EXPECT_EQ(started, 11) << [&] {
    std::string names;
    for (const auto& e : std::filesystem::directory_iterator(d))
      names += e.path().filename().string() + " ";
    return names;
  }();
  std::sort(edges.begin(), edges.end());
  int now = 0, most = 0;
  for (const auto& [at, step] : edges) most = std::max(most, now += step);
  EXPECT_LE(most, 3);
  EXPECT_GE(most, 2);  // and they did run side by side
  // Nothing of it runs on any machine; the failure is in its events with the reason.
  for (const auto& [id, m] : agents_running()) EXPECT_NE(id.rfind("crunch.", 0), 0u) << id;
  auto events = c_.cp("job.events", {{"name", "crunch"}});
  ASSERT_TRUE(events.ok());
  EXPECT_NE(events->dump().find("exited with code 3"), std::string::npos) << events->dump(2);
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "crunch"}}).ok());
}

// Issue 48: a task alive but stuck, through the control plane. Its liveness check fails
// three times in a row on its machine; the agent says so and the control plane restarts
// it (as `weftctl task restart` would, a job's TaskController asked first), on its
// machine; once live again it runs on.
TEST_F(MultiMachine, AStuckTaskIsRestartedByItsLivenessCheck) {
  std::string d = c_.dir() + "/live";
  ASSERT_TRUE(mkdir_p(d).ok());
  ASSERT_EQ(::chmod(d.c_str(), 0777), 0);
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "svc"}, {"quota", 4}}).ok());
  json job = job_params("stuck", "svc", 1, 100);
  job["task"]["liveness"] = {{"type", "exec"},
                             {"command", {"/bin/sh", "-c", "test ! -e " + d + "/stuck"}},
                             {"interval", "200ms"},
                             {"failure_threshold", 3}};
  ASSERT_TRUE(c_.cp("job.create", job).ok());
  json first = wait_running("stuck", 1);
  ASSERT_FALSE(first.is_null());
  std::string id0 = running_by_index(first).at(0)["id"];
  ASSERT_TRUE(write_file(d + "/stuck", "").ok());
  json next = c_.wait_cp(
      "job.show", {{"name", "stuck"}},
      [&](const json& j) {
        auto run = running_by_index(j);
        return run.count(0) && run.at(0)["id"] != id0;
      },
      30000);
  ASSERT_FALSE(next.is_null()) << c_.cp("job.show", {{"name", "stuck"}})->dump(2) << c_.logs();
  EXPECT_EQ(running_by_index(next).at(0)["machine"], running_by_index(first).at(0)["machine"]);
  auto events = c_.cp("job.events", {{"name", "stuck"}});
  ASSERT_TRUE(events.ok());
  bool asked = false;
  for (const auto& e : (*events)["events"])
    asked |= e["task"] == id0 && e["what"] == "restart asked" &&
             e.value("detail", "").find("liveness: 3 liveness checks failed") == 0;
  EXPECT_TRUE(asked) << events->dump(2);
  // Live again: the new task runs on.
  ASSERT_EQ(::unlink((d + "/stuck").c_str()), 0);
  std::string id1 = running_by_index(next).at(0)["id"];
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  auto now = c_.cp("job.show", {{"name", "stuck"}});
  ASSERT_TRUE(now.ok());
  auto run = running_by_index(*now);
  ASSERT_TRUE(run.count(0)) << now->dump(2);
  EXPECT_EQ(run.at(0)["id"], id1) << now->dump(2);
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "stuck"}}).ok());
}

// Issue 48: an opportunistic batch job runs on room nobody uses (the free pool's and
// another entitlement's idle machines), counted against no quota; when that entitlement's
// job scales up, the room is taken back at once: the owner's tasks run without waiting
// for the guests, which are told to stop (SIGTERM) and killed at their notice, and run
// again, without counting as failures, once there is room.
TEST_F(MultiMachine, AnOpportunisticJobGivesItsRoomBackWithinItsNotice) {
  auto ls = c_.cp("machine.ls");
  ASSERT_TRUE(ls.ok());
  const int64_t cap = (*ls)["machines"][0]["cpu_milli"].get<int64_t>();
  const int64_t half = cap / 2;
  std::string d = c_.dir() + "/guests";
  ASSERT_TRUE(mkdir_p(d).ok());
  ASSERT_EQ(::chmod(d.c_str(), 0777), 0);
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "svc"}, {"quota", 2}}).ok());
  ASSERT_TRUE(c_.cp("entitlement.create", {{"name", "lab"}, {"quota", 1}}).ok());
  json web = job_params("web", "svc", 2, static_cast<int>(half));
  ASSERT_TRUE(c_.cp("job.create", web).ok());
  ASSERT_FALSE(wait_running("web", 2).is_null());
  // Six guests of half a machine each: the two free machines' room and svc's idle halves.
  json crunch{{"name", "crunch"},
              {"entitlement", "lab"},
              {"kind", "batch"},
              {"batch",
               {{"completions", 100},
                {"parallelism", 6},
                {"opportunistic", true},
                {"notice", "3s"},
                {"max_failures", 0}}},
              {"per_task", {{"cpu_milli", half}, {"mem_mb", 16}}},
              {"task",
               {{"argv",
                 {"/bin/sh", "-c",
                  "trap 'echo term >> $f' TERM; f=$(mktemp " + d +
                      "/g.XXXXXX); while :; do sleep 0.1; done"}}}}};
  auto made = c_.cp("job.create", crunch);
  ASSERT_TRUE(made.ok()) << made.error().str();
  ASSERT_FALSE(wait_running("crunch", 6).is_null());
  // Each guest's file says its trap is set ("running" is said once its shell started: on
  // a loaded machine a guest asked to stop before that died without writing "term").
  auto files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(d)) n += e.is_regular_file();
    return n;
  };
  for (int i = 0; i < 100 && files() < 6; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(files(), 6u);
  // Nothing joined lab's entitlement: its guests are counted against no quota.
  auto ents = c_.cp("entitlement.ls");
  ASSERT_TRUE(ents.ok());
  for (const auto& e : (*ents)["entitlements"])
    if (e["name"] == "lab") {
      EXPECT_EQ(e["machines"], 0) << e.dump();
    }

  // svc's job grows into the room its guests hold: its tasks run at once.
  auto t0 = Clock::now();
  ASSERT_TRUE(c_.cp("job.scale", {{"name", "web"}, {"count", 4}}).ok());
  ASSERT_FALSE(wait_running("web", 4).is_null());
  double owner_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(owner_s, 3.0) << "the owner waited longer than the guests' notice";
  // Two guests were taken back: asked to stop, killed at their 3 s notice, not failed.
  json after = c_.wait_cp(
      "job.show", {{"name", "crunch"}},
      [&](const json& j) {
        int stopped = 0;
        for (const auto& t : j["tasks"]) stopped += t["state"] == "stopped";
        return stopped == 2;
      },
      15000);
  ASSERT_FALSE(after.is_null()) << c_.cp("job.show", {{"name", "crunch"}})->dump(2) << c_.logs();
  double left_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(left_s, 3.0 + 3.0) << "a guest outstayed its notice";
  EXPECT_GT(left_s, 2.5) << "the guests did not have their notice (they ignore SIGTERM)";
  EXPECT_EQ(after.value("failed", 0), 0) << after.dump(2);
  int terms = 0;
  for (const auto& e : std::filesystem::directory_iterator(d))
    terms += read_file(e.path().string()).value_or("") == "term\n";
  EXPECT_EQ(terms, 2);
  auto events = c_.cp("job.events", {{"name", "crunch"}});
  ASSERT_TRUE(events.ok());
  int taken = 0;
  for (const auto& e : (*events)["events"]) taken += e["what"] == "taken back";
  EXPECT_EQ(taken, 2) << events->dump(2);
  // The room comes back: so do the guests.
  ASSERT_TRUE(c_.cp("job.scale", {{"name", "web"}, {"count", 2}}).ok());
  ASSERT_FALSE(wait_running("crunch", 6).is_null());
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "crunch"}}).ok());
  ASSERT_TRUE(c_.cp("job.stop", {{"name", "web"}}).ok());
}

}  // namespace
}  // namespace weft::testing
