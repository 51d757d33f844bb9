// A machine daemon's link to control plane replicas: endpoints tried in turn, a
// follower's "not the leader" answer followed to the leader it names, and on to the next
// replica when the leader goes away.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/cp_link.h"
#include "common/fs.h"

namespace weft {
namespace {

using json = nlohmann::json;

struct Replica {
  std::string sock;
  bool leads = false;
  std::string leader;  // what a follower names
  int hellos = 0;
  rpc::Dispatcher methods;
  std::unique_ptr<rpc::Server> server;
};

TEST(ControlPlaneLink, FollowsTheLeaderAmongReplicas) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-link-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  Replica rs[3];
  for (int i = 0; i < 3; ++i) {
    Replica& r = rs[i];
    r.sock = dir + "/cp" + std::to_string(i) + ".sock";
    r.methods.add("machine.register", [&r](const json&, const rpc::CallContext&) -> Result<json> {
      ++r.hellos;
      if (r.leads) return json{{"heartbeat_interval_ms", 1000}};
      Error e = make_error("a follower").with_code(rpc::kNotLeader);
      e.leader = r.leader;
      return e;
    });
    r.server = std::make_unique<rpc::Server>(**loop, &r.methods);
    ASSERT_TRUE(r.server->listen_unix(r.sock, 0600).ok());
  }
  // Replica 2 leads; replica 0 (tried first) names it; replica 1 names nobody.
  rs[2].leads = true;
  rs[0].leader = rs[2].sock;
  auto link = std::make_unique<ControlPlaneLink>(
      **loop, rs[0].sock + ", " + rs[1].sock + "," + rs[2].sock, "test", nullptr,
      [](rpc::Session& s, ControlPlaneLink::Done done) {
        s.call("machine.register", json::object(), std::move(done));
      },
      [](rpc::Session&) {});
  link->start();
  for (int i = 0; i < 300 && !link->session(); ++i) (void)(*loop)->run_once(10'000);
  ASSERT_NE(link->session(), nullptr);
  EXPECT_EQ(rs[0].hellos, 1);
  EXPECT_EQ(rs[1].hellos, 0) << "the follower's redirect went straight to the leader";
  EXPECT_EQ(rs[2].hellos, 1);
  // The leader goes away and replica 1 leads now: the link finds it within a round.
  rs[2].server.reset();
  rs[1].leads = true;
  rs[0].leader = rs[1].sock;
  for (int i = 0; i < 300 && (rs[1].hellos == 0 || !link->session()); ++i)
    (void)(*loop)->run_once(10'000);
  ASSERT_NE(link->session(), nullptr);
  EXPECT_EQ(rs[1].hellos, 1);
  link.reset();
  for (auto& r : rs) r.server.reset();
  (void)remove_tree(dir);
}

TEST(ControlPlaneLink, EveryEndpointOfAListIsChecked) {
  EXPECT_TRUE(check_control_plane_endpoint("/run/a.sock, /run/b.sock", "agent.toml:3", false).ok());
  auto bad = check_control_plane_endpoint("/run/a.sock, 10.0.0.1:7070", "agent.toml:3", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().str().find("control_plane_tls"), std::string::npos) << bad.error().str();
  EXPECT_FALSE(check_control_plane_endpoint(" , ", "agent.toml:3", true).ok());
  EXPECT_EQ(split_endpoints(" a:1 ,b:2,, c:3 "), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
}

}  // namespace
}  // namespace weft
