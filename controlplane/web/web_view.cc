#include "controlplane/web/web_view.h"

#include <algorithm>
#include <ctime>
#include <map>
#include <sstream>
#include <vector>

namespace weft::cp {

using nlohmann::json;

namespace {

std::string str(const json& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return dflt;
  return it->get<std::string>();
}

int64_t num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<int64_t>();
}

// Health states and their colours (the legend shows them in this order).
const std::vector<std::pair<std::string, std::string>>& state_colours() {
  static const std::vector<std::pair<std::string, std::string>> k = {
      {"ok", "#2e9d4a"},        {"degraded", "#e0b000"}, {"failed", "#d23f31"},
      {"dead", "#6b6b6b"},      {"drained", "#3b7dd8"},  {"preparing", "#f08c00"},
      {"unprepared", "#a64ca6"}};
  return k;
}

std::string state_colour(const std::string& s) {
  for (const auto& [name, c] : state_colours())
    if (name == s) return c;
  return "#bbbbbb";
}

// One outline colour per entitlement, in name order; the free pool has none.
const char* kEntColours[] = {"#1b4f72", "#7d3c98", "#117864", "#b9770e", "#943126",
                             "#2e4053", "#1abc9c", "#c0392b", "#5b2c6f", "#0e6655"};

std::string utc(int64_t wall_us) {
  std::time_t t = static_cast<std::time_t>(wall_us / 1'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// A bar of `part` out of `whole`, `w` pixels wide.
std::string bar(int64_t part, int64_t whole, const std::string& colour, const std::string& cls) {
  int w = 160;
  double f =
      whole > 0 ? std::clamp(static_cast<double>(part) / static_cast<double>(whole), 0.0, 1.0) : 0;
  std::ostringstream o;
  o << "<svg class=\"bar " << cls << "\" width=\"" << w << "\" height=\"12\" role=\"img\">"
    << "<rect width=\"" << w << "\" height=\"12\" fill=\"#e5e5e5\"/>"
    << "<rect class=\"fill\" width=\"" << static_cast<int>(f * w) << "\" height=\"12\" fill=\""
    << colour << "\"/></svg>";
  return o.str();
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  return o;
}

namespace {

using Colours = std::map<std::string, std::string>;

// Entitlement outline colours, by name.
Colours entitlement_colours(const FleetSnapshot& s) {
  Colours ent_colour;
  std::vector<std::string> names;
  for (const auto& e : s.entitlements) names.push_back(str(e, "name"));
  std::sort(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i)
    ent_colour[names[i]] = kEntColours[i % (sizeof kEntColours / sizeof *kEntColours)];
  return ent_colour;
}

// The page's head and the summary line.
void write_head(std::ostringstream& o, const FleetSnapshot& s) {
  std::map<std::string, int> by_state;
  int64_t tasks = 0;
  for (const auto& m : s.machines) {
    ++by_state[str(m, "state")];
    tasks += num(m, "tasks");
  }
  o << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    << "<title>weft fleet</title><style>"
    << "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}"
    << "h1{margin:0 0 4px}h2{margin:28px 0 8px;border-bottom:1px solid #ccc}"
    << "h3{margin:12px 0 4px;font-size:14px}table{border-collapse:collapse}"
    << "td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #e3e3e3}"
    << "th{font-weight:600;background:#f0f0f0}.muted{color:#777}.swatch{display:inline-block;"
    << "width:10px;height:10px;border:2px solid;margin-right:6px;vertical-align:middle}"
    << "svg text{font:11px system-ui,sans-serif}.legend span{margin-right:14px}"
    << "</style></head><body>\n";
  o << "<header><h1>weft fleet</h1><p class=\"summary\" id=\"summary\">" << s.machines.size()
    << " machines";
  for (const auto& [st, c] : state_colours())
    if (by_state.count(st)) o << " · " << by_state[st] << " " << st;
  o << " · " << s.entitlements.size() << " entitlements · " << s.jobs.size() << " jobs · " << tasks
    << " tasks placed · as of " << utc(s.now_wall_us);
  if (!s.leader.empty()) o << " · leader " << html_escape(s.leader);
  o << "</p></header>\n";
}

// Machines: one grid per data centre, one row per fault domain.
void write_machines(std::ostringstream& o, const FleetSnapshot& s, Colours& ent_colour) {
  o << "<section id=\"machines\"><h2>Machines</h2><p class=\"legend\">";
  for (const auto& [st, c] : state_colours())
    o << "<span><span class=\"swatch\" style=\"background:" << c << ";border-color:" << c
      << "\"></span>" << st << "</span>";
  o << "<span class=\"muted\">outline: entitlement (none: free pool)</span></p>\n";
  std::map<std::string, std::map<std::string, std::vector<const json*>>> grid;
  for (const auto& m : s.machines) grid[str(m, "dc", "-")][str(m, "domain", "-")].push_back(&m);
  constexpr int kCell = 22, kGap = 4, kPerRow = 40, kLabel = 110;
  for (const auto& [dc, domains] : grid) {
    int rows = 0;
    for (const auto& [d, ms] : domains)
      rows += static_cast<int>((ms.size() + kPerRow - 1) / kPerRow);
    int width = kLabel + kPerRow * (kCell + kGap);
    int height = rows * (kCell + kGap) + kGap;
    o << "<h3>data centre " << html_escape(dc) << "</h3><svg class=\"grid\" data-dc=\""
      << html_escape(dc) << "\" width=\"" << width << "\" height=\"" << height
      << "\" role=\"img\">\n";
    int row = 0;
    for (const auto& [domain, ms] : domains) {
      int y = kGap + row * (kCell + kGap);
      o << "<text x=\"0\" y=\"" << y + 15 << "\">" << html_escape(domain) << "</text>\n";
      for (size_t i = 0; i < ms.size(); ++i) {
        const json& m = *ms[i];
        int x = kLabel + static_cast<int>(i % kPerRow) * (kCell + kGap);
        int yy = y + static_cast<int>(i / kPerRow) * (kCell + kGap);
        std::string st = str(m, "state"), ent = str(m, "entitlement");
        std::string outline = ent.empty() ? "#cfcfcf" : ent_colour[ent];
        o << "<rect class=\"machine state-" << html_escape(st) << "\" data-machine=\""
          << html_escape(str(m, "machine")) << "\" data-entitlement=\"" << html_escape(ent)
          << "\" x=\"" << x + 2 << "\" y=\"" << yy + 2 << "\" width=\"" << kCell - 4
          << "\" height=\"" << kCell - 4 << "\" rx=\"3\" fill=\"" << state_colour(st)
          << "\" stroke=\"" << outline << "\" stroke-width=\"" << (ent.empty() ? 1 : 4)
          << "\"><title>" << html_escape(str(m, "machine")) << " — " << html_escape(st) << " — "
          << (ent.empty() ? "free pool" : "entitlement " + html_escape(ent)) << " — "
          << num(m, "tasks") << " tasks — profile " << html_escape(str(m, "profile", "-"))
          << "</title></rect>\n";
      }
      row += static_cast<int>((ms.size() + kPerRow - 1) / kPerRow);
    }
    o << "</svg>\n";
  }
  o << "</section>\n";
}

// Entitlements: machines against quota, profile (and its roll), owners.
void write_entitlements(std::ostringstream& o, const FleetSnapshot& s, Colours& ent_colour) {
  o << "<section id=\"entitlements\"><h2>Entitlements</h2><table><tr><th>entitlement</th>"
    << "<th>machines / quota</th><th></th><th>profile</th><th>owners</th></tr>\n";
  for (const auto& e : s.entitlements) {
    std::string name = str(e, "name");
    int64_t used = num(e, "machines"), quota = num(e, "quota");
    std::string owners;
    if (e.contains("owners") && e["owners"].is_array())
      for (const auto& w : e["owners"])
        if (w.is_string()) owners += (owners.empty() ? "" : ", ") + w.get<std::string>();
    std::string profile = str(e, "profile", "any");
    if (auto r = e.find("profile_roll"); r != e.end() && r->is_object() && !r->value("done", true))
      profile +=
          " (rolling: " + std::to_string(r->value("waiting", json::array()).size()) + " waiting)";
    o << "<tr class=\"entitlement\" data-entitlement=\"" << html_escape(name) << "\"><td><span "
      << "class=\"swatch\" style=\"border-color:" << ent_colour[name] << "\"></span>"
      << html_escape(name) << "</td><td class=\"used\">" << used << " / " << quota << "</td><td>"
      << bar(used, quota, ent_colour[name], "quota") << "</td><td>" << html_escape(profile)
      << "</td><td class=\"muted\">" << html_escape(owners.empty() ? "admins" : owners)
      << "</td></tr>\n";
  }
  o << "</table></section>\n";
}

// Jobs: ready against count, generation, rollout or run.
void write_jobs(std::ostringstream& o, const FleetSnapshot& s) {
  o << "<section id=\"jobs\"><h2>Jobs</h2><table><tr><th>job</th><th>entitlement</th>"
    << "<th>ready / count</th><th></th><th>generation</th><th>rollout</th></tr>\n";
  for (const auto& j : s.jobs) {
    int64_t count = num(j, "count"), ready = num(j, "ready"), current = num(j, "current");
    std::string rollout =
        j.value("stopping", false) ? "stopping"
        : current >= count         ? "done"
                           : std::to_string(current) + " of " + std::to_string(count) + " updated";
    // A batch job's progress, a periodic job's schedule; a rollout's pause or canaries.
    std::string kind = str(j, "kind");
    if (kind == "batch")
      rollout = (str(j, "outcome").empty() ? "running" : str(j, "outcome")) + " " +
                std::to_string(num(j, "succeeded")) + "/" + std::to_string(num(j, "completions")) +
                " completed";
    else if (kind == "periodic")
      rollout = "periodic: " + str(j, "schedule");
    else if (j.value("paused", false))
      rollout += " (paused)";
    else if (j.value("canary", false))
      rollout += " (canaries: weftctl job promote)";
    rollout = html_escape(rollout);
    o << "<tr class=\"job\" data-job=\"" << html_escape(str(j, "name")) << "\"><td>"
      << html_escape(str(j, "name")) << "</td><td>" << html_escape(str(j, "entitlement"))
      << "</td><td class=\"ready\">" << ready << " / " << count << "</td><td>"
      << bar(ready, count, "#2e9d4a", "ready") << "</td><td>" << num(j, "generation")
      << "</td><td class=\"rollout\">" << rollout << "</td></tr>\n";
  }
  o << "</table></section>\n";
}

// Maintenance: the next 72 hours as a timeline, then every event not yet ended.
void write_maintenance(std::ostringstream& o, const FleetSnapshot& s) {
  o << "<section id=\"maintenance\"><h2>Maintenance calendar</h2>\n";
  constexpr int kW = 720, kRowH = 20;
  const int64_t span = 72LL * 3600 * 1'000'000;
  int h = 24 + kRowH * static_cast<int>(std::max<size_t>(1, s.maintenance.size()));
  o << "<svg class=\"calendar\" width=\"" << kW + 160 << "\" height=\"" << h << "\" role=\"img\">";
  for (int hour = 0; hour <= 72; hour += 12) {
    int x = 160 + hour * kW / 72;
    o << "<line x1=\"" << x << "\" y1=\"14\" x2=\"" << x << "\" y2=\"" << h
      << "\" stroke=\"#ddd\"/><text x=\"" << x + 2 << "\" y=\"11\">+" << hour << "h</text>";
  }
  for (size_t i = 0; i < s.maintenance.size(); ++i) {
    const json& e = s.maintenance[i];
    int64_t start = num(e, "start_us"), dur = num(e, "duration_us");
    double a = std::clamp(static_cast<double>(start - s.now_wall_us) / span, 0.0, 1.0);
    double b = std::clamp(static_cast<double>(start + dur - s.now_wall_us) / span, 0.0, 1.0);
    int y = 18 + static_cast<int>(i) * kRowH;
    std::string label = str(e, "target_kind") + " " + str(e, "target");
    o << "<text x=\"0\" y=\"" << y + 13 << "\">" << html_escape(label.substr(0, 26)) << "</text>"
      << "<rect class=\"event state-" << html_escape(str(e, "state")) << "\" x=\""
      << 160 + static_cast<int>(a * kW) << "\" y=\"" << y + 2 << "\" width=\""
      << std::max(3, static_cast<int>((b - a) * kW)) << "\" height=\"" << kRowH - 6 << "\" fill=\""
      << (e.value("reboot", false) ? "#d23f31" : "#3b7dd8") << "\"><title>" << html_escape(label)
      << " — " << html_escape(str(e, "state")) << " — " << html_escape(str(e, "reason"))
      << "</title></rect>";
  }
  o << "</svg>\n<table><tr><th>id</th><th>target</th><th>start</th><th>end</th><th>state</th>"
    << "<th>reboot</th><th>reason</th></tr>\n";
  for (const auto& e : s.maintenance)
    o << "<tr class=\"maintenance\"><td>" << num(e, "id") << "</td><td>"
      << html_escape(str(e, "target_kind") + " " + str(e, "target")) << "</td><td>"
      << html_escape(str(e, "start")) << "</td><td>" << html_escape(str(e, "end")) << "</td><td>"
      << html_escape(str(e, "state")) << "</td><td>" << (e.value("reboot", false) ? "yes" : "no")
      << "</td><td>" << html_escape(str(e, "reason")) << "</td></tr>\n";
  o << "</table></section>\n";
}

// What tasks use (weftctl top): by job, then the busiest machines.
void write_usage(std::ostringstream& o, const FleetSnapshot& s) {
  o << "<section id=\"usage\"><h2>What tasks use</h2>\n";
  if (s.usage.is_null()) {
    o << "<p class=\"legend\">Asking the machines; reload in a few seconds.</p>";
  } else {
    auto cores = [](int64_t milli) {
      char b[32];
      std::snprintf(b, sizeof b, "%.2f", static_cast<double>(milli) / 1000.0);
      return std::string(b);
    };
    auto mib = [](int64_t bytes) { return std::to_string(bytes / (1024 * 1024)); };
    o << "<p class=\"legend\">as of " << num(s.usage, "age_s") << " s ago";
    if (s.usage.contains("silent") && !s.usage["silent"].empty())
      o << "; no answer from " << s.usage["silent"].size() << " machine(s)";
    o << "</p><table><tr><th>job</th><th>entitlement</th><th>tasks</th><th>CPU (cores)</th>"
      << "<th>of reserved</th><th>memory (MiB)</th><th>of reserved</th><th>I/O read/write "
      << "(KiB/s)</th></tr>\n";
    for (const auto& r : s.usage.value("jobs", json::array())) {
      int64_t cpu = num(r, "cpu_milli"), cpu_req = num(r, "cpu_request_milli");
      int64_t mem = num(r, "mem_bytes"), mem_req = num(r, "mem_request_mb");
      o << "<tr class=\"usage-job\" data-job=\"" << html_escape(str(r, "job")) << "\"><td>"
        << html_escape(str(r, "job")) << "</td><td>" << html_escape(str(r, "entitlement"))
        << "</td><td>" << num(r, "tasks") << "</td><td class=\"cpu\">" << cores(cpu) << " / "
        << cores(cpu_req) << "</td><td>"
        << bar(cpu, std::max<int64_t>(cpu_req, 1), "#3b7dd8", "cpu") << "</td><td class=\"mem\">"
        << mib(mem) << " / " << mem_req << "</td><td>"
        << bar(mem / (1024 * 1024), std::max<int64_t>(mem_req, 1), "#8a5cc2", "memory")
        << "</td><td>" << num(r, "io_read_bps") / 1024 << " / " << num(r, "io_write_bps") / 1024
        << "</td></tr>\n";
    }
    o << "</table>\n<table><tr><th>machine</th><th>tasks</th><th>CPU (cores)</th>"
      << "<th>of capacity</th><th>memory (MiB)</th><th>of capacity</th></tr>\n";
    size_t shown = 0;
    for (const auto& r : s.usage.value("machines", json::array())) {
      if (++shown > 20) break;  // the busiest (rows come largest CPU first)
      int64_t cpu = num(r, "cpu_milli"), cap = num(r, "cpu_capacity_milli");
      int64_t mem = num(r, "mem_bytes"), mem_cap = num(r, "mem_capacity_mb");
      o << "<tr class=\"usage-machine\" data-machine=\"" << html_escape(str(r, "machine"))
        << "\"><td>" << html_escape(str(r, "machine")) << "</td><td>" << num(r, "tasks")
        << "</td><td class=\"cpu\">" << cores(cpu) << " / " << cores(cap) << "</td><td>"
        << bar(cpu, std::max<int64_t>(cap, 1), "#3b7dd8", "cpu") << "</td><td class=\"mem\">"
        << mib(mem) << " / " << mem_cap << "</td><td>"
        << bar(mem / (1024 * 1024), std::max<int64_t>(mem_cap, 1), "#8a5cc2", "memory")
        << "</td></tr>\n";
    }
    o << "</table>";
  }
  o << "</section>\n";
}

// What happened to tasks lately (weftctl job events), newest first.
void write_events(std::ostringstream& o, const FleetSnapshot& s) {
  o << "<section id=\"events\"><h2>Recent task events</h2><table><tr><th>ago</th><th>job</th>"
    << "<th>task</th><th>machine</th><th>what</th><th>detail</th></tr>\n";
  for (const auto& e : s.events) {
    int64_t ago_s = std::max<int64_t>(0, (s.now_wall_us - num(e, "at_us")) / 1'000'000);
    o << "<tr class=\"event what-" << html_escape(str(e, "what")) << "\"><td>" << ago_s
      << " s</td><td>" << html_escape(str(e, "job")) << "</td><td>" << html_escape(str(e, "task"))
      << "</td><td>" << html_escape(str(e, "machine")) << "</td><td>" << html_escape(str(e, "what"))
      << "</td><td>" << html_escape(str(e, "detail")) << "</td></tr>\n";
  }
  o << "</table></section>\n</body></html>\n";
}

}  // namespace

std::string render_fleet_html(const FleetSnapshot& s) {
  std::ostringstream o;
  Colours ent_colour = entitlement_colours(s);
  write_head(o, s);
  write_machines(o, s, ent_colour);
  write_entitlements(o, s, ent_colour);
  write_jobs(o, s);
  write_maintenance(o, s);
  write_usage(o, s);
  write_events(o, s);
  return o.str();
}

}  // namespace weft::cp
