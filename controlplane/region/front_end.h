// A region's front end (docs/regions.md): stateless, any number behind one name. weftctl
// talks to it as to a control plane; it checks the caller once, routes each call to the
// shard that owns the entitlement, job or machine the call names (carried with the
// caller's role and identity: `frontend.forward`), answers the calls that span shards
// by asking every shard and merging, and gives each new entitlement a shard (the one
// with the fewest) by claiming its home in etcd before the shard creates it.
//
// What it keeps is a cache: the entitlements' homes (read from etcd at the start, again
// whenever etcd says one changed (a watch), after each change it makes, and every 30 s),
// and which shard had each job and machine it was asked about (checked again when the
// shard says it has no such thing).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "common/cp_link.h"
#include "common/event.h"
#include "common/rpc/server.h"
#include "controlplane/api/access.h"
#include "controlplane/api/cp_server.h"
#include "controlplane/daemon/cp_conf.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/move_driver.h"
#include "controlplane/region/prefix_watch.h"
#include "controlplane/tasks/exec_relay.h"

namespace weft::cp {

class FrontEnd {
 public:
  static Result<std::unique_ptr<FrontEnd>> create(CpConfig cfg);
  ~FrontEnd();
  Status start();
  Status run();

  // How a call finds its shard.
  enum class Route {
    kEntitlement,      // params[key] names an entitlement: its home
    kJob,              // params[key] names a job: the shard that has it
    kTask,             // params[key] is a task id "<job>.<index>.<generation>": its job's
    kMachine,          // params[key] names a machine: the shard that holds it
    kAll,              // every shard; the lists under `key` merged
    kJobOrAny,         // params[key] names a job: its shard; none: any one shard
    kNewEntitlement,   // entitlement.create: a home first
    kDropEntitlement,  // entitlement.rm: its home, then the home dropped
    kNewJob,           // job.create: its entitlement's home, the name unused elsewhere
    kStatus,           // answered here
    kWeb,              // the web view of the whole region, from every shard's listings
    kMaintenance,      // every shard and broker group: schedule (a region id) or cancel
    kMove,             // entitlement.move: driven from here (moves.h)
    kDrainShard,       // shard.drain: every entitlement of the shard moved elsewhere
    kUnsupported,      // not through a front end (yet): said so
  };
  struct MethodRoute {
    const char* name;
    int access;  // Access (access.h)
    Route route;
    const char* key;
  };

 private:
  FrontEnd(CpConfig cfg, std::unique_ptr<EventLoop> loop);
  struct Shard {
    std::string id, endpoints;
    std::unique_ptr<ControlPlaneLink> link;
    uint64_t forwarded = 0, failed = 0;
  };
  using Done = std::function<void(Result<nlohmann::json>)>;

  Status serve();
  void register_methods();
  Result<nlohmann::json> handle(const MethodRoute& m, const nlohmann::json& p,
                                const rpc::CallContext& c);
  // The caller as the shards are told (caller.who, caller.role, caller.identity).
  nlohmann::json carried(const Caller& who) const;
  // One call to one shard, carried for `who`.
  void forward(const std::string& shard, const std::string& method, const nlohmann::json& p,
               const nlohmann::json& who, Done done);
  // The same call to every shard (but `except`; and the brokers, for machines);
  // `done` gets each one's answer.
  // With `only`, just the shards it names, each with its own params.
  void fan_out(const std::string& method, const nlohmann::json& p, const nlohmann::json& who,
               std::function<void(std::map<std::string, Result<nlohmann::json>>)> done,
               const std::string& except = {}, bool with_brokers = false,
               const std::map<std::string, nlohmann::json>* only = nullptr);
  // Which shard has job (or machine) `name`: the cache, else asked of every shard.
  void locate(Route kind, const std::string& name, const nlohmann::json& who,
              std::function<void(Result<std::string>)> done);
  // The home of entitlement `name`: the cache, else read again from etcd first.
  void home_of(const std::string& name, std::function<void(Result<std::string>)> done);
  void route_entitlement_create(const nlohmann::json& p, const nlohmann::json& who, Done done);
  void route_job_create(const nlohmann::json& p, const nlohmann::json& who, Done done);
  void route_to_located(Route kind, const std::string& name, const MethodRoute& m,
                        const nlohmann::json& p, const nlohmann::json& who, Done done);
  nlohmann::json merge(const std::string& key,
                       const std::map<std::string, Result<nlohmann::json>>& answers) const;
  nlohmann::json status() const;
  // The region's web view (web_view.h) from every shard's and broker group's listings,
  // as `who` sees them.
  void web_page(const nlohmann::json& who, std::function<void(std::string)> done);
  // web_listen's page: the last one made, made again (in the background) when it is
  // viewed and older than 2 s: nothing is asked of the shards while nobody looks.
  void refresh_web();
  // maintenance.schedule (with a region id from etcd) and maintenance.cancel, asked of
  // every shard and broker group: done by those with machines of the target (or the
  // event); the answer says which, and which did not answer.
  void route_maintenance(const std::string& method, const nlohmann::json& p,
                         const nlohmann::json& who, Done done);
  // entitlement.move and shard.drain (moves.h); entitlement.show says where a move is.
  void route_move(const nlohmann::json& p, Done done);
  void route_all(const std::string& method, const char* key, const nlohmann::json& p,
                 const nlohmann::json& w, Done done);
  void route_job_or_any(const MethodRoute& m, const std::string& name, const nlohmann::json& p,
                        const nlohmann::json& w, Done done);
  void route_entitlement(const MethodRoute& m, const std::string& name, const nlohmann::json& p,
                         const nlohmann::json& w, Done done);
  // task.exec: to the shard that holds the task's job, its bytes through execs_.
  Result<nlohmann::json> route_exec(const nlohmann::json& p, const rpc::CallContext& c);
  void route_drain(const nlohmann::json& p, Done done);
  std::unique_ptr<MoveDriver> moves_;
  // Reads every entitlement's home from etcd (then runs `then`, if any).
  void refresh_homes(std::function<void()> then = {});

  CpConfig cfg_;
  std::unique_ptr<EventLoop> loop_;
  CpServer server_{*loop_};
  rpc::Dispatcher shard_commands_;
  std::map<std::string, Shard> shards_;
  ExecRelay execs_{"the task's shard"};
  std::unique_ptr<EtcdWorker> etcd_;
  std::unique_ptr<PrefixWatch> homes_watch_;
  std::map<std::string, std::string> homes_;                // entitlement -> shard
  std::set<std::string> draining_;                          // shards shard.drain marked
  std::unordered_map<std::string, std::string> job_shard_;  // seen: job -> shard
  std::unordered_map<std::string, std::string> machine_shard_;
  bool homes_read_ = false;
  uint64_t homes_errors_ = 0;
  Source refresh_timer_;
  std::string web_html_;  // web_listen's page
  uint64_t web_made_us_ = 0;
  bool web_making_ = false;
};

}  // namespace weft::cp
