#include "controlplane/region/front_end.h"

#include <signal.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <set>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/endpoint.h"
#include "common/rpc/protocol.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/prefix_watch.h"
#include "controlplane/region/records.h"
#include "controlplane/region/region.h"
#include "controlplane/region/transactions.h"
#include "controlplane/web/web_view.h"

namespace weft::cp {

using json = nlohmann::json;
using rpc::CallContext;
using Route = FrontEnd::Route;

namespace {

// A broker group's link among the shards' (not a shard id: it cannot be one):
// "(brokers)" for the one group of `brokers = "..."`, "(brokers dc1)" for a named one.
std::string brokers_link(const std::string& group) {
  return group == "default" ? "(brokers)" : "(brokers " + group + ")";
}
bool is_brokers(const std::string& id) {
  return id.rfind("(brokers", 0) == 0;
}

// Every call weftctl makes, with what its caller needs and where it goes. Machine calls
// are not here: a machine's daemons reach the shard that holds it.
const FrontEnd::MethodRoute kRoutes[] = {
    {"entitlement.create", kAdminCall, Route::kNewEntitlement, "name"},
    {"entitlement.update", kAdminCall, Route::kEntitlement, "name"},
    {"entitlement.rm", kAdminCall, Route::kDropEntitlement, "name"},
    {"entitlement.ls", kViewerCall, Route::kAll, "entitlements"},
    {"entitlement.show", kViewerCall, Route::kEntitlement, "name"},
    {"job.create", kOperatorCall, Route::kNewJob, "name"},
    {"job.scale", kOperatorCall, Route::kJob, "name"},
    {"job.update", kOperatorCall, Route::kJob, "name"},
    {"job.stop", kOperatorCall, Route::kJob, "name"},
    {"job.ls", kViewerCall, Route::kAll, "jobs"},
    {"job.show", kViewerCall, Route::kJob, "name"},
    {"job.autoscale", kViewerCall, Route::kJob, "name"},
    {"job.events", kViewerCall, Route::kJob, "name"},
    {"job.history", kViewerCall, Route::kJob, "name"},
    {"job.revert", kOperatorCall, Route::kJob, "name"},
    {"job.rollout", kOperatorCall, Route::kJob, "name"},
    {"job.autoscale.pause", kOperatorCall, Route::kJob, "name"},
    {"rebalance.plan", kViewerCall, Route::kEntitlement, "name"},
    {"rebalance.status", kViewerCall, Route::kEntitlement, "name"},
    {"rebalance.pause", kOperatorCall, Route::kEntitlement, "name"},
    {"top", kViewerCall, Route::kAll, "rows"},
    {"task.ls", kViewerCall, Route::kAll, "tasks"},
    {"task.logs", kViewerCall, Route::kTask, "task"},
    {"task.show", kViewerCall, Route::kTask, "id"},
    {"task.signal", kOperatorCall, Route::kTask, "id"},
    {"task.restart", kOperatorCall, Route::kTask, "id"},
    {"machine.ls", kViewerCall, Route::kAll, "machines"},
    {"machine.show", kViewerCall, Route::kMachine, "machine"},
    {"machine.drain", kAdminCall, Route::kMachine, "machine"},
    {"machine.rm", kAdminCall, Route::kMachine, "machine"},
    {"machine.assign", kAdminCall, Route::kMachine, "machine"},
    {"machine.release", kAdminCall, Route::kMachine, "machine"},
    {"audit.ls", kViewerCall, Route::kAll, "entries"},
    {"maintenance.ls", kViewerCall, Route::kAll, "events"},
    {"maintenance.schedule", kAdminCall, Route::kMaintenance, ""},
    {"maintenance.cancel", kAdminCall, Route::kMaintenance, ""},
    {"entitlement.move", kAdminCall, Route::kMove, "name"},
    {"shard.drain", kAdminCall, Route::kDrainShard, "shard"},
    {"controlplane.status", kViewerCall, Route::kStatus, ""},
    {"web.page", kViewerCall, Route::kWeb, ""},
    {"service.ls", kViewerCall, Route::kAll, "services"},
    {"service.show", kViewerCall, Route::kJob, "job"},
    // Every shard has the whole region's services (RegionServices): one answers a watch
    // of all of them.
    {"service.watch", kViewerCall, Route::kJobOrAny, "job"},
};

template <class T>
bool not_found(const Result<T>& r) {
  return !r.ok() && r.error().code == rpc::kNotFound;
}

// Whether a shard's error says what it did (it refused, nothing changed) rather than that
// the answer was lost on the way (the shard may have done it).
bool definite(const Error& e) {
  return e.code != rpc::kUnavailable && e.code != rpc::kTimeout && e.code != 0;
}

Error unavailable(const std::string& what) {
  return make_error(what).with_code(rpc::kUnavailable);
}

// The job a task id "<job>.<index>.<generation>" belongs to ("" when it is not one).
std::string job_of_task(const std::string& id) {
  size_t gen = id.rfind('.');
  if (gen == std::string::npos || gen == 0) return "";
  size_t index = id.rfind('.', gen - 1);
  if (index == std::string::npos || index == 0) return "";
  return id.substr(0, index);
}

// The field a merged list is sorted by: the first of these its entries have.
const char* const kSortKeys[] = {"name", "machine", "job", "id", "at_wall_us"};

}  // namespace

Result<std::unique_ptr<FrontEnd>> FrontEnd::create(CpConfig cfg) {
  TRY_ASSIGN(auto loop, EventLoop::create());
  return std::unique_ptr<FrontEnd>(new FrontEnd(std::move(cfg), std::move(loop)));
}

FrontEnd::FrontEnd(CpConfig cfg, std::unique_ptr<EventLoop> loop)
    : cfg_(std::move(cfg)), loop_(std::move(loop)) {}

FrontEnd::~FrontEnd() {
  server_.close();
  for (auto& [id, s] : shards_) s.link.reset();
}

Status FrontEnd::start() {
  TRY_ASSIGN(etcd_, EtcdWorker::create(*loop_, cfg_.store.etcd.etcd));
  TRY_ASSIGN(homes_watch_,
             PrefixWatch::create(*loop_, cfg_.store.etcd.etcd, cfg_.region.prefix + "entitlements/",
                                 [this] { refresh_homes(); }));
  ControlPlaneTls ctls{cfg_.tls, ""};
  // The brokers too, when given: machine listings include the free pool.
  std::map<std::string, std::string> links = cfg_.region.shards;
  for (const auto& [group, endpoints] : cfg_.region.brokers) links[brokers_link(group)] = endpoints;
  for (const auto& [id, endpoints] : links) {
    Shard& s = shards_[id];
    s.id = id;
    s.endpoints = endpoints;
    json hello_call{{"method", "controlplane.status"},
                    {"caller", {{"who", "front end"}, {"role", "viewer"}}}};
    // The link's hello and keepalive: the shard's leader answers; a follower says where
    // the leader is (not_leader) and the link goes there.
    auto hello = [hello_call](rpc::Session& session, ControlPlaneLink::Done done) {
      session.call("frontend.forward", hello_call, [done](Result<json> r) {
        if (!r.ok()) return done(std::move(r));
        done(json{{"heartbeat_interval_ms", 1000}});
      });
    };
    auto report = [hello_call](rpc::Session& session) {
      session.call("frontend.forward", hello_call, [](Result<json>) {});
    };
    TRY_ASSIGN(s.link, make_control_plane_link(*loop_, endpoints,
                                               "weft-frontend (shard " + id + ")", &shard_commands_,
                                               hello, report, cfg_.insecure_listen, ctls));
    s.link->start();
  }
  MoveDriver::Hooks mh;
  mh.call = [this](const std::string& shard, const json& params, MoveDriver::Done done) {
    auto it = shards_.find(shard);
    rpc::Session* s = it == shards_.end() ? nullptr : it->second.link->session();
    if (!s) return done(unavailable("shard " + shard + " is unreachable now"));
    s->call("region.move", params, std::move(done));
  };
  mh.homes_changed = [this] { refresh_homes(); };
  TRY_ASSIGN(moves_, MoveDriver::create(*loop_, cfg_, std::move(mh)));
  TRY(serve());
  refresh_homes();
  sd_notify(0, "READY=1");
  log_info("front end serving", {{"SHARDS", std::to_string(shards_.size())}});
  return {};
}

Status FrontEnd::run() {
  return loop_->run();
}

Status FrontEnd::serve() {
  register_methods();
  TRY(mkdir_p(cfg_.state_dir, 0750));
  // SIGHUP reads the TLS files again for the shards' links too.
  auto reload_links = [this]() -> Status {
    for (auto& [id, sh] : shards_)
      if (Status s = sh.link->reload_tls(); !s.ok()) return s;
    return {};
  };
  TRY(server_.listen(cfg_, reload_links));
  if (!cfg_.web_listen.empty()) {
    TRY(server_.serve_web(cfg_.web_listen, cfg_.web_hosts, [this] {
      if (now_monotonic_us() - web_made_us_ > 2'000'000) refresh_web();
      return web_html_;
    }));
    refresh_web();
  }
  TRY(loop_->exit_on_termination());
  loop_->enable_watchdog();
  return {};
}

void FrontEnd::register_methods() {
  for (const MethodRoute& m : kRoutes)
    server_.methods().add(
        m.name, [this, &m](const json& p, const CallContext& c) { return handle(m, p, c); });
  // A command inside a task (issue 59): carried to the shard that holds the task's job,
  // as the operator, its bytes relayed both ways (exec_relay.h); the shard checks the
  // operator and audits the command as for a call of its own.
  server_.methods().add("task.exec",
                        [this](const json& p, const CallContext& c) { return route_exec(p, c); });
  server_.methods().add("task.exec.input", [this](const json& p, const CallContext& c) {
    if (c.session) execs_.from_caller(c.session, p);
    return Result<json>(json::object());
  });
  for (const char* m : {"task.exec.output", "task.exec.exit"})
    shard_commands_.add(
        m, [this, exit = std::string(m) == "task.exec.exit"](const json& p, const CallContext& c) {
          if (c.session) execs_.from_upstream(c.session, p, exit);
          return Result<json>(json::object());
        });
}

Result<json> FrontEnd::route_exec(const json& p, const CallContext& c) {
  Caller who = identify_caller(c.peer, cfg_.access, server_.socket_gid(), cfg_.socket_group);
  TRY(permit_call(who, kOperatorCall, "task.exec", cfg_.socket_group));
  if (!p.is_object() || !p.contains("id") || !p["id"].is_string())
    return field_error("id", "is required: the task's id");
  std::string job = job_of_task(p["id"].get<std::string>());
  if (job.empty()) return field_error("id", "is not a task id (<job>.<index>.<generation>)");
  TRY(execs_.admit(c.session, who.who));
  rpc::Session* caller = c.session;
  // The operator's session may close while the job is looked for: then it is not used.
  auto gone = std::make_shared<bool>(false);
  caller->watch_close([gone] { *gone = true; });
  json w = carried(who);
  rpc::ReplyFn reply = caller->defer_reply();
  locate(Route::kJob, job, w,
         [this, p, w, reply, caller, gone, name = who.who](Result<std::string> shard) {
           if (*gone) return;
           if (!shard.ok()) return reply(std::move(shard).error());
           auto it = shards_.find(*shard);
           rpc::Session* s = it == shards_.end() ? nullptr : it->second.link->session();
           execs_.start(caller, name, s, "frontend.forward",
                        {{"method", "task.exec"}, {"params", p}, {"caller", w}}, reply);
         });
  return json();
}

json FrontEnd::carried(const Caller& who) const {
  json c{{"role", role_name(who.role)}, {"who", who.who}};
  if (who.id)
    c["identity"] = {{"subject", who.id->subject},
                     {"cn", who.id->common_name},
                     {"ou", who.id->units},
                     {"dns", who.id->dns}};
  return c;
}

Result<json> FrontEnd::handle(const MethodRoute& m, const json& p, const CallContext& c) {
  Caller who = identify_caller(c.peer, cfg_.access, server_.socket_gid(), cfg_.socket_group);
  TRY(permit_call(who, m.access, m.name, cfg_.socket_group));
  if (m.route == Route::kStatus) return status();
  if (m.route == Route::kUnsupported)
    return make_error(std::string(m.name) +
                      " is not served by a front end yet: call the shard's own control plane "
                      "(docs/regions.md)")
        .with_code(rpc::kUnsupported);
  if (!p.is_object()) return field_error("params", "must be an object");
  std::string name;
  if (m.route == Route::kJobOrAny && p.contains(m.key)) {
    if (!p[m.key].is_string()) return field_error(m.key, "must be a job's name");
    name = p[m.key].get<std::string>();
  } else if (m.route != Route::kAll && m.route != Route::kWeb && m.route != Route::kJobOrAny &&
             m.route != Route::kMaintenance) {
    const char* key = m.route == Route::kNewJob ? "name" : m.key;
    if (!p.contains(key) || !p[key].is_string() || p[key].get_ref<const std::string&>().empty())
      return field_error(key, "is required");
    name = p[key].get<std::string>();
  }
  if (!c.session) return make_error("a front end serves sessions only");
  json w = carried(who);
  rpc::ReplyFn reply = c.session->defer_reply();
  std::string method = m.name;
  Done done = [reply, method](Result<json> r) {
    if (!r.ok() && r.error().code == rpc::kNotLeader)
      r = unavailable(method + ": the shard is changing leader; try again");
    reply(std::move(r));
  };
  switch (m.route) {
    case Route::kAll:
      route_all(method, m.key, p, w, done);
      break;
    case Route::kWeb:
      web_page(w, [done](std::string html) { done(json{{"html", std::move(html)}}); });
      break;
    case Route::kMaintenance:
      route_maintenance(method, p, w, done);
      break;
    case Route::kJobOrAny:
      route_job_or_any(m, name, p, w, done);
      break;
    case Route::kNewEntitlement:
      route_entitlement_create(p, w, done);
      break;
    case Route::kNewJob:
      route_job_create(p, w, done);
      break;
    case Route::kEntitlement:
    case Route::kDropEntitlement:
      route_entitlement(m, name, p, w, done);
      break;
    case Route::kJob:
    case Route::kMachine:
      route_to_located(m.route, name, m, p, w, done);
      break;
    case Route::kMove:
      route_move(p, done);
      break;
    case Route::kDrainShard:
      route_drain(p, done);
      break;
    case Route::kTask: {
      std::string job = job_of_task(name);
      if (job.empty()) {
        done(field_error(m.key, "is not a task id (<job>.<index>.<generation>)"));
        break;
      }
      route_to_located(Route::kJob, job, m, p, w, done);
      break;
    }
    default:
      done(make_error("unrouted method"));
  }
  return json();  // the deferred reply answers
}

// Every shard's answer, merged (ls calls, services, machine.ls's pages by shard).
void FrontEnd::route_all(const std::string& method, const char* key, const json& p, const json& w,
                         Done done) {
  // A shard lists the region's services (its own and the others'): each shard is
  // asked for its own only.
  json params = p;
  if (method == "service.ls") params["local"] = true;
  // machine.ls's pages: `after` is an earlier answer's `next`, each shard's cursor;
  // only the shards it names are asked again, each from its own.
  std::map<std::string, json> cursors;
  if (method == "machine.ls" && p.contains("after")) {
    Status read = [&]() -> Status {
      if (!p["after"].is_object() || p["after"].empty())
        return field_error("after", "must be the `next` of an earlier machine.ls");
      for (const auto& [shard, at] : p["after"].items()) {
        if (!shards_.count(shard) || !at.is_string())
          return field_error("after." + shard, "is no shard's cursor");
        cursors[shard] = params;
        cursors[shard]["after"] = at;
      }
      return {};
    }();
    if (!read.ok()) return done(std::move(read).error());
  }
  fan_out(
      method, params, w,
      [this, done, method, key = std::string(key)](auto answers) {
        json out = merge(key, answers);
        if (method == "service.ls") {  // each shard's agents, and the stops they hold
          json agents = json::array();
          uint64_t held = 0;
          for (const auto& [shard, r] : answers) {
            if (!r.ok() || !r->is_object()) continue;
            held += r->value("stops_waiting", uint64_t{0});
            if (r->contains("agents") && (*r)["agents"].is_array())
              for (json a : (*r)["agents"]) {
                if (a.is_object()) a["shard"] = shard;
                agents.push_back(std::move(a));
              }
          }
          out["agents"] = std::move(agents);
          out["stops_waiting"] = held;
        }
        done(std::move(out));
      },
      {}, method == "machine.ls", cursors.empty() ? nullptr : &cursors);
}

// A job's shard when the call names one, else any reachable shard.
void FrontEnd::route_job_or_any(const MethodRoute& m, const std::string& name, const json& p,
                                const json& w, Done done) {
  if (!name.empty()) {
    route_to_located(Route::kJob, name, m, p, w, done);
  } else {
    std::string any;
    for (const auto& [id, s] : shards_)
      if (!is_brokers(id) && s.link->session()) {
        any = id;
        break;
      }
    if (any.empty())
      done(unavailable("no shard is reachable now"));
    else
      forward(any, m.name, p, w, done);
  }
}

// The entitlement's home shard (and, for entitlement.rm, the home dropped after it).
void FrontEnd::route_entitlement(const MethodRoute& m, const std::string& name, const json& p,
                                 const json& w, Done done) {
  home_of(name, [this, &m, p, w, done, name](Result<std::string> shard) {
    if (!shard.ok()) return done(std::move(shard).error());
    forward(*shard, m.name, p, w, [this, &m, done, name, s = *shard](Result<json> r) {
      if (r.ok() && m.route == Route::kDropEntitlement) {
        homes_.erase(name);
        std::string prefix = cfg_.region.prefix;
        etcd_->post([prefix, name, s](etcd::Client& client) -> EtcdWorker::Then {
          if (auto d = drop_entitlement_home(client, prefix, name, s); !d.ok())
            log_warn("entitlement home not dropped",
                     {{"ENTITLEMENT", name}, {"ERROR", d.error().str()}});
          return {};
        });
      }
      // Where the entitlement lives (entitlement show): its home, and its move if
      // one is under way.
      if (r.ok() && r->is_object() && std::string(m.name) == "entitlement.show") {
        (*r)["shard"] = s;
        return moves_->list([r, name, done](auto moves) mutable {
          if (moves.ok())
            if (auto mv = moves->find(name); mv != moves->end()) (*r)["move"] = mv->second;
          done(std::move(r));
        });
      }
      done(std::move(r));
    });
  });
}

void FrontEnd::forward(const std::string& shard, const std::string& method, const json& p,
                       const json& who, Done done) {
  auto it = shards_.find(shard);
  if (it == shards_.end())
    return done(unavailable("shard " + shard + " is not one of this front end's [region.shards]"));
  rpc::Session* s = it->second.link->session();
  if (!s) {
    ++it->second.failed;
    return done(unavailable("shard " + shard + " is unreachable now (no leader answers at " +
                            it->second.endpoints + ")"));
  }
  ++it->second.forwarded;
  s->call("frontend.forward", {{"method", method}, {"params", p}, {"caller", who}},
          [this, shard, done](Result<json> r) {
            if (!r.ok() && !definite(r.error())) {
              auto sh = shards_.find(shard);
              if (sh != shards_.end()) ++sh->second.failed;
            }
            done(std::move(r));
          });
}

void FrontEnd::fan_out(const std::string& method, const json& p, const json& who,
                       std::function<void(std::map<std::string, Result<json>>)> done,
                       const std::string& except, bool with_brokers,
                       const std::map<std::string, json>* only) {
  struct Gather {
    size_t left = 0;
    std::map<std::string, Result<json>> answers;
    std::function<void(std::map<std::string, Result<json>>)> done;
  };
  auto g = std::make_shared<Gather>();
  auto asked = [&](const std::string& id) {
    return id != except && (!is_brokers(id) || with_brokers) && (!only || only->count(id));
  };
  for (const auto& [id, s] : shards_) g->left += asked(id);
  g->done = std::move(done);
  if (g->left == 0) return g->done({});
  for (const auto& [id, s] : shards_)
    if (asked(id))
      forward(id, method, only ? only->at(id) : p, who, [g, id = id](Result<json> r) {
        g->answers.emplace(id, std::move(r));
        if (--g->left == 0) g->done(std::move(g->answers));
      });
}

json FrontEnd::merge(const std::string& key,
                     const std::map<std::string, Result<json>>& answers) const {
  json list = json::array(), unreachable = json::array(), next = json::object();
  bool truncated = false;
  for (const auto& [shard, r] : answers) {
    if (!r.ok()) {
      unreachable.push_back({{"shard", shard}, {"error", r.error().str()}});
      continue;
    }
    if (!r->is_object() || !r->contains(key) || !(*r)[key].is_array()) continue;
    if (r->contains("next")) {
      truncated = true;
      next[shard] = (*r)["next"];
    }
    for (json e : (*r)[key]) {
      if (e.is_object()) e["shard"] = shard;
      list.push_back(std::move(e));
    }
  }
  const char* by = nullptr;
  for (const char* k : kSortKeys)
    if (!list.empty() && list[0].is_object() && list[0].contains(k)) {
      by = k;
      break;
    }
  if (by)
    std::stable_sort(list.begin(), list.end(), [by](const json& a, const json& b) {
      if (!a.is_object() || !b.is_object() || !a.contains(by) || !b.contains(by)) return false;
      return a[by] < b[by];
    });
  json out{{key, std::move(list)}};
  if (!unreachable.empty()) out["unreachable"] = std::move(unreachable);
  // A shard that has more says where it stopped: `next` (shard -> its cursor) asks each
  // for the rest (machine.ls pages so; a list that cannot page says it is cut short).
  if (truncated)
    out[key == "machines" ? "next" : "truncated"] =
        key == "machines" ? std::move(next) : json(true);
  return out;
}

void FrontEnd::locate(Route kind, const std::string& name, const json& who,
                      std::function<void(Result<std::string>)> done) {
  auto& cache = kind == Route::kJob ? job_shard_ : machine_shard_;
  if (auto it = cache.find(name); it != cache.end()) return done(it->second);
  const char* method = kind == Route::kJob ? "job.show" : "machine.show";
  json p = kind == Route::kJob ? json{{"name", name}} : json{{"machine", name}};
  auto found_at = [this, kind, name, done](std::map<std::string, Result<json>> answers) {
    std::string lost, found;
    std::set<std::string> at, entitlements;
    for (const auto& [shard, r] : answers) {
      if (r.ok()) {
        found += (found.empty() ? "" : " and ") + shard;
        at.insert(shard);
        if (r->is_object() && (*r).contains("entitlement") && (*r)["entitlement"].is_string())
          entitlements.insert((*r)["entitlement"].get<std::string>());
      }
      if (!r.ok() && !not_found(r)) lost += (lost.empty() ? "" : ", ") + shard;
    }
    std::string what = (kind == Route::kJob ? "job " : "machine ") + name;
    if (at.size() > 1 && kind == Route::kJob && entitlements.size() == 1) {
      // One job on two shards, in one entitlement: it is moving (the new shard has read
      // it in, both fenced) or was just moved (the old one not yet forgotten). Its home in
      // etcd, read again now, says which shard acts for it: asked there, a fenced shard
      // answers "moving" (issue 59: this was answered as two jobs, "stop one"). Not
      // cached: the home changes when the move is decided.
      const std::string ent = *entitlements.begin();
      return refresh_homes([this, ent, at, found, what, done] {
        auto it = homes_.find(ent);
        if (it != homes_.end() && at.count(it->second)) return done(it->second);
        done(unavailable(what + " is moving between shards " + found +
                         ": try again in a few seconds (weftctl entitlement show " + ent + ")"));
      });
    }
    if (at.size() > 1)
      return done(make_error(what + " is on shards " + found +
                             " (made while one did not answer): stop one through its shard")
                      .with_code(rpc::kConflict));
    if (!found.empty()) {
      (kind == Route::kJob ? job_shard_ : machine_shard_)[name] = found;
      return done(found);
    }
    if (!lost.empty())
      return done(unavailable(what + " is not on the shards that answered; shards " + lost +
                              " did not answer"));
    done(make_error("no " + what + " in this region").with_code(rpc::kNotFound));
  };
  fan_out(method, p, who, found_at, {}, kind == Route::kMachine);
}

void FrontEnd::route_to_located(Route kind, const std::string& name, const MethodRoute& m,
                                const json& p, const json& who, Done done) {
  bool cached = (kind == Route::kJob ? job_shard_ : machine_shard_).count(name) > 0;
  locate(kind, name, who, [this, kind, name, &m, p, who, done, cached](Result<std::string> s) {
    if (!s.ok()) return done(std::move(s).error());
    forward(*s, m.name, p, who,
            [this, kind, name, &m, p, who, done, cached, shard = *s](Result<json> r) {
              // A job stopped and made again on another shard since it was cached: look again
              // once.
              if (cached && not_found(r)) {
                (kind == Route::kJob ? job_shard_ : machine_shard_).erase(name);
                return route_to_located(kind, name, m, p, who, done);
              }
              // job show, machine show: which shard answered.
              std::string method = m.name;
              if (r.ok() && r->is_object() && method.size() > 5 &&
                  method.compare(method.size() - 5, 5, ".show") == 0)
                (*r)["shard"] = shard;
              done(std::move(r));
            });
  });
}

void FrontEnd::home_of(const std::string& name, std::function<void(Result<std::string>)> done) {
  if (auto it = homes_.find(name); it != homes_.end()) return done(it->second);
  refresh_homes([this, name, done] {
    if (auto it = homes_.find(name); it != homes_.end()) return done(it->second);
    done(make_error("no entitlement named " + name + " in this region").with_code(rpc::kNotFound));
  });
}

void FrontEnd::route_entitlement_create(const json& p, const json& who, Done done) {
  std::string name = p["name"].get<std::string>();
  if (auto s = check_machine_name("name", name, true); !s.ok()) return done(std::move(s).error());
  json params = p;
  std::string shard;
  if (p.contains("shard")) {  // the Capacity Portal's choice
    if (!p["shard"].is_string()) return done(field_error("shard", "must be a shard id"));
    shard = p["shard"].get<std::string>();
    if (!check_shard_id("shard", shard).ok() || !shards_.count(shard))
      return done(field_error("shard", "no shard " + shard));
    params.erase("shard");
  } else {
    // The reachable shard with the fewest entitlements.
    std::map<std::string, size_t> load;
    for (const auto& [id, s] : shards_)
      if (!is_brokers(id) && !draining_.count(id) && s.link->session()) load[id] = 0;
    for (const auto& [e, s] : homes_)
      if (load.count(s)) ++load[s];
    for (const auto& [id, n] : load)
      if (shard.empty() || n < load[shard]) shard = id;
    if (shard.empty()) return done(unavailable("no shard is reachable now"));
  }
  std::string prefix = cfg_.region.prefix;
  etcd_->post(
      [this, prefix, name, shard, params, who, done](etcd::Client& client) -> EtcdWorker::Then {
        Status claimed = claim_entitlement_home(client, prefix, name, shard);
        return [this, claimed, prefix, name, shard, params, who, done] {
          if (!claimed.ok()) return done(claimed.error());
          homes_[name] = shard;
          log_info("entitlement home", {{"ENTITLEMENT", name}, {"SHARD", shard}});
          forward(shard, "entitlement.create", params, who,
                  [this, prefix, name, shard, done](Result<json> r) {
                    // Refused by the shard (a bad field): nothing was made, so the home
                    // goes too. An answer lost on the way keeps it: the shard may have made
                    // the entitlement, and a retry goes to the same shard.
                    if (!r.ok() && definite(r.error()) && r.error().code != rpc::kConflict) {
                      homes_.erase(name);
                      etcd_->post([prefix, name, shard](etcd::Client& c) -> EtcdWorker::Then {
                        (void)drop_entitlement_home(c, prefix, name, shard);
                        return {};
                      });
                    }
                    if (r.ok() && r->is_object()) (*r)["shard"] = shard;
                    done(std::move(r));
                  });
        };
      });
}

void FrontEnd::route_move(const json& p, Done done) {
  std::string name = p["name"].get<std::string>();
  if (auto s = check_machine_name("name", name, true); !s.ok()) return done(std::move(s).error());
  if (!p.contains("to") || !p["to"].is_string())
    return done(field_error("to", "must name a shard"));
  std::string to = p["to"].get<std::string>();
  if (!check_shard_id("to", to).ok() || !shards_.count(to) || is_brokers(to))
    return done(field_error("to", "no shard " + to + " in this front end's [region.shards]"));
  if (p.contains("wait") && !p["wait"].is_boolean())
    return done(field_error("wait", "must be true or false"));
  bool wait = p.value("wait", true);
  home_of(name, [this, name, to, wait, done](Result<std::string> from) {
    if (!from.ok()) return done(from.error());
    if (*from == to)
      return done(field_error("to", "entitlement " + name + " is on shard " + to + " already"));
    moves_->start(name, *from, to, wait, done);
  });
}

void FrontEnd::route_drain(const json& p, Done done) {
  std::string shard = p["shard"].get<std::string>();
  if (!check_shard_id("shard", shard).ok() || !shards_.count(shard) || is_brokers(shard))
    return done(field_error("shard", "no shard " + shard + " in this front end's [region.shards]"));
  if (p.contains("wait") && !p["wait"].is_boolean())
    return done(field_error("wait", "must be true or false"));
  bool wait = p.value("wait", true);
  std::string prefix = cfg_.region.prefix;
  // Marked first, so that no new entitlement is given the shard meanwhile (and none
  // after: remove it from [region.shards] once it is empty).
  etcd_->post([this, prefix, shard, wait, done](etcd::Client& c) -> EtcdWorker::Then {
    auto marked = c.txn({}, {{etcd::Op::Kind::kPut, prefix + "draining/" + shard, "{}", {}, 0}});
    return [this, marked, shard, wait, done] {
      if (!marked.ok()) return done(marked.error());
      draining_.insert(shard);
      refresh_homes([this, shard, wait, done] {
        // Each to the reachable shard with the fewest entitlements, one at a time.
        struct Drain {
          std::vector<std::string> left;
          json moved = json::array(), failed = json::array();
          Done done;
          std::function<void()> next;
        };
        auto d = std::make_shared<Drain>();
        for (const auto& [e, s] : homes_)
          if (s == shard) d->left.push_back(e);
        d->done = done;
        json plan = d->left;
        d->next = [this, d, shard] {
          if (d->left.empty()) {
            Done finished = std::move(d->done);
            d->next = nullptr;  // the cycle through the shared state ends here
            if (finished)
              finished(json{{"shard", shard},
                            {"moved", d->moved},
                            {"failed", d->failed},
                            {"empty", d->failed.empty()}});
            return;
          }
          std::string e = d->left.back();
          d->left.pop_back();
          std::map<std::string, size_t> load;
          for (const auto& [id, s] : shards_)
            if (!is_brokers(id) && id != shard && !draining_.count(id) && s.link->session())
              load[id] = 0;
          for (const auto& [name, s] : homes_)
            if (load.count(s)) ++load[s];
          std::string to;
          for (const auto& [id, n] : load)
            if (to.empty() || n < load[to]) to = id;
          if (to.empty()) {
            d->failed.push_back({{"entitlement", e}, {"error", "no other shard is reachable"}});
            return d->next();
          }
          moves_->start(e, shard, to, true, [d, e, to](Result<json> r) {
            if (r.ok())
              d->moved.push_back({{"entitlement", e}, {"to", to}});
            else
              d->failed.push_back({{"entitlement", e}, {"error", r.error().str()}});
            auto go = d->next;
            if (go) go();
          });
        };
        if (!wait) {
          done(json{{"shard", shard}, {"moving", plan}});
          d->done = nullptr;
        }
        d->next();
      });
    };
  });
}

void FrontEnd::route_job_create(const json& p, const json& who, Done done) {
  if (!p.contains("entitlement") || !p["entitlement"].is_string())
    return done(field_error("entitlement", "is required"));
  std::string ent = p["entitlement"].get<std::string>(), name = p["name"].get<std::string>();
  home_of(ent, [this, p, who, done, name](Result<std::string> home) {
    if (!home.ok())
      return done(field_error("entitlement", home.error().message).with_code(home.error().code));
    // Job names are the region's: one made on another shard first is refused here (the
    // home shard refuses its own duplicates itself, so only the others are asked).
    std::string s = *home;
    auto create = [this, p, who, done, name, s] {
      forward(s, "job.create", p, who, [this, done, name, s](Result<json> r) {
        if (r.ok()) job_shard_[name] = s;
        done(std::move(r));
      });
    };
    if (cfg_.region.shards.size() == 1) return create();
    fan_out(
        "job.show", json{{"name", name}}, who,
        [this, done, name, create](std::map<std::string, Result<json>> answers) {
          for (const auto& [shard, r] : answers) {
            if (r.ok()) {
              job_shard_[name] = shard;
              return done(make_error("job " + name + " exists on shard " + shard)
                              .with_code(rpc::kConflict));
            }
            // A shard that does not answer does not hold up the others' creates (a
            // shard's trouble stays its own); should it have the name, later calls by
            // name are refused as ambiguous until one of the two goes.
            if (!not_found(r))
              log_info("job.create: a shard did not answer whether it has the name",
                       {{"JOB", name}, {"SHARD", shard}, {"ERROR", r.error().str()}});
          }
          create();
        },
        s);
  });
}

void FrontEnd::refresh_homes(std::function<void()> then) {
  std::string prefix = cfg_.region.prefix;
  etcd_->post([this, prefix, then](etcd::Client& c) -> EtcdWorker::Then {
    int64_t revision = 0;
    auto kvs = c.range_prefix(prefix + "entitlements/", &revision);
    Result<std::map<std::string, std::string>> homes =
        kvs.ok() ? parse_entitlement_homes(prefix, *kvs)
                 : Result<std::map<std::string, std::string>>(std::move(kvs).error());
    // Shards being drained (shard.drain): given no new entitlement.
    std::set<std::string> draining;
    std::string base = prefix + "draining/";
    auto marks = c.range_prefix(base);
    if (marks.ok())
      for (const auto& kv : *marks) draining.insert(kv.key.substr(base.size()));
    return
        [this, homes = std::move(homes), then, revision, draining, marked = marks.ok()]() mutable {
          if (marked) draining_ = std::move(draining);
          if (homes.ok()) {
            // An entitlement that changed shard (a move) took its jobs and machines
            // along: where they were seen is forgotten, and found again when next named.
            for (const auto& [name, shard] : *homes)
              if (auto was = homes_.find(name); was != homes_.end() && was->second != shard) {
                job_shard_.clear();
                machine_shard_.clear();
                break;
              }
            homes_ = std::move(homes).value();
            homes_read_ = true;
            homes_watch_->after(revision);  // read again as soon as one changes
          } else if (homes_errors_++ % 30 == 0) {
            log_warn("the region's entitlements not read from etcd; the last copy stays",
                     {{"ERROR", homes.error().str()}});
          }
          if (then) then();
          // Besides the watch: again 30 s after the last read (a second after a failed one).
          auto t =
              loop_->add_timer_in(homes.ok() ? 30'000'000 : 1'000'000, [this] { refresh_homes(); });
          if (t.ok()) refresh_timer_ = std::move(t).value();
        };
  });
}

void FrontEnd::route_maintenance(const std::string& method, const json& p, const json& who,
                                 Done done) {
  auto ask_all = [this, method, who, done](json params) {
    fan_out(
        method, params, who,
        [done](std::map<std::string, Result<json>> answers) {
          json took = json::array(), unreachable = json::array(), first;
          Result<json> refusal =
              field_error("id", "no shard or broker has this event").with_code(rpc::kNotFound);
          bool refused = false;
          for (auto& [shard, r] : answers) {
            if (r.ok()) {
              if (first.is_null()) first = *r;
              took.push_back(shard);
            } else if (r.error().code == rpc::kNotFound) {
              if (!refused) refusal = r.error();  // none of its machines: not for it
            } else if (r.error().code == rpc::kUnavailable) {
              unreachable.push_back({{"shard", shard}, {"error", r.error().str()}});
            } else {
              refusal = r.error();  // refused (a bad field): said as it is
              refused = true;
            }
          }
          if (took.empty()) {
            if (!refused && !unreachable.empty())
              return done(unavailable("no shard or broker group took it; unreachable: " +
                                      unreachable.dump()));
            return done(std::move(refusal));
          }
          first["shards"] = std::move(took);
          if (!unreachable.empty()) first["unreachable"] = std::move(unreachable);
          done(std::move(first));
        },
        {}, /*with_brokers=*/true);
  };
  if (method == "maintenance.cancel") return ask_all(p);
  if (p.contains("id"))
    return done(field_error("id", "is given by the front end (a region's event id)"));
  // One id for the event everywhere, from the region's sequence in etcd.
  std::string key = cfg_.region.prefix + "maintenance-seq";
  etcd_->post([key, p, ask_all, done](etcd::Client& c) -> EtcdWorker::Then {
    auto n = next_in_sequence(c, key);
    return [n, p, ask_all, done] {
      if (!n.ok()) return done(unavailable("no region event id from etcd: " + n.error().str()));
      json params = p;
      params["id"] = Maintenance::kRegionIds + *n;
      ask_all(std::move(params));
    };
  });
}

void FrontEnd::web_page(const json& who, std::function<void(std::string)> done) {
  // The four listings the page is made of (web_view.h), each from every shard (and, for
  // machines, every broker group's free pool).
  struct Pages {
    FleetSnapshot s;
    int left = 4;
    std::vector<std::string> away;
    std::function<void(std::string)> done;
  };
  auto g = std::make_shared<Pages>();
  g->s.now_wall_us = static_cast<int64_t>(now_realtime_us());
  g->s.leader = "front end " + (cfg_.listen.empty() ? cfg_.socket : cfg_.listen);
  g->done = std::move(done);
  for (auto [method, key] : {std::pair{"machine.ls", "machines"},
                             {"entitlement.ls", "entitlements"},
                             {"job.ls", "jobs"},
                             {"maintenance.ls", "events"}}) {
    std::string k = key, mth = method;
    fan_out(
        mth, json::object(), who,
        [this, g, k, mth](std::map<std::string, Result<json>> answers) {
          json merged = merge(k, answers);
          for (const auto& [shard, r] : answers)
            if (!r.ok()) g->away.push_back(shard + " (" + mth + ")");
          json& rows = merged[k];
          if (mth == "machine.ls") g->s.machines = std::move(rows);
          if (mth == "entitlement.ls") g->s.entitlements = std::move(rows);
          if (mth == "job.ls") g->s.jobs = std::move(rows);
          if (mth == "maintenance.ls") g->s.maintenance = std::move(rows);
          if (--g->left > 0) return;
          std::string html = render_fleet_html(g->s);
          if (!g->away.empty()) {
            // Said at the top of the page: what is missing from it.
            std::string note = "<p id=\"unreachable\">Not shown (unreachable now): ";
            for (size_t i = 0; i < g->away.size(); ++i)
              note += (i ? ", " : "") + html_escape(g->away[i]);
            note += "</p>";
            size_t body = html.find("<body>");
            html.insert(body == std::string::npos ? 0 : body + 6, note);
          }
          g->done(std::move(html));
        },
        {}, mth == "machine.ls");
  }
}

void FrontEnd::refresh_web() {
  if (web_making_) return;
  web_making_ = true;
  web_page({{"role", "viewer"}, {"who", "front end (web_listen)"}}, [this](std::string html) {
    web_html_ = std::move(html);
    web_made_us_ = now_monotonic_us();
    web_making_ = false;
  });
}

json FrontEnd::status() const {
  json shards = json::array();
  for (const auto& [id, s] : shards_) {
    size_t n = 0;
    for (const auto& [e, home] : homes_) n += home == id;
    shards.push_back({{"shard", id},
                      {"endpoints", s.endpoints},
                      {"connected", s.link->session() != nullptr},
                      {"entitlements", n},
                      {"forwarded", s.forwarded},
                      {"failed", s.failed}});
  }
  return {{"role", "front-end"}, {"leading", true},           {"store", "etcd"},
          {"shards", shards},    {"homes_read", homes_read_}, {"entitlements", homes_.size()}};
}

}  // namespace weft::cp
