#include "sidekick/manager.h"

#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstring>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "sidekick/conflicts.h"

namespace weft::sidekick {

using json = nlohmann::json;
using rpc::RpcCode;

Result<std::unique_ptr<Manager>> Manager::create(SidekickConfig cfg) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<Manager>(new Manager(std::move(cfg), std::move(loop)));
}

Manager::~Manager() {
  server_.reset();
  if (reboot_slot_) sd_bus_slot_unref(reboot_slot_);
  if (bus_) sd_bus_flush_close_unref(bus_);
}

Status Manager::check_privileged(const rpc::Peer& peer) const {
  return rpc::require_privileged(peer, weft_gid_, cfg_.socket_group, "changing the host profile");
}

void Manager::update_status() {
  sd_notifyf(0, "STATUS=profile %s, %s", engine_->active_profile().value_or("none").c_str(),
             last_outcome_.c_str());
}

Status Manager::start() {
  TRY(mkdir_p(cfg_.state_dir, 0750));
  std::unique_ptr<Links> links;
  if (cfg_.host_root == "/") {
    // The real kernel: links through netlink. Fake trees (tests) use sysfs files.
    TRY_ASSIGN(links, make_netlink_links());
  }
  auto host = std::make_unique<HostKnobs>(HostPaths(cfg_.host_root), cfg_.workload_cgroup,
                                          std::move(links));
  TRY_ASSIGN(engine_, Engine::open(cfg_.state_dir + "/sidekick.db", std::move(host)));
  TRY_ASSIGN(auto rolled, engine_->recover());
  if (rolled)
    log_warn("rolled back a profile switch interrupted by a crash",
             {{"SWITCH", std::to_string(*rolled)}});
  weft_gid_ = group_gid(cfg_.socket_group);

  // Re-apply the committed profile before anything else runs (the unit orders itself
  // before weft-agent): after a reboot the kernel has forgotten it.
  if (auto active = engine_->active_profile(); active && cfg_.apply_on_start) {
    auto profile = load_profile(path(), *active);
    if (!profile.ok()) {
      log_error("cannot load the active profile; the machine keeps its current settings",
                {{"PROFILE", *active}, {"ERROR", profile.error().str()}});
      last_outcome_ = "failed";
    } else {
      SwitchReport rep = engine_->apply(*profile);
      last_outcome_ = outcome_name(rep.outcome);
      log_msg(rep.outcome == Outcome::kFailed ? LogLevel::kError : LogLevel::kInfo,
              "re-applied the active profile",
              {{"PROFILE", *active}, {"OUTCOME", last_outcome_}, {"ERROR", rep.error}});
    }
  }

  register_methods();
  server_ = std::make_unique<rpc::Server>(*loop_, &methods_);
  TRY(server_->listen_unix(cfg_.socket, 0660, weft_gid_));
  TRY(loop_->exit_on_termination());
  TRY_ASSIGN(sighup_, loop_->add_signal(SIGHUP, [this] { reload_control_plane_tls(cp_.get()); }));
  loop_->enable_watchdog();
  if (cfg_.host_root == "/") {
    if (auto s = watch_links(); !s.ok())
      log_warn("no link events; links are checked by the periodic verification only",
               {{"ERROR", s.error().str()}});
  }
  schedule_verify();
  schedule_converge();  // huge pages still converging from before a restart
  if (!cfg_.control_plane.empty()) TRY(cp_start());
  log_info("sidekick ready",
           {{"SOCKET", cfg_.socket}, {"PROFILE", engine_->active_profile().value_or("none")}});
  register_metrics();
  metrics_http_ = metrics::HttpServer::serve(*loop_, cfg_.metrics_listen, &metrics_);
  sd_notify(0, "READY=1");
  update_status();
  return {};
}

void Manager::register_metrics() {
  metrics_.add([this](metrics::Writer& w) {
    w.family("weft_sidekick_switches_total", "counter", "Profile switches, by outcome.");
    for (const auto& [outcome, n] : switches_)
      w.sample("weft_sidekick_switches_total", static_cast<double>(n), {{"outcome", outcome}});
    w.family("weft_sidekick_knob_failures_total", "counter",
             "Knobs a switch could not set (required or best effort).");
    w.sample("weft_sidekick_knob_failures_total", static_cast<double>(knob_failures_));
    w.family("weft_sidekick_drift_total", "counter",
             "Verifications that found a knob changed behind sidekick's back.");
    w.sample("weft_sidekick_drift_total", static_cast<double>(drift_));
    w.family("weft_sidekick_active_profile", "gauge", "The active host profile (1).");
    w.sample("weft_sidekick_active_profile", 1,
             {{"profile", engine_->active_profile().value_or("")}});
  });
}

SwitchReport Manager::switch_to(const Profile& prof) {
  SwitchReport rep = engine_->apply(prof);
  last_outcome_ = outcome_name(rep.outcome);
  ++switches_[last_outcome_];
  for (const auto& k : rep.knobs) knob_failures_ += k.status == "failed";
  update_status();
  log_msg(rep.outcome == Outcome::kFailed ? LogLevel::kError : LogLevel::kInfo, "profile switch",
          {{"PROFILE", prof.name}, {"OUTCOME", last_outcome_}, {"ERROR", rep.error}});
  for (const auto& k : rep.knobs)
    if (k.status == "converging") schedule_converge();
  for (const auto& conflict : conflicts_json(prof))
    log_warn("another owner also sets this",
             {{"KNOB", conflict["knob"]}, {"OWNER", conflict["owner"]}});
  if (cp_) cp_->report_now();
  return rep;
}

Status Manager::cp_start() {
  cp_methods_.add("profile.apply", [this](const json& p, const rpc::CallContext&) -> Result<json> {
    if (!p.is_object() || !p.contains("profile") || !p["profile"].is_string())
      return field_error("profile", "must be a profile name");
    cp_failed_.clear();  // an explicit push is tried now
    cp_desired(p["profile"].get<std::string>());
    return json{{"profile", engine_->active_profile().value_or("")}, {"state", last_outcome_}};
  });
  cp_methods_.add("machine.reboot", [this](const json& p, const rpc::CallContext&) -> Result<json> {
    std::string reason = p.is_object() && p.contains("reason") && p["reason"].is_string()
                             ? p["reason"].get<std::string>().substr(0, 512)
                             : "";
    return reboot(reason);
  });
  auto report_params = [this] {
    // The profiles this machine has: the control plane refuses an entitlement's profile
    // that no machine has, and tells why a machine never became ready.
    json offered = json::array();
    for (const auto& n : list_profiles(path()))
      if (valid_profile_name(n) && offered.size() < kMaxReportedProfiles) offered.push_back(n);
    return json{{"machine", cfg_.machine_id},
                {"profile", engine_->active_profile().value_or("")},
                {"state", last_outcome_},
                {"profiles", std::move(offered)}};
  };
  auto on_reply = [this](const Result<json>& r) {
    if (r.ok() && r->is_object() && r->contains("desired") && (*r)["desired"].is_string())
      cp_desired((*r)["desired"].get<std::string>());
  };
  auto hello = [report_params, on_reply](rpc::Session& s, ControlPlaneLink::Done done) {
    s.call("profile.report", report_params(), [on_reply, done](Result<json> r) {
      on_reply(r);
      done(std::move(r));
    });
  };
  auto report = [report_params, on_reply](rpc::Session& s) {
    s.call("profile.report", report_params(), on_reply);
  };
  TRY_ASSIGN(
      cp_, make_control_plane_link(*loop_, cfg_.control_plane, "weft-sidekick", &cp_methods_, hello,
                                   report, cfg_.insecure_control_plane, cfg_.control_plane_tls));
  cp_->start();
  return {};
}

void Manager::cp_desired(const std::string& name) {
  // "" leaves the machine as it is (a free machine, an entitlement without a profile).
  if (name.empty() || engine_->active_profile() == name) return;
  uint64_t now = now_monotonic_us();
  if (name == cp_failed_ && now - cp_failed_at_us_ < 60'000'000) return;
  auto prof = load_profile(path(), name);
  if (!prof.ok()) {
    log_error("the control plane asks for a profile this machine cannot load",
              {{"PROFILE", name}, {"ERROR", prof.error().str()}});
    cp_failed_ = name;
    cp_failed_at_us_ = now;
    return;
  }
  log_info("switching to the control plane's desired profile", {{"PROFILE", name}});
  SwitchReport rep = switch_to(*prof);
  if (rep.outcome == Outcome::kFailed) {
    cp_failed_ = name;
    cp_failed_at_us_ = now;
  }
}

void Manager::schedule_converge() {
  if (converge_timer_.active()) return;
  auto t = loop_->add_timer_in(1'000'000, [this] {
    converge_timer_.reset();
    auto c = engine_->converge_step();
    if (!c.ok()) {
      log_error("huge page convergence step failed", {{"ERROR", c.error().str()}});
      return;
    }
    convergence_ = *c;
    bool pending = false;
    for (const auto& k : convergence_) {
      if (k["state"] == "converging")
        pending = true;
      else if (k["state"] == "failed")
        log_error("slow knob missed its deadline",
                  {{"KNOB", k["id"]}, {"PROGRESS", k["progress"]}});
    }
    std::string progress;
    for (const auto& k : convergence_)
      progress += " " + k["id"].get<std::string>() + " " + k["progress"].get<std::string>();
    sd_notifyf(0, "STATUS=profile %s, %s;%s", engine_->active_profile().value_or("none").c_str(),
               pending ? "converging" : last_outcome_.c_str(), progress.c_str());
    if (pending) schedule_converge();
  });
  if (t.ok()) converge_timer_ = std::move(t).value();
}

void Manager::schedule_verify() {
  auto t = loop_->add_timer_in(cfg_.verify_interval_us, [this] { periodic_verify(); });
  if (t.ok()) verify_timer_ = std::move(t).value();
}

void Manager::periodic_verify() {
  schedule_verify();
  check_now(/*replan=*/false);
}

Status Manager::watch_links() {
  // What changed does not matter, only that links changed.
  TRY_ASSIGN(link_watch_, LinkWatch::start(*loop_, [this](const LinkEvent&) { on_link_event(); }));
  return {};
}

void Manager::on_link_event() {
  // A burst of events (a link coming up sends several) gets one check, 200 ms later.
  if (link_debounce_.active()) return;
  auto t = loop_->add_timer_in(200'000, [this] {
    link_debounce_.reset();
    check_now(/*replan=*/true);
  });
  if (t.ok()) link_debounce_ = std::move(t).value();
}

void Manager::check_now(bool replan) {
  if (!engine_->active_profile()) return;
  if (replan) {
    // A link that re-appeared, or a new one a glob matches: re-plan the whole profile.
    auto profile = load_profile(path(), *engine_->active_profile());
    if (!profile.ok()) return;
    auto plan = engine_->plan(*profile);
    if (!plan.ok() || plan->changes.empty()) return;
    for (const auto& c : plan->changes)
      log_warn("drift after a link event",
               {{"KNOB", c.knob.id}, {"WANT", c.knob.value}, {"HAVE", c.from}});
    if (cfg_.enforce_drift) {
      SwitchReport fix = engine_->apply(*profile);
      last_outcome_ = outcome_name(fix.outcome);
      log_info("re-enforced the active profile after a link event", {{"OUTCOME", last_outcome_}});
    } else {
      last_outcome_ = "drift";
    }
    update_status();
    return;
  }
  SwitchReport rep = engine_->verify();
  last_verify_ = rep.to_json();
  last_verify_["at"] = format_rfc3339(static_cast<int64_t>(now_realtime_us()));
  if (rep.outcome == Outcome::kDrift) {
    ++drift_;
    for (const auto& k : rep.knobs)
      if (k.status == "drift")
        log_warn("drift", {{"KNOB", k.id}, {"WANT", k.to}, {"HAVE", k.from}});
    if (cfg_.enforce_drift) {
      auto profile = load_profile(path(), *engine_->active_profile());
      if (profile.ok()) {
        SwitchReport fix = engine_->apply(*profile);
        log_info("re-enforced the active profile", {{"OUTCOME", outcome_name(fix.outcome)}});
        rep.outcome = fix.outcome;
      }
    }
  }
  last_outcome_ = outcome_name(rep.outcome);
  update_status();
}

nlohmann::json Manager::conflicts_json(const Profile& p) const {
  json out = json::array();
  for (const auto& c : detect_conflicts(p.knobs, HostPaths(cfg_.host_root)))
    out.push_back({{"knob", c.knob}, {"owner", c.owner}, {"detail", c.detail}});
  return out;
}

namespace {
constexpr const char* kSystemdPrivate = "unix:path=/run/systemd/private";
}  // namespace

Result<json> Manager::reboot(const std::string& reason) {
  if (!cfg_.allow_reboot)
    return make_error(
               "reboots are not allowed on this machine (sidekick.toml: allow_reboot = false)")
        .with_code(rpc::kPermissionDenied);
  if (reboot_slot_) return json{{"rebooting", true}};  // asked already
  // systemctl reboot's request, asynchronously: StartUnit("reboot.target") on systemd's
  // bus, answered by the loop.
  if (!bus_) {
    sd_bus* bus = nullptr;
    int r = sd_bus_open_system(&bus);
    if (r < 0) {
      // No D-Bus daemon (a minimal server): systemd's own socket, as systemctl does as
      // root.
      int sys = r;
      bus = nullptr;
      if ((r = sd_bus_new(&bus)) >= 0 && (r = sd_bus_set_address(bus, kSystemdPrivate)) >= 0)
        r = sd_bus_start(bus);
      if (r < 0) {
        if (bus) sd_bus_unref(bus);
        return errno_error(-sys, std::string("connect to the system bus (and to ") +
                                     (kSystemdPrivate + 10) + ": " + std::strerror(-r) + ")");
      }
    }
    if ((r = sd_bus_attach_event(bus, loop_->get(), 0)) < 0) {
      sd_bus_unref(bus);
      return errno_error(-r, "attach the system bus");
    }
    bus_ = bus;
  }
  log_warn("rebooting for planned maintenance", {{"REASON", reason}});
  int r = sd_bus_call_method_async(
      bus_, &reboot_slot_, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
      "org.freedesktop.systemd1.Manager", "StartUnit",
      [](sd_bus_message* m, void* self, sd_bus_error*) -> int {
        auto* mgr = static_cast<Manager*>(self);
        if (sd_bus_message_is_method_error(m, nullptr)) {
          log_error(
              "systemd refused the reboot",
              {{"ERROR", sd_bus_message_get_error(m)->message ? sd_bus_message_get_error(m)->message
                                                              : "unknown"}});
          mgr->reboot_slot_ = sd_bus_slot_unref(mgr->reboot_slot_);  // may be asked again
        }
        return 0;
      },
      this, "ss", "reboot.target", "replace-irreversibly");
  if (r < 0) return errno_error(-r, "ask systemd to reboot");
  return json{{"rebooting", true}};
}

}  // namespace weft::sidekick
