#include "controlplane/region/records.h"

#include <nlohmann/json.hpp>

namespace weft::cp {

using json = nlohmann::json;

std::string entitlement_home_key(const std::string& prefix, const std::string& name) {
  return prefix + "entitlements/" + name;
}

std::string entitlement_home_value(const std::string& shard) {
  return json{{"shard", shard}}.dump();
}

namespace {

// A stored record: a JSON object of at most 4 KiB (hostile input).
Result<json> parse_record(const std::string& key, const std::string& value) {
  if (value.size() > 4096) return field_error(key, "record larger than 4 KiB");
  json j = json::parse(value, nullptr, false);
  if (!j.is_object()) return field_error(key, "not a JSON object");
  return j;
}

}  // namespace

Result<std::string> parse_entitlement_home(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  if (!j.contains("shard") || !j["shard"].is_string())
    return field_error(key, "'shard' must be a shard id");
  std::string shard = j["shard"].get<std::string>();
  TRY(check_shard_id(key + ": shard", shard));
  return shard;
}

Result<std::map<std::string, std::string>> parse_entitlement_homes(
    const std::string& prefix, const std::vector<etcd::Kv>& kvs) {
  std::map<std::string, std::string> out;
  std::string base = prefix + "entitlements/";
  for (const etcd::Kv& kv : kvs) {
    if (kv.key.rfind(base, 0) != 0) return field_error(kv.key, "outside " + base);
    std::string name = kv.key.substr(base.size());
    TRY(check_machine_name(kv.key, name, true));  // an entitlement's name: the same rules
    TRY_ASSIGN(std::string shard, parse_entitlement_home(kv.key, kv.value));
    out[name] = std::move(shard);
  }
  return out;
}

std::string machine_holder_key(const std::string& prefix, const std::string& machine) {
  return prefix + "machines/" + machine;
}

std::string machine_holder_value(const MachineHolder& h) {
  json j{{"holder", h.holder}, {"epoch", h.epoch}};
  if (!h.broker.empty()) j["broker"] = h.broker;
  return j.dump();
}

Result<MachineHolder> parse_machine_holder(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  MachineHolder h;
  if (!j.contains("holder") || !j["holder"].is_string())
    return field_error(key, "'holder' must be a shard id or \"\"");
  h.holder = j["holder"].get<std::string>();
  if (!h.holder.empty()) TRY(check_shard_id(key + ": holder", h.holder));
  if (!j.contains("epoch") || !j["epoch"].is_number_unsigned())
    return field_error(key, "'epoch' must be a whole number");
  h.epoch = j["epoch"].get<uint64_t>();
  if (j.contains("broker")) {
    if (!j["broker"].is_string()) return field_error(key, "'broker' must be a broker group");
    h.broker = j["broker"].get<std::string>();
    TRY(check_shard_id(key + ": broker", h.broker));
  }
  return h;
}

std::string move_key(const std::string& prefix, const std::string& name) {
  return prefix + "moves/" + name;
}

std::string move_value(const MoveRecord& m) {
  json j{{"from", m.from},     {"to", m.to},           {"step", m.step},
         {"driver", m.driver}, {"beat_us", m.beat_us}, {"started_us", m.started_us}};
  if (!m.why.empty()) j["why"] = m.why.substr(0, 1024);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<MoveRecord> parse_move(const std::string& key, const std::string& value) {
  TRY_ASSIGN(json j, parse_record(key, value));
  MoveRecord m;
  auto text = [&](const char* k, std::string* out, bool required) -> Status {
    if (!j.contains(k)) {
      if (required) return field_error(key, std::string("'") + k + "' is required");
      return {};
    }
    if (!j[k].is_string()) return field_error(key, std::string("'") + k + "' must be a string");
    *out = j[k].get<std::string>();
    return {};
  };
  TRY(text("from", &m.from, true));
  TRY(text("to", &m.to, true));
  TRY(text("step", &m.step, true));
  TRY(text("driver", &m.driver, false));
  TRY(text("why", &m.why, false));
  TRY(check_shard_id(key + ": from", m.from));
  TRY(check_shard_id(key + ": to", m.to));
  if (m.from == m.to) return field_error(key, "'to' must not be 'from'");
  if (m.step != "export" && m.step != "release" && m.step != "rollback")
    return field_error(key, "'step' must be export, release or rollback");
  for (auto [k, out] : {std::pair{"beat_us", &m.beat_us}, std::pair{"started_us", &m.started_us}}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_number_unsigned())
      return field_error(key, std::string("'") + k + "' must be a time");
    *out = j[k].get<uint64_t>();
  }
  return m;
}

}  // namespace weft::cp
