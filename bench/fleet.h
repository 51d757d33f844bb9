// The fleet simulator's machines (fleet_sim.cc, region_bench.cc): thousands of simulated
// machines, each with the sessions of its daemons, over real TCP (or mutual TLS) to a real
// control plane, on one event loop; they register with Alibaba's machine shapes, report
// as the daemons do, answer task.run / task.stop / profile.apply, follow a region's
// "moved" to the control plane that holds them, and die on command. Header-only: each
// benchmark is one translation unit.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench/sim_util.h"
#include "common/clock.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/client.h"
#include "common/services.h"
#include "common/strings.h"
#include "common/task_report.h"
#include "common/tls.h"
#include "testing/machine_wire.h"
#include "testing/ports.h"

namespace weft::bench::fleet {

using json = nlohmann::json;

struct Options {
  int machines = 1000;
  double heartbeat_s = 2;
  double rest_s = 20;
  int jobs = 200, tasks = 36, clients = 4;
  double create_rate = 0;  // jobs a second in all (0: as fast as the callers go)
  // Each task's request: 2 cores and 4 GiB by default, so that a 96-core machine of the
  // list runs tens of tasks, as a fleet's machines do, not a thousand.
  int64_t task_cpu_milli = 2000, task_mem_mb = 4096;
  double fail_percent = 1;
  double run_delay_ms = 0, run_fail = 0;
  int connect_window = 2000;
  int daemons = 3;  // sessions per machine: agent, sidekick, hcs (1 = the agent only)
  bool tls = false;
  bool full_reports = false;     // the pre-issue-14 agent: the whole task list every time
  bool loud_heartbeats = false;  // the pre-issue-46 agent: every heartbeat a request
  std::string phases = "register,rest,create,rest,fail";
  std::string cp_extra;  // more controlplane.toml lines
  std::string data =
      std::string(WEFT_SOURCE_DIR) + "/../shared/data/alibaba-v2018-machine_meta.csv";
  double timeout_s = 300;
  unsigned seed = 1;
  bool keep = false;
  // Every machine's shape and fault domain, instead of Alibaba's (0: the list's).
  int64_t machine_cpu_milli = 0, machine_mem_mb = 0;
  int domain_size = 0;  // machines per fault domain (an MSB)
  // The fig14 phase (docs/benchmarks.md, Twine's Fig. 14).
  int max_unavailable = 1;
  int shards = 15000, replicas = 3, floor = 2, max_in_flight = 0;
  std::string controller;     // the shard_controller binary; "" = no TaskController
  double scale = 1;           // the timeline (failure at 120 s, back at 415 s) times this
  std::string out;            // per-second CSV
  bool expect_floor = false;  // fail unless no shard lost two replicas outside the failure
  // The discovery phase (issue 33): every agent answers DNS (serves_discovery), and a job
  // of `discovery_tasks` is scaled down step by step; each step's withdrawal is timed
  // until every agent holds it, and until the stop reaches the task's machine.
  int discovery_tasks = 20, discovery_steps = 10;
  // Which jobs the agents answer DNS for (issue 46): "" = none (they do not answer DNS)
  // unless the discovery phase runs, then every job; "all": every job; else a comma list
  // of job names (registration's discovery_interest: pushes by interest).
  std::string dns_interest;
  // A region (docs/regions.md): the control plane is shard s1 of a region whose records
  // are in this etcd, with a front end of its own; the entitlement is made through the
  // front end, and the create phase's jobs through `jobs_via` ("front-end" or "shard").
  std::string region_etcd;
  std::string jobs_via = "front-end";
  // "broker": the control plane is the region's broker instead (no shard, no front end):
  // what its free machines cost it (register and rest phases only).
  std::string region_role = "shard";
};

struct Shape {
  int64_t cpu_milli = 0, mem_mb = 0;
  std::string domain, dc;
};

// Alibaba's machine list: the last row of each machine (its latest shape and domains).
// cpu_num cores; mem_size is normalised 0-100, taken as a share of 512 GiB (a synthesis).
inline std::vector<Shape> read_shapes(const std::string& path) {
  std::map<std::string, Shape> by_id;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto f = split(line, ',');
    if (f.size() < 7) continue;
    Shape s;
    s.domain = "fd" + f[2];
    s.dc = "dc" + f[3];
    s.cpu_milli = std::strtoll(f[4].c_str(), nullptr, 10) * 1000;
    s.mem_mb = std::strtoll(f[5].c_str(), nullptr, 10) * 512 * 1024 / 100;
    if (s.cpu_milli > 0 && s.mem_mb > 0) by_id[f[0]] = s;
  }
  std::vector<Shape> out;
  for (auto& [id, s] : by_id) out.push_back(std::move(s));
  return out;
}

enum Kind { kAgent, kSidekick, kHcs };
constexpr const char* kKindName[] = {"agent", "sidekick", "hcs"};

struct Machine;
struct Daemon {
  Machine* m = nullptr;
  Kind kind = kAgent;
  Dialer dialer;
  Source retry, report;
  std::unique_ptr<rpc::Session> session;
  bool up = false;
  uint64_t interval_us = 0;
  uint64_t backoff_us = 500'000;
};

struct SimTask {
  std::string state;  // "running" or "stopped"
  Source start;       // the delayed start
};

struct Machine {
  int index = 0;
  std::string id;
  Shape shape;
  in_addr source{};
  std::shared_ptr<tls::Context> ctx;
  Daemon d[3];
  std::map<std::string, SimTask> tasks;
  std::string profile;
  // Service discovery: the endpoints of the discovery phase's job in this agent's copy,
  // and when that count last changed.
  ServiceCatalog catalog;
  size_t svc_endpoints = SIZE_MAX;
  uint64_t svc_changed_us = 0;
  std::string acked_digest;                  // the digest the control plane holds for this machine
  std::map<std::string, std::string> acked;  // and the list it stands for
  bool reporting = false, report_again = false;
  bool quiet_ok = false;  // its control plane takes unanswered heartbeats (its hello said)
  uint64_t resends = 0;   // report.resend notifications so far (as weft-agent's CpSession)
  bool dead = false;
  // A region: the control plane that holds it (its port; 0: the one the fleet was given,
  // the brokers'), learnt from "moved" (-32009) as the daemons' links do.
  uint16_t port = 0;
};

// "<job>.<index>.<seq>" -> (job, index)
inline std::pair<std::string, int> job_index(const std::string& task) {
  auto last = task.rfind('.');
  auto mid = last == std::string::npos ? last : task.rfind('.', last - 1);
  if (mid == std::string::npos) return {task, -1};
  return {task.substr(0, mid), std::atoi(task.c_str() + mid + 1)};
}

inline double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100 * static_cast<double>(v.size())));
  return v[i];
}

class Fleet {
 public:
  Fleet(EventLoop& loop, const Options& o, uint16_t port) : loop_(loop), o_(o), port_(port) {
    agent_methods_.add("task.run",
                       [this](const json& p, const rpc::CallContext& c) { return task_run(p, c); });
    agent_methods_.add(
        "task.stop", [this](const json& p, const rpc::CallContext& c) { return task_stop(p, c); });
    // What the control plane says of a quiet heartbeat, as weft-agent takes it.
    agent_methods_.add("report.resend", [this](const json&, const rpc::CallContext& c) {
      if (Machine* m = machine_of(c)) {
        ++m->resends;
        m->acked_digest.clear();
        report_soon(m->d[kAgent]);
      }
      return Result<json>(json::object());
    });
    agent_methods_.add("report.forget", [this](const json& p, const rpc::CallContext& c) {
      if (Machine* m = machine_of(c); m && p.is_object() && p.contains("forget"))
        forget_tasks(*m, p["forget"]);
      return Result<json>(json::object());
    });
    // An agent that answers DNS: the agent's own reader and copy of each update.
    agent_methods_.add("service.update",
                       [this](const json& p, const rpc::CallContext& c) -> Result<json> {
                         Machine* m = machine_of(c);
                         if (!m) return make_error("no machine");
                         TRY_ASSIGN(ServiceUpdate u, parse_service_update(p));
                         m->catalog.apply(u);
                         ++service_updates_;
                         const Service* s = m->catalog.find("svc", "fleet");
                         size_t n = s ? s->endpoints.size() : 0;
                         if (n != m->svc_endpoints) {
                           m->svc_endpoints = n;
                           m->svc_changed_us = now_monotonic_us();
                         }
                         return json{{"version", m->catalog.version()}};
                       });
    sidekick_methods_.add("profile.apply", [this](const json& p, const rpc::CallContext& c) {
      return profile_apply(p, c);
    });
  }
  size_t sessions_wanted() const { return machines_.size() * static_cast<size_t>(o_.daemons); }
  ~Fleet() {
    for (auto& m : machines_)
      for (auto& d : m->d) d.session.reset();
  }

  Status add(int index, const Shape& shape, const std::string& pki) {
    auto m = std::make_unique<Machine>();
    m->index = index;
    m->id = machine_name(index);
    m->shape = shape;
    // 80 machines (240 sessions) per source address: under the control plane's cap of
    // 256 sessions per address.
    m->source.s_addr = htonl((127u << 24) | (1u << 16) | static_cast<uint32_t>(index / 80 + 1));
    if (o_.tls) {
      TRY_ASSIGN(m->ctx, tls::Context::create({pki + "/ca.pem", pki + "/" + m->id + ".pem",
                                               pki + "/" + m->id + ".key", ""},
                                              tls::Role::kClient));
    }
    for (int k = 0; k < o_.daemons; ++k) {
      m->d[k].m = m.get();
      m->d[k].kind = static_cast<Kind>(k);
      m->d[k].interval_us = static_cast<uint64_t>(o_.heartbeat_s * 1e6);
      queue_.push_back(&m->d[k]);
    }
    machines_.push_back(std::move(m));
    return {};
  }

  // Starts queued connections while fewer than the window are in flight.
  void pump() {
    while (!queue_.empty() && connecting_ < static_cast<size_t>(o_.connect_window)) {
      Daemon* d = queue_.front();
      queue_.pop_front();
      connect(*d);
    }
  }

  size_t daemons_up() const { return up_; }
  // task.run calls accepted (a start, or a restart) and "moved" answers followed.
  uint64_t task_runs() const { return task_runs_; }
  // Those of jobs whose name starts with `prefix`.
  uint64_t task_runs(const std::string& prefix) const {
    uint64_t n = 0;
    for (const auto& [job, k] : runs_by_job_) n += job.rfind(prefix, 0) == 0 ? k : 0;
    return n;
  }
  uint64_t moved() const { return moved_; }
  // Machines whose agent is up at a control plane the region sent it to (not the
  // fleet's own port: a shard, not the brokers).
  size_t up_elsewhere() const {
    size_t n = 0;
    for (const auto& m : machines_) n += m->d[kAgent].up && m->port != 0 && m->port != port_;
    return n;
  }
  // Machines running a task of `job_prefix` ("" = any), and how many of those have
  // their agent up at the control plane on `port`.
  std::pair<size_t, size_t> hosting(const std::string& job_prefix, uint16_t port) const {
    size_t with = 0, there = 0;
    for (const auto& m : machines_) {
      bool has = false;
      for (const auto& [id, t] : m->tasks)
        has = has || (t.state == "running" && id.rfind(job_prefix, 0) == 0);
      if (!has) continue;
      ++with;
      there += m->d[kAgent].up && m->port == port;
    }
    return {with, there};
  }
  size_t running() const { return running_; }
  size_t machines() const { return machines_.size(); }
  uint64_t messages() const { return messages_; }
  std::vector<double> take_rtts() { return std::exchange(rtt_ms_, {}); }
  size_t report_errors() const { return report_errors_; }
  size_t full_reports() const { return full_reports_; }
  size_t quiet_reports() const { return quiet_reports_; }
  size_t digest_reports() const { return digest_reports_; }
  size_t change_reports() const { return change_reports_; }

  // Kills `share` of the machines that run tasks: their sessions close, they never come
  // back. Returns how many died; from now on each lost (job, index) is timed until a
  // copy runs on a live machine.
  size_t kill(double share, std::mt19937& rng) {
    std::vector<Machine*> with_tasks;
    for (auto& m : machines_)
      if (!m->dead && std::any_of(m->tasks.begin(), m->tasks.end(),
                                  [](const auto& t) { return t.second.state == "running"; }))
        with_tasks.push_back(m.get());
    std::shuffle(with_tasks.begin(), with_tasks.end(), rng);
    size_t n = std::min(with_tasks.size(),
                        static_cast<size_t>(share * static_cast<double>(machines_.size()) + 0.5));
    killed_at_us_ = now_monotonic_us();
    lost_.clear();
    replaced_ms_.clear();
    for (size_t i = 0; i < n; ++i) {
      Machine* m = with_tasks[i];
      m->dead = true;
      for (auto& [id, t] : m->tasks)
        if (t.state == "running") {
          lost_.insert(job_index(id));
          --running_;
        }
      m->tasks.clear();
      hang_up(*m);
    }
    lost_total_ = lost_.size();
    return n;
  }
  // A dead machine's daemons: timers stopped, dials cancelled, sessions closed.
  void hang_up(Machine& m) {
    for (auto& d : m.d) {
      d.report.reset();
      d.retry.reset();
      if (d.dialer.dialing()) --connecting_;
      d.dialer.cancel();
      if (d.session) d.session->close();
    }
  }
  // An MSB fails: every machine of the domain dies (sessions closed, tasks gone). Returns
  // their names.
  std::vector<std::string> kill_domain(const std::string& domain) {
    std::vector<std::string> names;
    for (auto& m : machines_) {
      if (m->dead || m->shape.domain != domain) continue;
      names.push_back(m->id);
      m->dead = true;
      for (auto& [id, t] : m->tasks)
        if (t.state == "running") --running_;
      m->tasks.clear();
      hang_up(*m);
    }
    return names;
  }
  // And comes back: its machines register again, with nothing running.
  void revive_domain(const std::string& domain) {
    for (auto& m : machines_) {
      if (!m->dead || m->shape.domain != domain) continue;
      m->dead = false;
      m->acked_digest.clear();
      for (int k = 0; k < o_.daemons; ++k) {
        m->d[k].backoff_us = 500'000;
        queue_.push_back(&m->d[k]);
      }
    }
  }
  // The domain whose machines run the most tasks.
  std::string busiest_domain() const {
    std::map<std::string, int> n;
    for (const auto& m : machines_)
      if (!m->dead)
        for (const auto& [id, t] : m->tasks) n[m->shape.domain] += t.state == "running";
    std::string best;
    for (const auto& [d, c] : n)
      if (best.empty() || c > n.at(best)) best = d;
    return best;
  }
  // The discovery phase: agents whose copy has `n` endpoints of the job, the latest time
  // one of them changed to that, and when the stop of `task` reached its machine (0: not).
  size_t agents_with(size_t n) const {
    size_t k = 0;
    for (const auto& m : machines_) k += !m->dead && m->svc_endpoints == n;
    return k;
  }
  std::vector<uint64_t> changed_at(size_t n) const {
    std::vector<uint64_t> out;
    for (const auto& m : machines_)
      if (!m->dead && m->svc_endpoints == n) out.push_back(m->svc_changed_us);
    return out;
  }
  uint64_t stopped_at(const std::string& task) const {
    auto it = stopped_at_.find(task);
    return it == stopped_at_.end() ? 0 : it->second;
  }
  uint64_t service_updates() const { return service_updates_; }
  size_t lost_waiting() const { return lost_.size(); }
  size_t lost_total() const { return lost_total_; }
  std::vector<double> replaced_ms() const { return replaced_ms_; }

 private:
  Machine* machine_of(const rpc::CallContext& c) {
    auto it = by_session_.find(c.session);
    return it == by_session_.end() ? nullptr : it->second;
  }

  Result<json> task_run(const json& p, const rpc::CallContext& c) {
    Machine* m = machine_of(c);
    if (!m || !p.is_object() || !p.contains("name") || !p["name"].is_string())
      return field_error("name", "is required");
    std::string name = p["name"].get<std::string>();
    auto it = m->tasks.find(name);
    if (it != m->tasks.end() && it->second.state == "running")
      return make_error("task " + name + " exists").with_code(rpc::kConflict);
    if (o_.run_fail > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < o_.run_fail)
      return make_error("simulated start failure");
    SimTask& t = m->tasks[name];
    t.state = "starting";
    ++task_runs_;
    ++runs_by_job_[job_index(name).first];
    auto started = [this, m, name] {
      auto at = m->tasks.find(name);
      if (at == m->tasks.end() || at->second.state != "starting") return;
      at->second.state = "running";
      ++running_;
      if (!lost_.empty() && lost_.erase(job_index(name)))
        replaced_ms_.push_back(static_cast<double>(now_monotonic_us() - killed_at_us_) / 1e3);
      report_soon(m->d[kAgent]);
    };
    if (o_.run_delay_ms > 0) {
      auto s = loop_.add_timer_in(static_cast<uint64_t>(o_.run_delay_ms * 1000), started);
      if (s.ok()) t.start = std::move(s).value();
    } else {
      started();
    }
    return json{{"name", name}};
  }

  Result<json> task_stop(const json& p, const rpc::CallContext& c) {
    Machine* m = machine_of(c);
    if (!m || !p.is_object() || !p.contains("id") || !p["id"].is_string())
      return field_error("id", "is required");
    auto it = m->tasks.find(p["id"].get<std::string>());
    if (it == m->tasks.end()) return make_error("no such task").with_code(rpc::kNotFound);
    stopped_at_[it->first] = now_monotonic_us();
    if (it->second.state == "running") --running_;
    it->second.state = "stopped";
    it->second.start.reset();
    report_soon(m->d[kAgent]);
    return json::object();
  }

  Result<json> profile_apply(const json& p, const rpc::CallContext& c) {
    Machine* m = machine_of(c);
    if (!m || !p.is_object() || !p.contains("profile") || !p["profile"].is_string())
      return field_error("profile", "is required");
    m->profile = p["profile"].get<std::string>();
    report_soon(m->d[kSidekick]);
    return json{{"profile", m->profile}, {"state", "applied"}};
  }

  // The daemons report a change at once (the agent on a task's start or end, sidekick on
  // a switch), batched to the next loop iteration.
  void report_soon(Daemon& d) {
    if (!d.up) return;
    auto s = loop_.add_timer_in(1, [this, &d] { report(d); });
    if (s.ok()) d.report = std::move(s).value();
  }

  void connect(Daemon& d) {
    d.retry.reset();
    ++connecting_;
    d.dialer.dial(loop_, d.m->source, d.m->port ? d.m->port : port_, [this, &d](Fd fd) {
      --connecting_;
      if (!fd.valid()) {
        retry_later(d);
        return;
      }
      start_session(d, std::move(fd));
    });
  }

  void start_session(Daemon& d, Fd fd) {
    Machine& m = *d.m;
    int fdnum = fd.get();
    const rpc::Dispatcher* methods = d.kind == kAgent      ? &agent_methods_
                                     : d.kind == kSidekick ? &sidekick_methods_
                                                           : nullptr;
    d.session = std::make_unique<rpc::Session>(loop_, std::move(fd), rpc::Peer{}, methods);
    if (m.ctx) {
      auto ssl = m.ctx->new_ssl(fdnum, "127.0.0.1");
      if (!ssl.ok()) {
        d.session.reset();
        retry_later(d);
        return;
      }
      d.session->use_tls(*ssl, 30'000'000);
    }
    by_session_[d.session.get()] = &m;
    d.session->set_on_close([this, &d] {
      by_session_.erase(d.session.get());
      if (d.up) --up_;
      d.up = false;
      d.report.reset();
      if (d.kind == kAgent) {
        d.m->acked_digest.clear();
        d.m->reporting = d.m->report_again = false;
      }
      auto later = loop_.add_defer([this, &d] {
        d.session.reset();
        if (!d.m->dead) retry_later(d);
      });
      if (later.ok()) d.retry = std::move(later).value();
    });
    (void)d.session->start();
    ++messages_;
    d.session->call(hello_method(d.kind), hello(d), [this, &d](Result<json> r) {
      if (!r.ok()) {
        if (r.error().code == rpc::kMoved) {
          // Held elsewhere: there, at once ("": the brokers, the fleet's own port).
          ++moved_;
          std::string to = r.error().leader;
          to = to.substr(0, to.find(','));
          size_t colon = to.rfind(':');
          d.m->port = colon == std::string::npos
                          ? 0
                          : static_cast<uint16_t>(std::atoi(to.c_str() + colon + 1));
          d.backoff_us = 1000;
        } else {
          ++hello_refused_;
        }
        if (d.session) d.session->close();
        return;
      }
      d.up = true;
      ++up_;
      d.backoff_us = 500'000;
      if (d.kind == kAgent)
        d.m->quiet_ok =
            !o_.loud_heartbeats && r->is_object() && r->value("quiet_heartbeats", false);
      take_interval(d, *r);
      schedule(d);
      if (d.kind == kAgent && o_.daemons == 1) {
        // One session speaks for the machine's three daemons: a verdict once, so that
        // the machine takes tasks.
        d.session->call("health.report", testing::health_verdict(d.m->id, "ok"),
                        [](Result<json>) {});
      }
    });
  }

  static const char* hello_method(Kind k) {
    return k == kAgent ? "machine.register" : k == kSidekick ? "profile.report" : "health.report";
  }
  json hello(const Daemon& d) const {
    const Machine& m = *d.m;
    if (d.kind == kAgent) {
      testing::Registration reg;
      reg.machine = m.id;
      reg.dc = m.shape.dc;
      reg.domain = m.shape.domain;
      reg.cpu_milli = m.shape.cpu_milli;
      reg.mem_mb = m.shape.mem_mb;
      reg.controllers = {"cpu", "memory", "io", "pids"};
      reg.serves_discovery =
          !o_.dns_interest.empty() || o_.phases.find("discovery") != std::string::npos;
      if (!o_.dns_interest.empty() && o_.dns_interest != "all") {
        reg.dns_interest.emplace();
        for (const auto& j : split(o_.dns_interest, ','))
          if (!j.empty()) reg.dns_interest->push_back(j);
      }
      return testing::registration(reg);
    }
    return report_params(d);
  }
  json report_params(const Daemon& d) const {
    const Machine& m = *d.m;
    if (d.kind == kSidekick) return testing::profile_report(m.id, m.profile);
    return testing::health_verdict(m.id, "ok");
  }
  void take_interval(Daemon& d, const json& r) {
    if (r.is_object() && r.contains("heartbeat_interval_ms") &&
        r["heartbeat_interval_ms"].is_number_unsigned())
      d.interval_us =
          std::max<uint64_t>(r["heartbeat_interval_ms"].get<uint64_t>() * 1000, 100'000);
  }
  void schedule(Daemon& d) {
    auto t = loop_.add_timer_in(d.interval_us, [this, &d] { report(d); });
    if (t.ok()) d.report = std::move(t).value();
  }

  void report(Daemon& d) {
    if (!d.session || !d.up) return;
    schedule(d);
    ++messages_;
    if (d.kind != kAgent) {
      d.session->call(hello_method(d.kind), report_params(d), [this, &d](Result<json> r) {
        if (r.ok()) take_interval(d, *r);
      });
      return;
    }
    Machine& m = *d.m;
    if (m.reporting) {  // one report at a time, as weft-agent
      m.report_again = true;
      return;
    }
    std::map<std::string, std::string> states;
    for (const auto& [id, t] : m.tasks) states[id] = t.state == "starting" ? "running" : t.state;
    json p{{"machine", m.id}};
    std::string digest = tasks_digest(states);
    if (!o_.full_reports && !m.acked_digest.empty() && digest == m.acked_digest) {
      p["digest"] = digest;
      ++digest_reports_;
      // As weft-agent: no answer needed while the control plane spoke within 1.5 intervals.
      if (m.quiet_ok && now_monotonic_us() - d.session->last_heard_us() < d.interval_us * 3 / 2) {
        ++quiet_reports_;
        d.session->notify("machine.report", std::move(p));
        return;
      }
    } else if (!o_.full_reports && !m.acked_digest.empty()) {  // as weft-agent does
      p["changes"] = task_changes_json(m.acked, states);
      p["base"] = m.acked_digest;
      p["digest"] = digest;
      ++change_reports_;
    } else {
      p["tasks"] = states;
      ++full_reports_;
    }
    uint64_t t0 = now_monotonic_us();
    m.reporting = true;
    d.session->call("machine.report", std::move(p),
                    [this, &m, &d, t0, digest, states, resends = m.resends](Result<json> r) {
                      m.reporting = false;
                      if (std::exchange(m.report_again, false)) report_soon(d);
                      rtt_ms_.push_back(static_cast<double>(now_monotonic_us() - t0) / 1e3);
                      if (!r.ok()) {
                        ++report_errors_;
                        return;
                      }
                      if (r->is_object() && r->value("resend", false)) {
                        m.acked_digest.clear();  // the control plane wants the whole list
                        report_soon(d);
                        return;
                      }
                      if (resends != m.resends) return;  // a resend came meanwhile
                      m.acked_digest = digest;
                      m.acked = states;
                      if (r->is_object() && r->contains("forget")) forget_tasks(m, (*r)["forget"]);
                    });
  }

  void forget_tasks(Machine& m, const json& names) {
    if (!names.is_array()) return;
    for (const auto& id : names)
      if (id.is_string()) {
        auto it = m.tasks.find(id.get<std::string>());
        if (it != m.tasks.end() && it->second.state != "running" && it->second.state != "starting")
          m.tasks.erase(it);  // gone from the next report's changes
      }
  }

  void retry_later(Daemon& d) {
    auto t = loop_.add_timer_in(d.backoff_us, [this, &d] { queue_.push_back(&d); });
    if (t.ok()) d.retry = std::move(t).value();
    d.backoff_us = std::min<uint64_t>(d.backoff_us * 2, 30'000'000);
  }

  EventLoop& loop_;
  const Options& o_;
  uint16_t port_;
  rpc::Dispatcher agent_methods_, sidekick_methods_;
  std::map<std::string, uint64_t> stopped_at_;  // task -> when its task.stop arrived
  uint64_t service_updates_ = 0;
  std::vector<std::unique_ptr<Machine>> machines_;
  std::deque<Daemon*> queue_;
  std::unordered_map<rpc::Session*, Machine*> by_session_;
  size_t connecting_ = 0, up_ = 0, running_ = 0, hello_refused_ = 0;
  uint64_t task_runs_ = 0, moved_ = 0;
  std::unordered_map<std::string, uint64_t> runs_by_job_;
  size_t report_errors_ = 0, full_reports_ = 0, digest_reports_ = 0, change_reports_ = 0;
  size_t quiet_reports_ = 0;
  uint64_t messages_ = 0;
  std::vector<double> rtt_ms_;
  std::mt19937 rng_{7};
  // The failure phase.
  uint64_t killed_at_us_ = 0;
  std::set<std::pair<std::string, int>> lost_;
  size_t lost_total_ = 0;
  std::vector<double> replaced_ms_;
};

// job.create from other threads, over the Unix socket, as operators would.
struct Creator {
  std::atomic<int> done{0}, failed{0};
  std::mutex mu;
  std::vector<double> latency_ms;
  std::string first_error;
  std::vector<std::thread> threads;

  void start(const std::string& socket, const Options& o) {
    for (int c = 0; c < o.clients; ++c)
      threads.emplace_back([this, socket, &o, c] {
        auto client = rpc::Client::connect(socket);
        if (!client.ok()) {
          failed += o.jobs;
          return;
        }
        uint64_t begun = now_monotonic_us();
        for (int j = c; j < o.jobs; j += o.clients) {
          if (o.create_rate > 0) {  // job j is due j / rate seconds after the start
            uint64_t due = begun + static_cast<uint64_t>(j / o.create_rate * 1e6);
            uint64_t now = now_monotonic_us();
            if (due > now) std::this_thread::sleep_for(std::chrono::microseconds(due - now));
          }
          json spec{{"name", "job" + std::to_string(j)},
                    {"entitlement", "fleet"},
                    {"count", o.tasks},
                    {"per_task", {{"cpu_milli", o.task_cpu_milli}, {"mem_mb", o.task_mem_mb}}},
                    {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
          uint64_t t0 = now_monotonic_us();
          auto r = (*client)->call("job.create", spec, 120'000);
          double ms = static_cast<double>(now_monotonic_us() - t0) / 1e3;
          std::lock_guard<std::mutex> lock(mu);
          latency_ms.push_back(ms);
          if (r.ok()) {
            ++done;
          } else {
            ++failed;
            if (first_error.empty()) first_error = r.error().str();
          }
        }
      });
  }
  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }
};

struct Phase {
  const char* name;
  double seconds = 0;
  double cp_cpu = 0;
  long rss_mib = 0;
  double msgs_per_s = 0;
  std::vector<double> rtt;
};

inline void print_phase(const Phase& p, const std::string& extra) {
  std::printf(
      "%-9s %7.2f s | cp CPU %5.1f%% of a core, RSS %5ld MiB | fleet sent %7.0f msg/s | "
      "report rtt p50 %6.1f ms p99 %7.1f ms%s%s\n",
      p.name, p.seconds, p.seconds > 0 ? 100 * p.cp_cpu / p.seconds : 0, p.rss_mib, p.msgs_per_s,
      pct(p.rtt, 50), pct(p.rtt, 99), extra.empty() ? "" : " | ", extra.c_str());
  std::fflush(stdout);
}

}  // namespace weft::bench::fleet
