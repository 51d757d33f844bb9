// shard_controller: a reference TaskController (docs/taskcontrol.md). It listens for the
// control plane's taskcontrol.plan calls and acknowledges a job's restarts only while
// every shard keeps at least --floor replicas serving (shard_manager.h).
//
//   shard_controller --listen 127.0.0.1:7400 --shards 15000 --replicas 3 --floor 2
//
// and in the job file:  [task_controller]  address = "127.0.0.1:7400"
#include <CLI/CLI.hpp>

#include "common/event.h"
#include "common/log.h"
#include "common/rpc/endpoint.h"
#include "common/rpc/server.h"
#include "examples/shard_controller/shard_manager.h"

using namespace weft;

int main(int argc, char** argv) {
  CLI::App app{"shard_controller: a shard-manager TaskController for weft"};
  std::string listen = "127.0.0.1:7400";
  int shards = 100, replicas = 3, floor = 2;
  app.add_option("--listen", listen, "host:port or unix:/path to listen on");
  app.add_option("--shards", shards, "shards")->check(CLI::Range(1, 10'000'000));
  app.add_option("--replicas", replicas, "replicas per shard")->check(CLI::Range(1, 100));
  app.add_option("--floor", floor, "replicas of a shard that must keep serving")
      ->check(CLI::Range(0, 100));
  int max_in_flight = 0;
  app.add_option("--max-in-flight", max_in_flight,
                 "operations acknowledged and not yet complete at most (0: only the floor)")
      ->check(CLI::Range(0, 1'000'000));
  CLI11_PARSE(app, argc, argv);

  auto loop = EventLoop::create();
  if (!loop.ok()) {
    std::fprintf(stderr, "shard_controller: %s\n", loop.error().str().c_str());
    return 1;
  }
  // One shard map per job this controller serves.
  std::map<std::string, example::ShardManager> managers;
  rpc::Dispatcher methods;
  methods.add(
      "taskcontrol.plan",
      [&](const nlohmann::json& p, const rpc::CallContext&) -> Result<nlohmann::json> {
        if (!p.is_object() || !p.contains("job") || !p["job"].is_string() || !p.contains("seq"))
          return field_error("job", "a plan names its job and seq");
        auto [it, fresh] = managers.try_emplace(p["job"].get<std::string>(), shards, replicas,
                                                floor, max_in_flight);
        nlohmann::json ack = it->second.decide(p);
        if (!ack.empty()) log_info("acknowledged", {{"JOB", it->first}, {"OPS", ack.dump()}});
        return nlohmann::json{{"seq", p["seq"]}, {"ack", ack}};
      });
  rpc::Server server(**loop, &methods);
  auto ep = rpc::parse_endpoint(listen);
  Status s = !ep.ok()      ? Status(ep.error())
             : ep->is_unix ? server.listen_unix(ep->path, 0600)
                           : server.listen_tcp(ep->host, ep->port);
  if (!s.ok()) {
    std::fprintf(stderr, "shard_controller: %s\n", s.error().str().c_str());
    return 1;
  }
  (void)(*loop)->exit_on_termination();
  log_info("shard controller ready",
           {{"LISTEN", ep->is_unix ? ep->path : ep->host + ":" + std::to_string(server.tcp_port())},
            {"SHARDS", std::to_string(shards)},
            {"REPLICAS", std::to_string(replicas)},
            {"FLOOR", std::to_string(floor)}});
  return (*loop)->run().ok() ? 0 : 1;
}
