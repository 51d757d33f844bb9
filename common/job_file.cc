#include "common/job_file.h"

#include <cmath>

#include "common/config.h"
#include "common/fs.h"

namespace weft {

using json = nlohmann::json;

namespace {

// TOML values as JSON (the task table is the agent's spec, checked by the agent).
json to_json(const toml::node& n) {
  if (const auto* t = n.as_table()) {
    json o = json::object();
    for (const auto& [k, v] : *t) o[std::string(k.str())] = to_json(v);
    return o;
  }
  if (const auto* a = n.as_array()) {
    json arr = json::array();
    for (const auto& v : *a) arr.push_back(to_json(v));
    return arr;
  }
  if (const auto* s = n.as_string()) return s->get();
  if (const auto* i = n.as_integer()) return i->get();
  if (const auto* f = n.as_floating_point()) return f->get();
  if (const auto* b = n.as_boolean()) return b->get();
  return n.is_value() ? json(std::string(n.value_or<std::string_view>(""))) : json();
}

bool valid_job_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

}  // namespace

Result<json> parse_job_file(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(
      t, "",
      {"name", "entitlement", "count", "max_unavailable", "machine_type", "resources", "task"}));
  auto at = [&](const toml::table& tab, const char* key) {
    return tab.get(key) ? doc.where(*tab.get(key)) : name;
  };
  json j = json::object();
  TRY_ASSIGN(auto job, doc.get_string(t, "name"));
  if (!job || !valid_job_name(*job))
    return field_error(at(t, "name"), "'name' is required: 1-64 letters, digits, '-' or '_'");
  j["name"] = *job;
  TRY_ASSIGN(auto ent, doc.get_string(t, "entitlement"));
  if (!ent || ent->empty())
    return field_error(at(t, "entitlement"), "'entitlement' is required: an entitlement's name");
  j["entitlement"] = *ent;
  for (auto [key, min] : {std::pair{"count", 0}, {"max_unavailable", 1}}) {
    TRY_ASSIGN(auto v, doc.get_int(t, key));
    if (!v) continue;
    if (*v < min || *v > 100000)
      return field_error(at(t, key),
                         std::string("'") + key + "' must be " + std::to_string(min) + "..100000");
    j[key] = *v;
  }
  TRY_ASSIGN(auto type, doc.get_string(t, "machine_type"));
  if (type) j["machine_type"] = *type;

  TRY_ASSIGN(const toml::table* res, doc.get_table(t, "resources"));
  json per_task = {{"cpu_milli", 0}, {"mem_mb", 0}};
  if (res) {
    TRY(doc.only_keys(*res, "resources.", {"cpu", "memory"}));
    if (const toml::node* cpu = res->get("cpu")) {
      double cores = -1;
      if (cpu->is_integer()) cores = static_cast<double>(cpu->as_integer()->get());
      if (cpu->is_floating_point()) cores = cpu->as_floating_point()->get();
      if (const auto* s = cpu->as_string()) {
        std::string v = s->get();
        char* end = nullptr;
        double x = std::strtod(v.c_str(), &end);
        if (end && end != v.c_str() && std::string(end) == "m")
          cores = x / 1000;
        else if (end && end != v.c_str() && *end == '\0')
          cores = x;
      }
      if (!(cores >= 0) || cores > 100000 || std::isnan(cores))
        return field_error(doc.where(*cpu), "'resources.cpu' must be cores, e.g. 0.5 or \"500m\"");
      per_task["cpu_milli"] = static_cast<int64_t>(std::llround(cores * 1000));
    }
    if (const toml::node* mem = res->get("memory")) {
      int64_t mb = -1;
      if (const auto* s = mem->as_string()) {
        auto bytes = parse_size(s->get());
        if (bytes.ok()) mb = static_cast<int64_t>((*bytes + (1 << 20) - 1) >> 20);
      }
      if (mb < 0)
        return field_error(doc.where(*mem), "'resources.memory' must be a size, e.g. \"256M\"");
      per_task["mem_mb"] = mb;
    }
  }
  j["per_task"] = per_task;

  TRY_ASSIGN(const toml::table* task, doc.get_table(t, "task"));
  if (!task) return field_error(name, "a [task] table is required (the task to run)");
  for (const char* forbidden : {"name", "owner"})
    if (task->get(forbidden))
      return field_error(at(*task, forbidden), std::string("'task.") + forbidden +
                                                   "' is set by the control plane (each task "
                                                   "gets its own id)");
  const toml::node* argv = task->get("argv");
  const toml::array* arr = argv ? argv->as_array() : nullptr;
  bool ok = arr && !arr->empty();
  if (ok)
    for (const auto& a : *arr) ok = ok && a.is_string();
  if (!ok)
    return field_error(argv ? doc.where(*argv) : at(t, "task"),
                       "'task.argv' must be a non-empty list of strings");
  j["task"] = to_json(*task);
  return j;
}

Result<json> load_job_file(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_job_file(text, path);
}

}  // namespace weft
