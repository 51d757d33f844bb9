// What the leader's features keep beyond the model's rows, so that the next leader (after
// a restart, a SIGKILL or a failover) shows and does what this one would have: a job's
// events, autoscaling's history, a profile roll's progress, the ReBalancer's budgets
// and moves under way (docs/replicas.md, "What a new leader knows").
//
// A note is a small JSON document under a key ("job-events/web/00000000000000000042").
// A feature puts or erases notes as its state changes; they are written with the next
// write of the state (Effects::persist, in its group commit: durable when the group
// is, written again when the group is not taken, the newest value winning), and read
// back whole when a control plane restores. In sqlite a table, in etcd the keys under
// <prefix>notes/. Each feature reads its own back as hostile input: a note it cannot
// read is skipped with a warning, never a reason not to start.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace weft::cp {

class Notes {
 public:
  using Pending = std::map<std::string, std::optional<nlohmann::json>>;  // none: erased
  static constexpr size_t kMaxKey = 400;
  // Letters, digits and . _ - /, at most kMaxKey, no empty part (what etcd and sqlite
  // keep as they are, and what no feature's key escapes from).
  static bool valid_key(std::string_view key);

  void put(const std::string& key, nlohmann::json value) { pending_[key] = std::move(value); }
  void erase(const std::string& key) { pending_[key] = std::nullopt; }
  bool pending() const { return !pending_.empty(); }
  // What to write now (Effects::persist).
  Pending take() { return std::exchange(pending_, {}); }

  // What the store held at restore (StateStore::notes).
  void set_loaded(std::map<std::string, nlohmann::json> all) { loaded_ = std::move(all); }
  // The loaded notes under `prefix` (keys kept whole), given to the feature that owns
  // them and forgotten here.
  std::map<std::string, nlohmann::json> take_loaded(const std::string& prefix);

 private:
  Pending pending_;
  std::map<std::string, nlohmann::json> loaded_;
};

}  // namespace weft::cp
