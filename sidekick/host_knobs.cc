#include "sidekick/host_knobs.h"

#include <fnmatch.h>

#include <algorithm>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::sidekick {

namespace {

// "always [madvise] never" -> "madvise"
std::string bracketed(const std::string& s) {
  auto a = s.find('['), b = s.find(']');
  if (a == std::string::npos || b == std::string::npos || b < a) return trim(s);
  return s.substr(a + 1, b - a - 1);
}

}  // namespace

std::vector<std::string> HostKnobs::per_cpu_files(const std::string& name) const {
  std::vector<std::string> out;
  auto cpus = list_dir(host_.sys("devices/system/cpu"));
  if (!cpus.ok()) return out;
  std::sort(cpus->begin(), cpus->end());
  for (const auto& c : *cpus) {
    if (c.size() < 4 || c.rfind("cpu", 0) != 0 ||
        c.find_first_not_of("0123456789", 3) != std::string::npos)
      continue;
    std::string f = host_.sys("devices/system/cpu/" + c + "/cpufreq/" + name);
    if (path_exists(f)) out.push_back(f);
  }
  return out;
}

Result<std::string> HostKnobs::path_of(const std::string& family, const std::string& key) const {
  if (family == "sysctl") {
    std::string rel = key;
    std::replace(rel.begin(), rel.end(), '.', '/');
    return host_.proc("sys/" + rel);
  }
  if (family == "thp") return host_.sys("kernel/mm/transparent_hugepage/" + key);
  if (family == "hugepages") {
    auto slash = key.find('/');
    if (slash == std::string::npos)
      return host_.sys("kernel/mm/hugepages/hugepages-" + key + "/nr_hugepages");
    return host_.sys("devices/system/node/" + key.substr(slash + 1) + "/hugepages/hugepages-" +
                     key.substr(0, slash) + "/nr_hugepages");
  }
  if (family == "irq") return host_.proc("irq/" + key + "/smp_affinity_list");
  return errno_error(EINVAL, "no path for " + family + ":" + key);
}

Result<std::vector<Knob>> HostKnobs::expand(const std::vector<Knob>& knobs) const {
  std::vector<Knob> out;
  for (const auto& k : knobs) {
    if (k.family != "nic" && k.family != "irq") {
      out.push_back(k);
      continue;
    }
    std::vector<std::string> matches;
    std::string glob = k.family == "nic" ? k.key.substr(0, k.key.find('/')) : k.key;
    if (k.family == "nic") {
      auto links = links_->names();
      if (links.ok())
        for (const auto& l : *links)
          if (fnmatch(glob.c_str(), l.c_str(), 0) == 0) matches.push_back(l);
    } else {
      // /proc/interrupts: "  24:   0   5   PCI-MSI 49153-edge   virtio0-input.0"; the IRQ's
      // action names are the last column (comma-separated when shared).
      auto text = read_file(host_.proc("interrupts"));
      if (text.ok()) {
        for (const auto& line : split(*text, '\n')) {
          auto colon = line.find(':');
          if (colon == std::string::npos) continue;
          std::string num = trim(line.substr(0, colon));
          if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
          auto fields = split(trim(line.substr(colon + 1)), ' ');
          fields.erase(std::remove(fields.begin(), fields.end(), ""), fields.end());
          if (fields.empty()) continue;
          for (const auto& name : split(fields.back(), ','))
            if (fnmatch(glob.c_str(), trim(name).c_str(), 0) == 0) {
              matches.push_back(num);
              break;
            }
        }
      }
    }
    if (matches.empty()) {
      if (k.required)
        return field_error(k.source, k.family + " '" + glob + "' matches nothing on this machine");
      continue;
    }
    std::sort(matches.begin(), matches.end());
    for (const auto& m : matches) {
      Knob c = k;
      c.key = k.family == "nic" ? m + k.key.substr(k.key.find('/')) : m;
      c.id = k.family + ":" + c.key;
      out.push_back(std::move(c));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Knob& a, const Knob& b) { return a.order < b.order; });
  return out;
}

Result<std::string> HostKnobs::read(const std::string& family, const std::string& key) const {
  if (family == "cpu") {
    if (key == "turbo") {
      std::string no_turbo = host_.sys("devices/system/cpu/intel_pstate/no_turbo");
      if (path_exists(no_turbo)) {
        TRY_ASSIGN(std::string v, read_file(no_turbo));
        return std::string(trim(v) == "1" ? "off" : "on");
      }
      std::string boost = host_.sys("devices/system/cpu/cpufreq/boost");
      if (path_exists(boost)) {
        TRY_ASSIGN(std::string v, read_file(boost));
        return std::string(trim(v) == "1" ? "on" : "off");
      }
      return errno_error(ENOENT, "no Turbo control (intel_pstate/no_turbo or cpufreq/boost)");
    }
    auto files = per_cpu_files(key == "governor" ? "scaling_governor" : key);
    if (files.empty()) return errno_error(ENOENT, "no cpufreq " + key + " files");
    std::string first;
    for (const auto& f : files) {
      TRY_ASSIGN(std::string v, read_file(f));
      if (first.empty())
        first = trim(v);
      else if (trim(v) != first)
        return std::string("mixed");
    }
    return first;
  }
  if (family == "cgroup") {
    TRY_ASSIGN(std::string v, read_file(workload_cgroup_ + "/cgroup.subtree_control"));
    auto ctrls = split(trim(v), ' ');
    return std::string(std::find(ctrls.begin(), ctrls.end(), key) != ctrls.end() ? "on" : "off");
  }
  if (family == "nic") {
    auto slash = key.find('/');
    return links_->read(key.substr(0, slash), key.substr(slash + 1));
  }
  if (family == "kernel") {
    TRY_ASSIGN(std::string cmdline, read_file(host_.proc("cmdline")));
    for (const auto& w : split(trim(cmdline), ' '))
      if (w == key) return std::string("present");
    return std::string("absent");
  }
  TRY_ASSIGN(std::string path, path_of(family, key));
  TRY_ASSIGN(std::string v, read_file(path));
  if (family == "thp") return bracketed(v);
  std::string t = trim(v);
  std::replace(t.begin(), t.end(), '\t', ' ');
  return t;
}

Status HostKnobs::write(const std::string& family, const std::string& key,
                        const std::string& value) {
  if (family == "kernel")
    return errno_error(EOPNOTSUPP, "kernel arguments take effect at the next boot");
  if (family == "cpu") {
    if (key == "turbo") {
      std::string no_turbo = host_.sys("devices/system/cpu/intel_pstate/no_turbo");
      if (path_exists(no_turbo)) return write_file(no_turbo, value == "on" ? "0" : "1");
      std::string boost = host_.sys("devices/system/cpu/cpufreq/boost");
      if (path_exists(boost)) return write_file(boost, value == "on" ? "1" : "0");
      return errno_error(ENOENT, "no Turbo control (intel_pstate/no_turbo or cpufreq/boost)");
    }
    auto files = per_cpu_files(key == "governor" ? "scaling_governor" : key);
    if (files.empty()) return errno_error(ENOENT, "no cpufreq " + key + " files");
    for (const auto& f : files) TRY(write_file(f, value));
    return {};
  }
  if (family == "nic") {
    auto slash = key.find('/');
    return links_->write(key.substr(0, slash), key.substr(slash + 1), value);
  }
  if (family == "cgroup")
    return write_file(workload_cgroup_ + "/cgroup.subtree_control",
                      (value == "on" ? "+" : "-") + key);
  TRY_ASSIGN(std::string path, path_of(family, key));
  return write_file(path, value);
}

}  // namespace weft::sidekick
