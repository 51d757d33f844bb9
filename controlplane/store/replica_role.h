// A replica's place in its election (docs/replicas.md). Until it wins, every call is
// answered "not the leader" with where the leader is (the caller's override on the
// dispatcher); once it wins, its store is fenced at the election key's revision, the
// state is read (the previous leader wrote until its end) and it leads; when it loses
// (its lease, or a write refused by the fence) it stops, and systemd starts it again
// as a follower. An all-in-one on sqlite has no election: it leads from the start,
// and only steps down when its store says another writer took over.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/event.h"
#include "common/result.h"
#include "controlplane/store/etcd_store.h"
#include "controlplane/store/leader.h"

namespace weft::cp {

class ReplicaRole {
 public:
  struct Hooks {
    std::function<Status()> restore;  // read the state into the modules
    std::function<void()> lead;       // start leading (after restore)
  };
  ReplicaRole(EventLoop& loop, Hooks hooks) : loop_(loop), hooks_(std::move(hooks)) {}
  // The store is etcd: writes are fenced once this replica wins.
  void use(EtcdStore* store) { etcd_ = store; }
  bool on_etcd() const { return etcd_ != nullptr; }
  // Campaigns under `cfg`, and looks at the election every 50 ms.
  Status start(LeaderConfig cfg);
  bool replicated() const { return leadership_ != nullptr; }
  bool following() const { return leadership_ && !leading_; }
  bool stepped_down() const { return stepped_down_; }
  // The leader's identity as last read while following ("" = none known yet).
  const std::string& leader_hint() const { return hint_; }
  // This process stops leading (and ends: the loop exits with 3). Nothing held is sent.
  void step_down(const std::string& why);

 private:
  void watch();
  void check();
  EventLoop& loop_;
  Hooks hooks_;
  EtcdStore* etcd_ = nullptr;
  std::unique_ptr<Leadership> leadership_;
  std::string key_;
  bool leading_ = false, stepped_down_ = false;
  std::string hint_;
  Source timer_;
};

}  // namespace weft::cp
