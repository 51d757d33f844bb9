// A shard manager's decisions, as a TaskController makes them (docs/taskcontrol.md):
// `shards` shards of `replicas` replicas each, spread over the job's task indices
// (replica r of shard s on index (s * replicas + r) % count), and a restart allowed only
// when every shard keeps at least `floor` replicas on tasks that run and are not being
// restarted. An example for controller writers; the control plane does not link it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::example {

class ShardManager {
 public:
  // max_in_flight: at most this many acknowledged operations not yet complete (0: no
  // limit but the floors), the controller's own pacing.
  ShardManager(int shards, int replicas, int floor, int max_in_flight = 0)
      : shards_(shards), replicas_(replicas), floor_(floor), max_in_flight_(max_in_flight) {}

  // The task indices holding shard s's replicas, for a job of `count` tasks.
  std::vector<int> replicas_of(int shard, int count) const {
    std::vector<int> out;
    for (int r = 0; r < replicas_; ++r) out.push_back((shard * replicas_ + r) % count);
    return out;
  }

  // A plan comes from the network: members are read only when they have the expected
  // type and range, anything else counts as absent.
  static int64_t int_of(const nlohmann::json& j, const char* key, int64_t dflt, int64_t max) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return dflt;
    if (j[key].is_number_unsigned())
      return j[key].get<uint64_t>() > static_cast<uint64_t>(max) ? dflt : j[key].get<int64_t>();
    int64_t v = j[key].get<int64_t>();
    return v < 0 || v > max ? dflt : v;
  }
  static const nlohmann::json& list_of(const nlohmann::json& j, const char* key) {
    static const nlohmann::json empty = nlohmann::json::array();
    return j.is_object() && j.contains(key) && j[key].is_array() ? j[key] : empty;
  }
  static std::string str_of(const nlohmann::json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>()
                                                                  : std::string();
  }

  // Answers one taskcontrol.plan: the ids of the pending operations that may go now.
  nlohmann::json decide(const nlohmann::json& plan) {
    int count = static_cast<int>(int_of(plan, "count", 0, 100000));
    if (count < 1) return nlohmann::json::array();
    if (in_flight_.size() > 100000) in_flight_.clear();  // a peer feeding garbage
    // Operations done are no longer in flight.
    for (const auto& id : list_of(plan, "completed"))
      if (id.is_string()) in_flight_.erase(id.get<std::string>());
    std::set<std::string> pending_ids;
    for (const auto& op : list_of(plan, "pending"))
      if (!str_of(op, "op").empty()) pending_ids.insert(str_of(op, "op"));
    std::set<int> down;         // indices that do not count as serving now
    std::set<int> up, current;  // serving (running and ready); of the current generation
    int64_t generation = int_of(plan, "generation", 0, INT64_MAX);
    for (const auto& t : list_of(plan, "tasks")) {
      int64_t index = int_of(t, "index", -1, count - 1);
      bool ready =
          t.is_object() && t.contains("ready") && t["ready"].is_boolean() && t["ready"].get<bool>();
      if (index < 0 || str_of(t, "state") != "running" || !ready) continue;
      up.insert(static_cast<int>(index));
      if (int_of(t, "generation", -1, INT64_MAX) == generation)
        current.insert(static_cast<int>(index));
    }
    // A completion this controller did not hear of (its answer was lost): an operation
    // no longer pending whose index runs the current generation is done, and so is a
    // `stop` (a scale-down) whose index is past the job's count now.
    std::erase_if(in_flight_, [&](const auto& e) {
      return !pending_ids.count(e.first) && (current.count(e.second) || e.second >= count);
    });
    for (const auto& [id, index] : in_flight_) down.insert(index);
    nlohmann::json ack = nlohmann::json::array();
    for (const auto& op : list_of(plan, "pending")) {
      std::string id = str_of(op, "op");
      int64_t at = int_of(op, "index", -1, count - 1);
      if (id.empty() || at < 0) continue;
      int index = static_cast<int>(at);
      if (in_flight_.count(id)) {  // acknowledged already: again (the answer may be lost)
        ack.push_back(id);
        continue;
      }
      if (max_in_flight_ > 0 && in_flight_.size() >= static_cast<size_t>(max_in_flight_)) continue;
      down.insert(index);
      if (all_shards_keep_floor(count, up, down)) {
        in_flight_[id] = index;
        ack.push_back(id);
      } else {
        down.erase(index);
      }
    }
    return ack;
  }

  // Shards whose replicas on running tasks (not being restarted) are below the floor.
  int shards_below_floor(int count, const std::set<int>& up, const std::set<int>& down) const {
    int n = 0;
    for (int s = 0; s < shards_; ++s) {
      int serving = 0;
      for (int i : replicas_of(s, count)) serving += up.count(i) && !down.count(i);
      n += serving < floor_;
    }
    return n;
  }

 private:
  bool all_shards_keep_floor(int count, const std::set<int>& up, const std::set<int>& down) const {
    for (int s = 0; s < shards_; ++s) {
      auto rs = replicas_of(s, count);
      int serving = 0;
      bool touched = false;
      for (int i : rs) {
        serving += up.count(i) && !down.count(i);
        touched |= down.count(i) > 0;
      }
      // A shard already below its floor (a failure) must not lose more; shards the
      // operation does not touch are not this operation's to judge.
      if (touched && serving < floor_) return false;
    }
    return true;
  }

  int shards_, replicas_, floor_, max_in_flight_;
  std::map<std::string, int> in_flight_;  // op id -> task index, acked and not completed
};

}  // namespace weft::example
