#include "sidekick/profile.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/config.h"
#include "common/cp_link.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/units.h"

namespace weft::sidekick {

namespace {

// Apply order: what others depend on first. Channels before IRQ affinity, controllers
// before anything that might create cgroups, runtime tunables before slow allocations.
constexpr int kOrderCgroup = 10, kOrderKernel = 20, kOrderSysctl = 30, kOrderThp = 40,
              kOrderCpu = 50, kOrderNicMtu = 60, kOrderNicQueue = 61, kOrderIrq = 70,
              kOrderHugepages = 80;

std::string scalar_text(const toml::node& n) {
  if (n.is_string()) return n.as_string()->get();
  if (n.is_integer()) return std::to_string(n.as_integer()->get());
  if (n.is_boolean()) return n.as_boolean()->get() ? "1" : "0";
  if (n.is_floating_point()) return std::to_string(n.as_floating_point()->get());
  return "";
}

std::string collapse_ws(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : trim(s)) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

class Compiler {
 public:
  Compiler(const TomlDoc& doc, Profile* out) : doc_(doc), out_(out) {}

  Status run() {
    const auto& t = doc_.root();
    TRY(doc_.only_keys(t, "",
                       {"include", "description", "sysctl", "hugepages", "thp", "cpu", "cgroup",
                        "kernel", "nic", "irq"}));
    TRY_ASSIGN(auto desc, doc_.get_string(t, "description"));
    if (desc) out_->description = *desc;
    if (const toml::node* inc = t.get("include")) {
      const toml::array* arr = inc->as_array();
      if (!arr) return field_error(doc_.where(*inc), "'include' must be a list of profile names");
      for (const auto& e : *arr) {
        if (!e.is_string()) return field_error(doc_.where(e), "'include' entries must be names");
        out_->includes.push_back(e.as_string()->get());
      }
    }
    TRY(sysctl(t));
    TRY(hugepages(t));
    TRY(thp(t));
    TRY(cpu(t));
    TRY(cgroup(t));
    TRY(kernel(t));
    TRY(nic(t));
    TRY(irq(t));
    return {};
  }

 private:
  // A setting is a scalar, or a table {value|min|count|cpus..., best_effort}.
  struct Setting {
    const toml::node* value = nullptr;
    bool required = true;
    bool at_least = false;
    const toml::table* table = nullptr;
  };

  Result<Setting> setting(const toml::node& n, const std::string& name,
                          const char* value_key = "value") {
    Setting s;
    if (const toml::table* tb = n.as_table()) {
      s.table = tb;
      TRY(doc_.only_keys(*tb, name + ".",
                         {value_key, "min", "best_effort", "node", "deadline", "wait"}));
      TRY_ASSIGN(auto be, doc_.get_bool(*tb, "best_effort"));
      s.required = !be.value_or(false);
      if (const toml::node* v = tb->get(value_key)) s.value = v;
      if (const toml::node* m = tb->get("min")) {
        if (s.value)
          return field_error(doc_.where(n), "'" + name + "': give either " + value_key + " or min");
        if (!m->is_integer())
          return field_error(doc_.where(*m), "'" + name + ".min' must be an integer");
        s.value = m;
        s.at_least = true;
      }
      if (!s.value) return field_error(doc_.where(n), "'" + name + "' needs a " + value_key);
    } else {
      s.value = &n;
    }
    if (!(s.value->is_string() || s.value->is_integer() || s.value->is_boolean()))
      return field_error(doc_.where(*s.value),
                         "'" + name + "' must be a string, integer or boolean");
    return s;
  }

  Knob base(const std::string& family, const std::string& key, int order, const toml::node& at) {
    Knob k;
    k.family = family;
    k.key = key;
    k.id = family + ":" + key;
    k.order = order;
    k.source = doc_.where(at);
    return k;
  }

  void add(Knob k) {
    // Later definitions (the including profile) replace earlier ones (the included).
    auto it = std::find_if(out_->knobs.begin(), out_->knobs.end(),
                           [&](const Knob& x) { return x.id == k.id; });
    if (it != out_->knobs.end())
      *it = std::move(k);
    else
      out_->knobs.push_back(std::move(k));
  }

  Status sysctl(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "sysctl"));
    if (!tb) return {};
    for (const auto& [k, v] : *tb) {
      std::string key(k.str());
      if (key.empty() || key.find("..") != std::string::npos ||
          key.find('/') != std::string::npos || key.front() == '.' || key.back() == '.')
        return field_error(doc_.where(v),
                           "'" + key + "' is not a sysctl name (e.g. net.core.somaxconn)");
      TRY_ASSIGN(Setting s, setting(v, "sysctl." + key));
      Knob knob = base("sysctl", key, kOrderSysctl, v);
      knob.value = collapse_ws(scalar_text(*s.value));
      knob.required = s.required;
      knob.cmp = s.at_least ? Comparator::kAtLeast : Comparator::kEqual;
      add(std::move(knob));
    }
    return {};
  }

  Status hugepages(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "hugepages"));
    if (!tb) return {};
    for (const auto& [k, v] : *tb) {
      std::string size(k.str());
      auto bytes = parse_size(size);
      if (!bytes.ok() || *bytes < (1u << 20) || (*bytes & (*bytes - 1)) != 0)
        return field_error(doc_.where(v), "'" + size + "' is not a huge page size (2M, 1G)");
      TRY_ASSIGN(Setting s, setting(v, "hugepages." + size, "count"));
      if (!s.value->is_integer() || s.value->as_integer()->get() < 0)
        return field_error(doc_.where(*s.value),
                           "'hugepages." + size + "' count must be a non-negative integer");
      std::string key = std::to_string(*bytes / 1024) + "kB";
      if (s.table) {
        TRY_ASSIGN(auto node, doc_.get_int(*s.table, "node"));
        if (node) {
          if (*node < 0 || *node > 1023)
            return field_error(doc_.where(v), "'node' must be a NUMA node number");
          key += "/node" + std::to_string(*node);
        }
      }
      Knob knob = base("hugepages", key, kOrderHugepages, v);
      knob.value = scalar_text(*s.value);
      knob.required = s.required;
      knob.klass = KnobClass::kSlow;
      if (s.table) {
        TRY_ASSIGN(auto deadline, doc_.get_string(*s.table, "deadline"));
        if (deadline) {
          auto us = parse_duration_us(*deadline);
          if (!us.ok())
            return field_error(doc_.where(*s.table->get("deadline")), us.error().message);
          knob.deadline_us = *us;
        }
        TRY_ASSIGN(auto wait, doc_.get_bool(*s.table, "wait"));
        knob.wait = wait.value_or(false);
      }
      add(std::move(knob));
    }
    return {};
  }

  Status choice(const toml::table& tb, const std::string& family, const char* key,
                std::initializer_list<const char*> allowed, int order) {
    const toml::node* v = tb.get(key);
    if (!v) return {};
    TRY_ASSIGN(Setting s, setting(*v, family + "." + key));
    std::string val = scalar_text(*s.value);
    if (allowed.size() &&
        std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return val == a; })) {
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return field_error(doc_.where(*s.value),
                         "'" + family + "." + key + "' must be one of " + list);
    }
    Knob knob = base(family, key, order, *v);
    knob.value = val;
    knob.required = s.required;
    add(std::move(knob));
    return {};
  }

  Status thp(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "thp"));
    if (!tb) return {};
    TRY(doc_.only_keys(*tb, "thp.", {"enabled", "defrag"}));
    TRY(choice(*tb, "thp", "enabled", {"always", "madvise", "never"}, kOrderThp));
    TRY(choice(*tb, "thp", "defrag", {"always", "defer", "defer+madvise", "madvise", "never"},
               kOrderThp));
    return {};
  }

  Status cpu(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "cpu"));
    if (!tb) return {};
    TRY(doc_.only_keys(*tb, "cpu.", {"turbo", "governor", "energy_performance_preference"}));
    if (const toml::node* v = tb->get("turbo")) {
      TRY_ASSIGN(Setting s, setting(*v, "cpu.turbo"));
      if (!s.value->is_boolean())
        return field_error(doc_.where(*s.value), "'cpu.turbo' must be true or false");
      Knob knob = base("cpu", "turbo", kOrderCpu, *v);
      knob.value = s.value->as_boolean()->get() ? "on" : "off";
      knob.required = s.required;
      add(std::move(knob));
    }
    TRY(choice(*tb, "cpu", "governor", {}, kOrderCpu));
    TRY(choice(*tb, "cpu", "energy_performance_preference", {}, kOrderCpu));
    return {};
  }

  Status cgroup(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "cgroup"));
    if (!tb) return {};
    TRY(doc_.only_keys(*tb, "cgroup.", {"enable", "disable", "best_effort"}));
    TRY_ASSIGN(auto be, doc_.get_bool(*tb, "best_effort"));
    for (const char* which : {"enable", "disable"}) {
      const toml::node* n = tb->get(which);
      if (!n) continue;
      const toml::array* arr = n->as_array();
      if (!arr)
        return field_error(doc_.where(*n),
                           std::string("'cgroup.") + which + "' must be a list of controllers");
      for (const auto& e : *arr) {
        static const std::set<std::string> known = {"cpu",  "cpuset",  "io",   "memory",
                                                    "pids", "hugetlb", "misc", "rdma"};
        if (!e.is_string() || !known.count(e.as_string()->get()))
          return field_error(
              doc_.where(e),
              "unknown cgroup controller (cpu, cpuset, io, memory, pids, hugetlb, misc, rdma)");
        Knob knob = base("cgroup", e.as_string()->get(), kOrderCgroup, e);
        knob.value = std::string(which) == "enable" ? "on" : "off";
        knob.required = !be.value_or(false);
        add(std::move(knob));
      }
    }
    return {};
  }

  Status kernel(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "kernel"));
    if (!tb) return {};
    TRY(doc_.only_keys(*tb, "kernel.", {"cmdline"}));
    const toml::node* n = tb->get("cmdline");
    if (!n) return {};
    const toml::array* arr = n->as_array();
    if (!arr) return field_error(doc_.where(*n), "'kernel.cmdline' must be a list of arguments");
    for (const auto& e : *arr) {
      if (!e.is_string() || e.as_string()->get().empty() ||
          e.as_string()->get().find(' ') != std::string::npos)
        return field_error(doc_.where(e),
                           "a kernel argument is one word, e.g. \"transparent_hugepage=madvise\"");
      std::string arg = e.as_string()->get();
      Knob knob = base("kernel", arg, kOrderKernel, e);
      knob.value = "present";
      knob.klass = KnobClass::kReboot;
      add(std::move(knob));
    }
    return {};
  }

  Status nic(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "nic"));
    if (!tb) return {};
    for (const auto& [k, v] : *tb) {
      std::string glob(k.str());
      const toml::table* nt = v.as_table();
      if (!nt)
        return field_error(doc_.where(v), "'nic." + glob + "' must be a table of link settings");
      TRY(doc_.only_keys(*nt, "nic." + glob + ".",
                         {"mtu", "txqueuelen", "channels", "rings", "features", "best_effort"}));
      TRY_ASSIGN(auto be, doc_.get_bool(*nt, "best_effort"));
      auto add_field = [&](const std::string& field, const toml::node& n, int64_t min, int64_t max,
                           int order) -> Status {
        if (!n.is_integer() || n.as_integer()->get() < min || n.as_integer()->get() > max)
          return field_error(doc_.where(n), "'nic." + glob + "." + field +
                                                "' must be an integer from " + std::to_string(min) +
                                                " to " + std::to_string(max));
        Knob knob = base("nic", glob + "/" + field, order, n);
        knob.value = std::to_string(n.as_integer()->get());
        knob.klass = KnobClass::kDisruptive;
        knob.required = !be.value_or(false);
        add(std::move(knob));
        return {};
      };
      if (const toml::node* n = nt->get("mtu"))
        TRY(add_field("mtu", *n, 68, 65535 * 4, kOrderNicMtu));
      if (const toml::node* n = nt->get("txqueuelen"))
        TRY(add_field("txqueuelen", *n, 0, 1 << 20, kOrderNicQueue));
      if (const toml::node* n = nt->get("channels")) {
        const toml::table* ct = n->as_table();
        if (!ct)
          return field_error(
              doc_.where(*n),
              "'nic." + glob + ".channels' must be a table (combined, rx, tx, other)");
        TRY(doc_.only_keys(*ct, "nic." + glob + ".channels.", {"combined", "rx", "tx", "other"}));
        // Channel counts change the set of queue IRQs: they come before IRQ affinity.
        for (const auto& [ck, cv] : *ct)
          TRY(add_field("channels." + std::string(ck.str()), cv, 0, 4096, kOrderNicQueue));
      }
      if (const toml::node* n = nt->get("rings")) {
        const toml::table* rt = n->as_table();
        if (!rt)
          return field_error(
              doc_.where(*n),
              "'nic." + glob + ".rings' must be a table (rx, tx, rx-mini, rx-jumbo)");
        TRY(doc_.only_keys(*rt, "nic." + glob + ".rings.", {"rx", "tx", "rx-mini", "rx-jumbo"}));
        for (const auto& [rk, rv] : *rt)
          TRY(add_field("rings." + std::string(rk.str()), rv, 1, 1 << 20, kOrderNicQueue));
      }
      if (const toml::node* n = nt->get("features")) {
        const toml::table* ft = n->as_table();
        if (!ft)
          return field_error(doc_.where(*n),
                             "'nic." + glob + ".features' must map feature names to true/false");
        for (const auto& [fk, fv] : *ft) {
          std::string name(fk.str());
          if (!fv.is_boolean() || name.empty() || name.find_first_of(" /") != std::string::npos)
            return field_error(doc_.where(fv),
                               "'nic." + glob + ".features." + name + "' must be true or false");
          Knob knob = base("nic", glob + "/features." + name, kOrderNicQueue, fv);
          knob.value = fv.as_boolean()->get() ? "on" : "off";
          knob.klass = KnobClass::kDisruptive;
          knob.required = !be.value_or(false);
          add(std::move(knob));
        }
      }
    }
    return {};
  }

  Status irq(const toml::table& t) {
    TRY_ASSIGN(const toml::table* tb, doc_.get_table(t, "irq"));
    if (!tb) return {};
    for (const auto& [k, v] : *tb) {
      std::string glob(k.str());
      const toml::table* it = v.as_table();
      if (!it) return field_error(doc_.where(v), "'irq." + glob + "' must be a table with cpus");
      TRY(doc_.only_keys(*it, "irq." + glob + ".", {"cpus", "best_effort"}));
      TRY_ASSIGN(auto cpus, doc_.get_string(*it, "cpus"));
      if (!cpus || !parse_cpulist(*cpus))
        return field_error(doc_.where(v),
                           "'irq." + glob + ".cpus' must be a CPU list such as \"0-3\"");
      TRY_ASSIGN(auto be, doc_.get_bool(*it, "best_effort"));
      Knob knob = base("irq", glob, kOrderIrq, v);
      knob.value = *cpus;
      knob.cmp = Comparator::kCpuList;
      knob.required = !be.value_or(false);
      add(std::move(knob));
    }
    return {};
  }

  const TomlDoc& doc_;
  Profile* out_;
};

Status load_into(const ProfilePath& path, const std::string& name, Profile* out,
                 std::vector<std::string>* stack) {
  if (!valid_profile_name(name))
    return field_error("profile", "'" + name + "' is not a profile name");
  if (std::find(stack->begin(), stack->end(), name) != stack->end())
    return make_error("include cycle: " + [&] {
      std::string s;
      for (const auto& x : *stack) s += x + " -> ";
      return s + name;
    }());
  std::string file;
  for (const auto& d : path.dirs) {
    if (path_exists(d + "/" + name + ".toml")) {
      file = d + "/" + name + ".toml";
      break;
    }
  }
  if (file.empty()) return make_error("no profile named '" + name + "'");
  TRY_ASSIGN(TomlDoc doc, TomlDoc::load(file));
  Profile own;
  TRY(Compiler(doc, &own).run());
  stack->push_back(name);
  for (const auto& inc : own.includes)
    TRY_CTX(load_into(path, inc, out, stack), file + ": include '" + inc + "'");
  stack->pop_back();
  out->files.push_back(file);
  for (auto& k : own.knobs) {
    auto it = std::find_if(out->knobs.begin(), out->knobs.end(),
                           [&](const Knob& x) { return x.id == k.id; });
    if (it != out->knobs.end())
      *it = std::move(k);
    else
      out->knobs.push_back(std::move(k));
  }
  if (!own.description.empty()) out->description = own.description;
  return {};
}

}  // namespace

Result<Profile> parse_profile_text(const std::string& text, const std::string& file_name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, file_name));
  Profile p;
  TRY(Compiler(doc, &p).run());
  std::sort(p.knobs.begin(), p.knobs.end(), [](const Knob& a, const Knob& b) {
    return a.order != b.order ? a.order < b.order : a.id < b.id;
  });
  return p;
}

Result<Profile> load_profile(const ProfilePath& path, const std::string& name) {
  Profile p;
  std::vector<std::string> stack;
  TRY(load_into(path, name, &p, &stack));
  p.name = name;
  std::sort(p.knobs.begin(), p.knobs.end(), [](const Knob& a, const Knob& b) {
    return a.order != b.order ? a.order < b.order : a.id < b.id;
  });
  return p;
}

std::vector<std::string> list_profiles(const ProfilePath& path) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const auto& d : path.dirs) {
    auto names = list_dir(d);
    if (!names.ok()) continue;
    std::sort(names->begin(), names->end());
    for (const auto& n : *names) {
      if (n.size() < 6 || n.compare(n.size() - 5, 5, ".toml") != 0) continue;
      std::string name = n.substr(0, n.size() - 5);
      if (seen.insert(name).second) out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

const char* comparator_name(Comparator c) {
  switch (c) {
    case Comparator::kEqual:
      return "equal";
    case Comparator::kAtLeast:
      return "at-least";
    case Comparator::kCpuList:
      return "cpulist";
    case Comparator::kMask:
      return "mask";
  }
  return "equal";
}

const char* class_name(KnobClass k) {
  switch (k) {
    case KnobClass::kRuntime:
      return "runtime";
    case KnobClass::kDisruptive:
      return "disruptive";
    case KnobClass::kSlow:
      return "slow";
    case KnobClass::kReboot:
      return "reboot";
  }
  return "runtime";
}

std::optional<std::vector<int>> parse_cpulist(const std::string& s) {
  std::vector<int> out;
  std::string t = trim(s);
  if (t.empty()) return out;
  for (const auto& part : split(t, ',')) {
    auto r = split(trim(part), '-');
    if (r.empty() || r.size() > 2) return std::nullopt;
    for (const auto& x : r)
      if (x.empty() || x.size() > 5 || x.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    int a = std::stoi(r[0]), b = r.size() == 2 ? std::stoi(r[1]) : a;
    if (b < a) return std::nullopt;
    for (int i = a; i <= b; ++i) out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

static std::optional<std::vector<bool>> parse_mask(const std::string& s) {
  std::vector<bool> bits;  // least significant first
  std::string t;
  for (char c : trim(s))
    if (c != ',') t += c;
  for (auto it = t.rbegin(); it != t.rend(); ++it) {
    if (!std::isxdigit(static_cast<unsigned char>(*it))) return std::nullopt;
    int v = std::stoi(std::string(1, *it), nullptr, 16);
    for (int i = 0; i < 4; ++i) bits.push_back((v >> i) & 1);
  }
  while (!bits.empty() && !bits.back()) bits.pop_back();
  return bits;
}

bool knob_satisfied(Comparator cmp, const std::string& desired, const std::string& current) {
  switch (cmp) {
    case Comparator::kEqual:
      return collapse_ws(desired) == collapse_ws(current);
    case Comparator::kAtLeast: {
      char* e1 = nullptr;
      char* e2 = nullptr;
      long long d = std::strtoll(desired.c_str(), &e1, 10);
      long long c = std::strtoll(trim(current).c_str(), &e2, 10);
      return e1 && !*e1 && !trim(current).empty() && c >= d;
    }
    case Comparator::kCpuList: {
      auto a = parse_cpulist(desired), b = parse_cpulist(current);
      return a && b && *a == *b;
    }
    case Comparator::kMask: {
      auto a = parse_mask(desired), b = parse_mask(current);
      return a && b && *a == *b;
    }
  }
  return false;
}

}  // namespace weft::sidekick
