#include "controlplane/region/shard_moves.h"
#include "controlplane/region/region.h"

#include <algorithm>

#include "common/cp_link.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/rpc/protocol.h"
#include "controlplane/region/records.h"
#include "controlplane/region/transactions.h"

namespace weft::cp {

using json = nlohmann::json;

std::set<MachineId> EntitlementMoves::machines_of(EntitlementId e) const {
  // Free machines that still run a task of its jobs: a drained machine whose slots moved
  // on (the allocator gave it back) while its task runs until the replacement does.
  std::set<MachineId> out;
  for (const auto& pj : sched_.handover().persisted_jobs())
    if (pj.spec.entitlement_id == e)
      for (const TaskRecord* t : sched_.tasks().refs_of(pj.spec.name))
        if (t->state != TaskState::kStopped && t->state != TaskState::kFailed &&
            t->state != TaskState::kLost && alloc_.entitlement_of(t->machine) == kFreePool)
          out.insert(t->machine);
  for (MachineId m = 0; m < alloc_.machine_count(); ++m)
    if (alloc_.entitlement_of(m) == e) out.insert(m);
  std::erase_if(out, [this](MachineId m) { return broker_.removed(m); });
  return out;
}

MoveDoc EntitlementMoves::document(EntitlementId e, uint64_t now) const {
  MoveDoc d;
  d.entitlement = broker_.entitlements().spec(e);
  Lending* lending = hooks_.lending();
  std::set<MachineId> mine;
  for (MachineId m : machines_of(e)) {
    MoveDoc::Machine dm{broker_.persisted(m), 0, broker_.verdict_of(m)};
    dm.state.pinned = alloc_.pinned(m);
    if (lending)
      if (json h = lending->holder_of(dm.state.info.id); h.is_object())
        dm.epoch = h.value("epoch", uint64_t{0});
    d.machines.push_back(std::move(dm));
    mine.insert(m);
  }
  for (const auto& pj : sched_.handover().persisted_jobs()) {
    if (pj.spec.entitlement_id != e) continue;
    const std::string& name = pj.spec.name;
    MoveDoc::Job j;
    j.job = *sched_.handover().moved_job(name);
    j.request = alloc_.request(name);
    if (j.request) {
      for (MachineId m : alloc_.placement(name)) j.placement.push_back(alloc_.spec(m).name);
      j.dynamic_ports = alloc_.dynamic_ports(name);
    }
    for (const TaskRecord* t : sched_.tasks().refs_of(name)) {
      // An ended task on a machine that left the entitlement since is not carried: it
      // holds nothing and waits on nothing.
      if (!mine.count(t->machine)) continue;
      MoveDoc::Task dt{*t, alloc_.spec(t->machine).name, now > t->since_us ? now - t->since_us : 0};
      dt.record.machine = 0;
      dt.record.entitlement = 0;
      d.tasks.push_back(std::move(dt));
    }
    d.jobs.push_back(std::move(j));
  }
  d.task_seq = sched_.task_seq();
  if (hooks_.roll_of) d.profile_roll = hooks_.roll_of(e);
  return d;
}

Result<json> EntitlementMoves::out(const std::string& name, const std::string& to, uint64_t now) {
  auto id = broker_.entitlements().named(name);
  if (!id)
    return field_error("entitlement", "no entitlement " + name + " on this shard")
        .with_code(rpc::kNotFound);
  if (auto it = moving_.find(*id); it != moving_.end() && !it->second.outgoing)
    return conflict_error("entitlement " + name + " is on its way here from shard " +
                          it->second.other);
  if (!hooks_.lending())
    return make_error("moving an entitlement needs the region's brokers ([region] brokers)")
        .with_code(rpc::kUnsupported);
  if (!moving_.count(*id)) {
    log_info("entitlement fenced: it moves to another shard", {{"ENTITLEMENT", name}, {"TO", to}});
    moving_[*id] = {true, to, now};
  }
  fence(*id, true);
  // Written once, at the fence: asked again (a resumed move), the same document.
  Exported& x = exported_[name];
  if (x.text.empty()) {
    MoveDoc d = document(*id, now);
    x.text = move_doc_to_json(d).dump(-1, ' ', false, json::error_handler_t::replace);
    x.counts = {
        {"machines", d.machines.size()}, {"jobs", d.jobs.size()}, {"tasks", d.tasks.size()}};
    // Pages of at most kPageBytes, never cutting a UTF-8 sequence (each page is a JSON
    // string of its own on the way).
    for (size_t at = 0; at < x.text.size();) {
      size_t end = std::min(x.text.size(), at + page_bytes_);
      while (end < x.text.size() && end > at + 1 &&
             (static_cast<unsigned char>(x.text[end]) & 0xC0) == 0x80)
        --end;
      x.cuts.push_back(end);
      at = end;
    }
    x.counts["bytes"] = x.text.size();
    x.counts["pages"] = x.cuts.size();
  }
  return page_of(name, 0);
}

Result<json> EntitlementMoves::page_of(const std::string& name, size_t page) const {
  auto it = exported_.find(name);
  if (it == exported_.end())
    return conflict_error("entitlement " + name +
                          " was not written out here (ask for step out first)");
  const Exported& x = it->second;
  size_t pages = x.cuts.size();
  if (page >= pages) return field_error("page", "must be below " + std::to_string(pages));
  size_t from = page == 0 ? 0 : x.cuts[page - 1];
  json out = x.counts;
  out["pages"] = pages;
  out["page"] = page;
  out["data"] = x.text.substr(from, x.cuts[page] - from);
  return out;
}

Result<json> EntitlementMoves::receive(const std::string& name, const std::string& from,
                                       const json& p, uint64_t now) {
  auto number = [&](const char* key, uint64_t max) -> Result<uint64_t> {
    if (!p.contains(key) || !p[key].is_number_unsigned() || p[key].get<uint64_t>() > max)
      return field_error(key, "must be a number from 0 to " + std::to_string(max));
    return p[key].get<uint64_t>();
  };
  TRY_ASSIGN(uint64_t pages, number("pages", kMaxDocBytes / kPageBytes));
  if (pages == 0) return field_error("pages", "must be at least 1");
  TRY_ASSIGN(uint64_t page, number("page", pages - 1));
  if (!p.contains("data") || !p["data"].is_string() ||
      p["data"].get_ref<const std::string&>().size() > kPageBytes)
    return field_error("data", "must be a page of the document (at most " +
                                   std::to_string(kPageBytes) + " bytes)");
  Incoming& got = incoming_[name];
  if (page == 0) got = Incoming{from, pages, 0, {}};
  if (got.from != from || got.pages != pages || got.next != page) {
    uint64_t want = got.next;
    incoming_.erase(name);
    return conflict_error("page " + std::to_string(page) + " of " + std::to_string(pages) +
                          " out of order (expected " + std::to_string(want) +
                          "): send again from 0");
  }
  got.text += p["data"].get_ref<const std::string&>();
  if (++got.next < pages)
    return json{{"entitlement", name}, {"received", got.next}, {"pages", pages}};
  std::string text = std::move(got.text);
  incoming_.erase(name);
  auto j = parse_json_bounded(text);
  if (!j.ok()) return field_error("document", j.error().str());
  auto d = parse_move_doc(*j);
  if (!d.ok()) return field_error("document", d.error().str());
  if (d->entitlement.name != name)
    return field_error("document.entitlement.name", "must be " + name);
  return in(*d, from, now);
}

Result<json> EntitlementMoves::in(const MoveDoc& d, const std::string& from, uint64_t now) {
  const std::string& name = d.entitlement.name;
  if (!hooks_.lending())
    return make_error("moving an entitlement needs the region's brokers ([region] brokers)")
        .with_code(rpc::kUnsupported);
  if (auto old = broker_.entitlements().named(name)) {
    auto it = moving_.find(*old);
    if (it == moving_.end() || it->second.outgoing)
      return conflict_error("entitlement " + name + " is this shard's already");
    TRY(remove(*old, "read in again by a resumed move"));  // an earlier try of this move
    moving_.erase(it);
  }
  for (const auto& m : d.machines) {
    auto here = broker_.find(m.state.info.id);
    if (here && !broker_.removed(*here) && alloc_.entitlement_of(*here) != kFreePool)
      return conflict_error("machine " + m.state.info.id +
                            " is in another entitlement on this shard");
    if (here && !broker_.removed(*here) && alloc_.tasks_on(*here) > 0)
      return conflict_error("machine " + m.state.info.id + " runs tasks of this shard");
  }
  EntitlementSpec spec = d.entitlement;
  spec.quota = std::max<size_t>(spec.quota, 1);
  TRY_ASSIGN(EntitlementId id, broker_.entitlements().create(spec));
  fence(id, true);  // before anything of it is here: nothing acts for it
  moving_[id] = {false, from, now};
  auto undo = [&](Error e) -> Error {
    if (auto s = remove(id, "its move failed"); !s.ok())
      log_warn("a move's read-in was not undone",
               {{"ENTITLEMENT", name}, {"ERROR", s.error().str()}});
    moving_.erase(id);
    return e;
  };
  std::map<std::string, MachineId> ids;
  std::set<MachineId> machines;
  for (const auto& m : d.machines) {
    auto mid = broker_.register_machine(m.state.info, now);
    if (!mid.ok()) return undo(mid.error());
    ids[m.state.info.id] = *mid;
    machines.insert(*mid);
    if (auto s = alloc_.assign(*mid, id); !s.ok()) return undo(s.error());
    if (auto s = broker_.drain(m.state.info.id, m.state.drained, now); !s.ok())
      return undo(s.error());
    if (auto s = broker_.profile_applied(m.state.info.id, m.state.applied_profile); !s.ok())
      return undo(s.error());
    if (auto s = broker_.health(m.state.info.id, m.verdict, now); !s.ok()) return undo(s.error());
    alloc_.pin(*mid, m.state.pinned);
    broker_.expect(*mid, now + kArrivalUs);
  }
  if (d.profile_roll && hooks_.adopt_roll) hooks_.adopt_roll(id, *d.profile_roll, ids);
  std::map<std::string, std::vector<TaskRecord>> tasks;
  for (const auto& t : d.tasks) {
    TaskRecord r = t.record;
    r.machine = ids.at(t.machine);
    r.entitlement = id;
    r.since_us = now > t.age_us ? now - t.age_us : 0;
    tasks[r.job].push_back(std::move(r));
  }
  std::set<std::string> jobs;
  for (const auto& j : d.jobs) {
    Scheduler::MovedJob mj = j.job;
    mj.job.spec.entitlement_id = id;
    const std::string& job = mj.job.spec.name;
    if (sched_.job(job)) return undo(conflict_error("job " + job + " exists on this shard"));
    if (j.request) {
      Request r = *j.request;
      r.entitlement = id;
      std::vector<MachineId> placement;
      for (const auto& m : j.placement) placement.push_back(ids.at(m));
      if (auto s = alloc_.restore(r, placement, j.dynamic_ports); !s.ok())
        return undo(make_error("job " + job + ": " + s.error().str()));
    }
    sched_.handover().adopt_job(mj, tasks[job]);
    jobs.insert(job);
  }
  sched_.set_task_seq(std::max(sched_.task_seq(), d.task_seq));
  if (auto s = hooks_.persist(jobs, machines); !s.ok()) return undo(s.error());
  log_info("entitlement read in from another shard, fenced until its move is decided",
           {{"ENTITLEMENT", name},
            {"FROM", from},
            {"MACHINES", std::to_string(d.machines.size())},
            {"JOBS", std::to_string(d.jobs.size())},
            {"TASKS", std::to_string(d.tasks.size())}});
  return json{{"entitlement", name},
              {"machines", d.machines.size()},
              {"jobs", d.jobs.size()},
              {"tasks", d.tasks.size()}};
}

void EntitlementMoves::open(const std::string& name, uint64_t now, rpc::ReplyFn reply) {
  (void)now;
  auto id = broker_.entitlements().named(name);
  if (!id)
    return reply(field_error("entitlement", "no entitlement " + name + " on this shard")
                     .with_code(rpc::kNotFound));
  auto it = moving_.find(*id);
  if (it == moving_.end()) return reply(json{{"entitlement", name}, {"opened", true}});
  if (it->second.outgoing)
    return reply(conflict_error("entitlement " + name + " is moving away from this shard"));
  std::string from = it->second.other;
  std::vector<std::string> names;
  for (MachineId m : machines_of(*id)) names.push_back(alloc_.spec(m).name);
  Lending* lending = hooks_.lending();
  if (!lending)
    return reply(make_error("moving an entitlement needs the region's brokers")
                     .with_code(rpc::kUnsupported));
  EntitlementId e = *id;
  lending->take_over(
      names, from,
      [this, e, name, from, reply, count = names.size()](std::vector<std::string> held,
                                                         std::string why, bool retry) {
        auto at = moving_.find(e);
        if (at == moving_.end() || at->second.outgoing || broker_.entitlements().named(name) != e)
          return reply(conflict_error("the move of entitlement " + name + " changed meanwhile"));
        if (retry && held.size() < count)
          return reply(make_error("the machines' holder records were not all taken over: " + why)
                           .with_code(rpc::kUnavailable));
        if (held.size() < count)
          log_warn("machines of a moved entitlement are held elsewhere: they are not this shard's",
                   {{"ENTITLEMENT", name}, {"WHY", why}});
        fence(e, false);
        moving_.erase(at);
        hooks_.kick();
        log_info(
            "entitlement moved here: this shard acts for it now",
            {{"ENTITLEMENT", name}, {"FROM", from}, {"MACHINES", std::to_string(held.size())}});
        reply(json{{"entitlement", name}, {"opened", true}, {"machines", held.size()}});
      });
}

Status EntitlementMoves::remove(EntitlementId e, const char* why) {
  std::set<MachineId> machines = machines_of(e);
  std::set<std::string> jobs;
  for (const auto& j : sched_.handover().persisted_jobs())
    if (j.spec.entitlement_id == e) jobs.insert(j.spec.name);
  for (const auto& j : jobs) sched_.handover().forget_job(j);
  Lending* lending = hooks_.lending();
  for (MachineId m : machines) {
    std::string machine = alloc_.spec(m).name;
    alloc_.pin(m, false);
    TRY(hooks_.forget_machine(m, why));
    if (lending) lending->handed_over(machine);
  }
  broker_.entitlements().forget(e);
  fence(e, false);
  TRY(hooks_.delete_entitlement(e));
  return hooks_.persist(jobs, {});
}

Result<json> EntitlementMoves::forget(const std::string& name, const std::string& to) {
  auto id = broker_.entitlements().named(name);
  if (!id) return json{{"entitlement", name}, {"forgotten", true}};
  auto it = moving_.find(*id);
  if (it != moving_.end() && !it->second.outgoing)
    return conflict_error("entitlement " + name + " is on its way here, not away");
  std::string why = "moved with its entitlement to shard " + to;
  TRY(remove(*id, why.c_str()));
  moving_.erase(*id);
  exported_.erase(name);
  log_info("entitlement forgotten: it moved to another shard", {{"ENTITLEMENT", name}, {"TO", to}});
  return json{{"entitlement", name}, {"forgotten", true}};
}

Result<json> EntitlementMoves::drop(const std::string& name) {
  auto id = broker_.entitlements().named(name);
  if (!id) return json{{"entitlement", name}, {"dropped", true}};
  auto it = moving_.find(*id);
  if (it == moving_.end() || it->second.outgoing)
    return conflict_error("entitlement " + name + " is this shard's: it is not dropped");
  std::string why = "its move from shard " + it->second.other + " rolled back";
  TRY(remove(*id, why.c_str()));
  moving_.erase(*id);
  log_info("a move rolled back: what was read in is dropped", {{"ENTITLEMENT", name}});
  return json{{"entitlement", name}, {"dropped", true}};
}

Result<json> EntitlementMoves::unfence(const std::string& name) {
  auto id = broker_.entitlements().named(name);
  if (!id)
    return field_error("entitlement", "no entitlement " + name + " on this shard")
        .with_code(rpc::kNotFound);
  auto it = moving_.find(*id);
  if (it != moving_.end()) {
    if (!it->second.outgoing)
      return conflict_error("entitlement " + name + " is on its way here: drop it instead");
    moving_.erase(it);
    exported_.erase(name);
    fence(*id, false);
    hooks_.kick();
    log_info("a move rolled back: this shard acts for the entitlement again",
             {{"ENTITLEMENT", name}});
  }
  return json{{"entitlement", name}, {"unfenced", true}};
}

void EntitlementMoves::call(const json& p, uint64_t now, rpc::ReplyFn reply) {
  RegionChecks* checks = hooks_.checks ? hooks_.checks() : nullptr;
  if (!checks) return act(p, now, std::move(reply));
  // The fields first (a bad one is refused without a read), then the records.
  auto text = [&](const char* key) -> Result<std::string> {
    if (!p.is_object() || !p.contains(key) || !p[key].is_string())
      return field_error(key, "is required");
    return p[key].get<std::string>();
  };
  auto fields = [&]() -> Result<std::pair<std::string, std::string>> {
    TRY_ASSIGN(std::string step, text("step"));
    TRY_ASSIGN(std::string name, text("entitlement"));
    TRY(check_machine_name("entitlement", name, true));
    if (step == "out" || step == "forget" || step == "in") {
      const char* key = step == "in" ? "from" : "to";
      TRY_ASSIGN(std::string other, text(key));
      TRY(check_shard_id(key, other));
    }
    return std::pair{step, name};
  };
  auto f = fields();
  if (!f.ok()) return reply(std::move(f).error());
  const auto& [step, name] = *f;
  std::string other = step == "in"                        ? p["from"].get<std::string>()
                      : step == "out" || step == "forget" ? p["to"].get<std::string>()
                                                          : std::string();
  std::weak_ptr<bool> alive = alive_;
  checks->move_step(name, step, other, [this, alive, p, now, reply](Status s) {
    if (!alive.lock()) return;
    if (!s.ok()) {
      log_warn("a move's step refused: the region's records do not say it",
               {{"ERROR", s.error().str()}});
      return reply(std::move(s).error());
    }
    act(p, now, reply);
  });
}

void EntitlementMoves::act(const json& p, uint64_t now, rpc::ReplyFn reply) {
  auto text = [&](const char* key) -> Result<std::string> {
    if (!p.is_object() || !p.contains(key) || !p[key].is_string())
      return field_error(key, "is required");
    return p[key].get<std::string>();
  };
  auto run = [&]() -> Result<json> {
    TRY_ASSIGN(std::string step, text("step"));
    TRY_ASSIGN(std::string name, text("entitlement"));
    TRY(check_machine_name("entitlement", name, true));
    if (step == "out" || step == "forget") {
      TRY_ASSIGN(std::string to, text("to"));
      TRY(check_shard_id("to", to));
      return step == "out" ? out(name, to, now) : forget(name, to);
    }
    if (step == "in") {
      TRY_ASSIGN(std::string from, text("from"));
      TRY(check_shard_id("from", from));
      return receive(name, from, p, now);
    }
    if (step == "page") {
      if (!p.contains("page") || !p["page"].is_number_unsigned())
        return field_error("page", "must be a page number");
      return page_of(name, p["page"].get<size_t>());
    }
    if (step == "open") {
      open(name, now, reply);
      return json(nullptr);  // answered by open()
    }
    if (step == "drop") return drop(name);
    if (step == "unfence") return unfence(name);
    return field_error("step", "must be out, in, open, forget, drop or unfence");
  };
  bool opening = p.is_object() && p.value("step", json()).is_string() && p["step"] == "open";
  Result<json> r = run();
  if (opening && r.ok()) return;
  reply(std::move(r));
}

json EntitlementMoves::status(EntitlementId e) const {
  auto it = moving_.find(e);
  if (it == moving_.end()) return nullptr;
  return json{{it->second.outgoing ? "to" : "from", it->second.other}, {"fenced", true}};
}

Status EntitlementMoves::load(uint64_t now) {
  moving_.clear();
  TRY_ASSIGN(auto client, etcd::Client::create(cfg_.store.etcd.etcd));
  TRY_ASSIGN(auto moves, read_moves(*client, cfg_.region.prefix));
  const std::string& me = cfg_.region.shard;
  for (const auto& [name, read] : moves) {
    const MoveRecord& m = read.record;
    auto id = broker_.entitlements().named(name);
    if (!id || (m.from != me && m.to != me)) continue;
    bool outgoing = m.from == me;
    if (outgoing && m.step == "release") {
      // Decided while this shard's leader was away: what is left of it here goes. Its
      // machines' holder records go to the new shard first, unless it took them already
      // (it does when it opens): this shard must not take their daemons back meanwhile,
      // as it would once its lending read the records.
      for (MachineId mid : machines_of(*id)) {
        const std::string& machine = alloc_.spec(mid).name;
        std::string key = machine_holder_key(cfg_.region.prefix, machine);
        TRY_ASSIGN(auto rec, client->get(key));
        if (!rec) continue;
        TRY_ASSIGN(MachineHolder h, parse_machine_holder(key, rec->value));
        if (h.holder != me) continue;
        if (auto t = transfer_machine(*client, cfg_.region.prefix, machine, me, h.epoch, m.to);
            !t.ok() && t.error().code != rpc::kConflict)
          return t.error();
      }
      moving_[*id] = {true, m.to, now};
      TRY(forget(name, m.to));
      continue;
    }
    if (outgoing && m.step == "rollback") continue;  // carried on here
    if (!outgoing && m.step == "rollback") {
      moving_[*id] = {false, m.from, now};
      TRY(drop(name));
      continue;
    }
    // Under way: fenced until the front end that drives it says (export: either way;
    // release, here: open).
    moving_[*id] = {outgoing, outgoing ? m.to : m.from, now};
    fence(*id, true);
    if (!outgoing)
      for (MachineId mid = 0; mid < alloc_.machine_count(); ++mid)
        if (alloc_.entitlement_of(mid) == *id) broker_.expect(mid, now + kArrivalUs);
    log_info("a move under way: its entitlement is fenced",
             {{"ENTITLEMENT", name}, {"FROM", m.from}, {"TO", m.to}, {"STEP", m.step}});
  }
  return {};
}

}  // namespace weft::cp
