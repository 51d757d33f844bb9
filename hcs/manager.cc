#include "hcs/manager.h"

#include <malloc.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strings.h"

namespace weft::hcs {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kMigrations = {
    R"(CREATE TABLE probes (name TEXT PRIMARY KEY, state TEXT NOT NULL);
       CREATE TABLE history (id INTEGER PRIMARY KEY AUTOINCREMENT, at_us INTEGER NOT NULL,
                             probe TEXT NOT NULL, from_state TEXT NOT NULL, to_state TEXT NOT NULL,
                             detail TEXT NOT NULL);
       CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);)",
};

uint64_t now_us() {
  return now_realtime_us();
}

}  // namespace

Result<std::unique_ptr<Manager>> Manager::create(HcsConfig cfg) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<Manager>(new Manager(std::move(cfg), std::move(loop)));
}

Manager::~Manager() {
  server_.reset();
}

Status Manager::start() {
  TRY(mkdir_p(cfg_.state_dir, 0750));
  // Health history: losing the last entries with the power is harmless.
  TRY_ASSIGN(db_, Db::open(cfg_.state_dir + "/hcs.db", Db::Durability::kProcessCrash));
  TRY_CTX(db_->migrate(kMigrations), "hcs database");
  HostPaths host(cfg_.host_root);
  for (const std::string& res : cfg_.psi) {
    auto p = std::make_unique<PsiProbe>(host, res, cfg_.psi_degraded_pct, cfg_.psi_failed_pct);
    if (cfg_.psi_triggers) {
      // A stall burst wakes us at once; without triggers (old kernel, fake tree) the
      // probe still reads avg10 every interval.
      auto fd = p->arm_trigger();
      if (fd.ok()) {
        PsiProbe* probe = p.get();
        auto src = loop_->add_io(fd->get(), EPOLLPRI, [this, probe](uint32_t ev) {
          if (ev & EPOLLERR) return;  // the pressure file went away
          if (probe->triggered(now_us())) sample(*probe, now_us());
        });
        if (src.ok()) psi_triggers_.emplace_back(std::move(fd).value(), std::move(src).value());
      } else {
        log_info("PSI trigger not armed; polling avg10 only",
                 {{"RESOURCE", res}, {"ERROR", fd.error().str()}});
      }
    }
    add_probe(std::move(p));
  }
  for (const auto& d : cfg_.disks)
    add_probe(make_disk_probe(host, d.path, d.min_free_pct, d.min_inodes_pct));
  for (const auto& l : cfg_.links) {
    auto p = std::make_unique<LinkProbe>(host, l);
    link_probes_.push_back(p.get());
    add_probe(std::move(p));
  }
  if (!link_probes_.empty()) {
    auto w = LinkWatch::start(*loop_, [this](const LinkEvent& e) { on_link(e); });
    if (w.ok())
      link_watch_ = std::move(w).value();
    else
      log_warn("no link events; carrier is polled every interval", {{"ERROR", w.error().str()}});
  }
  for (const auto& e : cfg_.execs) add_probe(make_exec_probe(e.name, e.command, e.timeout_us));
  if (!cfg_.agent_socket.empty())
    add_probe(
        make_socket_probe("weft-agent", cfg_.agent_socket, "agent.info", cfg_.liveness_timeout_ms));
  if (!cfg_.sidekick_socket.empty())
    add_probe(make_socket_probe("weft-sidekick", cfg_.sidekick_socket, "profile.active",
                                cfg_.liveness_timeout_ms));
  OomProbe* oom_probe = nullptr;
  {
    auto oom = std::make_unique<OomProbe>(host, cfg_.kernel);
    oom_probe = oom.get();
    oom->attach(*loop_, [this, oom_probe] { sample(*oom_probe, now_us()); });
    add_probe(std::move(oom));
    for (auto kind : {RateProbe::Kind::kTcpRetransmits, RateProbe::Kind::kNetDrops}) {
      auto p = std::make_unique<RateProbe>(kind, host, cfg_.kernel);
      p->attach();
      add_probe(std::move(p));
    }
  }
  KmsgProbe* kmsg_probe = nullptr;
  if (cfg_.kmsg) {
    auto k = std::make_unique<KmsgProbe>();
    kmsg_probe = k.get();
    add_probe(std::move(k));
  }
  // Hysteresis state survives a restart.
  {
    TRY_ASSIGN(Stmt st, db_->prepare("SELECT name, state FROM probes"));
    for (;;) {
      TRY_ASSIGN(bool row, st.step());
      if (!row) break;
      json j = json::parse(st.col_text(1), nullptr, false);
      if (j.is_object()) states_.emplace(st.col_text(0), ProbeState::from_json(j, cfg_.hysteresis));
    }
  }
  for (const auto& p : probes_)
    if (!states_.count(p->name())) states_.emplace(p->name(), ProbeState(cfg_.hysteresis));

  if (kmsg_probe) {
    TRY_ASSIGN(kmsg_, KmsgReader::open(*loop_, *db_, cfg_.host_root, *kmsg_probe, oom_probe,
                                       [this, kmsg_probe](uint64_t now) {
                                         if (published_) sample(*kmsg_probe, now);
                                       }));
  }
  weft_gid_ = group_gid(cfg_.socket_group);
  register_methods();
  server_ = std::make_unique<rpc::Server>(*loop_, &methods_);
  TRY(server_->listen_unix(cfg_.socket, 0660, weft_gid_));
  // Loading the eBPF probes parsed the kernel's BTF (several MiB, freed since): give
  // that memory back to the system rather than keep it in the heap.
  ::malloc_trim(0);
  TRY(loop_->exit_on_termination());
  TRY_ASSIGN(sighup_, loop_->add_signal(SIGHUP, [this] { reload_control_plane_tls(cp_.get()); }));
  loop_->enable_watchdog();
  TRY_ASSIGN(timer_, loop_->add_defer([this] { cycle(); }));
  register_metrics();
  metrics_.http = metrics::HttpServer::serve(*loop_, cfg_.metrics_listen, &metrics_.registry);
  log_info("hcs ready", {{"SOCKET", cfg_.socket}, {"PROBES", std::to_string(probes_.size())}});
  sd_notify(0, "READY=1\nSTATUS=first probe cycle running");
  if (!cfg_.control_plane.empty()) TRY(cp_start());
  return {};
}

Status Manager::persist(const std::string& probe, const ProbeState& st) {
  TRY_ASSIGN(Stmt s, db_->prepare("INSERT OR REPLACE INTO probes (name, state) VALUES (?1, ?2)"));
  s.bind(1, probe).bind(2, st.to_json().dump());
  return s.run();
}

void Manager::record_transition(const std::string& probe, Health from, Health to,
                                const std::string& detail) {
  log_msg(
      to == Health::kFailed ? LogLevel::kWarning : LogLevel::kInfo, "probe changed state",
      {{"PROBE", probe}, {"FROM", health_name(from)}, {"TO", health_name(to)}, {"DETAIL", detail}});
  auto st = db_->prepare(
      "INSERT INTO history (at_us, probe, from_state, to_state, detail) VALUES (?1,?2,?3,?4,?5)");
  if (!st.ok()) return;
  st->bind(1, static_cast<int64_t>(now_us()))
      .bind(2, probe)
      .bind(3, std::string(health_name(from)));
  st->bind(4, std::string(health_name(to))).bind(5, detail);
  (void)st->run();
}

void Manager::sample(Probe& p, uint64_t now) {
  // Events can come in storms (an OOM storm, a flapping link): at most 10 samples a
  // second per probe; the periodic cycle still sees everything.
  if (auto it = last_event_sample_us_.find(p.name());
      it != last_event_sample_us_.end() && now >= it->second && now - it->second < 100'000) {
    // Too soon after the last sample: sample once more when the 100 ms are up, so the
    // event that arrived now is never lost.
    std::string name = p.name();
    if (!deferred_.count(name) || !deferred_[name].active()) {
      Probe* probe = &p;
      auto t = loop_->add_timer_in(100'000 - (now - it->second) + 1000, [this, probe, name] {
        deferred_.erase(name);
        sample(*probe, now_us());
      });
      if (t.ok()) deferred_[name] = std::move(t).value();
    }
    return;
  }
  last_event_sample_us_[p.name()] = now;
  p.start(*loop_, now, [this, &p, now](Sample s) {
    uint64_t done = now_us();
    metrics_.probe_seconds.observe(p.name(), static_cast<double>(done - now) / 1e6);
    ++metrics_.samples[{p.name(), health_name(s.health)}];
    feed(p, std::move(s), done);
  });
}

void Manager::register_metrics() {
  metrics_.registry.add([this](metrics::Writer& w) {
    w.family("weft_hcs_probe_state", "gauge", "Each probe's state after hysteresis (1).");
    for (const auto& [name, st] : states_)
      w.sample("weft_hcs_probe_state", 1, {{"probe", name}, {"state", health_name(st.state())}});
    w.family("weft_hcs_probe_samples_total", "counter", "Probe results, by probe and result.");
    for (const auto& [key, n] : metrics_.samples)
      w.sample("weft_hcs_probe_samples_total", static_cast<double>(n),
               {{"probe", key.first}, {"result", key.second}});
    w.family("weft_hcs_probe_seconds", "histogram", "How long each probe took.");
    metrics_.probe_seconds.write(w, "weft_hcs_probe_seconds");
    w.family("weft_hcs_verdict", "gauge", "The machine verdict published (1).");
    w.sample("weft_hcs_verdict", 1,
             {{"verdict", published_ ? health_name(machine_verdict(states_)) : "unknown"}});
  });
}

void Manager::feed(Probe& p, Sample s, uint64_t now) {
  ProbeState& st = states_.at(p.name());
  Health before = st.state();
  if (st.sample(s.health, now, s.detail)) record_transition(p.name(), before, st.state(), s.detail);
  last_[p.name()] = s;
  (void)persist(p.name(), st);
  cp_check_verdict();
  // Published once every probe has reported since start (scripts finish later than
  // the rest of the first cycle).
  if (cycled_ && !published_ && last_.size() == probes_.size()) {
    published_ = true;
    sd_notifyf(0, "STATUS=machine %s", health_name(machine_verdict(states_)));
  }
  // A failed sample short of fail_after is a suspicion: confirm it soon rather than at
  // the next interval.
  std::string name = p.name();
  if (s.health == Health::kFailed && st.state() != Health::kFailed) {
    if (!confirm_.count(name) || !confirm_[name].active()) {
      Probe* probe = &p;
      auto t = loop_->add_timer_in(cfg_.confirm_interval_us, [this, probe, name] {
        confirm_.erase(name);
        sample(*probe, now_us());
      });
      if (t.ok()) confirm_[name] = std::move(t).value();
    }
  }
}

void Manager::on_link(const LinkEvent& e) {
  uint64_t now = now_us();
  for (LinkProbe* p : link_probes_) {
    if (!e.overflow && e.ifname != p->ifname()) continue;
    if (!e.overflow) p->event(e.carrier && e.admin_up && !e.removed, now);
    // One carrier change sends several messages; they are one observation, so the
    // usual rate limit applies and FAILED still takes fail_after spaced samples.
    sample(*p, now);
  }
}

void Manager::cycle() {
  uint64_t now = now_us();
  (void)db_->begin();
  for (auto& p : probes_) {
    last_event_sample_us_.erase(p->name());
    sample(*p, now);
  }
  (void)db_->commit();
  cycled_ = true;
  if (last_.size() == probes_.size()) published_ = true;  // one full cycle has reported
  cp_check_verdict();
  Health v = machine_verdict(states_);
  sd_notifyf(0, "STATUS=machine %s", health_name(v));
  auto t = loop_->add_timer_in(cfg_.interval_us, [this] { cycle(); });
  if (t.ok()) timer_ = std::move(t).value();
}

json Manager::verdict_json() const {
  json failing = json::array();
  for (const auto& [name, st] : states_) {
    if (st.state() == Health::kOk) continue;
    failing.push_back({{"probe", name},
                       {"state", health_name(st.state())},
                       {"detail", st.detail()},
                       {"since", format_rfc3339(static_cast<int64_t>(st.since_us()))},
                       {"pinned", st.pinned()}});
  }
  return {{"verdict", published_ ? health_name(machine_verdict(states_)) : "unknown"},
          {"published", published_},
          {"problems", failing}};
}

Status Manager::cp_start() {
  cfg_.machine_id = resolve_machine_id(cfg_.machine_id, cfg_.host_root);
  auto params = [this] {
    json v = verdict_json();
    cp_reported_ = v["verdict"].get<std::string>();
    // Within the control plane's bounds: the first problems, their details cut.
    json problems = json::array();
    for (auto& p : v["problems"]) {
      if (problems.size() >= kMaxReportedProblems) break;
      p["detail"] = utf8_prefix(p.value("detail", ""), kMaxProblemBytes / 2);
      p["probe"] = p.value("probe", "").substr(0, 128);
      problems.push_back(std::move(p));
    }
    return json{{"machine", cfg_.machine_id}, {"verdict", v["verdict"]}, {"problems", problems}};
  };
  auto hello = [params](rpc::Session& s, ControlPlaneLink::Done done) {
    s.call("health.report", params(), std::move(done));
  };
  auto report = [params](rpc::Session& s) {
    s.call("health.report", params(), [](Result<json> r) {
      if (!r.ok()) log_debug("health report failed", {{"ERROR", r.error().str()}});
    });
  };
  TRY_ASSIGN(cp_,
             make_control_plane_link(*loop_, cfg_.control_plane, "weft-hcs", nullptr, hello, report,
                                     cfg_.insecure_control_plane, cfg_.control_plane_tls));
  cp_->start();
  return {};
}

void Manager::cp_check_verdict() {
  if (!cp_) return;
  std::string now = published_ ? health_name(machine_verdict(states_)) : "unknown";
  if (now != cp_reported_) cp_->report_now();
}

}  // namespace weft::hcs
