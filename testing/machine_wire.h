// What a machine says to its control plane, for the doubles that play machines: the
// process tests' FakeMachine (testing/fake_machine.h) and the simulators' fleet
// (bench/fleet.h). One definition of each message, as weft-agent, weft-hcs and
// weft-sidekick send it (docs/protocol.md), so a change to the protocol is made once for
// every double.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::testing {

// machine.register's parameters.
struct Registration {
  std::string machine, dc = "dc1", domain, type;
  int64_t cpu_milli = 0, mem_mb = 0;
  std::vector<std::string> controllers;  // none: left out
  bool reports_ready = false;            // an agent that reports "ready" (readiness checks)
  bool serves_discovery = false;
  std::string boot_id;                                   // "": left out
  std::optional<std::vector<std::string>> dns_interest;  // discovery_interest
};

inline nlohmann::json registration(const Registration& r) {
  nlohmann::json reg{{"machine", r.machine}, {"dc", r.dc},
                     {"domain", r.domain},   {"cpu_milli", r.cpu_milli},
                     {"mem_mb", r.mem_mb},   {"serves_discovery", r.serves_discovery}};
  if (!r.type.empty()) reg["type"] = r.type;
  if (!r.controllers.empty()) reg["controllers"] = r.controllers;
  if (r.reports_ready) reg["reports_ready"] = true;
  if (!r.boot_id.empty()) reg["boot_id"] = r.boot_id;
  if (r.dns_interest) reg["discovery_interest"] = *r.dns_interest;
  return reg;
}

// weft-hcs's verdict on the machine (health.report), with no problem named.
inline nlohmann::json health_verdict(const std::string& machine, const std::string& verdict) {
  return {{"machine", machine}, {"verdict", verdict}, {"problems", nlohmann::json::array()}};
}

// weft-sidekick's report of the profile it applied (profile.report).
inline nlohmann::json profile_report(const std::string& machine, const std::string& profile) {
  return {{"machine", machine}, {"profile", profile}, {"state", "ok"}};
}

// A machine.report with the whole task list: task id -> its state's name.
inline nlohmann::json task_list_report(const std::string& machine,
                                       const std::map<std::string, std::string>& states) {
  return {{"machine", machine}, {"tasks", states}};
}

}  // namespace weft::testing
