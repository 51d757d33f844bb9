// weft-controlplane as a process: its validator, weftctl's and the agent's agree on
// random jobs (issue 12).
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
#include "common/rpc/protocol.h"
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

// ---- the three validators agree (issue 12)

// A random job in the protocol's form: each field valid, invalid or absent.
json random_job(std::mt19937_64& rng, int i) {
  auto pick = [&](const std::vector<json>& pool) {
    return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
  };
  // Mostly a valid value (or none), now and then an invalid one.
  auto field = [&](const std::vector<json>& valid, const std::vector<json>& invalid) {
    return std::uniform_int_distribution<int>(0, 99)(rng) < 94 ? pick(valid) : pick(invalid);
  };
  json j;
  std::string n = std::to_string(i);  // names are unique: the longest allowed too
  j["name"] = field({"j" + n, std::string(kMaxJobNameLength - n.size(), 'n') + n},
                    {"", "a.b", "-x", std::string(33, 'n'), 7, "has space"});
  j["entitlement"] = field({"web"}, {"", 3, nullptr});
  j["count"] = field({nullptr, 1, 2, 3}, {0, -1, 100001, "2", 2.5});
  j["max_unavailable"] = field({nullptr, 1, 2}, {0, "1"});
  j["placement"] = field({nullptr, "spread", "pack"}, {"heap", 1});
  j["machine_type"] = field({nullptr, "std"}, {5});
  j["per_task"] =
      field({nullptr, json{{"cpu_milli", 100}, {"mem_mb", 16}}, json{{"cpu_milli", 0}}},
            {json{{"cpu_milli", -5}}, json{{"mem_mb", int64_t{1} << 31}}, json{{"disk", 1}}});
  if (std::uniform_int_distribution<int>(0, 49)(rng) == 0) j["colour"] = "blue";
  json task = {{"argv", field({json::array({"/bin/true"}), json::array({"/bin/sh", "-c", "x"})},
                              {json::array(), json::array({""}), json::array({"x", 3}), "true"})}};
  // Task fields: each present now and then, mostly valid.
  std::vector<std::tuple<const char*, std::vector<json>, std::vector<json>>> optional = {
      {"cwd", {"/", "/tmp"}, {"rel"}},
      {"env", {json{{"A", "1"}}}, {json{{"A", 1}}, json{{"B=C", "x"}}}},
      {"user", {"nobody"}, {5}},
      {"resources",
       {json{{"memory_max", "64M"}}, json{{"cpu", 0.5}}, json{{"pids_max", 64}},
        json{{"memory_max", "64M"}, {"memory_high", "32M"}}},
       {json{{"memory_max", "lots"}}, json{{"cpu", 0}}, json{{"pids_max", 0}}, json{{"gpus", 1}},
        json{{"memory_max", "64M"}, {"memory_high", "128M"}}}},
      {"restart",
       {json{{"policy", "always"}}, json{{"policy", "on-failure"}, {"delay", "1s"}}},
       {json{{"policy", "sometimes"}}, json{{"delay", "1s"}, {"max_delay", "500ms"}},
        json{{"max_restarts", -2}}}},
      {"stop_signal", {"TERM", "9"}, {"SIGFOO"}},
      {"stop_grace", {"5s", 2}, {"soon"}},
      {"namespaces",
       {json{{"network", "private"}}, json{{"network", "bridge"}}},
       {json{{"network", "overlay"}}}},
      {"hostname", {"box"}, {std::string(70, 'h')}},
      {"seccomp", {"default"}, {"off"}},
      {"logs", {json{{"max_files", 3}}}, {json{{"max_files", 0}}}},
      {"rootfs", {"/srv/root"}, {"srv"}},
      {"name", {}, {"mine"}},
      {"owner", {}, {"controlplane"}},
      {"limits", {}, {json{{"memory_max", "64M"}}}},
  };
  for (const auto& [key, valid, invalid] : optional) {
    if (std::uniform_int_distribution<int>(0, 9)(rng) != 0) continue;
    bool bad = valid.empty() || std::uniform_int_distribution<int>(0, 2)(rng) == 0;
    task[key] = bad ? pick(invalid) : pick(valid);
  }
  j["task"] = std::uniform_int_distribution<int>(0, 49)(rng) ? task : json("sleep");
  for (auto it = j.begin(); it != j.end();) it = it->is_null() ? j.erase(it) : std::next(it);
  return j;
}

toml::array toml_array(const json& a);
toml::table toml_table(const json& o);
template <class Put>
void toml_value(const json& v, Put put) {
  if (v.is_object())
    put(toml_table(v));
  else if (v.is_array())
    put(toml_array(v));
  else if (v.is_string())
    put(v.get<std::string>());
  else if (v.is_boolean())
    put(v.get<bool>());
  else if (v.is_number_integer())
    put(v.get<int64_t>());
  else if (v.is_number_float())
    put(v.get<double>());
}
toml::array toml_array(const json& a) {
  toml::array out;
  for (const auto& e : a) toml_value(e, [&](auto&& x) { out.push_back(std::move(x)); });
  return out;
}
toml::table toml_table(const json& o) {
  toml::table out;
  for (const auto& item : o.items()) {
    const std::string& k = item.key();  // (clang 14 cannot capture a structured binding)
    toml_value(item.value(), [&](auto&& x) { out.insert_or_assign(k, std::move(x)); });
  }
  return out;
}

// The job file an operator would write for it: [resources] with cpu and memory in the
// file's units instead of per_task.
std::string as_job_file(json j) {
  if (j.contains("per_task")) {
    json res = json::object();
    for (const auto& [k, v] : j["per_task"].items()) {
      if (k == "cpu_milli" && v.is_number_integer())
        res["cpu"] = std::to_string(v.get<int64_t>()) + "m";
      else if (k == "mem_mb" && v.is_number_integer())
        res["memory"] = std::to_string(v.get<int64_t>()) + "M";
      else
        res[k] = v;
    }
    j.erase("per_task");
    j["resources"] = res;
  }
  std::ostringstream os;
  os << toml_table(j);
  return os.str();
}

// Random jobs, valid and invalid, go to weftctl's job-file validator, to a real control
// plane's job.create, and every task the control plane then starts goes to the agent's
// validator (the fake machines run it). They must agree on every job: what weftctl
// accepts the control plane accepts, and the agent starts.
TEST_F(ControlPlane, TheThreeValidatorsAgreeOnRandomJobs) {
  start();
  if (HasFatalFailure()) return;
  auto ms = fake_machines(3);
  for (auto& m : ms) {
    ASSERT_TRUE(m->connect(sock()));
    m->report();
  }
  // The validators of the spec's form agree; what an entitlement grants (policy, not
  // form: ControlPlaneTls.AnOperatorsJobGetsOnlyWhatItsEntitlementGrants) is all here.
  ASSERT_TRUE(call("entitlement.create",
                   {{"name", "web"}, {"quota", 3}, {"grants", {{"privileged", true}}}})
                  .ok());
  const char* cases_env = getenv("WEFT_PROPERTY_CASES");
  int cases = cases_env ? std::atoi(cases_env) : 400;
  const char* seed_env = getenv("WEFT_PROPERTY_SEED");
  uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : std::random_device{}();
  std::cout << "[ property ] " << cases << " random jobs, seed " << seed
            << " (WEFT_PROPERTY_SEED to replay)\n";
  std::mt19937_64 rng(seed);
  int accepted = 0, refused = 0, starts_before = 0;
  for (auto& m : ms) starts_before += m->starts();
  for (int i = 0; i < cases; ++i) {
    json job = random_job(rng, i);
    std::string file = as_job_file(job);
    auto by_file = parse_job_file(file, "case.toml");
    auto by_cp = call("job.create", job);
    // Refused by the control plane's validator (not for want of room).
    bool cp_refused = !by_cp.ok() && by_cp.error().code == rpc::kInvalidParams;
    ASSERT_EQ(by_file.ok(), !cp_refused)
        << "seed " << seed << " case " << i << "\njob: " << job.dump() << "\nfile:\n"
        << file << "\nweftctl: " << (by_file.ok() ? "accepted" : by_file.error().str())
        << "\ncontrol plane: " << (by_cp.ok() ? by_cp->dump() : by_cp.error().str());
    if (by_file.ok()) {
      // weftctl sends what the file became: the control plane accepts that too.
      EXPECT_EQ(parse_job_spec(*by_file).ok(), true) << file;
      ++accepted;
    } else {
      ++refused;
    }
    if (by_cp.ok()) {
      for (auto& m : ms) m->report();  // the starts reach the machines' validator
      ASSERT_TRUE(call("job.stop", {{"name", job["name"]}}).ok());
      for (auto& m : ms) m->report();
    }
  }
  int starts = -starts_before;
  for (auto& m : ms) {
    starts += m->starts();
    EXPECT_TRUE(m->refusals().empty()) << m->refusals().front();
  }
  std::cout << "[ property ] " << accepted << " accepted by all three, " << refused
            << " refused by both job validators; " << starts << " starts, none refused\n";
  // Both outcomes were exercised, and tasks really reached the agent's validator.
  EXPECT_GT(accepted, cases / 10);
  EXPECT_GT(refused, cases / 10);
  EXPECT_GT(starts, 0);
}

}  // namespace
}  // namespace weft::testing
