// A machine daemon's link to control plane replicas: endpoints tried in turn, a
// follower's "not the leader" answer followed to the leader it names, and on to the next
// replica when the leader goes away.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/cp_link.h"
#include "common/fs.h"
#include "common/rpc/server.h"
#include "common/strings.h"

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

// A region (docs/regions.md): the configured control plane (a broker) names the shard
// that holds the machine (kMoved); the link goes there and stays. When the shard sends
// it back (kMoved to ""), the link returns to the configured endpoints; when every
// replica of the holder stops answering, too.
TEST(ControlPlaneLink, FollowsTheMachineToItsHolderAndBack) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-link-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  Replica broker, shard;
  broker.sock = dir + "/broker.sock";
  shard.sock = dir + "/shard.sock";
  std::string holder = shard.sock;  // what the broker says; "" = the machine is free
  bool shard_holds = true;
  broker.methods.add("machine.register", [&](const json&, const rpc::CallContext&) -> Result<json> {
    ++broker.hellos;
    if (holder.empty()) return json{{"heartbeat_interval_ms", 1000}};
    Error e = make_error("held by shard s1").with_code(rpc::kMoved);
    e.leader = "/nonexistent/replica.sock," + holder;  // the shard's replicas
    return e;
  });
  shard.methods.add("machine.register", [&](const json&, const rpc::CallContext&) -> Result<json> {
    ++shard.hellos;
    if (shard_holds) return json{{"heartbeat_interval_ms", 1000}};
    return make_error("not held here").with_code(rpc::kMoved);  // back to the brokers
  });
  for (Replica* r : {&broker, &shard}) {
    r->server = std::make_unique<rpc::Server>(**loop, &r->methods);
    ASSERT_TRUE(r->server->listen_unix(r->sock, 0600).ok());
  }
  auto link = std::make_unique<ControlPlaneLink>(
      **loop, broker.sock, "test", nullptr,
      [](rpc::Session& s, ControlPlaneLink::Done done) {
        s.call("machine.register", json::object(), std::move(done));
      },
      [](rpc::Session&) {});
  link->start();
  auto until = [&](auto ok) {
    for (int i = 0; i < 1000 && !ok(); ++i) (void)(*loop)->run_once(10'000);
    return ok();
  };
  ASSERT_TRUE(until([&] { return link->session() && shard.hellos == 1; }));
  EXPECT_EQ(broker.hellos, 1);
  // The shard gives the machine back: its session ends and it says so at the next hello.
  shard_holds = false;
  holder = "";
  link->session()->close();
  ASSERT_TRUE(until([&] { return link->session() && broker.hellos == 2; }));
  EXPECT_EQ(shard.hellos, 2);
  // Lent again; then the shard's every replica goes away: after two rounds there, the
  // link asks the broker again.
  holder = shard.sock;
  shard_holds = true;
  link->session()->close();
  ASSERT_TRUE(until([&] { return link->session() && shard.hellos == 3; }));
  shard.server.reset();
  holder = "";
  ASSERT_TRUE(until([&] { return link->session() && broker.hellos == 4; }))
      << "broker hellos " << broker.hellos;
  link.reset();
  broker.server.reset();
  (void)remove_tree(dir);
}

// A listening Unix socket at `path` (the caller accepts, or never does).
Fd listen_at(const std::string& path) {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(fd.get(), 4) != 0)
    return Fd();
  return fd;
}

// Replicas that are there but do not answer (a frozen process: the kernel still
// accepts its connections) are left for the next: one that never answers the hello
// (after the hello timeout), one that answers the hello and then no report (after three
// report intervals), and the link ends at the replica that answers.
TEST(ControlPlaneLink, AReplicaThatStopsAnsweringIsLeft) {
  std::string dir = std::filesystem::temp_directory_path() / ("weft-link-" + random_hex(5));
  ASSERT_TRUE(mkdir_p(dir).ok());
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  // 0: accepts nothing.
  Fd mute = listen_at(dir + "/mute.sock");
  ASSERT_TRUE(mute.valid());
  // 1: answers the hello (reports every 100 ms), then reads and never answers.
  Fd frozen = listen_at(dir + "/frozen.sock");
  ASSERT_TRUE(frozen.valid());
  int lines_unanswered = 0;
  std::thread frozen_side([&] {
    pollfd p{frozen.get(), POLLIN, 0};
    if (::poll(&p, 1, 15'000) != 1) return;
    Fd c(::accept4(frozen.get(), nullptr, nullptr, SOCK_CLOEXEC));
    std::string in;
    char buf[4096];
    bool answered = false;
    for (;;) {
      pollfd q{c.get(), POLLIN, 0};
      if (::poll(&q, 1, 15'000) != 1) return;
      ssize_t n = ::read(c.get(), buf, sizeof buf);
      if (n <= 0) return;  // the link left
      in.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = in.find('\n')) != std::string::npos; in.erase(0, nl + 1)) {
        if (answered) {
          ++lines_unanswered;
          continue;
        }
        json hello = json::parse(in.substr(0, nl));
        std::string reply = json{{"jsonrpc", "2.0"},
                                 {"id", hello["id"]},
                                 {"result", {{"heartbeat_interval_ms", 100}}}}
                                .dump() +
                            "\n";
        if (::write(c.get(), reply.data(), reply.size()) != static_cast<ssize_t>(reply.size()))
          return;
        answered = true;
      }
    }
  });
  // 2: leads and answers.
  Replica live;
  live.sock = dir + "/live.sock";
  int reports = 0;
  live.methods.add("machine.register", [&](const json&, const rpc::CallContext&) -> Result<json> {
    ++live.hellos;
    return json{{"heartbeat_interval_ms", 100}};
  });
  live.methods.add("machine.report", [&](const json&, const rpc::CallContext&) -> Result<json> {
    ++reports;
    return json::object();
  });
  live.server = std::make_unique<rpc::Server>(**loop, &live.methods);
  ASSERT_TRUE(live.server->listen_unix(live.sock, 0600).ok());

  auto link = std::make_unique<ControlPlaneLink>(
      **loop, dir + "/mute.sock," + dir + "/frozen.sock," + live.sock, "test", nullptr,
      [](rpc::Session& s, ControlPlaneLink::Done done) {
        s.call("machine.register", json::object(), std::move(done));
      },
      [](rpc::Session& s) { s.call("machine.report", json::object(), [](Result<json>) {}); });
  auto t0 = std::chrono::steady_clock::now();
  link->start();
  for (int i = 0; i < 1500 && reports < 3; ++i) (void)(*loop)->run_once(10'000);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(live.hellos, 1);
  EXPECT_GE(reports, 3) << "the link never reached the replica that answers";
  // The hello timeout (5 s) and three intervals (at least 1 s), not much more.
  EXPECT_GE(took, 6.0);
  EXPECT_LT(took, 12.0);
  link.reset();
  frozen_side.join();
  EXPECT_GE(lines_unanswered, 3) << "the frozen replica was left before three report intervals";
  live.server.reset();
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

// Names that travel between sidekicks and the control plane: a profile is never a path.
TEST(ControlPlaneLink, ProfileAndMachineNamesAreBounded) {
  for (const char* good : {"dev", "web-2", "db_primary", "v1.2"})
    EXPECT_TRUE(valid_profile_name(good)) << good;
  for (const std::string& bad :
       std::vector<std::string>{"", ".hidden", "../../../etc/passwd", "a/b", "a b", "x\n",
                                std::string(65, 'p'), std::string("a\0b", 3)})
    EXPECT_FALSE(valid_profile_name(bad)) << bad;
  EXPECT_TRUE(check_machine_name("machine", "m1.dc1.example:7", true).ok());
  EXPECT_FALSE(check_machine_name("machine", "", true).ok());
  EXPECT_TRUE(check_machine_name("dc", "", false).ok());
  EXPECT_FALSE(check_machine_name("machine", "a/b", true).ok());
  EXPECT_FALSE(check_machine_name("machine", std::string(254, 'm'), true).ok());
}

}  // namespace
}  // namespace weft
