#include "controlplane/jobs/calls.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/clock.h"
#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/oci.h"
#include "common/tls.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;

namespace {

// A job spec as shown to a viewer: environment values and files' contents (where
// secrets go, docs/images.md) replaced.
void hide_secrets(json& spec) {
  if (auto task = spec.find("task"); task != spec.end()) hide_task_secrets(*task);
}

// A job's task that names an image by tag only (no digest).
bool image_needs_resolution(const json& p) {
  if (!p.is_object() || !p.contains("task") || !p["task"].is_object()) return false;
  const json& t = p["task"];
  if (!t.contains("image") || !t["image"].is_string()) return false;
  auto ref = oci::parse_image_ref(t["image"].get<std::string>());
  return ref.ok() && !ref->digest;
}

}  // namespace

JobCalls::JobCalls(const ShardParts& s)
    : cfg_(s.cfg),
      loop_(s.loop),
      model_(s.model),
      job_events_(s.job_events),
      periodic_(s.periodic),
      replica_(s.replica),
      control_(s.control),
      secrets_(s.secrets),
      fx_(s.fx),
      gate_(s.gate) {}

Result<json> JobCalls::job_create(const json& p, const CallContext& c) {
  if (image_needs_resolution(p)) return resolve_image_then(p, c, &JobCalls::job_create_resolved);
  return job_create_resolved(p, c);
}

Result<json> JobCalls::resolve_image_then(const json& p, const CallContext& c, JobCall next) {
  // Checked whole first: a bad job or a caller without the right is refused before any
  // registry is asked.
  TRY_ASSIGN(JobSpec spec, job_from_params(p));
  TRY(gate_.may_change_jobs(gate_.caller(c), spec.entitlement_id));
  const json& image = p["task"]["image"];
  TRY_ASSIGN(oci::ImageRef ref, oci::parse_image_ref(image.get<std::string>()));
  if (!registry_) {
    TRY_ASSIGN(auto client, registry::Client::create(loop_, cfg_.registry));
    registry_ = std::move(client);
  }
  if (!c.session) return field_error("task.image", "needs a digest on this connection");
  rpc::ReplyFn reply = c.session->defer_reply();
  rpc::Peer peer = c.peer;
  json params = p;
  registry_->manifest(ref, [this, reply, peer, params, ref,
                            next](Result<registry::FetchedManifest> m) mutable {
    if (!m.ok()) {
      Error e = field_error("task.image", "cannot resolve " + ref.str() + ": " + m.error().str());
      return reply(e);
    }
    // What every agent would refuse (more layers than overlayfs stacks, a malformed
    // manifest) is refused here, by the agents' own reader, not after placement.
    if (auto doc = oci::parse_manifest(m->bytes, m->media_type); !doc.ok())
      return reply(field_error("task.image", ref.str() + ": " + doc.error().str()));
    // The answer came after this replica stopped leading: nothing is written here (the
    // caller retries at the leader, which resolves the tag again).
    if (replica_.following())
      return reply(make_error("this control plane stopped leading while resolving the image")
                       .with_code(rpc::kNotLeader));
    oci::ImageRef pinned = ref;
    pinned.digest = m->digest;
    params["task"]["image"] = pinned.str();
    log_info("image tag resolved", {{"IMAGE", ref.str()}, {"DIGEST", m->digest.str()}});
    reply((this->*next)(params, CallContext{nullptr, peer}));
  });
  return json();
}

Result<json> JobCalls::job_create_resolved(const json& p, const CallContext& c) {
  TRY_ASSIGN(JobSpec spec, job_from_params(p));
  TRY(gate_.may_change_jobs(gate_.caller(c), spec.entitlement_id));
  TRY_ASSIGN(auto cmds, model_.sched.create(spec, now_us()));
  model_.sched.rollouts().note_revision(spec.name, "created by " + gate_.caller(c).who);
  // A periodic job's first period is the first after now.
  if (spec.periodic)
    model_.sched.batch().skip_period(spec.name, static_cast<int64_t>(now_realtime_us() / 1'000'000),
                                     "");
  // The job's row and its tasks' (a machine's row changes only when the machine changes
  // pool, which the allocator reports itself: not one row per machine it placed on).
  if (auto s = fx_.persist({spec.name}, {}); !s.ok()) {
    model_.sched.abandon(spec.name);  // not durable: not created, nothing was sent
    return std::move(s).error();
  }
  fx_.send(cmds);
  return json{{"job", spec.name}, {"tasks", cmds.size()}};
}

Result<json> JobCalls::job_op(const std::string& op, const json& p, const CallContext& c,
                              const std::string& note) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  std::string name = p["name"].get<std::string>();
  Caller who = gate_.caller(c);
  if (auto current = model_.sched.job(name))
    TRY(gate_.may_change_jobs(who, current->entitlement_id));
  Result<std::vector<Command>> cmds = make_error("unknown operation");
  if (op == "scale") {
    const json& count = p.contains("count") ? p["count"] : json();
    if (!count.is_number_integer() || count.get<int64_t>() < 1 ||
        count.get<int64_t>() > kMaxTasksPerJob ||
        (count.is_number_unsigned() && count.get<uint64_t>() > kMaxTasksPerJob))
      return field_error("count",
                         "must be an integer from 1 to " + std::to_string(kMaxTasksPerJob));
    cmds = model_.sched.scale(name, static_cast<int>(count.get<int64_t>()), now_us());
  } else if (op == "update") {
    TRY_ASSIGN(JobSpec spec, job_from_params(p));
    TRY(gate_.may_change_jobs(who, spec.entitlement_id));  // the entitlement it moves to, too
    cmds = model_.sched.rollouts().update(spec, now_us());
    if (cmds.ok())
      model_.sched.rollouts().note_revision(name, note.empty() ? "updated by " + who.who : note);
  } else {
    cmds = model_.sched.stop(name, now_us());
  }
  if (!cmds.ok()) return cmds.error();
  TRY(fx_.persist({name}, {}));
  fx_.send(*cmds);
  if (op == "update") {
    if (control_) control_->round();  // a new controller, or new operations: at once
  }
  return json{{"job", name}, {"commands", cmds->size()}};
}

Result<json> JobCalls::job_scale(const json& p, const CallContext& c) {
  return job_op("scale", p, c);
}

Result<json> JobCalls::job_update(const json& p, const CallContext& c) {
  if (image_needs_resolution(p)) return resolve_image_then(p, c, &JobCalls::job_update_resolved);
  return job_op("update", p, c);
}

Result<json> JobCalls::job_update_resolved(const json& p, const CallContext& c) {
  return job_op("update", p, c);
}

Result<json> JobCalls::job_stop(const json& p, const CallContext& c) {
  return job_op("stop", p, c);
}

Result<json> JobCalls::job_ls(const json&, const CallContext&) {
  json arr = json::array();
  for (const auto& j : model_.sched.handover().persisted_jobs()) {
    int running = 0, ready = 0, current = 0;
    for (const TaskRecord* t : model_.sched.tasks().refs_of(j.spec.name)) {
      running += t->state == TaskState::kRunning;
      ready += available(*t);
      current += available(*t) && t->generation == j.generation;
    }
    json row{{"name", j.spec.name},
             {"count", j.spec.count},
             {"running", running},
             {"ready", ready},
             {"current", current},
             {"generation", j.generation},
             {"entitlement", j.spec.entitlement},
             {"stopping", j.stopping}};
    if (j.spec.is_batch()) {
      row["kind"] = j.spec.periodic ? "periodic" : "batch";
      row["completions"] = j.spec.batch.completions;
      row["succeeded"] = j.progress.succeeded;
      row["failed"] = j.progress.failed;
      row["outcome"] = j.progress.outcome;
    }
    arr.push_back(std::move(row));
  }
  return json{{"jobs", arr}};
}

Result<json> JobCalls::job_events(const json& p, const CallContext&) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  const std::string name = p["name"].get<std::string>();
  TRY_ASSIGN(const int64_t after, int_member(p, "after", 0, 0, INT64_MAX));
  TRY_ASSIGN(const int64_t limit, int_member(p, "limit", 100, 1, 1000));
  fx_.take_events();  // what happened up to now
  uint64_t next = 0;
  auto events =
      job_events_.list(name, static_cast<uint64_t>(after), static_cast<size_t>(limit), &next);
  if (events.empty() && !model_.sched.job(name) && after == 0)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  json out = json::array();
  for (const auto& e : events) out.push_back(JobEvents::to_json(e));
  return json{{"job", name}, {"events", out}, {"next", next}};
}

Result<json> JobCalls::job_history(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  std::string name = p["name"].get<std::string>();
  auto spec = model_.sched.job(name);
  auto progress = model_.sched.batch().progress(name);
  if (!spec || !progress)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  bool may_see_secrets = gate_.may_change_jobs(gate_.caller(c), spec->entitlement_id).ok();
  uint64_t now = now_us();
  int64_t wall = static_cast<int64_t>(now_realtime_us());
  json revs = json::array();
  for (const auto& r : progress->revisions) {
    json shown = r.spec;
    if (!may_see_secrets) hide_secrets(shown);
    revs.push_back(
        {{"generation", r.generation},
         {"at", format_rfc3339(wall - static_cast<int64_t>(now > r.at_us ? now - r.at_us : 0))},
         {"note", r.note},
         {"spec", shown}});
  }
  return json{{"job", name},
              {"generation", model_.sched.generation(name)},
              {"paused", progress->paused},
              {"canary", progress->canary},
              {"revisions", revs}};
}

Result<json> JobCalls::job_revert(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  std::string name = p["name"].get<std::string>();
  TRY_ASSIGN(const int64_t gen, int_member(p, "generation", 0, 1, INT64_MAX));
  if (gen == 0) return field_error("generation", "is required: the revision to go back to");
  return revert_to(name, static_cast<uint64_t>(gen),
                   "revert to generation " + std::to_string(gen) + " by " + gate_.caller(c).who, c);
}

Result<json> JobCalls::revert_to(const std::string& name, uint64_t gen, const std::string& note,
                                 const CallContext& c) {
  auto progress = model_.sched.batch().progress(name);
  auto current = model_.sched.job(name);
  if (!progress || !current)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(gate_.may_change_jobs(gate_.caller(c), current->entitlement_id));
  const Revision* rev = nullptr;
  for (const auto& r : progress->revisions)
    if (r.generation == gen) rev = &r;
  if (!rev)
    return field_error("generation", "job " + name + " keeps no revision " + std::to_string(gen) +
                                         " (weftctl job history " + name + ")")
        .with_code(rpc::kNotFound);
  // A rolling update to that spec (its own validation and grants), without a canary
  // phase: a revert rolls to every task. The job's size stays what it is now.
  json params = rev->spec;
  params["name"] = name;
  if (!current->is_batch()) params["count"] = current->count;
  TRY_ASSIGN(json r, job_op("update", params, c, note));
  if (model_.sched.batch().progress(name).value_or(JobProgress{}).canary) {
    TRY_ASSIGN(auto cmds, model_.sched.rollouts().promote(name, now_us(), note));
    TRY(fx_.persist({name}, {}));
    fx_.send(cmds);
  }
  r["generation"] = model_.sched.generation(name);
  r["reverted_to"] = gen;
  return r;
}

Result<json> JobCalls::job_rollout(const json& p, const CallContext& c) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
    return field_error("name", "is required: the job's name");
  if (!p.contains("action") || !p["action"].is_string())
    return field_error("action", "is required: pause, resume, abort or promote");
  std::string name = p["name"].get<std::string>(), action = p["action"].get<std::string>();
  auto spec = model_.sched.job(name);
  auto progress = model_.sched.batch().progress(name);
  if (!spec || !progress)
    return field_error("name", "no such job " + name).with_code(rpc::kNotFound);
  TRY(gate_.may_change_jobs(gate_.caller(c), spec->entitlement_id));
  std::string who = gate_.caller(c).who;
  if (action == "abort") {
    // Back to the revision before the current one, at once and whole.
    const auto& revs = progress->revisions;
    uint64_t gen = model_.sched.generation(name);
    const Revision* before = nullptr;
    for (const auto& r : revs)
      if (r.generation < gen) before = &r;
    if (!before)
      return field_error("name", "job " + name + " has no earlier revision to go back to")
          .with_code(rpc::kConflict);
    return revert_to(name, before->generation,
                     "rollout of generation " + std::to_string(gen) + " aborted by " + who, c);
  }
  Result<std::vector<Command>> cmds = make_error("unknown");
  if (action == "pause" || action == "resume")
    cmds = model_.sched.rollouts().pause_rollout(name, action == "pause", now_us());
  else if (action == "promote")
    cmds = model_.sched.rollouts().promote(name, now_us(), "promoted by " + who);
  else
    return field_error("action", "must be pause, resume, abort or promote");
  if (!cmds.ok()) return cmds.error();
  TRY(fx_.persist({name}, {}));
  fx_.send(*cmds);
  if (control_) control_->round();
  auto now = model_.sched.batch().progress(name).value_or(JobProgress{});
  return json{
      {"job", name}, {"paused", now.paused}, {"canary", now.canary}, {"commands", cmds->size()}};
}

Result<json> JobCalls::job_show(const json& p, const CallContext& c) {
  if (!p.contains("name") || !p["name"].is_string()) return field_error("name", "is required");
  auto spec = model_.sched.job(p["name"].get<std::string>());
  if (!spec) return field_error("name", "no such job").with_code(rpc::kNotFound);
  json tasks = json::array();
  for (const auto& t : model_.sched.tasks().of_job(spec->name))
    tasks.push_back(task_json(t, model_.alloc));
  json shown = weft::to_json(*spec);
  // The environment carries secrets: shown to those who may change the job only.
  if (!gate_.may_change_jobs(gate_.caller(c), spec->entitlement_id).ok()) hide_secrets(shown);
  // The network its tasks get (a job stored before "own" was the default has none
  // written: the host's, until its next update).
  std::string network = "host";
  if (const json& t = spec->task;
      t.is_object() && t.contains("namespaces") && t["namespaces"].is_object() &&
      t["namespaces"].contains("network") && t["namespaces"]["network"].is_string())
    network = t["namespaces"]["network"].get<std::string>();
  static const std::map<std::string, std::string> kNetworks = {
      {"own",
       "a namespace of each task's own: the machine's bridge where it has one, else "
       "private (only loopback)"},
      {"bridge", "an address on the machine's bridge, ports published on its address"},
      {"private", "a namespace with only loopback"},
      {"host", "the machine's own network (a grant: host_network)"}};
  json out{{"spec", shown},
           {"entitlement", spec->entitlement},
           {"generation", model_.sched.generation(spec->name)},
           {"network", network},
           {"network_detail", kNetworks.count(network) ? kNetworks.at(network) : ""},
           {"tasks", tasks}};
  if (spec->is_batch()) out[spec->periodic ? "periodic" : "batch"] = batch_json(spec->name, *spec);
  if (spec->controller) {
    json ops = json::array();
    for (const auto& op : model_.sched.operations().pending_operations(spec->name))
      ops.push_back(op.id);
    out["task_controller"] = {
        {"address", spec->controller->job.empty()
                        ? spec->controller->address
                        : controller_address(model_.sched, model_.sessions, *spec->controller)},
        {"unreachable", control_ && control_->unreachable(spec->name)},
        {"fallback", model_.sched.operations().control_fallback(spec->name)},
        {"pending", ops}};
    if (!spec->controller->job.empty()) {
      out["task_controller"]["job"] = spec->controller->job;
      out["task_controller"]["port"] = spec->controller->port;
    }
  }
  return out;
}

json JobCalls::batch_json(const std::string& name, const JobSpec& spec) {
  JobProgress p = model_.sched.batch().progress(name).value_or(JobProgress{});
  uint64_t now = now_us();
  int64_t wall = static_cast<int64_t>(now_realtime_us());
  auto at = [&](uint64_t mono) {
    return format_rfc3339(wall + (static_cast<int64_t>(mono) - static_cast<int64_t>(now)));
  };
  if (spec.periodic) {
    int64_t wall_s = wall / 1'000'000;
    json runs = json::array();
    auto live = model_.sched.batch().periodic_jobs();
    std::vector<std::string> all = model_.sched.batch().ended_runs(name);
    if (auto it = live.find(name); it != live.end())
      all.insert(all.end(), it->second.begin(), it->second.end());
    for (const auto& run : all) {
      auto rp = model_.sched.batch().progress(run).value_or(JobProgress{});
      runs.push_back({{"job", run},
                      {"outcome", rp.outcome.empty() ? "running" : rp.outcome},
                      {"succeeded", rp.succeeded},
                      {"failed", rp.failed}});
    }
    json out{{"schedule", spec.periodic->schedule},
             {"overlap", weft::overlap_name(spec.periodic->overlap)},
             {"runs", runs}};
    if (p.last_period) out["last_period"] = format_rfc3339(p.last_period * 1'000'000);
    if (auto next = periodic_.next_period(model_.sched, name, std::max(wall_s, p.last_period)))
      out["next_period"] = format_rfc3339(*next * 1'000'000);
    return out;
  }
  json out{{"completions", spec.batch.completions},
           {"parallelism", spec.count},
           {"max_failures", spec.batch.max_failures},
           {"succeeded", p.succeeded},
           {"failed", p.failed},
           {"outcome", p.outcome.empty() ? "running" : p.outcome},
           {"reason", p.reason}};
  if (p.started_us) out["started"] = at(p.started_us);
  if (p.ended_us) out["ended"] = at(p.ended_us);
  if (spec.batch.deadline_us && p.started_us)
    out["deadline"] = at(p.started_us + spec.batch.deadline_us);
  if (!p.parent.empty()) out["periodic_job"] = p.parent;
  return out;
}

Result<JobSpec> JobCalls::job_from_params(const json& p) const {
  TRY_ASSIGN(weft::JobSpec base, weft::parse_job_spec(p));  // the one job validator
  auto id = model_.broker.entitlements().named(base.entitlement);
  if (!id)
    return field_error("entitlement", "no entitlement named " + base.entitlement)
        .with_code(rpc::kNotFound);
  // A job's task gets a network of its own unless it asks for another (the host's is a
  // grant): written into the spec, so the job keeps what it was created with. A job
  // stored before this default keeps the host's network until its next update.
  if (!base.task.is_object()) base.task = json::object();
  json& ns = base.task["namespaces"];
  if (ns.is_null()) ns = json::object();
  if (ns.is_object() && !ns.contains("network")) ns["network"] = "own";
  // What its tasks ask of the host, against what the entitlement grants (an admin's).
  const TaskGrants& grants = model_.broker.entitlements().spec(*id).grants;
  TRY(check_port_grants(base.ports, grants, base.entitlement, "ports."));
  TRY_ASSIGN(TaskSpec task, parse_task_spec(task_run_params(base, base.name + ".0.0")));
  TRY(check_task_grants(task, grants, base.entitlement, cfg_.socket_group));
  // A control plane with TLS speaks to TCP controllers over mutual TLS only, to the name
  // the job gives: without one, any process on the controller's address would decide.
  if (base.controller && cfg_.tls.enabled() && base.controller->identity.empty()) {
    auto ep = rpc::parse_endpoint(base.controller->address);
    if (!base.controller->job.empty() || (ep.ok() && !ep->is_unix))
      return field_error("task_controller.identity",
                         "is required: this control plane speaks to task controllers over "
                         "mutual TLS; give the name the controller's certificate carries");
  }
  // Secrets are kept sealed at rest: without a key there is nowhere to keep one.
  if (std::string where = first_secret(weft::to_json(base)); !secrets_ && !where.empty())
    return field_error(where.substr(where.find('/') + 1),
                       "is a secret, and this control plane has no secrets_key to seal it "
                       "with at rest (docs/security.md; the packages make one at install)");
  JobSpec spec;
  static_cast<weft::JobSpec&>(spec) = std::move(base);
  spec.entitlement_id = *id;
  return spec;
}

void JobCalls::register_calls(Calls& calls) {
  calls.add("job.create", kOperatorCall, this, &JobCalls::job_create);
  calls.add("job.scale", kOperatorCall, this, &JobCalls::job_scale);
  calls.add("job.update", kOperatorCall, this, &JobCalls::job_update);
  calls.add("job.stop", kOperatorCall, this, &JobCalls::job_stop);
  calls.add("job.ls", kViewerCall, this, &JobCalls::job_ls);
  calls.add("job.show", kViewerCall, this, &JobCalls::job_show);
  calls.add("job.events", kViewerCall, this, &JobCalls::job_events);
  calls.add("job.history", kViewerCall, this, &JobCalls::job_history);
  calls.add("job.revert", kOperatorCall, this, &JobCalls::job_revert);
  calls.add("job.rollout", kOperatorCall, this, &JobCalls::job_rollout);
}

}  // namespace weft::cp
