#include "controlplane/maintenance/maintenance.h"

#include <ctime>

#include "common/clock.h"
#include "common/fs.h"
#include "common/rpc/protocol.h"
#include "common/units.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMinute = 60'000'000;
constexpr uint64_t kWeek = 7 * 24 * 60 * kMinute;

Result<uint64_t> duration_field(const json& p, const char* key, uint64_t dflt, uint64_t min,
                                uint64_t max) {
  if (!p.contains(key)) return dflt;
  const json& v = p[key];
  Result<uint64_t> us = make_error("");
  if (v.is_string())
    us = parse_duration_us(v.get<std::string>());
  else if (v.is_number_integer() && v.get<int64_t>() >= 0)
    us = seconds_to_us(v.get<double>());
  else
    return field_error(key, "must be a duration such as \"30m\" or seconds");
  if (!us.ok()) return field_error(key, us.error().message);
  if (*us < min || *us > max)
    return field_error(key, "must be between " + std::to_string(min / 1'000'000) + "s and " +
                                std::to_string(max / 1'000'000) + "s");
  return *us;
}

}  // namespace

Result<int64_t> parse_rfc3339_utc(const std::string& s) {
  int y, mo, d, h, mi, sec;
  char z = 0;
  int n = 0;
  if (s.size() != 20 ||
      std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c%n", &y, &mo, &d, &h, &mi, &sec, &z, &n) !=
          7 ||
      n != 20 || z != 'Z' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
      sec > 60 || y < 1970 || y > 9999)
    return make_error("must be a UTC time such as \"2026-11-23T14:00:00Z\"");
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  time_t t = timegm(&tm);
  if (t == static_cast<time_t>(-1) || tm.tm_mday != d) return make_error("is not a valid date");
  return static_cast<int64_t>(t) * 1'000'000;
}

Result<MaintenanceEvent> parse_maintenance_request(const json& p, int64_t now) {
  if (!p.is_object()) return field_error("params", "must be an object");
  for (const auto& [k, v] : p.items())
    if (k != "machine" && k != "domain" && k != "dc" && k != "start" && k != "duration" &&
        k != "notice" && k != "reason" && k != "reboot")
      return field_error(k, "unknown field");
  MaintenanceEvent e;
  int targets = 0;
  for (const char* kind : {"machine", "domain", "dc"}) {
    if (!p.contains(kind)) continue;
    ++targets;
    if (!p[kind].is_string() || p[kind].get<std::string>().empty() ||
        p[kind].get<std::string>().size() > 253)
      return field_error(kind, "must be a name of 1-253 characters");
    e.target_kind = kind;
    e.target = p[kind].get<std::string>();
  }
  if (targets != 1) return field_error("machine", "exactly one of machine, domain or dc is needed");
  if (!p.contains("start")) return field_error("start", "is required");
  const json& s = p["start"];
  if (s.is_number_integer()) {
    if (s.get<int64_t>() < 0 || s.get<int64_t>() > 253402300799ll)
      return field_error("start", "is out of range");
    e.start_us = s.get<int64_t>() * 1'000'000;
  } else if (s.is_string() && !s.get<std::string>().empty() && s.get<std::string>()[0] == '+') {
    auto in = parse_duration_us(s.get<std::string>().substr(1));
    if (!in.ok() || *in > kWeek * 52)
      return field_error("start", "a relative start is \"+<duration>\", at most a year");
    e.start_us = now + static_cast<int64_t>(*in);
  } else if (s.is_string()) {
    auto at = parse_rfc3339_utc(s.get<std::string>());
    if (!at.ok()) return field_error("start", at.error().message);
    e.start_us = *at;
  } else {
    return field_error("start", "must be a UTC time, unix seconds or \"+<duration>\"");
  }
  TRY_ASSIGN(e.duration_us, duration_field(p, "duration", 0, 1'000'000, kWeek));
  if (!p.contains("duration")) return field_error("duration", "is required");
  TRY_ASSIGN(e.notice_us, duration_field(p, "notice", 15 * kMinute, 0, kWeek));
  if (e.end_us() <= now) return field_error("start", "the window is over already");
  if (p.contains("reason")) {
    if (!p["reason"].is_string() || p["reason"].get<std::string>().size() > 256)
      return field_error("reason", "must be a string of at most 256 characters");
    e.reason = p["reason"].get<std::string>();
  }
  if (p.contains("reboot")) {
    if (!p["reboot"].is_boolean()) return field_error("reboot", "must be true or false");
    e.reboot = p["reboot"].get<bool>();
  }
  return e;
}

json to_json(const MaintenanceEvent& e) {
  json rs = json::object();
  for (const auto& [m, at] : e.reboot_sent) rs[m] = at;
  json boots = json::object();
  for (const auto& [m, b] : e.boot_before) boots[m] = b;
  json refused = json::object();
  for (const auto& [m, at] : e.reboot_refused) refused[m] = at;
  return json{{"id", e.id},
              {"target_kind", e.target_kind},
              {"target", e.target},
              {"start_us", e.start_us},
              {"start", format_rfc3339(e.start_us)},
              {"end", format_rfc3339(e.end_us())},
              {"duration_us", e.duration_us},
              {"notice_us", e.notice_us},
              {"reason", e.reason},
              {"reboot", e.reboot},
              {"state", e.state},
              {"machines", e.machines},
              {"drained", e.drained},
              {"reboot_sent", rs},
              {"boot_before", boots},
              {"reboot_refused", refused},
              {"rebooted", e.rebooted},
              {"message", e.message}};
}

Result<MaintenanceEvent> maintenance_from_json(const json& j) {
  try {
    MaintenanceEvent e;
    e.id = j.at("id").get<uint64_t>();
    e.target_kind = j.at("target_kind").get<std::string>();
    e.target = j.at("target").get<std::string>();
    e.start_us = j.at("start_us").get<int64_t>();
    e.duration_us = j.at("duration_us").get<uint64_t>();
    e.notice_us = j.at("notice_us").get<uint64_t>();
    e.reason = j.at("reason").get<std::string>();
    e.reboot = j.at("reboot").get<bool>();
    e.state = j.at("state").get<std::string>();
    e.machines = j.at("machines").get<std::set<std::string>>();
    e.drained = j.at("drained").get<std::set<std::string>>();
    for (const auto& [m, at] : j.at("reboot_sent").items()) e.reboot_sent[m] = at.get<int64_t>();
    if (j.contains("reboot_refused"))
      for (const auto& [m, at] : j.at("reboot_refused").items())
        e.reboot_refused[m] = at.get<int64_t>();
    if (j.contains("boot_before"))
      for (const auto& [m, b] : j.at("boot_before").items())
        e.boot_before[m] = b.get<std::string>();
    e.rebooted = j.at("rebooted").get<std::set<std::string>>();
    e.message = j.value("message", "");
    static const std::set<std::string> states = {"scheduled",  "notified", "in_progress",
                                                 "completing", "done",     "cancelled"};
    if (!states.count(e.state)) return field_error("state", "unknown state " + e.state);
    return e;
  } catch (const json::exception& x) {
    return make_error(std::string("stored maintenance event: ") + x.what());
  }
}

Result<uint64_t> Maintenance::schedule(MaintenanceEvent e, uint64_t id) {
  size_t active = 0;
  for (const auto& [n, ev] : events_) active += ev.active();
  if (active >= kMaxEvents)
    return field_error(
        "start", "too many maintenance events scheduled (" + std::to_string(kMaxEvents) + ")");
  if (id != 0 && id < kRegionIds)
    return field_error("id", "a region's event id is at least " + std::to_string(kRegionIds));
  if (id != 0 && events_.count(id))
    return field_error("id", "maintenance event " + std::to_string(id) + " exists")
        .with_code(rpc::kConflict);
  e.id = id != 0 ? id : next_id_++;
  e.state = "scheduled";
  events_[e.id] = e;
  // Bounded: the oldest ended events go.
  for (auto it = events_.begin(); events_.size() > kMaxEvents && it != events_.end();) {
    if (!it->second.active()) {
      dropped_.push_back(it->first);
      it = events_.erase(it);
    } else {
      ++it;
    }
  }
  return e.id;
}

void Maintenance::restore(const MaintenanceEvent& e) {
  events_[e.id] = e;
  if (e.id < kRegionIds) next_id_ = std::max(next_id_, e.id + 1);  // a region's: not ours
}

bool Maintenance::cancel(uint64_t id, World& w) {
  auto it = events_.find(id);
  if (it == events_.end() || !it->second.active()) return false;
  MaintenanceEvent& e = it->second;
  for (const auto& m : e.drained) {
    // Another active event may still hold the machine.
    bool held = false;
    for (const auto& [oid, o] : events_)
      held = held || (oid != id && o.active() && o.drained.count(m));
    if (!held) w.set_drained(m, false);
  }
  e.drained.clear();
  e.state = "cancelled";
  e.message.clear();
  return true;
}

std::set<uint64_t> Maintenance::registered(const std::string& machine, const std::string& boot_id,
                                           int64_t now) {
  std::set<uint64_t> changed;
  for (auto& [id, e] : events_) {
    if (!e.active() || !e.reboot_sent.count(machine) || e.rebooted.count(machine)) continue;
    auto before = e.boot_before.find(machine);
    bool back = before == e.boot_before.end() || before->second.empty() || boot_id.empty()
                    ? now > e.reboot_sent[machine]
                    : before->second != boot_id;
    if (back) {
      e.rebooted.insert(machine);
      changed.insert(id);
    }
  }
  return changed;
}

std::set<uint64_t> Maintenance::reboot_refused(const std::string& machine, const std::string& why,
                                               int64_t now) {
  std::set<uint64_t> changed;
  for (auto& [id, e] : events_) {
    if (!e.active() || !e.reboot_sent.count(machine) || e.rebooted.count(machine)) continue;
    e.reboot_sent.erase(machine);
    e.boot_before.erase(machine);
    e.reboot_refused[machine] = now;
    e.message = machine + " refused to reboot: " + why;
    changed.insert(id);
  }
  return changed;
}

std::vector<const MaintenanceEvent*> Maintenance::affecting(const std::string& machine) const {
  std::vector<const MaintenanceEvent*> out;
  for (const auto& [id, e] : events_)
    if (e.active() && e.state != "scheduled" && e.machines.count(machine)) out.push_back(&e);
  return out;
}

std::set<uint64_t> Maintenance::step(World& w, int64_t now) {
  std::set<uint64_t> changed;
  for (auto& [id, e] : events_)
    if (e.active() && step_one(e, w, now)) changed.insert(id);
  return changed;
}

bool Maintenance::step_one(MaintenanceEvent& e, World& w, int64_t now) {
  std::string before = e.state, message = e.message;
  size_t drained = e.drained.size(), sent = e.reboot_sent.size();
  if (e.state == "scheduled" && now >= e.start_us - static_cast<int64_t>(e.notice_us)) {
    auto ms = w.machines_of(e);
    e.machines = std::set<std::string>(ms.begin(), ms.end());
    for (const auto& m : e.machines) {
      if (w.is_drained(m)) {
        // Drained by an operator: not this event's to return to service. Drained by
        // another event: held by both until both end.
        bool by_event = false;
        for (const auto& [oid, o] : events_)
          by_event = by_event || (o.active() && o.drained.count(m));
        if (by_event) e.drained.insert(m);
        continue;
      }
      w.set_drained(m, true);
      e.drained.insert(m);
    }
    e.state = "notified";
  }
  if (e.state == "notified" && now >= e.start_us) {
    for (const auto& m : e.machines) w.evict(m);
    e.state = "in_progress";
  }
  bool refused_recently = false;
  for (const auto& [m, at] : e.reboot_refused)
    refused_recently = refused_recently || (now - at < kRebootRetryUs && !e.reboot_sent.count(m));
  if (e.state == "in_progress" || e.state == "completing") {
    // Reboots: asked of each machine once it runs nothing (until it came back).
    std::vector<std::string> busy;
    for (const auto& m : e.machines) {
      if (!e.reboot || e.reboot_sent.count(m)) continue;
      if (auto r = e.reboot_refused.find(m);
          r != e.reboot_refused.end() && now - r->second < kRebootRetryUs)
        continue;  // refused a moment ago: the message says why
      if (!w.empty(m)) {
        busy.push_back(m);
        continue;
      }
      std::string boot = w.boot_id ? w.boot_id(m) : "";
      if (w.reboot(m)) {
        e.reboot_sent[m] = now;
        e.boot_before[m] = boot;
      } else
        busy.push_back(m);
    }
    if (!refused_recently)
      e.message =
          busy.empty()
              ? ""
              : "waiting to reboot " + busy.front() +
                    (busy.size() > 1 ? " and " + std::to_string(busy.size() - 1) + " more" : "");
    if (e.state == "in_progress" && now >= e.end_us()) e.state = "completing";
  }
  if (e.state == "completing") {
    std::vector<std::string> waiting;
    for (auto it = e.drained.begin(); it != e.drained.end();) {
      const std::string& m = *it;
      // Asked to reboot: back only once it did (a refusal keeps it out, the message says
      // why, and the request is repeated).
      bool back = !e.reboot || e.rebooted.count(m);
      if (back && w.healthy(m)) {
        bool held = false;
        for (const auto& [oid, o] : events_)
          held = held || (oid != e.id && o.active() && o.drained.count(m));
        if (!held) w.set_drained(m, false);
        it = e.drained.erase(it);
      } else {
        waiting.push_back(m);
        ++it;
      }
    }
    if (waiting.empty()) {
      e.state = "done";
      e.message.clear();
    } else if (!refused_recently) {
      e.message =
          "waiting for " + waiting.front() +
          (waiting.size() > 1 ? " and " + std::to_string(waiting.size() - 1) + " more" : "") +
          " to be back and healthy";
    }
  }
  return e.state != before || e.message != message || e.drained.size() != drained ||
         e.reboot_sent.size() != sent;
}

}  // namespace weft::cp
