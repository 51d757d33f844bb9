#include "controlplane/machines/machine_links.h"

#include "common/clock.h"
#include "common/log.h"
#include "controlplane/machines/broker.h"

namespace weft::cp {

using json = nlohmann::json;

void track_session(std::map<MachineId, rpc::Session*>& table, MachineId m, rpc::Session* s) {
  if (!s) return;
  auto it = table.find(m);
  if (it != table.end() && it->second == s) return;
  table[m] = s;
  s->watch_close([&table, m, s] {
    if (auto cur = table.find(m); cur != table.end() && cur->second == s) table.erase(cur);
  });
}

Status MachineSessions::claim(Daemon daemon, MachineId m, const std::string& name,
                              const rpc::CallContext& c, uint64_t interval_us) {
  if (!c.session) return {};
  auto& table = daemon == Daemon::kAgent ? agents_ : sidekicks_;
  const char* what = daemon == Daemon::kAgent ? "agent" : "sidekick";
  uint64_t now = now_monotonic_us();
  auto it = table.find(m);
  if (it != table.end() && it->second != c.session) {
    rpc::Session* old = it->second;
    auto h = heard_.find(old);
    uint64_t heard = h == heard_.end() ? 0 : h->second;
    uint64_t dead_after =
        (interval_us ? interval_us : heartbeat_us_) * static_cast<uint64_t>(missed_);
    if (now - heard < dead_after) {
      log_warn("second session for a connected machine refused",
               {{"MACHINE", name},
                {"DAEMON", what},
                {"CONNECTED", old->peer().address},
                {"REFUSED", c.peer.address}});
      return make_error("machine " + name + " already has a " + what + " session (from " +
                        old->peer().address + ", heard from " +
                        std::to_string((now - heard) / 1000) +
                        " ms ago); a second one is refused until that one closes or falls silent")
          .with_code(rpc::kConflict);
    }
    log_warn("a silent session replaced by a new one", {{"MACHINE", name},
                                                        {"DAEMON", what},
                                                        {"SILENT", old->peer().address},
                                                        {"NEW", c.peer.address}});
    table.erase(it);
    old->close();
  }
  track_session(table, m, c.session);
  if (heard_.emplace(c.session, now).second) {
    rpc::Session* s = c.session;
    s->watch_close([this, s] { heard_.erase(s); });
  } else {
    heard_[c.session] = now;
  }
  return {};
}

void MachineSessions::track_hcs(MachineId m, rpc::Session* s) {
  track_session(hcs_, m, s);
}

void MachineSessions::close(MachineId m) {
  for (auto* table : {&agents_, &sidekicks_, &hcs_})
    if (auto it = table->find(m); it != table->end() && it->second) it->second->close();
}

void MachineReports::forget(MachineId m) {
  lists.erase(m);
  problems.erase(m);
  profile_state.erase(m);
  controllers.erase(m);
  profiles_offered.erase(m);
  boot_ids.erase(m);
  running_means_ready.erase(m);
}

std::set<std::string> MachineReports::known_profiles() const {
  std::set<std::string> known;
  for (const auto& [m, names] : profiles_offered) known.insert(names.begin(), names.end());
  return known;
}

void PoolChanges::push(const MachineSessions& sessions, const Broker& broker,
                       const Allocator& alloc) {
  for (MachineId m : std::exchange(profile_, {})) {
    rpc::Session* s = sessions.sidekick(m);
    if (!s) continue;
    std::string want = broker.desired_profile(m);
    auto& pushed = pushed_[m];
    if (want.empty() || want == pushed || broker.persisted(m).applied_profile == want) continue;
    pushed = want;
    std::string name = alloc.spec(m).name;
    s->call("profile.apply", {{"profile", want}}, [name, want](Result<json> r) {
      if (!r.ok())
        log_warn("sidekick did not take the profile",
                 {{"MACHINE", name}, {"PROFILE", want}, {"ERROR", r.error().str()}});
    });
  }
}

}  // namespace weft::cp
