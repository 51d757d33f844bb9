// Allocator benchmark: job allocations a second, latency per job and memory per machine
// at fleet sizes up to 170K machines, shaped by Alibaba's 2018 machine list.
//
//   build/bench/alloc_bench [--machines 10000,100000,170000] [--jobs N] [--tasks 36]
//                           [--entitlements E] [--data PATH/alibaba-v2018-machine_meta.csv]
//
// Fleet (a synthesis from the trace, labelled as such in docs/benchmarks.md): Alibaba's
// 4,034 machines (last record of each) with their two failure-domain levels (domain 1 as
// the MSB/rack used for spreading, domain 2 as the DC) and core counts, replicated until
// the fleet has the requested size; each copy gets its own racks, so the number of fault
// domains grows with the fleet (292 per 4,034 machines). Memory: the trace's normalised
// 0-100 scaled to 384 GiB. A fifth of the machines start in E entitlements, the rest in
// the free pool. Every 50 jobs one entitlement returns its empty machines. Jobs: 36 tasks of 1-8
// cores and 2-16 GiB, each in a random entitlement, spread across racks; the oldest jobs are
// released when more than 60% of the fleet's cores are held, so the fleet stays busy but not full.
// Single thread, like the scheduler.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/fs.h"
#include "common/strings.h"
#include "controlplane/scheduling/allocator.h"

using namespace weft;

namespace {

struct TraceMachine {
  std::string domain, dc;
  int cpus = 0;
  double mem = 0;
};

double rss_mib() {
  auto s = read_file("/proc/self/status");
  if (!s.ok()) return 0;
  for (const auto& l : split(*s, '\n'))
    if (l.rfind("VmRSS:", 0) == 0) return std::strtod(l.c_str() + 6, nullptr) / 1024.0;
  return 0;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft allocator benchmark"};
  std::vector<int> sizes = {10000, 100000, 170000};
  int jobs = 20000, tasks = 36, ents = 100;
  std::string data = WEFT_DATA_DEFAULT;
  app.add_option("--machines", sizes, "fleet sizes")->delimiter(',');
  app.add_option("--jobs", jobs, "jobs to allocate per fleet size");
  app.add_option("--tasks", tasks, "tasks per job");
  app.add_option("--entitlements", ents, "entitlements");
  app.add_option("--data", data, "Alibaba machine_meta.csv");
  CLI11_PARSE(app, argc, argv);

  auto text = read_file(data);
  if (!text.ok()) {
    std::fprintf(stderr, "alloc_bench: %s\n", text.error().str().c_str());
    return 2;
  }
  std::map<std::string, TraceMachine> trace;  // last record per machine
  for (const auto& line : split(*text, '\n')) {
    auto f = split(trim(line), ',');
    if (f.size() < 7) continue;
    trace[f[0]] = {f[2], f[3], std::atoi(f[4].c_str()), std::atof(f[5].c_str())};
  }
  std::vector<TraceMachine> base;
  for (auto& [id, m] : trace) base.push_back(m);
  std::printf("trace: %zu machines from %s\n", base.size(), data.c_str());

  for (int n : sizes) {
    double rss0 = rss_mib();
    auto a = std::make_unique<cp::Allocator>();
    std::mt19937_64 rng(42);
    int64_t total_cpu = 0;
    for (int i = 0; i < n; ++i) {
      const TraceMachine& t = base[static_cast<size_t>(i) % base.size()];
      int copy = i / static_cast<int>(base.size());
      cp::MachineSpec s;
      s.name = "m" + std::to_string(i);
      s.domain = std::to_string(copy) + "-" + t.domain;
      s.dc = "dc" + t.dc;
      s.type = "c" + std::to_string(t.cpus);
      s.capacity = {t.cpus * 1000LL, static_cast<int64_t>(t.mem / 100.0 * 384 * 1024)};
      total_cpu += s.capacity.cpu_milli;
      cp::MachineId id = a->add_machine(s);
      if (rng() % 5 == 0) (void)a->assign(id, static_cast<cp::EntitlementId>(1 + rng() % ents));
    }
    double rss1 = rss_mib();
    const int64_t cores[] = {1000, 2000, 4000, 8000};
    const int64_t mems[] = {2048, 4096, 8192, 16384};
    std::deque<cp::Request> live;
    int64_t held = 0;
    std::vector<double> lat;
    lat.reserve(static_cast<size_t>(jobs));
    int failed = 0, joined = 0, returned = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int j = 0; j < jobs; ++j) {
      // Entitlements give their empty machines back now and then (Twine Fig. 7), so
      // jobs keep drawing machines from the free pool.
      if (j % 50 == 0)
        returned +=
            static_cast<int>(a->shrink(static_cast<cp::EntitlementId>(1 + rng() % ents)).size());
      while (held > total_cpu * 6 / 10 && !live.empty()) {
        a->release(live.front().job);
        held -= live.front().per_task.cpu_milli * live.front().tasks;
        live.pop_front();
      }
      cp::Request r;
      r.job = "j" + std::to_string(j);
      r.entitlement = static_cast<cp::EntitlementId>(1 + rng() % ents);
      r.tasks = tasks;
      size_t k = rng() % 4;
      r.per_task = {cores[k], mems[rng() % 4]};
      auto s = std::chrono::steady_clock::now();
      auto p = a->allocate(r);
      lat.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
      if (!p.ok()) {
        ++failed;
        continue;
      }
      joined += static_cast<int>(p->joined.size());
      live.push_back(r);
      held += r.per_task.cpu_milli * tasks;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The job cache: every live job asked for again, unchanged (what a scheduler's
    // reconciliation does).
    std::vector<double> cached;
    size_t hits = 0;
    for (const auto& r : live) {
      auto s = std::chrono::steady_clock::now();
      auto p = a->allocate(r);
      cached.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
      hits += p.ok() && p->cached;
    }
    double per_machine_b = (rss1 - rss0) * 1024 * 1024 / n;
    std::printf(
        "%7d machines (%zu entitlements): %d jobs x %d tasks in %.2f s = %.0f jobs/s; "
        "latency p50 %.3f ms p99 %.3f ms max %.3f ms; %d did not fit; %d machines joined "
        "entitlements, %d returned\n",
        n, static_cast<size_t>(ents), jobs, tasks, secs, jobs / secs, pct(lat, 50), pct(lat, 99),
        pct(lat, 100), failed, joined, returned);
    std::printf(
        "         index memory %.1f MiB = %.0f B/machine = %.0fK machines per GB; "
        "unchanged re-requests: %zu/%zu from the cache, p50 %.2f us\n",
        rss1 - rss0, per_machine_b, 1e9 / per_machine_b / 1000, hits, live.size(), pct(cached, 50));
  }
  return 0;
}
