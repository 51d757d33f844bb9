#include "sidekick/conflicts.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {

namespace {

// Running processes by command name.
std::vector<std::pair<int, std::string>> processes(const HostPaths& host) {
  std::vector<std::pair<int, std::string>> out;
  auto entries = list_dir(host.proc());
  if (!entries.ok()) return out;
  for (const auto& e : *entries) {
    if (e.empty() || e.find_first_not_of("0123456789") != std::string::npos) continue;
    auto comm = read_file(host.proc(e + "/comm"));
    if (comm.ok()) out.emplace_back(std::stoi(e), trim(*comm));
  }
  return out;
}

std::string sysctl_key(std::string k) {
  std::replace(k.begin(), k.end(), '/', '.');
  return trim(k);
}

}  // namespace

std::vector<Conflict> detect_conflicts(const std::vector<Knob>& knobs, const HostPaths& host) {
  std::vector<Conflict> out;
  std::set<std::string> sysctls;
  bool has_irq = false, any = !knobs.empty();
  for (const auto& k : knobs) {
    if (k.family == "sysctl") sysctls.insert(k.key);
    has_irq |= k.family == "irq";
  }
  if (!sysctls.empty()) {
    // systemd-sysctl reads these at boot (and when a package reloads them); a later file
    // of the same name wins, but for reporting every setter matters.
    std::vector<std::string> files;
    for (const char* dir : {"etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d",
                            "usr/lib/sysctl.d", "lib/sysctl.d"}) {
      std::string d = (host.root() == "/" ? "" : host.root()) + "/" + dir;
      auto names = list_dir(d);
      if (!names.ok()) continue;
      std::sort(names->begin(), names->end());
      for (const auto& n : *names)
        if (n.size() > 5 && n.compare(n.size() - 5, 5, ".conf") == 0) files.push_back(d + "/" + n);
    }
    files.push_back(host.etc("sysctl.conf"));
    for (const auto& f : files) {
      auto text = read_file(f);
      if (!text.ok()) continue;
      int line_no = 0;
      for (const auto& line : split(*text, '\n')) {
        ++line_no;
        std::string l = trim(line);
        if (l.empty() || l[0] == '#' || l[0] == ';') continue;
        if (l[0] == '-') l = l.substr(1);
        auto eq = l.find('=');
        if (eq == std::string::npos) continue;
        std::string key = sysctl_key(l.substr(0, eq));
        if (sysctls.count(key))
          out.push_back({"sysctl:" + key, f + ":" + std::to_string(line_no),
                         "systemd-sysctl sets it to '" + trim(l.substr(eq + 1)) + "' at boot"});
      }
    }
  }
  for (const auto& [pid, comm] : processes(host)) {
    if (has_irq && comm == "irqbalance")
      out.push_back({"irq", "irqbalance (pid " + std::to_string(pid) + ")",
                     "irqbalance moves IRQs weft pins"});
    if (any && comm == "tuned")
      out.push_back({"*", "tuned (pid " + std::to_string(pid) + ")",
                     "TuneD applies its own profile to the same settings"});
  }
  return out;
}

TunedImport import_tuned(const std::string& ini_text, const std::string& name) {
  TunedImport r;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> sections;
  std::vector<std::string> order;
  std::string cur;
  for (const auto& raw : split(ini_text, '\n')) {
    std::string l = trim(raw);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[' && l.back() == ']') {
      cur = trim(l.substr(1, l.size() - 2));
      if (!sections.count(cur)) order.push_back(cur);
      sections[cur];
      continue;
    }
    auto eq = l.find('=');
    if (eq == std::string::npos) continue;
    sections[cur].emplace_back(trim(l.substr(0, eq)), trim(l.substr(eq + 1)));
  }
  auto quote = [](const std::string& v) {
    std::string o = "\"";
    for (char c : v) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return o + "\"";
  };
  auto skip = [&](const std::string& sec, const std::string& k, const std::string& v,
                  const std::string& why) {
    r.unconverted.push_back(sec + "." + k + " = " + v + ": " + why);
  };
  std::string top =
      "# Converted from the TuneD profile '" + name + "' by weftctl profile import-tuned.\n";
  std::string sysctl, thp, cpu, kernel;
  for (const auto& sec : order) {
    for (const auto& [k, v] : sections[sec]) {
      bool dynamic = v.find("${") != std::string::npos || v.find("$[") != std::string::npos ||
                     (!v.empty() && (v[0] == '>' || v[0] == '<'));
      if (sec == "main") {
        if (k == "summary")
          top += "description = " + quote(v) + "\n";
        else if (k == "include")
          skip(sec, k, v, "include the converted parent profile by hand");
        else
          skip(sec, k, v, "no weft equivalent");
      } else if (dynamic) {
        skip(sec, k, v, "TuneD variables and conditional values are not converted");
      } else if (sec == "sysctl") {
        std::string key = sysctl_key(k);
        sysctl += quote(key) + " = " + quote(v) + "\n";
      } else if (sec == "vm" && (k == "transparent_hugepages" || k == "transparent_hugepage")) {
        thp += "enabled = " + quote(v) + "\n";
      } else if (sec == "vm" && k == "transparent_hugepage.defrag") {
        thp += "defrag = " + quote(v) + "\n";
      } else if (sec == "cpu" && k == "governor") {
        std::string g = split(v, '|')[0];
        cpu += "governor = " + quote(trim(g)) + "\n";
      } else if (sec == "cpu" && k == "energy_performance_preference") {
        cpu += "energy_performance_preference = " + quote(trim(split(v, '|')[0])) + "\n";
      } else if (sec == "sysfs" && k == "/sys/kernel/mm/transparent_hugepage/enabled") {
        thp += "enabled = " + quote(v) + "\n";
      } else if (sec == "sysfs" && k == "/sys/kernel/mm/transparent_hugepage/defrag") {
        thp += "defrag = " + quote(v) + "\n";
      } else if (sec == "sysfs" && k == "/sys/devices/system/cpu/intel_pstate/no_turbo") {
        cpu += std::string("turbo = ") + (v == "1" ? "false" : "true") + "\n";
      } else if (sec == "sysfs" && k.rfind("/proc/sys/", 0) == 0) {
        sysctl += quote(sysctl_key(k.substr(10))) + " = " + quote(v) + "\n";
      } else if (sec == "bootloader" && k == "cmdline") {
        std::string args;
        for (const auto& a : split(v, ' '))
          if (!a.empty()) args += (args.empty() ? "" : ", ") + quote(a);
        kernel += "cmdline = [" + args + "]\n";
      } else {
        skip(sec, k, v, "no weft knob for this TuneD setting");
      }
    }
  }
  r.toml = top;
  if (!sysctl.empty()) r.toml += "\n[sysctl]\n" + sysctl;
  if (!thp.empty()) r.toml += "\n[thp]\n" + thp;
  if (!cpu.empty()) r.toml += "\n[cpu]\n" + cpu;
  if (!kernel.empty()) r.toml += "\n[kernel]\n" + kernel;
  return r;
}

}  // namespace weft::sidekick
