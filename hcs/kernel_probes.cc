#include "hcs/kernel_probes.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"

#if WEFT_HAVE_BPF
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "hcs/bpf/events.h"
#include "hcs_drops.skel.h"
#include "hcs_oom.skel.h"
#include "hcs_tcp.skel.h"
#endif

namespace weft::hcs {

using json = nlohmann::json;

std::optional<uint64_t> snmp_counter(const std::string& text, const std::string& group,
                                     const std::string& name) {
  auto lines = split(text, '\n');
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].rfind(group + ":", 0) != 0 || lines[i + 1].rfind(group + ":", 0) != 0) continue;
    auto names = split(lines[i], ' '), values = split(lines[i + 1], ' ');
    for (size_t k = 1; k < names.size() && k < values.size(); ++k)
      if (names[k] == name) return std::strtoull(values[k].c_str(), nullptr, 10);
    ++i;  // the value line of this pair
  }
  return std::nullopt;
}

std::optional<uint64_t> vmstat_counter(const std::string& text, const std::string& name) {
  for (const auto& line : split(text, '\n')) {
    auto f = split(line, ' ');
    if (f.size() == 2 && f[0] == name) return std::strtoull(f[1].c_str(), nullptr, 10);
  }
  return std::nullopt;
}

namespace {

#if WEFT_HAVE_BPF
int libbpf_log(enum libbpf_print_level level, const char* fmt, va_list ap) {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::string m = trim(buf);
  (void)level;
  if (!m.empty()) log_debug("libbpf: " + m);
  return 0;
}

void init_libbpf() {
  static bool done = false;
  if (done) return;
  done = true;
  libbpf_set_print(libbpf_log);  // load failures are reported once, by the probe
}

// The parameter kinds of a BTF-typed tracepoint (btf_trace_<name>, whose first
// parameter is the context), or nothing when the kernel has no such tracepoint.
std::optional<std::vector<int>> tracepoint_params(const std::string& tp) {
  struct btf* btf = btf__load_vmlinux_btf();
  if (!btf || libbpf_get_error(btf)) return std::nullopt;
  std::optional<std::vector<int>> out;
  int id = btf__find_by_name_kind(btf, ("btf_trace_" + tp).c_str(), BTF_KIND_TYPEDEF);
  const struct btf_type* t = id > 0 ? btf__type_by_id(btf, id) : nullptr;
  if (t) t = btf__type_by_id(btf, t->type);  // pointer to the prototype
  if (t && btf_is_ptr(t)) t = btf__type_by_id(btf, t->type);
  if (t && btf_is_func_proto(t)) {
    out.emplace();
    const struct btf_param* p = btf_params(t);
    for (int i = 0; i < btf_vlen(t); ++i) {
      int rid = btf__resolve_type(btf, p[i].type);
      const struct btf_type* rt = rid > 0 ? btf__type_by_id(btf, rid) : nullptr;
      out->push_back(rt ? btf_kind(rt) : -1);
    }
  }
  btf__free(btf);
  return out;
}

std::map<uint32_t, std::string> drop_reason_names() {
  std::map<uint32_t, std::string> names;
  struct btf* btf = btf__load_vmlinux_btf();
  if (!btf || libbpf_get_error(btf)) return names;
  int id = btf__find_by_name_kind(btf, "skb_drop_reason", BTF_KIND_ENUM);
  const struct btf_type* t = id > 0 ? btf__type_by_id(btf, id) : nullptr;
  if (t) {
    const struct btf_enum* e = btf_enum(t);
    for (int i = 0; i < btf_vlen(t); ++i) {
      std::string n = btf__name_by_offset(btf, e[i].name_off);
      const std::string prefix = "SKB_DROP_REASON_";
      if (n.rfind(prefix, 0) == 0) n = n.substr(prefix.size());
      std::transform(n.begin(), n.end(), n.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (e[i].val >= 0 && e[i].val < WEFT_DROP_REASONS) names[static_cast<uint32_t>(e[i].val)] = n;
    }
  }
  btf__free(btf);
  return names;
}

// The sum over CPUs of a per-CPU array slot.
std::optional<uint64_t> percpu_sum(int map_fd, uint32_t key) {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return std::nullopt;
  std::vector<uint64_t> v(static_cast<size_t>(ncpu));
  if (bpf_map_lookup_elem(map_fd, &key, v.data()) != 0) return std::nullopt;
  uint64_t sum = 0;
  for (uint64_t x : v) sum += x;
  return sum;
}
#endif

std::string rate_str(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f/s", v);
  return b;
}

}  // namespace

// ---- OOM kills ----

struct OomProbe::Impl {
#if WEFT_HAVE_BPF
  hcs_oom* skel = nullptr;
  ring_buffer* rb = nullptr;
  ~Impl() {
    if (rb) ring_buffer__free(rb);
    if (skel) hcs_oom__destroy(skel);
  }
#endif
};

OomProbe::OomProbe(HostPaths host, KernelProbeConfig cfg) : host_(std::move(host)), cfg_(cfg) {}

OomProbe::~OomProbe() {
  rb_src_.reset();
}

std::string OomProbe::attach(EventLoop& loop, std::function<void()> on_kill) {
  on_kill_ = std::move(on_kill);
  std::string why = "built without BPF";
#if WEFT_HAVE_BPF
  if (!cfg_.bpf) {
    why = "bpf = false in the configuration";
  } else if (auto params = tracepoint_params("mark_victim");
             !params || params->size() < 2 || (*params)[1] != BTF_KIND_PTR) {
    // Kernels before 6.x pass only the victim's pid: no cgroup to judge from.
    why = "the kernel's oom:mark_victim tracepoint does not pass the victim task";
  } else {
    init_libbpf();
    auto impl = std::make_unique<Impl>();
    impl->skel = hcs_oom__open_and_load();
    int err = impl->skel ? hcs_oom__attach(impl->skel) : -errno;
    if (impl->skel && err == 0) {
      impl->rb = ring_buffer__new(
          bpf_map__fd(impl->skel->maps.oom_events),
          [](void* ctx, void* data, size_t size) -> int {
            if (size < sizeof(weft_oom_event)) return 0;
            const auto* e = static_cast<const weft_oom_event*>(data);
            uint64_t mono = now_monotonic_us(), real = now_realtime_us();
            uint64_t age = mono > e->ts_ns / 1000 ? mono - e->ts_ns / 1000 : 0;
            OomKill k;
            k.at_us = real > age ? real - age : real;
            k.pid = e->pid;
            k.memcg = e->memcg != 0;
            k.comm.assign(e->comm, strnlen(e->comm, sizeof e->comm));
            k.cgroup.assign(e->cgroup, strnlen(e->cgroup, sizeof e->cgroup));
            static_cast<OomProbe*>(ctx)->record(k);
            return 0;
          },
          this, nullptr);
      if (impl->rb) {
        auto src = loop.add_io(ring_buffer__epoll_fd(impl->rb), EPOLLIN, [this](uint32_t) {
          drain();
          if (on_kill_) on_kill_();
        });
        if (src.ok()) {
          rb_src_ = std::move(src).value();
          impl_ = std::move(impl);
          source_ = "bpf";
          return source_;
        }
      }
      why = "cannot watch the BPF ring buffer";
    } else {
      why = std::string("BPF program did not load: ") + std::strerror(err < 0 ? -err : errno);
    }
  }
#else
  (void)loop;
#endif
  auto vm = read_file(host_.proc("vmstat"));
  if (vm.ok()) vmstat_last_ = vmstat_counter(*vm, "oom_kill");
  source_ = vmstat_last_ ? "procfs" : "none";
  log_info("oom probe uses its fallback", {{"SOURCE", source_}, {"REASON", why}});
  return source_;
}

void OomProbe::drain() {
#if WEFT_HAVE_BPF
  if (impl_ && impl_->rb) ring_buffer__consume(impl_->rb);
#endif
}

void OomProbe::record(const OomKill& k) {
  ++total_;
  kills_.emplace_back(k.at_us, k.memcg);
  recent_.push_back(k);
  if (recent_.size() > 5) recent_.pop_front();
  // Bounded: a storm of kills must not grow memory without limit.
  while (kills_.size() > 200'000) kills_.pop_front();
}

void OomProbe::observe_kmsg(KernelEvent e, uint64_t now_us) {
  if (source_ == "bpf") return;  // BPF sees every kill itself
  if (e != KernelEvent::kOomKillMemcg && e != KernelEvent::kOomKillGlobal) return;
  OomKill k;
  k.at_us = now_us;
  k.memcg = e == KernelEvent::kOomKillMemcg;
  k.comm = "(from the kernel log)";
  record(k);
  ++kmsg_seen_;
}

std::pair<int, int> OomProbe::counts(uint64_t now_us, uint64_t window_us) const {
  int memcg = 0, global = 0;
  for (auto it = kills_.rbegin(); it != kills_.rend(); ++it) {
    if (now_us > it->first && now_us - it->first > window_us) break;
    (it->second ? memcg : global)++;
  }
  return {memcg, global};
}

Sample OomProbe::run(uint64_t now_us) {
  Sample s;
  drain();
  uint64_t unclassified = 0;
  if (source_ == "procfs") {
    auto vm = read_file(host_.proc("vmstat"));
    auto now = vm.ok() ? vmstat_counter(*vm, "oom_kill") : std::nullopt;
    if (!now) {
      s.detail = "cannot read oom_kill from /proc/vmstat";
      return s;
    }
    uint64_t delta = vmstat_last_ && *now >= *vmstat_last_ ? *now - *vmstat_last_ : 0;
    vmstat_last_ = now;
    // Kills the kernel log did not classify are counted as machine-wide: not knowing
    // is never read as harmless.
    unclassified = delta > kmsg_seen_ ? delta - kmsg_seen_ : 0;
    kmsg_seen_ = 0;
    for (uint64_t i = 0; i < unclassified; ++i) {
      OomKill k;
      k.at_us = now_us;
      k.comm = "(unclassified)";
      record(k);
    }
  } else if (source_ == "none") {
    s.detail = "no OOM source: BPF did not load and /proc/vmstat has no oom_kill";
    return s;
  }
  while (!kills_.empty() && now_us > kills_.front().first &&
         now_us - kills_.front().first > std::max<uint64_t>(cfg_.oom_window_us, 60'000'000))
    kills_.pop_front();
  auto [memcg_win, global_win] = counts(now_us, cfg_.oom_window_us);
  auto [memcg_min, global_min] = counts(now_us, 60'000'000);
  // A storm is judged on the last 10 s as well, scaled to a minute, so it shows within
  // seconds of starting rather than once a full minute of kills has piled up.
  int memcg_10s = counts(now_us, 10'000'000).first;
  json victims = json::array();
  for (const auto& k : recent_)
    victims.push_back({{"pid", k.pid},
                       {"comm", k.comm},
                       {"cgroup", k.cgroup},
                       {"kind", k.memcg ? "memcg" : "global"},
                       {"at", format_rfc3339(static_cast<int64_t>(k.at_us))}});
  s.metrics = {{"source", source_},
               {"memcg_kills_window", memcg_win},
               {"global_kills_window", global_win},
               {"memcg_kills_last_min", memcg_min},
               {"memcg_kills_last_10s", memcg_10s},
               {"global_kills_last_min", global_min},
               {"total_since_start", total_},
               {"recent_victims", victims}};
  if (unclassified) s.metrics["unclassified"] = unclassified;
  if (global_win >= cfg_.oom_global_failed) {
    s.health = Health::kFailed;
    s.detail = std::to_string(global_win) + " machine-wide OOM kills in the window";
  } else if (global_win > 0) {
    s.health = Health::kDegraded;
    s.detail = std::to_string(global_win) + " machine-wide OOM kill(s) in the window";
  } else if (memcg_min >= cfg_.memcg_oom_storm_per_min ||
             memcg_10s * 6 >= cfg_.memcg_oom_storm_per_min) {
    s.health = Health::kDegraded;
    s.detail = "OOM storm: " + std::to_string(std::max(memcg_min, memcg_10s * 6)) +
               " memory-cgroup kills a minute";
  } else {
    s.health = Health::kOk;  // memcg kills below a storm are the task's business
  }
  return s;
}

// ---- TCP retransmits and packet drops ----

struct RateProbe::Impl {
#if WEFT_HAVE_BPF
  hcs_tcp* tcp = nullptr;
  hcs_drops* drops = nullptr;
  std::map<uint32_t, std::string> reasons;
  ~Impl() {
    if (tcp) hcs_tcp__destroy(tcp);
    if (drops) hcs_drops__destroy(drops);
  }
#endif
};

RateProbe::RateProbe(Kind kind, HostPaths host, KernelProbeConfig cfg)
    : kind_(kind), host_(std::move(host)), cfg_(cfg) {}
RateProbe::~RateProbe() = default;

std::string RateProbe::name() const {
  return kind_ == Kind::kTcpRetransmits ? "tcp-retransmits" : "net-drops";
}

std::string RateProbe::attach() {
  std::string why = "built without BPF";
#if WEFT_HAVE_BPF
  if (!cfg_.bpf) {
    why = "bpf = false in the configuration";
  } else {
    init_libbpf();
    auto impl = std::make_unique<Impl>();
    int err = 0;
    if (kind_ == Kind::kTcpRetransmits) {
      impl->tcp = hcs_tcp__open_and_load();
      err = impl->tcp ? hcs_tcp__attach(impl->tcp) : -errno;
      if (!impl->tcp || err) why = "BPF program did not load";
    } else if (auto params = tracepoint_params("kfree_skb"); !params || params->size() < 4) {
      why = "the kernel's skb:kfree_skb tracepoint has no drop reason";  // before 5.17
      err = -1;
    } else {
      impl->drops = hcs_drops__open_and_load();
      err = impl->drops ? hcs_drops__attach(impl->drops) : -errno;
      if (!impl->drops || err) why = "BPF program did not load";
      impl->reasons = drop_reason_names();
    }
    if (err == 0) {
      impl_ = std::move(impl);
      source_ = "bpf";
    }
  }
#endif
  if (source_ != "bpf") {
    source_ = "procfs";
    log_info(name() + " probe uses its fallback", {{"SOURCE", source_}, {"REASON", why}});
  }
  last_ = read_counters();
  last_us_ = now_realtime_us();
  return source_;
}

std::optional<std::map<std::string, uint64_t>> RateProbe::read_counters() {
  std::map<std::string, uint64_t> out;
#if WEFT_HAVE_BPF
  if (impl_ && impl_->tcp) {
    auto v = percpu_sum(bpf_map__fd(impl_->tcp->maps.tcp_retrans), 0);
    if (!v) return std::nullopt;
    out["total"] = *v;
    return out;
  }
  if (impl_ && impl_->drops) {
    uint64_t total = 0;
    int fd = bpf_map__fd(impl_->drops->maps.drop_reasons);
    for (uint32_t r = 0; r < WEFT_DROP_REASONS; ++r) {
      auto v = percpu_sum(fd, r);
      if (!v) return std::nullopt;
      if (*v == 0) continue;
      auto it = impl_->reasons.find(r);
      out[it != impl_->reasons.end() ? it->second : "reason-" + std::to_string(r)] += *v;
      total += *v;
    }
    out["total"] = total;
    return out;
  }
#endif
  auto snmp = read_file(host_.proc("net/snmp"));
  if (!snmp.ok()) return std::nullopt;
  if (kind_ == Kind::kTcpRetransmits) {
    auto v = snmp_counter(*snmp, "Tcp", "RetransSegs");
    if (!v) return std::nullopt;
    out["total"] = *v;
    return out;
  }
  auto netstat = read_file(host_.proc("net/netstat"));
  uint64_t total = 0;
  bool any = false;
  for (auto [group, name] : {std::pair{"Ip", "InDiscards"},
                             {"Ip", "OutDiscards"},
                             {"Ip", "InHdrErrors"},
                             {"Udp", "InErrors"},
                             {"TcpExt", "ListenDrops"},
                             {"TcpExt", "TCPBacklogDrop"}}) {
    const std::string& text = std::string(group) == "TcpExt" ? netstat.value_or("") : *snmp;
    if (auto v = snmp_counter(text, group, name)) {
      out[std::string(group) + "." + name] = *v;
      total += *v;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  out["total"] = total;
  return out;
}

Sample RateProbe::run(uint64_t now_us) {
  Sample s;
  auto cur = read_counters();
  if (!cur) {
    s.detail = "cannot read the " + name() + " counters (" + source_ + ")";
    return s;
  }
  if (!last_ || now_us <= last_us_) {
    last_ = cur;
    last_us_ = now_us;
    s.detail = "first sample";
    return s;  // UNKNOWN until there is a rate
  }
  double secs = static_cast<double>(now_us - last_us_) / 1e6;
  auto delta = [&](const std::string& k) {
    uint64_t a = last_->count(k) ? last_->at(k) : 0, b = cur->count(k) ? cur->at(k) : 0;
    return b >= a ? b - a : 0;  // a counter reset (BPF reloaded) is not negative traffic
  };
  double rate = static_cast<double>(delta("total")) / secs;
  s.metrics = {{"source", source_}, {"per_s", rate}, {"total", cur->at("total")}};
  if (kind_ == Kind::kNetDrops) {
    std::vector<std::pair<uint64_t, std::string>> by;
    for (const auto& [k, v] : *cur)
      if (k != "total" && delta(k) > 0) by.emplace_back(delta(k), k);
    std::sort(by.rbegin(), by.rend());
    json top = json::object();
    for (size_t i = 0; i < by.size() && i < 5; ++i) top[by[i].second] = by[i].first;
    s.metrics["top_since_last_sample"] = top;
  }
  last_ = cur;
  last_us_ = now_us;
  double limit =
      kind_ == Kind::kTcpRetransmits ? cfg_.tcp_retrans_degraded_per_s : cfg_.drops_degraded_per_s;
  if (rate >= limit) {
    s.health = Health::kDegraded;
    s.detail = (kind_ == Kind::kTcpRetransmits ? "TCP retransmits at " : "packet drops at ") +
               rate_str(rate);
  } else {
    s.health = Health::kOk;
  }
  return s;
}

}  // namespace weft::hcs
