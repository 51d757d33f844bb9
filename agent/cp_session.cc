#include "agent/cp_session.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "agent/host_ports.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/paths.h"
#include "common/strings.h"
#include "common/task_report.h"

namespace weft::agent {

Report build_report(const std::string& machine, const std::map<std::string, ReportedTask>& tasks,
                    const std::map<std::string, std::string>& acked,
                    const std::string& acked_digest) {
  Report out;
  for (const auto& [name, t] : tasks) out.states[name] = t.state;
  out.digest = tasks_digest(out.states);
  nlohmann::json& params = out.params;
  params = {{"machine", machine}};
  if (out.digest == acked_digest) {
    params["digest"] = out.digest;  // unchanged: a heartbeat's cost, whatever runs here
  } else if (!acked_digest.empty()) {
    // What changed since the list the control plane holds: one entry per change.
    params["changes"] = task_changes_json(acked, out.states);
    params["base"] = acked_digest;
    params["digest"] = out.digest;
  } else {
    params["tasks"] = out.states;
  }
  // Why the failed tasks this report names failed: the control plane's MESSAGE.
  const nlohmann::json* named = params.contains("tasks")     ? &params["tasks"]
                                : params.contains("changes") ? &params["changes"]
                                                             : nullptr;
  nlohmann::json failures = nlohmann::json::object();
  for (const auto& [name, t] : tasks) {
    if (!named || !t.failed || !named->contains(name)) continue;
    failures[name] = {{"reason", utf8_prefix(t.reason, weft::kMaxFailureReason - 32)},
                      {"setup", t.setup_failed}};
  }
  if (!failures.empty()) params["failures"] = std::move(failures);
  return out;
}

nlohmann::json machine_registration(const AgentConfig& cfg, bool serves_discovery,
                                    const std::set<uint16_t>& task_ports,
                                    const std::vector<std::string>* discovery_interest) {
  std::set<uint16_t> own = host_ports_of(cfg).snapshot(kMaxReservedPorts + task_ports.size());
  for (uint16_t p : task_ports) own.erase(p);
  while (own.size() > kMaxReservedPorts) own.erase(std::prev(own.end()));
  long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  int64_t mem_mb = 0;
  if (auto mi = read_file(HostPaths(cfg.host_root).proc("meminfo")); mi.ok())
    for (const auto& line : split(*mi, '\n'))
      if (line.rfind("MemTotal:", 0) == 0)
        mem_mb = std::strtoll(line.c_str() + 9, nullptr, 10) / 1024;
  auto label = [&](const char* k, const char* alt = nullptr) {
    auto it = cfg.labels.find(k);
    if (it == cfg.labels.end() && alt) it = cfg.labels.find(alt);
    return it == cfg.labels.end() ? std::string() : it->second;
  };
  nlohmann::json reg{
      {"machine", cfg.machine_id},
      {"dc", label("dc")},
      {"domain", label("msb", "rack")},
      {"type", label("type")},
      {"cpu_milli", static_cast<int64_t>(cpus > 0 ? cpus : 1) * 1000},
      {"mem_mb", mem_mb > 0 ? mem_mb : 1},
      {"controllers",
       split(trim(read_file(cfg.cgroup_root + "/cgroup.controllers").value_or("")), ' ')},
      {"reports_ready", true},
      {"port_range", {cfg.port_first, cfg.port_last}},
      // The machine's own ports now (agent/host_ports.h): no job's fixed port is placed
      // on them, and none of the range is handed out.
      {"reserved_ports", own},
      {"serves_discovery", serves_discovery},
      {"boot_id", trim(read_file("/proc/sys/kernel/random/boot_id").value_or(""))}};
  if (!cfg.advertise_address.empty()) reg["address"] = cfg.advertise_address;
  if (serves_discovery && discovery_interest) reg["discovery_interest"] = *discovery_interest;
  return reg;
}

namespace {
// A holder's epoch: a number from 0 (a reply read off the wire is unsigned; one built in
// code may be signed).
std::optional<uint64_t> epoch_in(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}
}  // namespace

void HolderFence::registered(const nlohmann::json& reply) {
  holder_.clear();
  epoch_ = 0;
  if (!reply.is_object() || !reply.contains("holder") || !reply["holder"].is_object()) return;
  const nlohmann::json& h = reply["holder"];
  auto epoch = h.contains("epoch") ? epoch_in(h["epoch"]) : std::nullopt;
  if (h.contains("shard") && h["shard"].is_string() && epoch) {
    holder_ = h["shard"].get<std::string>().substr(0, 256);
    epoch_ = *epoch;
  }
}

Result<nlohmann::json> HolderFence::admit(nlohmann::json p, const std::string& method) const {
  if (!p.is_object()) return p;  // the command's own validator says what is wrong
  if (!p.contains("holder") && !p.contains("epoch")) {
    if (holder_.empty()) return p;  // an all-in-one control plane: nothing to fence
    return field_error("holder", "is required: this machine is held by shard '" + holder_ + "'")
        .with_code(rpc::kConflict);
  }
  if (!p.contains("holder") || !p["holder"].is_string())
    return field_error("holder", "must be the holding shard's id");
  auto given = p.contains("epoch") ? epoch_in(p["epoch"]) : std::nullopt;
  if (!given) return field_error("epoch", "must be the machine's holder epoch (a number)");
  std::string holder = p["holder"].get<std::string>();
  uint64_t epoch = *given;
  if (holder != holder_ || epoch < epoch_) {
    log_warn("a command from a control plane that no longer holds this machine refused",
             {{"METHOD", method},
              {"FROM_HOLDER", holder.substr(0, 256)},
              {"FROM_EPOCH", std::to_string(epoch)},
              {"HOLDER", holder_.empty() ? "-" : holder_},
              {"EPOCH", std::to_string(epoch_)}});
    return make_error(method + " from holder '" + holder.substr(0, 256) + "' at epoch " +
                      std::to_string(epoch) + " refused: this machine is held by " +
                      (holder_.empty() ? std::string("no shard") : "'" + holder_ + "'") +
                      " at epoch " + std::to_string(epoch_))
        .with_code(rpc::kConflict);
  }
  p.erase("holder");
  p.erase("epoch");
  return p;
}

Result<std::unique_ptr<CpSession>> CpSession::start(EventLoop& loop, const AgentConfig& cfg,
                                                    const rpc::Dispatcher* commands,
                                                    bool serves_discovery, Hooks hooks) {
  std::unique_ptr<CpSession> s(new CpSession(loop, cfg.machine_id, std::move(hooks)));
  CpSession* self = s.get();
  // Read again at each session: the controllers (and memory) may have changed since.
  auto hello = [self, cfg, serves_discovery](rpc::Session& session, ControlPlaneLink::Done done) {
    self->acked_digest_.clear();  // a new session: the whole list first
    self->in_flight_ = self->again_ = false;
    self->quiet_ok_ = false;
    std::set<uint16_t> held =
        self->hooks_.task_ports ? self->hooks_.task_ports() : std::set<uint16_t>{};
    std::optional<std::vector<std::string>> interest;
    if (self->hooks_.discovery_interest) interest = self->hooks_.discovery_interest();
    uint64_t sent = now_monotonic_us();
    session.call("machine.register",
                 machine_registration(cfg, serves_discovery, held, interest ? &*interest : nullptr),
                 [self, sent, done = std::move(done)](Result<nlohmann::json> r) {
                   if (r.ok()) self->fence_.registered(*r);
                   if (r.ok() && self->hooks_.lease_terms) self->hooks_.lease_terms(*r);
                   if (r.ok() && self->hooks_.renewed) self->hooks_.renewed(sent);
                   if (r.ok() && r->is_object())
                     self->quiet_ok_ = r->value("quiet_heartbeats", false);
                   done(std::move(r));
                 });
  };
  auto report = [self](rpc::Session& session) { self->report(session); };
  TRY_ASSIGN(s->link_,
             make_control_plane_link(loop, cfg.control_plane, "weft-agent", commands, hello, report,
                                     cfg.insecure_control_plane, cfg.control_plane_tls));
  s->link_->start();
  return s;
}

CpSession::~CpSession() {
  soon_.reset();
  later_.reset();
  link_.reset();
}

void CpSession::report_soon() {
  if (soon_.active()) return;
  auto t = loop_.add_timer_in(20'000, [this] {
    soon_.reset();
    link_->report_now();
  });
  if (t.ok()) soon_ = std::move(t).value();
}

void CpSession::report_now() {
  link_->report_now();
}

bool CpSession::unhealthy(const std::string& task, const std::string& reason) {
  rpc::Session* s = link_->session();
  if (!s) return false;
  s->notify("task.unhealthy",
            {{"machine", machine_}, {"task", task}, {"reason", reason.substr(0, 500)}});
  return true;
}

bool CpSession::ask_services(const std::vector<std::string>& jobs,
                             const std::vector<std::string>& forget,
                             std::function<void(Result<nlohmann::json>)> reply) {
  rpc::Session* s = link_->session();
  if (!s) return false;
  nlohmann::json p{{"machine", machine_}, {"jobs", jobs}};
  if (!forget.empty()) p["forget"] = forget;
  s->call("service.interest", p, std::move(reply));
  return true;
}

void CpSession::report(rpc::Session& s) {
  // One report at a time: a change while one is unanswered is sent when it is (against
  // the list that one makes the control plane hold), not against a stale base.
  if (in_flight_) {
    again_ = true;
    return;
  }
  if (int64_t step = wall_steps_.observe(now_monotonic_us(), now_realtime_us()))
    log_warn(
        "the wall clock stepped; the machine's lease and heartbeats count on the monotonic "
        "clock and are not moved",
        {{"STEP_SECONDS", std::to_string(static_cast<double>(step) / 1e6)}});
  Report r = build_report(machine_, hooks_.tasks(), acked_, acked_digest_);
  // Nothing changed and the control plane holds our list: while it has spoken within the
  // last interval and a half, the heartbeat needs no answer (a fleet's answers cost a
  // control plane as much as its heartbeats). Every other one is still a request, so a
  // control plane that stopped answering is found within the link's three intervals; a
  // refusal comes back as report.resend.
  bool unchanged = r.params.size() == 2 && r.params.contains("digest");
  bool lease = hooks_.needs_lease && hooks_.needs_lease();
  uint64_t sent = now_monotonic_us();
  if (quiet_ok_ && unchanged && !lease && sent - s.last_heard_us() < link_->interval_us() * 3 / 2) {
    s.notify("machine.report", std::move(r.params));
    return;
  }
  in_flight_ = true;
  s.call("machine.report", std::move(r.params),
         [this, digest = std::move(r.digest), states = std::move(r.states), sent_after = resends_,
          sent](Result<nlohmann::json> reply) mutable {
           in_flight_ = false;
           if (reply.ok() && hooks_.renewed) hooks_.renewed(sent);  // an answer from the leader
           if (std::exchange(again_, false)) {
             auto later = loop_.add_defer([this] { link_->report_now(); });
             if (later.ok()) later_ = std::move(later).value();
           }
           if (!reply.ok()) {
             acked_digest_.clear();  // the whole list next time (an older control plane, say)
             log_debug("report failed", {{"ERROR", reply.error().str()}});
             return;
           }
           if (reply->is_object() && reply->value("resend", false)) {
             acked_digest_.clear();  // it does not hold our list: send it now
             link_->report_now();
             return;
           }
           // A report.resend came while this one was unanswered: the whole list goes next,
           // whatever this answer says of the list it was sent against.
           if (sent_after != resends_) return;
           acked_digest_ = std::move(digest);
           acked_ = std::move(states);
           if (reply->is_object() && reply->contains("forget") && (*reply)["forget"].is_array()) {
             std::set<std::string> names;
             for (const auto& n : (*reply)["forget"])
               if (n.is_string()) names.insert(n.get<std::string>());
             hooks_.forget(names);
           }
         });
}

void CpSession::resend() {
  ++resends_;
  acked_digest_.clear();
  link_->report_now();
}

void CpSession::forget(const nlohmann::json& p) {
  if (!p.is_object() || !p.contains("forget") || !p["forget"].is_array()) return;
  std::set<std::string> names;
  for (const auto& n : p["forget"])
    if (n.is_string()) names.insert(n.get<std::string>());
  hooks_.forget(names);
}

}  // namespace weft::agent
