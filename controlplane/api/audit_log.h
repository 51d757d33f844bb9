// The audit log (docs/security.md): one entry per operator call, and one per batch of
// work a job's TaskController had the control plane do, in the journal and the store.
// It remembers who last created or updated each job (from the store after a restart,
// looked up once, when first needed): a controller acts on behalf of that operator.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "controlplane/api/access.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/store/group_commit.h"
#include "controlplane/store/state_store.h"

namespace weft::cp {

class AuditLog {
 public:
  AuditLog(StateStore& store, GroupCommit& group) : store_(store), group_(group) {}
  // An operator's call and its result.
  void call(const Caller& who, const std::string& method, const nlohmann::json& params,
            const Result<nlohmann::json>& result);
  // What a job's TaskController (`controller`: how to name it) had done when it
  // acknowledged `acks`. Nothing is written when nothing was done.
  void controller(const std::string& job, const std::string& controller,
                  const std::vector<std::string>& acks, const std::vector<Command>& done);
  // An autoscaling decision carried out (or refused): the job resized from `from` to
  // `to`, and why.
  void autoscaler(const std::string& job, int64_t from, int64_t to, const std::string& reason,
                  const Status& done);
  // A ReBalancer's move (rebalancer.h) in entitlement `ent`: task of job from one
  // machine to another, and its aim.
  void rebalancer(const std::string& ent, const std::string& job, const std::string& task,
                  const std::string& from, const std::string& to, const std::string& aim);

 private:
  void write(const AuditRecord& a);  // the journal and the store
  std::string job_operator(const std::string& job);
  StateStore& store_;
  GroupCommit& group_;
  std::map<std::string, std::string> job_operator_;
  bool loaded_ = false;
};

}  // namespace weft::cp
