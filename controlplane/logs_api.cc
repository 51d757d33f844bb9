// task.logs on the control plane: a task's output read from wherever it runs, through
// its machine's agent session (docs/logs.md). The control plane keeps no copy: each call
// asks the agent for one chunk from a cursor, so a follower (`weftctl task logs -f`)
// resumes exactly where the previous reply stopped.
//
// Logs can hold secrets, so reading them is its own permission: admins, operators who
// own the job's entitlement, and certificates matched by [access] logs. A viewer is not
// enough. A caller's first read of a task on a connection is audited, and so is every
// refusal. Reads are bounded: at most kMaxChunk bytes a reply, a byte rate per
// connection (a token bucket), a few reads in flight per connection and in all.
#include <algorithm>

#include "common/json_bounded.h"
#include "common/log.h"
#include "common/log_request.h"
#include "common/rpc/protocol.h"
#include "controlplane/manager.h"

namespace weft::cp {

using nlohmann::json;
using rpc::CallContext;

namespace {

constexpr size_t kMaxChunk = 256 * 1024;
constexpr int64_t kMaxWaitMs = 30'000;
constexpr uint64_t kPollUs = 250'000;  // a long poll asks the agent again this often
constexpr size_t kMaxTail = 100'000;
constexpr int kMaxPerSession = 4;
constexpr size_t kMaxReads = 256;
// Per identity (a certificate's subject, a local user), whatever its connections: one
// operator cannot take every read from the others.
constexpr size_t kMaxReadsPerIdentity = 16;
// Per connection: 4 MiB/s, bursts of 1 MiB. A read asks for no more than is left; below
// kMinGrant it waits for the bucket to fill.
constexpr double kBytesPerUs = 4.0 * 1024 * 1024 / 1e6;
constexpr double kBurst = 1024 * 1024;
constexpr double kMinGrant = 4096;

bool terminal_name(const std::string& s) {
  return s == "exited" || s == "failed" || s == "stopped";
}

// Ended in the control plane's view: nothing more will be written to its logs.
bool ended(TaskState s) {
  return s == TaskState::kStopped || s == TaskState::kExited || s == TaskState::kFailed ||
         s == TaskState::kLost;
}

}  // namespace

std::string Manager::machine_name(MachineId m) const {
  return broker_.persisted(m).info.id;
}

namespace {}  // namespace

bool Manager::may_read_logs(const Caller& who, EntitlementId e) const {
  if (who.role == Role::kAdmin) return true;
  if (who.id && any_matches(cfg_.access.logs, *who.id)) return true;
  auto it = broker_.entitlements().find(e);
  return it != broker_.entitlements().end() && may_operate(who, it->second.owners);
}

Result<json> Manager::api_task_logs(const json& p, const CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  // The agent's own parameters, checked here as the agent checks them (one validator),
  // and what the control plane adds: the task, a long poll.
  TRY_ASSIGN(LogRequest req, parse_log_request(p, kMaxChunk, kMaxTail));
  json ask{{"stream", req.stream}};
  if (req.cursor) ask["cursor"] = {{"seq", req.cursor->seq}, {"offset", req.cursor->offset}};
  if (req.tail) ask["tail"] = *req.tail;
  const size_t max_bytes = req.max_bytes;
  TRY_ASSIGN(const int64_t wait_ms, int_member(p, "wait_ms", 0, 0, kMaxWaitMs));

  // The task: by its id, or the live task of a job's index (the newest one if none is).
  // A task the scheduler no longer keeps (it ended and was replaced) is still asked for
  // on the machine it ran on, which keeps the output of its last ended tasks.
  std::string id, job_name;
  EntitlementId ent = 0;  // the entitlement the task ran in (TaskRecord::entitlement)
  MachineId machine = 0;
  TaskState state = TaskState::kExited;
  if (p.contains("task")) {
    if (!p["task"].is_string()) return field_error("task", "must be a task id");
    id = p["task"].get<std::string>();
    if (auto it = sched_.tasks().find(id); it != sched_.tasks().end()) {
      job_name = it->second.job;
      machine = it->second.machine;
      state = it->second.state;
      ent = it->second.entitlement;
    } else if (auto gone = sched_.erased_on(id)) {
      job_name = id.substr(0, id.find('.'));
      machine = gone->machine;
      ent = gone->entitlement;
    } else {
      return make_error("no task " + id + " (weftctl job show lists them)")
          .with_code(rpc::kNotFound);
    }
  } else if (p.contains("job")) {
    if (!p["job"].is_string()) return field_error("job", "must be a job's name");
    TRY_ASSIGN(const int64_t index, int_member(p, "index", 0, 0, INT32_MAX));
    job_name = p["job"].get<std::string>();
    if (!sched_.job(job_name)) return make_error("no job " + job_name).with_code(rpc::kNotFound);
    const TaskRecord* task = nullptr;
    for (const TaskRecord* t : sched_.task_refs_of(job_name)) {
      if (t->index != index) continue;
      bool live = !ended(t->state);
      if (!task || (live && ended(task->state)) ||
          (live == !ended(task->state) && t->since_us >= task->since_us))
        task = t;
    }
    if (!task)
      return make_error("job " + job_name + " has no task of index " + std::to_string(index))
          .with_code(rpc::kNotFound);
    id = task->id;
    machine = task->machine;
    state = task->state;
    ent = task->entitlement;
  } else {
    return field_error("task", "is required (or job and index)");
  }

  Caller who = caller(c);
  // A task's output belongs to the entitlement it ran in, recorded with the task (never
  // that of a job that took its job's name since). An entitlement removed since has no
  // owners: admins and access.logs only.
  json audited = {{"name", id}};
  if (!may_read_logs(who, ent)) {
    Result<json> no = make_error(who.who + " may not read the logs of " + id +
                                 ": logs need the admin role, an owner of the job's "
                                 "entitlement, or a certificate matching access.logs")
                          .with_code(rpc::kPermissionDenied);
    audit(who, "task.logs", audited, no);
    return no;
  }
  if (!c.session) return make_error("task.logs needs a session").with_code(rpc::kUnavailable);
  LogPeer& peer = log_peer(c.session);
  if (peer.in_flight >= kMaxPerSession || log_reads_.size() >= kMaxReads)
    return make_error("too many log reads in flight; try again").with_code(rpc::kUnavailable);
  // (At most kMaxReads reads to count: no index kept for this.)
  if (static_cast<size_t>(std::count_if(log_reads_.begin(), log_reads_.end(), [&](const auto& r) {
        return r.second->who == who.who;
      })) >= kMaxReadsPerIdentity)
    return make_error(who.who + " has " + std::to_string(kMaxReadsPerIdentity) +
                      " log reads in flight, the most one identity may; try again")
        .with_code(rpc::kUnavailable);
  if (peer.audited.insert(id).second) {
    if (peer.audited.size() > 4096) peer.audited.clear();  // bounded; audited again later
    audit(who, "task.logs", audited, json());
  }
  if (state == TaskState::kPending)
    return json{{"task", id},
                {"data", ""},
                {"state", task_state_name(state)},
                {"cursor", ask.value("cursor", json())},
                {"skipped", false}};

  ask["id"] = id;
  auto read = std::make_unique<LogRead>();
  read->reply = c.session->defer_reply();
  read->caller = c.session;
  read->who = who.who;
  read->task = id;
  read->machine = machine;
  read->ask = std::move(ask);
  read->max_bytes = max_bytes;
  read->deadline_us = now_us() + static_cast<uint64_t>(wait_ms) * 1000;
  ++peer.in_flight;
  uint64_t read_id = next_log_read_++;
  log_reads_.emplace(read_id, std::move(read));
  log_read_step(read_id);
  return json();
}

Manager::LogPeer& Manager::log_peer(rpc::Session* s) {
  auto [it, fresh] = log_peers_.try_emplace(s);
  if (fresh) {
    it->second.tokens = kBurst;
    it->second.at_us = now_us();
    s->watch_close([this, s] {
      log_peers_.erase(s);
      for (auto& [id, r] : log_reads_)
        if (r->caller == s) r->caller = nullptr;
    });
  }
  return it->second;
}

void Manager::log_read_step(uint64_t id) {
  auto it = log_reads_.find(id);
  if (it == log_reads_.end()) return;
  LogRead& r = *it->second;
  if (!r.caller) return log_read_done(id, make_error("the caller went away"));
  LogPeer& peer = log_peers_[r.caller];
  uint64_t now = now_us();
  peer.tokens = std::min(kBurst, peer.tokens + static_cast<double>(now - peer.at_us) * kBytesPerUs);
  peer.at_us = now;
  if (peer.tokens < kMinGrant) {
    // Over its rate: this read waits for the bucket, however long it may wait.
    auto wait = static_cast<uint64_t>((kMinGrant - peer.tokens) / kBytesPerUs) + 1;
    auto t = loop_->add_timer_in(wait, [this, id] { log_read_step(id); });
    if (!t.ok()) return log_read_done(id, std::move(t).error());
    r.timer = std::move(t).value();
    return;
  }
  auto s = sessions_.find(r.machine);
  if (s == sessions_.end())
    return log_read_done(id, make_error("machine " + machine_name(r.machine) +
                                        " is not connected; the logs of " + r.task + " are on it")
                                 .with_code(rpc::kUnavailable));
  json ask = r.ask;
  ask["max_bytes"] = std::min<size_t>(r.max_bytes, static_cast<size_t>(peer.tokens));
  s->second->call("task.logs", std::move(ask), [this, id](Result<json> got) {
    auto found = log_reads_.find(id);
    if (found == log_reads_.end()) return;
    LogRead& read = *found->second;
    if (!got.ok()) {
      Error e = std::move(got).error();
      if (e.code == rpc::kMethodNotFound)
        e = make_error("the agent of machine " + machine_name(read.machine) +
                       " is too old to serve logs to the control plane")
                .with_code(rpc::kUnavailable);
      return log_read_done(id, std::move(e).wrap("machine " + machine_name(read.machine)));
    }
    json j = std::move(got).value();
    if (!j.is_object() || !j.contains("data") || !j["data"].is_string())
      return log_read_done(
          id, make_error("machine " + machine_name(read.machine) + " sent a malformed log chunk"));
    std::string state =
        j.contains("state") && j["state"].is_string() ? j["state"].get<std::string>() : "";
    if (read.caller) {
      log_peers_[read.caller].tokens -=
          static_cast<double>(j["data"].get_ref<const std::string&>().size());
    }
    bool more_later = j["data"].get_ref<const std::string&>().empty() && !terminal_name(state) &&
                      now_us() + kPollUs < read.deadline_us;
    if (!more_later) {
      j["task"] = read.task;
      j["machine"] = machine_name(read.machine);
      return log_read_done(id, std::move(j));
    }
    // A long poll: nothing new yet; ask again from the cursor the agent gave.
    read.ask.erase("tail");
    if (j.contains("cursor")) read.ask["cursor"] = j["cursor"];
    auto t = loop_->add_timer_in(kPollUs, [this, id] { log_read_step(id); });
    if (!t.ok()) return log_read_done(id, std::move(t).error());
    read.timer = std::move(t).value();
  });
}

void Manager::log_read_done(uint64_t id, Result<json> r) {
  auto it = log_reads_.find(id);
  if (it == log_reads_.end()) return;
  std::unique_ptr<LogRead> read = std::move(it->second);
  log_reads_.erase(it);
  if (read->caller)
    if (auto p = log_peers_.find(read->caller); p != log_peers_.end()) --p->second.in_flight;
  read->reply(std::move(r));
}

}  // namespace weft::cp
