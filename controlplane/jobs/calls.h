// The jobs' calls (docs/jobs.md): a job created, scaled, updated (a rolling update) and
// stopped; its history, a revert to a revision, its rollout paused, resumed, aborted or
// promoted; listed and shown with its tasks, its batch or periodic runs and its events.
// A job's image named by tag is resolved to a digest first, off the loop.
#pragma once

#include "common/registry.h"
#include "controlplane/daemon/shard_parts.h"

namespace weft::cp {

class JobCalls : public Feature {
 public:
  explicit JobCalls(const ShardParts& s);
  // Its calls, with their access levels (access.h).
  void register_calls(Calls& calls) override;

 private:
  using JobCall = Result<json> (JobCalls::*)(const json&, const CallContext&);
  Result<json> job_create(const json& p, const CallContext& c);
  Result<json> resolve_image_then(const json& p, const CallContext& c, JobCall next);
  Result<json> job_create_resolved(const json& p, const CallContext& c);
  Result<json> job_scale(const json& p, const CallContext& c);
  Result<json> job_update(const json& p, const CallContext& c);
  Result<json> job_update_resolved(const json& p, const CallContext& c);
  Result<json> job_stop(const json& p, const CallContext& c);
  Result<json> job_ls(const json&, const CallContext&);
  Result<json> job_events(const json& p, const CallContext&);
  Result<json> job_history(const json& p, const CallContext& c);
  Result<json> job_revert(const json& p, const CallContext& c);
  Result<json> revert_to(const std::string& name, uint64_t gen, const std::string& note,
                         const CallContext& c);
  Result<json> job_rollout(const json& p, const CallContext& c);
  Result<json> job_show(const json& p, const CallContext& c);
  json batch_json(const std::string& name, const JobSpec& spec);
  Result<JobSpec> job_from_params(const json& p) const;
  // job.scale, job.update and job.stop: the operation, persisted, then sent.
  Result<json> job_op(const std::string& op, const json& p, const CallContext& c,
                      const std::string& note = "");

  const CpConfig& cfg_;
  EventLoop& loop_;
  Model& model_;
  JobEvents& job_events_;
  PeriodicRuns& periodic_;
  const ReplicaRole& replica_;
  const std::unique_ptr<ControlRounds>& control_;
  const std::shared_ptr<const SecretBox>& secrets_;
  Effects& fx_;
  const Gate& gate_;
  std::unique_ptr<registry::Client> registry_;  // made at the first tag to resolve
};

}  // namespace weft::cp
