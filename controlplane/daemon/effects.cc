#include "controlplane/daemon/effects.h"

#include "common/clock.h"
#include "common/log.h"
#include "controlplane/api/audit_log.h"
#include "controlplane/daemon/clocks.h"
#include "controlplane/discovery/discovery.h"
#include "controlplane/jobs/job_events.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/region/lending.h"
#include "controlplane/store/group_commit.h"
#include "controlplane/store/notes.h"
#include "controlplane/store/state_store.h"
#include "controlplane/taskcontrol/control_rounds.h"

namespace weft::cp {

using json = nlohmann::json;

uint64_t now_us() {
  return now_monotonic_us();  // the scheduler and broker need a steady clock
}

Status Effects::apply(const Decision& d) {
  // Nothing decided: nothing written (a round that found nothing to do costs nothing).
  if (d.commands.empty() && d.jobs.empty() && d.machines.empty() && !d.kick &&
      d.ask_controller.empty())
    return {};
  TRY(persist(d.jobs, d.machines));
  send(d.commands);
  if (d.kick) kick();
  if (!d.ask_controller.empty() && p_.control) p_.control->ask(d.ask_controller);
  return {};
}

void Effects::apply_logged(const Decision& d) {
  // What changed is written again by the next write; the commands are resent.
  if (auto s = apply(d); !s.ok()) log_error("cannot write state: " + s.error().str());
}

void Effects::kick() {
  p_.clocks.kick();
}

void Effects::push_profiles() {
  m_.pool_changes.push(m_.sessions, m_.broker, m_.alloc);
}

std::string Effects::machine_name(MachineId m) const {
  return m_.broker.persisted(m).info.id;
}

Status Effects::persist(const std::set<std::string>& jobs, const std::set<MachineId>& machines) {
  take_events();
  // What changed since the last write: machines that moved between pools, tasks created
  // or changed (kept across a failed write, for the next one). A write costs what
  // changed, not the size of the jobs or of the fleet.
  Written& w = p_.group->unsaved();
  for (MachineId m : m_.alloc.take_moved()) w.machines.insert(m);
  for (auto& id : m_.sched.take_dirty_tasks()) w.tasks.insert(std::move(id));
  w.machines.insert(machines.begin(), machines.end());
  // A job's row (spec, placement) is written when it changed, not when one of its tasks
  // did: a 1,000-task job starting is 1,000 task rows, not 1,000 copies of its placement.
  w.jobs.insert(jobs.begin(), jobs.end());
  w.jobs.merge(m_.sched.take_changed_jobs());
  w.jobs.merge(m_.alloc.take_changed_jobs());
  for (uint64_t id : p_.maintenance.take_dropped()) w.maintenance.insert(id);
  for (auto& e : m_.broker.unavailability().take_new()) w.events.push_back(std::move(e));
  p_.job_events.save_jobs(w.jobs, p_.notes);  // the jobs written: their events with them
  for (auto& [key, value] : p_.notes.take()) w.notes[key] = std::move(value);
  TRY(p_.group->open());
  TRY(p_.store->begin());
  auto fail = [this](Status s) {
    p_.store->rollback();
    return s;
  };
  for (const auto& [id, e] : m_.broker.entitlements())
    if (auto s = p_.store->put_entitlement(id, e); !s.ok()) return fail(s);
  for (MachineId m : w.machines) {
    Broker::Persisted row = m_.broker.persisted(m);
    row.pinned = m_.alloc.pinned(m);
    if (auto s = p_.store->put_machine(m, row, m_.alloc.entitlement_of(m)); !s.ok()) return fail(s);
  }
  for (const auto& name : w.jobs) {
    auto j = m_.sched.handover().persisted_job(name);
    auto s = j ? p_.store->put_job(*j, m_.alloc.request(name), m_.alloc.placement(name),
                                   m_.alloc.dynamic_ports(name))
               : p_.store->delete_job(name);
    if (!s.ok()) return fail(s);
  }
  for (const auto& id : w.tasks)
    if (auto it = m_.sched.tasks().find(id); it != m_.sched.tasks().end())
      if (auto s = p_.store->put_task(it->second); !s.ok()) return fail(s);
  if (auto s = p_.store->put_task_seq(m_.sched.task_seq()); !s.ok()) return fail(s);
  for (uint64_t id : w.maintenance) {
    auto it = p_.maintenance.events().find(id);
    auto s = it != p_.maintenance.events().end() ? p_.store->put_maintenance(it->second)
                                                 : p_.store->delete_maintenance(id);
    if (!s.ok()) return fail(s);
  }
  if (auto s = p_.store->put_events(w.events); !s.ok()) return fail(s);
  for (const auto& [key, value] : w.notes)
    if (auto s = value ? p_.store->put_note(key, *value) : p_.store->delete_note(key); !s.ok())
      return fail(s);
  TRY(p_.store->commit());
  // Machines whose pool changed may have a new desired profile (push_profiles).
  m_.pool_changes.changed(w.machines.begin(), w.machines.end());
  Written done = std::move(w);
  w = {};
  p_.group->wrote(done);  // kept until the group commits; committed now if it is old
  return {};
}

void Effects::send(const std::vector<Command>& cmds) {
  dispatch(p_.discovery->refresh(cmds));
}

void Effects::dispatch(const std::vector<Command>& cmds) {
  for (const auto& c : cmds) {
    rpc::Session* session = m_.sessions.agent(c.machine);
    if (!session) continue;  // offline: reconciled when it reports again
    std::string task = c.task_id;
    // A region's shard names itself and the machine's epoch: a command that arrives
    // after the machine left is refused there (agent/cp_session.h HolderFence).
    json holder = p_.lending ? p_.lending->holder_of(m_.alloc.spec(c.machine).name) : json();
    auto fenced = [&holder](json params) {
      if (!holder.is_null() && params.is_object()) {
        params["holder"] = holder["shard"];
        params["epoch"] = holder["epoch"];
      }
      return params;
    };
    if (c.kind == Command::Kind::kStart) {
      // The job's body serialised once, this task's keys spliced in (no JSON built here).
      std::string extra;
      if (!holder.is_null())
        extra = ",\"holder\":" + holder["shard"].dump() + ",\"epoch\":" + holder["epoch"].dump();
      session->call_serialized("task.run", c.run_text(extra), [this, task](Result<json> r) {
        if (r.ok()) return;
        const Error& e = r.error();
        // The session went away or timed out: the start is resent when the machine
        // reports again. A duplicate name: that task runs already (a resend).
        if (e.code == rpc::kUnavailable || e.code == rpc::kTimeout || e.code == rpc::kConflict)
          return;
        log_warn("the machine refused to start a task", {{"TASK", task}, {"ERROR", e.str()}});
        start_refused(task, e, e.code == rpc::kInvalidParams);
      });
    } else if (c.kind == Command::Kind::kPrefetch) {
      MachineId m = c.machine;
      uint64_t generation = c.spec.value("generation", uint64_t{0});
      json params = fenced(c.spec.value("fetch", json::object()));
      params["wait"] = true;
      session->call("image.pull", params, [this, task, m, generation](Result<json> r) {
        if (!r.ok())
          log_warn("a machine could not prefetch an image",
                   {{"JOB", task}, {"ERROR", r.error().str()}});
        prefetched(task, generation, m);
      });
    } else {
      json stop{{"id", task}};
      // A guest taken back stops within its job's notice (its SIGKILL then).
      if (c.spec.is_object() && c.spec.contains("grace")) stop["grace"] = c.spec["grace"];
      session->call("task.stop", fenced(std::move(stop)), [task](Result<json> r) {
        if (!r.ok())
          log_debug("task.stop failed on the machine",
                    {{"TASK", task}, {"ERROR", r.error().str()}});
      });
    }
  }
  push_profiles();
}

void Effects::prefetched(const std::string& job, uint64_t generation, MachineId m) {
  auto cmds = m_.sched.rollouts().prefetched(job, generation, m, now_us());
  if (cmds.empty()) return;
  std::set<MachineId> machines;
  for (const auto& c : cmds) machines.insert(c.machine);
  if (auto s = persist({job}, machines); !s.ok()) {
    log_error("cannot write state: " + s.error().str());
    return;
  }
  send(cmds);
}

void Effects::start_refused(const std::string& task, const Error& e, bool bad_spec) {
  // The agent's words, with the field it named: what job.show and weftctl print.
  std::string message = e.field.empty() ? e.message : e.field + ": " + e.message;
  auto cmds = m_.sched.start_refused(task, message, bad_spec, now_us());
  auto changed = m_.sched.take_reported_changes();
  if (changed.empty()) return;  // not awaited any more
  std::set<MachineId> machines;
  for (const auto& c : cmds) machines.insert(c.machine);
  if (auto s = persist({}, machines); !s.ok()) log_error("cannot write state: " + s.error().str());
  send(cmds);
}

void Effects::take_events() {
  const uint64_t at = now_realtime_us();
  for (auto& e : m_.sched.take_events()) {
    std::string machine = e.task.empty() ? std::string() : machine_name(e.machine);  // a job's own
    p_.job_events.record(e.job, JobEvents::Event{0, at, std::move(e.task), std::move(machine),
                                                 std::move(e.what), std::move(e.detail)});
  }
  // Gone jobs' events stay (an operator asks what happened to a job that stopped) until
  // there are many more of them than live jobs.
  if (p_.job_events.jobs() > 2 * m_.sched.job_count() + 1000)
    p_.job_events.keep_only(
        [this](const std::string& job) { return m_.sched.job(job).has_value(); }, p_.notes);
}

void Effects::audit_controller(const std::string& job, const std::vector<std::string>& acks,
                               const std::vector<Command>& done) {
  auto spec = m_.sched.job(job);
  std::string controller = "TaskController";
  if (spec && spec->controller)
    controller += spec->controller->address.empty()
                      ? " (a task of job " + spec->controller->job + ", port " +
                            std::to_string(spec->controller->port) + ")"
                      : " at " + spec->controller->address;
  p_.audit->controller(job, controller, acks, done);
}

}  // namespace weft::cp
