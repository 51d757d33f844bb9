#include "common/job_file.h"

#include <cmath>

#include "common/config.h"
#include "common/fs.h"
#include "common/job_spec.h"
#include "common/units.h"

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

// The TOML node an error's field names ("task.resources.memory_max", "task.argv[1]",
// "per_task.cpu_milli"), or the deepest table on its path that exists.
const toml::node* locate(const toml::table& root, const std::string& field) {
  std::string f = field;
  if (f.rfind("per_task.cpu_milli", 0) == 0) f = "resources.cpu";
  if (f.rfind("per_task.mem_mb", 0) == 0) f = "resources.memory";
  if (f.rfind("per_task", 0) == 0) f = "resources";
  const toml::node* at = &root;
  size_t i = 0;
  while (i < f.size() && at) {
    size_t j = f.find_first_of(".[", i);
    std::string key = f.substr(i, j == std::string::npos ? std::string::npos : j - i);
    const toml::node* next = nullptr;
    if (!key.empty() && at->is_table()) next = at->as_table()->get(key);
    if (!next) break;
    at = next;
    if (j == std::string::npos) break;
    i = j + 1;
    while (f[j] == '[' && at->is_array()) {  // "argv[1]"
      size_t close = f.find(']', j);
      if (close == std::string::npos) break;
      size_t idx = std::strtoul(f.c_str() + j + 1, nullptr, 10);
      const toml::node* elem = at->as_array()->get(idx);
      if (!elem) break;
      at = elem;
      j = close + 1;
      i = j + 1;
      if (j >= f.size() || f[j] != '.') break;
    }
  }
  return at == &root ? nullptr : at;
}

}  // namespace

Result<json> parse_job_file(const std::string& text, const std::string& name) {
  TRY_ASSIGN(TomlDoc doc, TomlDoc::parse(text, name));
  const auto& t = doc.root();
  TRY(doc.only_keys(
      t, "",
      {"name", "entitlement", "count", "max_unavailable", "machine_type", "placement", "resources",
       "task_controller", "task", "ports", "discovery_drain", "autoscale", "rebalance", "kind",
       "batch", "periodic", "canary", "auto_promote", "copies"}));
  // The file's own forms first (its tables and their types), then the one job
  // validator (common/job_spec.h) on the protocol form it becomes, its errors placed
  // at the file's line.
  json j = json::object();
  for (const char* key : {"name", "entitlement", "machine_type", "placement", "discovery_drain",
                          "kind", "auto_promote", "copies"}) {
    TRY_ASSIGN(auto v, doc.get_string(t, key));
    if (v) j[key] = *v;
  }
  if (const toml::node* r = t.get("rebalance")) {
    if (!r->is_boolean()) return field_error(doc.where(*r), "'rebalance' must be true or false");
    j["rebalance"] = r->as_boolean()->get();
  }
  for (const char* key : {"count", "max_unavailable", "canary"}) {
    TRY_ASSIGN(auto v, doc.get_int(t, key));
    if (v) j[key] = *v;
  }

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
        if (bytes.ok() && *bytes <= (uint64_t{1} << 62))
          mb = static_cast<int64_t>((*bytes + (1 << 20) - 1) >> 20);
      }
      if (mem->is_integer() && mem->as_integer()->get() >= 0)
        mb = (mem->as_integer()->get() + (1 << 20) - 1) >> 20;
      if (mb < 0)
        return field_error(doc.where(*mem), "'resources.memory' must be a size, e.g. \"256M\"");
      per_task["mem_mb"] = mb;
    }
  }
  j["per_task"] = per_task;

  // [task_controller]: its fields as they are (address, timeout_ms, when_unreachable),
  // checked by the job validator below.
  TRY_ASSIGN(const toml::table* controller, doc.get_table(t, "task_controller"));
  if (controller) j["task_controller"] = to_json(*controller);
  // [autoscale]: as it is, checked by the job validator.
  TRY_ASSIGN(const toml::table* autoscale, doc.get_table(t, "autoscale"));
  if (autoscale) j["autoscale"] = to_json(*autoscale);
  // [batch] and [periodic]: as they are, checked by the job validator.
  for (const char* key : {"batch", "periodic"}) {
    TRY_ASSIGN(const toml::table* table, doc.get_table(t, key));
    if (table) j[key] = to_json(*table);
  }
  TRY_ASSIGN(const toml::table* ports, doc.get_table(t, "ports"));
  if (ports) j["ports"] = to_json(*ports);
  TRY_ASSIGN(const toml::table* task, doc.get_table(t, "task"));
  if (task) j["task"] = to_json(*task);

  auto spec = parse_job_spec(j);
  if (!spec.ok()) {
    const Error& e = spec.error();
    const toml::node* n = locate(t, e.field);
    return field_error(n ? doc.where(*n) : name, "'" + e.field + "' " + e.message);
  }
  return j;
}

Result<json> load_job_file(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse_job_file(text, path);
}

}  // namespace weft
