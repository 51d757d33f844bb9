// The control plane's read-only web view (docs/web-view.md): one page of HTML and SVG
// rendered by the server, no script. Machines as a grid by data centre and fault domain,
// coloured by health and outlined by entitlement; each entitlement's machines against its
// quota and its profile; jobs with ready/count and rollout progress; the maintenance
// calendar; what tasks use by job and by machine (weftctl top's figures, at most seconds
// old); the latest task events of every job. A pure function of the listings the API
// gives (machine.ls, entitlement.ls, job.ls with rollout counts, maintenance.ls,
// job.events), so it is tested without a daemon.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace weft::cp {

struct FleetSnapshot {
  nlohmann::json machines = nlohmann::json::array();      // machine_json rows
  nlohmann::json entitlements = nlohmann::json::array();  // entitlement.ls rows (+ roll)
  nlohmann::json jobs = nlohmann::json::array();          // job.ls rows (+ "current")
  nlohmann::json maintenance = nlohmann::json::array();   // maintenance.ls events
  nlohmann::json events = nlohmann::json::array();        // job.events rows (+ "job"), newest first
  // What tasks use (usage_glance.h): {"jobs", "machines": top rows, "age_s", "silent"},
  // or null while the first answer is awaited.
  nlohmann::json usage;
  int64_t now_wall_us = 0;
  std::string leader;  // this replica's address
};

std::string render_fleet_html(const FleetSnapshot& s);

// Text safe inside HTML elements and attribute values.
std::string html_escape(const std::string& s);

}  // namespace weft::cp
