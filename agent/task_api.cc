#include "agent/task_api.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "agent/host_ports.h"
#include "agent/identity.h"
#include "agent/init/argv.h"
#include "agent/logs.h"
#include "agent/manager.h"
#include "agent/spawn.h"
#include "common/clock.h"
#include "common/json_bounded.h"
#include "common/log_request.h"
#include "common/units.h"

namespace weft::agent {

using json = nlohmann::json;
using rpc::RpcCode;

namespace {

// The agent reads up to 512 KiB a call; a tail may be as long as the files.
Result<LogRequest> agent_log_request(const json& p) {
  return parse_log_request(p, 512 * 1024, SIZE_MAX);
}

std::optional<LogCursor> agent_cursor(const LogRequest& r) {
  if (!r.cursor) return std::nullopt;
  return LogCursor{r.cursor->seq, r.cursor->offset};
}

json log_reply(const LogChunk& chunk, const std::string& state) {
  return json{{"data", chunk.data},
              {"cursor", {{"seq", chunk.next.seq}, {"offset", chunk.next.offset}}},
              {"skipped", chunk.skipped > 0},
              {"state", state}};
}

}  // namespace

// {"id": task, "wait_ms": N (default 30000, at most 600000), "remove": bool}: answered
// when the task has ended (exited, failed or stopped; a task waiting to restart has not),
// or at the deadline with "ended": false. A long poll, as Consul's blocking queries: a
// caller that needs longer asks again. With "remove" (privileged, as task.remove) the
// ended task is forgotten once the answer is made: `weftctl task run --wait --rm`.
namespace {
constexpr uint64_t kMaxTaskWaitUs = 600'000'000;
}  // namespace

// ---------------------------------------------------------------- images

Status TaskApi::check_privileged(const rpc::Peer& peer) const {
  return rpc::require_privileged(peer, m_.ids_.weft_gid_, m_.cfg_.socket_group, "changing tasks");
}

Result<Task*> TaskApi::find_task(const json& params) {
  TRY_ASSIGN(std::string key, string_member(params, "id"));
  if (auto it = m_.tasks_.find(key); it != m_.tasks_.end()) return it->second.get();
  // A name: the live task of that name, else the most recent one.
  Task* best = nullptr;
  for (auto& [id, t] : m_.tasks_) {
    if (t->name != key) continue;
    if (!best || (!t->terminal() && best->terminal()) ||
        (t->terminal() == best->terminal() && t->created_us > best->created_us))
      best = t.get();
  }
  if (best) return best;
  // A unique id prefix of at least 4 characters.
  if (key.size() >= 4) {
    for (auto& [id, t] : m_.tasks_) {
      if (id.rfind(key, 0) != 0) continue;
      if (best)
        return make_error("'" + key + "' matches more than one task").with_code(RpcCode::kConflict);
      best = t.get();
    }
    if (best) return best;
  }
  return make_error("no task '" + key + "'").with_code(RpcCode::kNotFound);
}

json TaskApi::summary(const Task& t) const {
  json j{{"id", t.id},
         {"name", t.name},
         {"state", task_state_name(t.state)},
         {"ready", t.state == TaskState::kRunning && t.ready},
         {"pid", t.pid > 0 ? json(t.pid) : json()},
         {"exit_code", t.exit_code ? json(*t.exit_code) : json()},
         {"signal", t.signal ? json(signal_name(*t.signal)) : json()},
         {"core_dumped", t.core_dumped},
         {"oom_killed", t.oom_killed},
         {"restarts", t.restarts},
         {"incarnation", t.incarnation},
         {"cgroup", m_.cgroup_rel(t.id)},
         {"reason", t.reason},
         {"created_at", format_rfc3339(t.created_us)},
         {"started_at", format_rfc3339(t.started_us)},
         {"finished_at",
          t.terminal() || t.state == TaskState::kBackoff ? format_rfc3339(t.finished_us) : ""}};
  if (t.state == TaskState::kBackoff) j["next_start_at"] = format_rfc3339(t.next_start_us);
  if (t.started_mono_us) j["started_monotonic_us"] = t.started_mono_us;
  if (t.finished_mono_us && t.finished_mono_us >= t.started_mono_us)
    j["finished_monotonic_us"] = t.finished_mono_us;
  // It failed before its program ran, in a way a start anywhere else would too.
  if (t.terminal() && t.setup_failed) j["failed_in_setup"] = true;
  // Its own uid (and gid), from agent.toml's task_uids; absent for a named user.
  if (t.own_uid >= 0) j["uid"] = t.own_uid;
  // Its address on the machine's bridge, kept for its life (namespaces.network = "bridge").
  if (t.bridge_addr != 0) j["bridge_address"] = ipv4_text(t.bridge_addr);
  if (!t.spec.image.empty()) {
    j["image"] = t.spec.image;
    if (t.image) j["image_manifest"] = t.image->manifest.str();
  }
  if (t.spec.package) j["package"] = t.spec.package->url;
  if (t.state == TaskState::kFetching) {
    // To the byte: what the download has received so far.
    image::PullProgress p = m_.fetching_.images_->progress(t.fetch_ticket).value_or(t.fetch);
    j["fetch"] = {{"bytes_done", p.done}, {"bytes_total", p.total}};
  }
  return j;
}

json TaskApi::detail(Task& t) {
  json j = summary(t);
  j["spec"] = to_json(t.spec);
  j["warnings"] = t.warnings;
  if (t.spec.readiness)
    j["readiness"] = {{"type", readiness_kind_name(t.spec.readiness->kind)},
                      {"passes_in_a_row", t.check_passes},
                      {"failures_in_a_row", t.check_failures},
                      {"last_failure", t.check_detail}};
  if (t.spec.liveness)
    j["liveness"] = {{"type", readiness_kind_name(t.spec.liveness->kind)},
                     {"failures_in_a_row", t.live.failures},
                     {"last_failure", t.live.detail}};
  if (t.state == TaskState::kRunning || t.state == TaskState::kStopping) {
    j["stats"] = m_.cgroups_->stats(t.id).to_json();
    auto fr = m_.cgroups_->frozen(t.id);
    j["frozen"] = fr.ok() && *fr;
  }
  if (t.state == TaskState::kStopping) j["stop_deadline_at"] = format_rfc3339(t.stop_deadline_us);
  json logs = json::object();
  for (const char* stream : {"stdout", "stderr"}) {
    LogStats li = log_stats(m_.task_state_dir(t.id) + "/logs", stream);
    logs[stream] = {{"files", li.files}, {"bytes", li.bytes}, {"dropped_bytes", li.dropped}};
  }
  j["logs"] = logs;
  return j;
}

Result<json> TaskApi::run_task(json p, bool for_control_plane) {
  uint64_t accepted = now_monotonic_us();
  if (for_control_plane && p.is_object()) p["owner"] = "controlplane";
  TRY_ASSIGN(TaskSpec spec, parse_task_spec(p));
  TRY(m_.net_.resolve_network(&spec));
  TRY(m_.ids_.assign_ports(&spec));
  TRY_ASSIGN(Task * t, m_.create_task(std::move(spec)));
  json j = summary(*t);
  j["warnings"] = t->warnings;
  // Request accepted to weft-init running in the task's cgroup (and recorded).
  j["start_latency_us"] = now_monotonic_us() - accepted;
  json phases = json::object();
  for (const auto& [name, us] : t->start_phases) phases[name] = us;
  if (!phases.empty()) j["start_phases_us"] = phases;
  return j;
}

Result<json> TaskApi::stop_task(const json& p) {
  TRY_ASSIGN(Task * t, find_task(p));
  std::optional<uint64_t> grace;
  if (p.contains("grace")) {
    const json& g = p["grace"];
    if (g.is_number()) {
      auto us = seconds_to_us(g.get<double>());
      if (!us.ok()) return field_error("grace", us.error().message);
      grace = *us;
    } else if (g.is_string()) {
      auto d = parse_duration_us(g.get<std::string>());
      if (!d.ok()) return field_error("grace", d.error().message);
      grace = *d;
    } else {
      return field_error("grace", "must be seconds or a duration such as \"5s\"");
    }
  }
  TRY(m_.request_stop(*t, grace));
  return summary(*t);
}

Result<json> TaskApi::api_task_usage(const json& p, const rpc::CallContext& c) {
  return task_usage(p, c, /*control_plane_only=*/false);
}

Result<json> TaskApi::task_usage(const json& p, const rpc::CallContext& c,
                                 bool control_plane_only) {
  TRY_ASSIGN(UsageRequest req, parse_usage_request(p));
  const std::vector<std::string>& names = req.tasks;
  // Asked by name (the control plane's task ids are the names it gave); sampled by id.
  std::map<std::string, std::string> id_of;  // live tasks: a name is one task's
  for (const auto& [id, t] : m_.tasks_)
    if (!t->terminal() && (!control_plane_only || t->spec.owner == "controlplane"))
      id_of[t->name] = id;
  std::vector<std::string> ids;
  std::map<std::string, std::string> name_of;
  auto want = [&](const std::string& name) {
    if (auto it = id_of.find(name); it != id_of.end()) {
      ids.push_back(it->second);
      name_of[it->second] = name;
    }
  };
  if (names.empty())
    for (const auto& [name, id] : id_of) want(name);
  else
    for (const auto& name : names) want(name);
  UsageReport named{m_.usage_->interval_ms(), {}, {}};
  if (!ids.empty()) {
    UsageReport r = m_.usage_->report(ids);
    for (auto& [id, u] : r.tasks) named.tasks[name_of[id]] = u;
  }
  if (req.scrape.empty() || !c.session) return to_json(named);
  // App metrics: each task's named port on its own network; answered when all ended.
  std::vector<ScrapeTarget> targets;
  for (const auto& g : req.scrape)
    for (const auto& name : g.tasks) {
      auto it = id_of.find(name);
      if (it == id_of.end() || !named.tasks.count(name)) continue;  // not here, or not sampled
      const Task& t = *m_.tasks_.at(it->second);
      if (t.state != TaskState::kRunning) continue;
      auto port = t.spec.ports.find(g.port);
      targets.push_back(ScrapeTarget{name, port == t.spec.ports.end() ? uint16_t{0} : port->second,
                                     t.pidfd.get(), t.spec.ns.own_network(), g.path, g.name});
    }
  if (targets.empty()) return to_json(named);
  auto reply = c.session->defer_reply();  // from here the answer goes through `reply`
  Status started = m_.usage_->scrape(*m_.loop_, *m_.http_, std::move(named), std::move(targets),
                                     [reply](UsageReport r) { reply(to_json(r)); });
  if (!started.ok()) reply(started.error());
  return json();
}

void TaskApi::register_methods() {
  // Guarded: changes tasks, root or the socket group only (check_privileged).
  static const rpc::Method<TaskApi> kMethods[] = {
      {"agent.info", &TaskApi::api_agent_info},
      {"task.run", &TaskApi::api_task_run, rpc::kPrivileged},
      {"task.ls", &TaskApi::api_task_ls},
      {"task.show", &TaskApi::api_task_show},
      {"task.stop", &TaskApi::api_task_stop, rpc::kPrivileged},
      {"task.kill", &TaskApi::api_task_kill, rpc::kPrivileged},
      {"task.freeze", &TaskApi::api_task_freeze, rpc::kPrivileged},
      {"task.thaw", &TaskApi::api_task_thaw, rpc::kPrivileged},
      {"task.logs", &TaskApi::api_task_logs},
      {"task.usage", &TaskApi::api_task_usage},
      {"task.remove", &TaskApi::api_task_remove, rpc::kPrivileged},
      {"task.wait", &TaskApi::api_task_wait},
  };
  rpc::Guard guard = [this](const rpc::CallContext& c) { return check_privileged(c.peer); };
  rpc::add_methods(methods_, this, kMethods, guard);
  m_.fetching_.image_calls_->add_to(methods_, guard);
}

Result<json> TaskApi::api_agent_info(const json&, const rpc::CallContext&) {
  json labels = m_.cfg_.labels;
  size_t running = 0;
  for (const auto& [id, t] : m_.tasks_)
    running += !t->terminal() && t->state != TaskState::kBackoff;
  // The sandboxes made ahead (agent/sandbox_pool.h): their ids are those of the next
  // tasks, and their cgroups are in the task tree already.
  json sandboxes = {{"size", m_.cfg_.sandbox_pool}, {"ids", m_.sandboxes_->ids()}};
  if (!m_.sandboxes_->failure().empty()) sandboxes["stopped"] = m_.sandboxes_->failure();
  return json{{"machine_id", m_.cfg_.machine_id},
              {"sandboxes", sandboxes},
              {"labels", labels},
              {"cgroup_root", m_.cfg_.cgroup_root},
              {"controllers", m_.cgroups_->controllers()},
              {"hugepage_sizes", m_.cgroups_->hugepage_sizes()},
              {"tasks", m_.tasks_.size()},
              {"tasks_running", running},
              {"uptime_seconds", (now_monotonic_us() - started_at_us_) / 1000000},
              {"version", "0.1.0"}};
}

Result<json> TaskApi::api_task_run(const json& p, const rpc::CallContext&) {
  return run_task(p, /*for_control_plane=*/false);
}

Result<json> TaskApi::api_task_ls(const json&, const rpc::CallContext&) {
  std::vector<const Task*> list;
  for (const auto& [id, t] : m_.tasks_) list.push_back(t.get());
  std::sort(list.begin(), list.end(),
            [](const Task* a, const Task* b) { return a->created_us < b->created_us; });
  json arr = json::array();
  for (const Task* t : list) arr.push_back(summary(*t));
  return json{{"tasks", arr}};
}

Result<json> TaskApi::api_task_show(const json& p, const rpc::CallContext& c) {
  TRY_ASSIGN(Task * t, find_task(p));
  json j = detail(*t);
  // Anyone who can connect may read; a task's secrets (its env values and files) only
  // those who may change tasks (root and the sockets' group), as job.show does.
  if (!check_privileged(c.peer).ok()) hide_task_secrets(j["spec"]);
  return j;
}

Result<json> TaskApi::api_task_stop(const json& p, const rpc::CallContext&) {
  return stop_task(p);
}

Result<json> TaskApi::api_task_kill(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Task * t, find_task(p));
  int sig = SIGKILL;
  if (p.contains("signal")) {
    if (!p["signal"].is_string() && !p["signal"].is_number_integer())
      return field_error("signal", "must be a signal name or number");
    auto s = parse_signal(p["signal"].is_string() ? p["signal"].get<std::string>()
                                                  : std::to_string(p["signal"].get<int>()));
    if (!s.ok()) return field_error("signal", s.error().message);
    sig = *s;
  }
  if (t->state != TaskState::kRunning && t->state != TaskState::kStopping &&
      t->state != TaskState::kStarting)
    return make_error("task " + t->id + " is " + task_state_name(t->state) + ", not running")
        .with_code(RpcCode::kConflict);
  if (sig == SIGKILL) {
    t->kill_sent = true;
    TRY(m_.cgroups_->kill_task(t->id));
  } else if (!signal_pidfd(t->pidfd.get(), sig).ok()) {
    return sys_error("signal task " + t->id);
  }
  return summary(*t);
}

Result<json> TaskApi::freeze_task(const json& p, bool freeze) {
  TRY_ASSIGN(Task * t, find_task(p));
  if (t->state != TaskState::kRunning)
    return make_error("task " + t->id + " is " + task_state_name(t->state) + ", not running")
        .with_code(RpcCode::kConflict);
  TRY(m_.cgroups_->freeze_task(t->id, freeze));
  // cgroup.events reports frozen once every member has stopped; wait briefly.
  bool done = false;
  for (int i = 0; i < 1000 && !done; ++i) {
    auto f = m_.cgroups_->frozen(t->id);
    done = f.ok() && *f == freeze;
    if (!done) ::usleep(1000);
  }
  json j = summary(*t);
  j["frozen"] = freeze ? done : !done;
  return j;
}

Result<json> TaskApi::api_task_freeze(const json& p, const rpc::CallContext&) {
  return freeze_task(p, true);
}

Result<json> TaskApi::api_task_thaw(const json& p, const rpc::CallContext&) {
  return freeze_task(p, false);
}

Result<json> TaskApi::api_task_logs(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Task * t, find_task(p));
  TRY_ASSIGN(LogRequest req, agent_log_request(p));
  TRY_ASSIGN(LogChunk chunk, read_log(m_.task_state_dir(t->id) + "/logs", req.stream,
                                      agent_cursor(req), req.max_bytes, req.tail));
  return log_reply(chunk, task_state_name(t->state));
}

Task* TaskApi::cp_task(const std::string& name) {
  Task* best = nullptr;
  for (auto& [id, t] : m_.tasks_) {
    if (t->spec.owner != "controlplane" || t->spec.name != name) continue;
    if (!best || (!t->terminal() && best->terminal()) ||
        (t->terminal() == best->terminal() && t->created_us > best->created_us))
      best = t.get();
  }
  return best;
}

Result<json> TaskApi::cp_task_show(const json& p) {
  TRY_ASSIGN(std::string name, string_member(p, "id"));
  Task* t = cp_task(name);
  if (!t) return make_error("no task " + name + " on this machine").with_code(RpcCode::kNotFound);
  return detail(*t);
}

Result<json> TaskApi::cp_task_kill(const json& p, const rpc::CallContext& c) {
  TRY_ASSIGN(std::string name, string_member(p, "id"));
  Task* t = cp_task(name);
  if (!t) return make_error("no task " + name + " on this machine").with_code(RpcCode::kNotFound);
  json q = p;
  q["id"] = t->id;
  return api_task_kill(q, c);
}

Result<json> TaskApi::cp_exec(const json& p, const rpc::CallContext& c) {
  TRY_ASSIGN(ExecRequest req, parse_exec_request(p));
  Task* t = cp_task(req.task);
  if (!t)
    return make_error("no task " + req.task + " on this machine").with_code(RpcCode::kNotFound);
  if (t->state != TaskState::kRunning || t->pid <= 0 || !t->pidfd.valid())
    return make_error(req.task + " is " + task_state_name(t->state) + ", not running")
        .with_code(RpcCode::kConflict);
  TRY_ASSIGN(Identity ident,
             t->identity ? Result<Identity>(*t->identity) : m_.ids_.identity_of(t, t->spec));
  InitJoin join{t->pid, req.command, req.options.tty, {}};
  if (req.options.tty) join.env_defaults["TERM"] = req.term.empty() ? "xterm" : req.term;
  std::vector<std::string> argv = init_argv(t->spec, ident, join);
  const std::string id = t->id;
  const int pidfd = t->pidfd.get();
  return m_.cp_calls_.execs_->start(c.session, id, req.options,
                                    [&](uint64_t n) -> Result<ExecStart> {
                                      TRY_ASSIGN(std::string dir, m_.cgroups_->exec_dir(id, n));
                                      return ExecStart{m_.cfg_.init_path, argv, pidfd, dir};
                                    });
}

Result<json> TaskApi::cp_task_logs(const json& p, const rpc::CallContext& c) {
  TRY_ASSIGN(std::string name, string_member(p, "id"));
  Task* best = cp_task(name);
  json q = p;
  if (best) {
    q["id"] = best->id;
    return api_task_logs(q, c);
  }
  // Forgotten once it ended: its kept output, if it is among the last ones kept.
  const std::string dir = m_.dirs_.ended_logs(name);
  if (dir.empty())
    return make_error("this machine no longer has the output of " + name + " (it keeps the last " +
                      std::to_string(TaskDirs::kEndedLogsKept) + " ended tasks')")
        .with_code(RpcCode::kNotFound);
  TRY_ASSIGN(LogRequest req, agent_log_request(p));
  TRY_ASSIGN(LogChunk chunk, read_log(dir, req.stream, agent_cursor(req), req.max_bytes, req.tail));
  auto state = read_file_bounded(dir + "/state", 64);
  return log_reply(chunk, state.ok() ? *state : "exited");
}

Result<json> TaskApi::api_task_remove(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(Task * t, find_task(p));
  if (!t->terminal())
    return make_error("task " + t->id + " is " + task_state_name(t->state) + "; stop it first")
        .with_code(RpcCode::kConflict);
  std::string id = t->id;
  TRY(m_.erase(id));
  m_.dirs_.remove(id);
  m_.tasks_.erase(id);
  return json{{"id", id}, {"removed", true}};
}

Result<json> TaskApi::api_task_wait(const json& p, const rpc::CallContext& c) {
  TRY_ASSIGN(Task * t, find_task(p));
  uint64_t wait_us = 30'000'000;
  if (p.contains("wait_ms")) {
    if (!p["wait_ms"].is_number_unsigned() || p["wait_ms"].get<uint64_t>() > kMaxTaskWaitUs / 1000)
      return field_error("wait_ms", "must be a number of milliseconds, at most 600000");
    wait_us = p["wait_ms"].get<uint64_t>() * 1000;
  }
  bool remove = false;
  if (p.contains("remove")) {
    if (!p["remove"].is_boolean()) return field_error("remove", "must be true or false");
    remove = p["remove"].get<bool>();
    if (remove) TRY(check_privileged(c.peer));
  }
  if (t->terminal() || wait_us == 0 || !c.session) return wait_answer(t->id, remove);
  if (m_.waiters_->size() >= TaskWaiters::kMax)
    return make_error("too many task waits; try again").with_code(RpcCode::kUnavailable);
  (void)m_.waiters_->add(t->id, c.session->defer_reply(), now_monotonic_us() + wait_us, remove);
  return json();
}

Result<json> TaskApi::wait_answer(const std::string& id, bool remove) {
  auto it = m_.tasks_.find(id);
  if (it == m_.tasks_.end())
    return make_error("no task '" + id + "'").with_code(RpcCode::kNotFound);
  Task& t = *it->second;
  json j = summary(t);
  j["ended"] = t.terminal();
  if (remove && t.terminal()) {
    TRY(m_.erase(id));
    m_.dirs_.remove(id);
    m_.tasks_.erase(it);  // `t` is gone
    j["removed"] = true;
  }
  return j;
}

}  // namespace weft::agent
