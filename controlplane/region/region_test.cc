// A region on a real etcd (Debian's etcd-server, started by the test on loopback): the
// records the roles share (entitlements' homes, machines' holders) and their
// transactions; then real weft-controlplane processes: a front end and two shards (one
// of two replicas), with fake machines on the shards' sockets. Calls through the front
// end land on the shard that owns their entitlement, lists span both shards, a job name
// is the region's, a shard acts for no entitlement it was not given, and a shard whose
// every replica is killed stops nothing on the other shard, nor, once back, any task of
// its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "common/fs.h"
#include "common/rpc/client.h"
#include "common/strings.h"
#include "common/tls.h"
#include "controlplane/region/records.h"
#include "controlplane/region/region.h"
#include "controlplane/region/transactions.h"
#include "testing/chaos.h"
#include "testing/etcd_server.h"
#include "testing/link_proxy.h"
#include "testing/replica_harness.h"

namespace weft::cp {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using weft::testing::LinkProxy;
using weft::testing::Machine;
using weft::testing::Replica;

TEST(RegionRecords, HostileValuesAreRefusedWithTheKeyNamed) {
  EXPECT_EQ(*parse_entitlement_home("/r/entitlements/web", R"({"shard":"s1"})"), "s1");
  for (const char* bad : {"", "[]", R"({"shard":1})", R"({"shard":"S1"})", R"({"shard":"../x"})",
                          R"({"shard":""})", "{\"shard\":\"s1\""}) {
    auto r = parse_entitlement_home("/r/entitlements/web", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().str().find("/r/entitlements/web"), std::string::npos) << r.error().str();
  }
  auto h = parse_machine_holder("/r/machines/m1", R"({"holder":"s2","epoch":7})");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->holder, "s2");
  EXPECT_EQ(h->epoch, 7u);
  EXPECT_TRUE(parse_machine_holder("k", R"({"holder":"","epoch":0})").ok());
  for (const char* bad : {R"({"holder":"s2"})", R"({"holder":"s2","epoch":-1})",
                          R"({"holder":"a/b","epoch":1})", R"({"epoch":1})"})
    EXPECT_FALSE(parse_machine_holder("k", bad).ok()) << bad;
  auto homes = parse_entitlement_homes("/r/", {{"/r/entitlements/web", R"({"shard":"s1"})"},
                                               {"/r/entitlements/db", R"({"shard":"s2"})"}});
  ASSERT_TRUE(homes.ok()) << homes.error().str();
  EXPECT_EQ(homes->size(), 2u);
  EXPECT_FALSE(parse_entitlement_homes("/r/", {{"/r/entitlements/..", R"({"shard":"s1"})"}}).ok());
  EXPECT_FALSE(check_shard_id("shard", "-a").ok());
  EXPECT_FALSE(check_shard_id("shard", std::string(33, 'a')).ok());
  EXPECT_TRUE(check_shard_id("shard", "s-1").ok());
}

class RegionEtcd : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    auto c = etcd::Client::create(etcd_->client_config());
    ASSERT_TRUE(c.ok()) << c.error().str();
    client_ = std::move(c).value();
  }
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::unique_ptr<etcd::Client> client_;
};

TEST_F(RegionEtcd, AWatchOfAPrefixWakesOnAChangeAfterTheRevisionRead) {
  ASSERT_TRUE(claim_entitlement_home(*client_, "/w/", "web", "s1").ok());
  int64_t rev = 0;
  auto kvs = client_->range_prefix("/w/entitlements/", &rev);
  ASSERT_TRUE(kvs.ok()) << kvs.error().str();
  ASSERT_EQ(kvs->size(), 1u);
  ASSERT_GT(rev, 0);
  // Nothing changed since: the wait ends at its timeout, saying so.
  auto quiet = client_->wait_changed("/w/entitlements/", rev, 300);
  ASSERT_TRUE(quiet.ok()) << quiet.error().str();
  EXPECT_FALSE(*quiet);
  // A key outside the prefix does not wake it; one inside does, at once.
  auto other = etcd::Client::create(etcd_->client_config());
  ASSERT_TRUE(other.ok());
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (void)(*other)->txn({}, {{etcd::Op::Kind::kPut, "/w/elsewhere", "x", {}, 0}});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (void)claim_entitlement_home(**other, "/w/", "db", "s2");
  });
  auto t0 = Clock::now();
  auto woke = client_->wait_changed("/w/entitlements/", rev, 10'000);
  auto took = Clock::now() - t0;
  writer.join();
  ASSERT_TRUE(woke.ok()) << woke.error().str();
  EXPECT_TRUE(*woke);
  EXPECT_GE(took, std::chrono::milliseconds(350)) << "woken by the key outside the prefix";
  EXPECT_LT(took, std::chrono::seconds(5));
  // A deletion wakes it too.
  int64_t now = 0;
  ASSERT_TRUE(client_->range_prefix("/w/entitlements/", &now).ok());
  ASSERT_TRUE(drop_entitlement_home(*client_, "/w/", "db", "s2").ok());
  auto deleted = client_->wait_changed("/w/entitlements/", now, 5'000);
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
}

TEST_F(RegionEtcd, AMachineIsHandedFromShardToShardOnlyByItsHolderAtItsEpoch) {
  auto lent = lend_machine(*client_, "/t/", "m1", "s1", "dc1");
  ASSERT_TRUE(lent.ok()) << lent.error().str();
  // Not its holder, or not at its epoch, or to itself: refused, nothing changed.
  EXPECT_EQ(transfer_machine(*client_, "/t/", "m1", "s2", lent->epoch, "s3").error().code,
            rpc::kConflict);
  EXPECT_EQ(transfer_machine(*client_, "/t/", "m1", "s1", lent->epoch + 1, "s2").error().code,
            rpc::kConflict);
  EXPECT_FALSE(transfer_machine(*client_, "/t/", "m1", "s1", lent->epoch, "s1").ok());
  EXPECT_FALSE(transfer_machine(*client_, "/t/", "m1", "s1", lent->epoch, "S/2").ok());
  EXPECT_FALSE(transfer_machine(*client_, "/t/", "nobody", "s1", 1, "s2").ok());
  auto moved = transfer_machine(*client_, "/t/", "m1", "s1", lent->epoch, "s2");
  ASSERT_TRUE(moved.ok()) << moved.error().str();
  EXPECT_EQ(moved->holder, "s2");
  EXPECT_EQ(moved->epoch, lent->epoch + 1);
  EXPECT_EQ(moved->broker, "dc1") << "the group that lent it keeps it";
  // The old holder can neither give it back nor hand it on; the new one can.
  EXPECT_FALSE(return_machine(*client_, "/t/", "m1", "s1", lent->epoch).ok());
  EXPECT_FALSE(transfer_machine(*client_, "/t/", "m1", "s1", lent->epoch, "s3").ok());
  auto back = return_machine(*client_, "/t/", "m1", "s2", moved->epoch);
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->holder, "");
  EXPECT_EQ(back->epoch, moved->epoch + 1);
}

TEST_F(RegionEtcd, AnEntitlementHasOneHome) {
  ASSERT_TRUE(claim_entitlement_home(*client_, "/r/", "web", "s1").ok());
  for (const char* shard : {"s1", "s2"}) {
    auto again = claim_entitlement_home(*client_, "/r/", "web", shard);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().code, rpc::kConflict);
    EXPECT_NE(again.error().message.find("its shard is s1"), std::string::npos);
  }
  // Only its own shard's home is dropped.
  ASSERT_TRUE(drop_entitlement_home(*client_, "/r/", "web", "s2").ok());
  EXPECT_TRUE(client_->get("/r/entitlements/web")->has_value());
  ASSERT_TRUE(drop_entitlement_home(*client_, "/r/", "web", "s1").ok());
  EXPECT_FALSE(client_->get("/r/entitlements/web")->has_value());
  EXPECT_TRUE(claim_entitlement_home(*client_, "/r/", "web", "s2").ok());
}

TEST_F(RegionEtcd, AMachineClaimedByTwoShardsAtOnceGoesToOne) {
  // Many rounds of two shards racing for one free machine, each with its own client.
  auto c2 = etcd::Client::create(etcd_->client_config());
  ASSERT_TRUE(c2.ok());
  for (int round = 0; round < 20; ++round) {
    std::string m = "m" + std::to_string(round % 3);
    std::atomic<int> won{0};
    Result<MachineHolder> a = make_error("unset"), b = make_error("unset");
    std::thread t1([&] { a = lend_machine(*client_, "/r/", m, "s1"); });
    std::thread t2([&] { b = lend_machine(**c2, "/r/", m, "s2"); });
    t1.join();
    t2.join();
    won = a.ok() + b.ok();
    ASSERT_EQ(won.load(), 1) << "round " << round << ": " << (a.ok() ? "" : a.error().str())
                             << " / " << (b.ok() ? "" : b.error().str());
    const Result<MachineHolder>& loser = a.ok() ? b : a;
    EXPECT_EQ(loser.error().code, rpc::kConflict) << loser.error().str();
    const MachineHolder& h = a.ok() ? *a : *b;
    auto stored = client_->get("/r/machines/" + m);
    ASSERT_TRUE(stored.ok() && stored->has_value());
    auto parsed = parse_machine_holder("k", (*stored)->value);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed->holder, h.holder);
    EXPECT_EQ(parsed->epoch, h.epoch);
    // A return with a stale epoch, or by the other shard, is refused; the holder's frees it.
    std::string other = h.holder == "s1" ? "s2" : "s1";
    EXPECT_FALSE(return_machine(*client_, "/r/", m, other, h.epoch).ok());
    EXPECT_FALSE(return_machine(*client_, "/r/", m, h.holder, h.epoch - 1).ok());
    auto freed = return_machine(*client_, "/r/", m, h.holder, h.epoch);
    ASSERT_TRUE(freed.ok()) << freed.error().str();
    EXPECT_EQ(freed->holder, "");
    EXPECT_EQ(freed->epoch, h.epoch + 1);
  }
}

// A key's value in the test's etcd, read the way a role reads it (nullopt: none, or etcd
// did not answer).
std::optional<std::string> etcd_value(const etcd::Config& cfg, const std::string& key) {
  auto c = etcd::Client::create(cfg);
  if (!c.ok()) return std::nullopt;
  auto kv = (*c)->get(key);
  if (!kv.ok() || !*kv) return std::nullopt;
  return (*kv)->value;
}

// A region of real processes: shard s1 (replicas a and b), shard s2 (replica c), a front
// end; four fake machines, two on each shard.
class Region : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-region-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    auto shard = [&](const char* name, const char* id, const std::string& top = "") {
      return std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, name, etcd_->client_config(),
                                       "2s", top, std::string("/shards/") + id + "/",
                                       std::string("[region]\nrole = \"shard\"\nshard = \"") + id +
                                           "\"\nprefix = \"/region/\"\n");
    };
    a_ = shard("a", "s1");
    b_ = shard("b", "s1");
    // s2 counts a silent machine dead at once (s1 gives its machines the usual grace
    // when it comes back).
    c_ = shard("c", "s2", "failover_grace = \"0s\"\n");
    std::string s1 = a_->sock() + "," + b_->sock();
    fe_ = std::make_unique<Replica>(
        WEFT_CONTROLPLANE_BIN, dir_, "fe", etcd_->client_config(), "2s", "", "/fe-unused/",
        "[region]\nrole = \"front-end\"\nprefix = \"/region/\"\n[region.shards]\ns1 = \"" + s1 +
            "\"\ns2 = \"" + c_->sock() + "\"\n");
    for (Replica* r : {a_.get(), b_.get(), c_.get(), fe_.get()}) r->start();
  }
  void TearDown() override {
    if (HasFailure())
      for (Replica* r : {a_.get(), b_.get(), c_.get(), fe_.get()})
        if (r) std::cerr << "---- " << r->sock() << "'s log (tail):\n" << tail(r->log()) << "\n";
    machines_.clear();
    fe_.reset();
    a_.reset();
    b_.reset();
    c_.reset();
    etcd_.reset();
    (void)remove_tree(dir_);
  }
  static std::string tail(const std::string& s, size_t max = 8000) {
    return s.size() <= max ? s : s.substr(s.size() - max);
  }
  template <class F>
  static bool wait_for(double seconds, F ok) {
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ok();
  }
  // Both shards lead and the front end reaches them.
  bool region_up() {
    return wait_for(30, [&] {
      auto st = fe_->call("controlplane.status");
      if (!st.ok() || !st->contains("shards")) return false;
      for (const auto& s : (*st)["shards"])
        if (!s.value("connected", false)) return false;
      return true;
    });
  }
  void add_machines(const std::string& shard, const std::vector<std::string>& socks, int n) {
    for (int i = 0; i < n; ++i) {
      machines_.push_back(std::make_unique<Machine>(shard + "-m" + std::to_string(i)));
      machines_.back()->start_reporting(socks, 100);
    }
  }
  int running_on(const std::string& prefix) {
    int n = 0;
    auto world = Machine::snapshot();
    for (auto& m : machines_)
      for (const auto& t : m->running()) n += t.rfind(prefix, 0) == 0;
    return n;
  }
  int starts(const std::string& prefix = "") {
    int n = 0;
    for (auto& m : machines_)
      if (m->id().rfind(prefix, 0) == 0) n += m->starts();
    return n;
  }
  static json job(const std::string& name, const std::string& ent, int count) {
    return {{"name", name},
            {"entitlement", ent},
            {"count", count},
            {"per_task", {{"cpu_milli", 500}, {"mem_mb", 256}}},
            {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  }
  static std::string shard_of(const json& list, const std::string& key, const std::string& name) {
    for (const auto& e : list)
      if (e.value(key, "") == name) return e.value("shard", "");
    return "";
  }
  std::string dir_;
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::unique_ptr<Replica> a_, b_, c_, fe_;
  std::vector<std::unique_ptr<Machine>> machines_;
};

// A front end that dies mid-call, again and again: it answers controlplane.status (so
// weftctl picks it) and closes the session on any other call without answering, as a
// front end killed after it read the call does.
class DyingFrontEnd {
 public:
  explicit DyingFrontEnd(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
          ::listen(fd_, 8) == 0;
    if (ok_) thread_ = std::thread([this] { serve(); });
  }
  ~DyingFrontEnd() {
    ::shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool ok() const { return ok_; }
  int dropped() const { return dropped_.load(); }

 private:
  void serve() {
    for (;;) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;  // shut down
      std::string buf;
      char chunk[4096];
      for (bool open = true; open;) {
        ssize_t n = ::read(c, chunk, sizeof chunk);
        if (n <= 0) break;
        buf.append(chunk, static_cast<size_t>(n));
        for (size_t nl; open && (nl = buf.find('\n')) != std::string::npos;) {
          json req = json::parse(buf.substr(0, nl), nullptr, false);
          buf.erase(0, nl + 1);
          if (req.is_object() && req.value("method", "") == "controlplane.status") {
            std::string reply = json{{"jsonrpc", "2.0"},
                                     {"id", req.value("id", json())},
                                     {"result", {{"leading", true}, {"role", "front-end"}}}}
                                    .dump() +
                                "\n";
            if (::write(c, reply.data(), reply.size()) < 0) open = false;
          } else {
            ++dropped_;
            open = false;  // read, and gone without a word
          }
        }
      }
      ::close(c);
    }
  }
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
  std::atomic<int> dropped_{0};
  std::thread thread_;
};

TEST_F(Region, CallsThroughTheFrontEndLandOnTheOwningShard) {
  ASSERT_TRUE(region_up()) << fe_->call("controlplane.status")->dump();
  add_machines("s1", {a_->sock(), b_->sock()}, 2);
  add_machines("s2", {c_->sock()}, 2);

  // Each new entitlement goes to the shard with the fewest: one each.
  auto web = fe_->call("entitlement.create", {{"name", "web"}, {"quota", 2}});
  ASSERT_TRUE(web.ok()) << web.error().str();
  auto batch = fe_->call("entitlement.create", {{"name", "batch"}, {"quota", 2}});
  ASSERT_TRUE(batch.ok()) << batch.error().str();
  std::string web_shard = web->value("shard", ""), batch_shard = batch->value("shard", "");
  ASSERT_FALSE(web_shard.empty());
  ASSERT_FALSE(batch_shard.empty());
  EXPECT_NE(web_shard, batch_shard);
  Replica& s1 = a_->leading() ? *a_ : *b_;
  Replica& web_cp = web_shard == "s1" ? s1 : *c_;
  Replica& batch_cp = web_shard == "s1" ? *c_ : s1;
  // The home is in etcd; a second front-end create of the name is refused.
  auto home = etcd::Client::create(etcd_->client_config());
  ASSERT_TRUE(home.ok());
  auto kv = (*home)->get("/region/entitlements/web");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ(*parse_entitlement_home("k", (*kv)->value), web_shard);
  auto again = fe_->call("entitlement.create", {{"name", "web"}, {"quota", 2}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, rpc::kConflict) << again.error().str();
  // A shard acts for no entitlement the region did not give it.
  auto direct = s1.call("entitlement.create", {{"name", "rogue"}, {"quota", 1}});
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.error().code, rpc::kUnsupported) << direct.error().str();
  // Only a front end may carry a caller: a plaintext TCP peer may not.
  {
    auto tcp = rpc::Client::connect(web_cp.address());
    ASSERT_TRUE(tcp.ok());
    auto forged = (*tcp)->call("frontend.forward", {{"method", "job.stop"},
                                                    {"params", {{"name", "site"}}},
                                                    {"caller", {{"role", "admin"}, {"who", "x"}}}});
    ASSERT_FALSE(forged.ok());
    EXPECT_EQ(forged.error().code, rpc::kPermissionDenied);
  }

  ASSERT_TRUE(fe_->call("job.create", job("site", "web", 2)).ok());
  ASSERT_TRUE(fe_->call("job.create", job("crunch", "batch", 2)).ok());
  // A job's name is the region's: the same name in the other shard's entitlement is refused.
  auto dup = fe_->call("job.create", job("site", "batch", 1));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, rpc::kConflict) << dup.error().str();
  EXPECT_TRUE(wait_for(30, [&] { return running_on("site.") == 2 && running_on("crunch.") == 2; }))
      << fe_->call("job.ls")->dump();
  // Each job is on its entitlement's shard only.
  EXPECT_TRUE(web_cp.call("job.show", {{"name", "site"}}).ok());
  EXPECT_FALSE(batch_cp.call("job.show", {{"name", "site"}}).ok());
  EXPECT_TRUE(batch_cp.call("job.show", {{"name", "crunch"}}).ok());

  // Service discovery spans the shards: the other shard's agents would answer for site.
  EXPECT_TRUE(wait_for(30, [&] {
    auto svc = batch_cp.call("service.show", {{"job", "site"}});
    return svc.ok() && (*svc)["endpoints"].size() == 2;
  })) << batch_cp.call("service.show", {{"job", "site"}})->dump();

  // Lists span the shards, each entry naming its shard.
  auto jobs = fe_->call("job.ls");
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)["jobs"].size(), 2u) << jobs->dump();
  EXPECT_EQ(shard_of((*jobs)["jobs"], "name", "site"), web_shard);
  EXPECT_EQ(shard_of((*jobs)["jobs"], "name", "crunch"), batch_shard);
  auto ms = fe_->call("machine.ls");
  ASSERT_TRUE(ms.ok());
  EXPECT_EQ((*ms)["machines"].size(), 4u) << ms->dump();
  // Page by page across the shards (issue 59: a shard's `next` was dropped, so a shard
  // with more than a page was cut short): `next` is each shard's cursor, and following
  // it lists every machine once.
  {
    std::set<std::string> paged;
    json params{{"limit", 1}};
    for (int pages = 0; pages < 10; ++pages) {
      auto page = fe_->call("machine.ls", params);
      ASSERT_TRUE(page.ok()) << page.error().str();
      for (const auto& m : (*page)["machines"])
        EXPECT_TRUE(paged.insert(m["machine"].get<std::string>()).second) << m.dump();
      if (!page->contains("next")) break;
      ASSERT_TRUE((*page)["next"].is_object()) << page->dump();
      params["after"] = (*page)["next"];
    }
    EXPECT_EQ(paged.size(), 4u);
    auto bad = fe_->call("machine.ls", {{"after", "s1-0"}});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().str().find("after"), std::string::npos) << bad.error().str();
  }
  auto ents = fe_->call("entitlement.ls");
  ASSERT_TRUE(ents.ok());
  EXPECT_EQ((*ents)["entitlements"].size(), 2u);
  // Services: each job once (a shard lists its own to a front end), with every shard's
  // agents; a watch of all of them from one shard, which has the whole region's.
  auto svcs = fe_->call("service.ls");
  ASSERT_TRUE(svcs.ok()) << svcs.error().str();
  EXPECT_EQ((*svcs)["services"].size(), 2u) << svcs->dump();
  EXPECT_EQ(shard_of((*svcs)["services"], "job", "site"), web_shard);
  EXPECT_TRUE((*svcs)["agents"].is_array());
  // (The other shard's services reach the one that answers through etcd: waited for, as
  // a loaded machine, the sanitizer pass, once showed only its own.)
  Result<json> watch = make_error("not asked");
  EXPECT_TRUE(wait_for(30, [&] {
    watch = fe_->call("service.watch", {{"wait_ms", 0}});
    return watch.ok() && (*watch)["services"].contains("site") &&
           (*watch)["services"].contains("crunch");
  })) << (watch.ok() ? watch->dump() : watch.error().str());
  // Maintenance through the front end: one region id, scheduled where its machines are.
  auto all_dc =
      fe_->call("maintenance.schedule", {{"dc", "dc1"}, {"start", "+1h"}, {"duration", "30m"}});
  ASSERT_TRUE(all_dc.ok()) << all_dc.error().str();
  uint64_t region_id = all_dc->value("id", uint64_t{0});
  EXPECT_GT(region_id, 1'000'000'000u);
  EXPECT_EQ((*all_dc)["shards"], json({"s1", "s2"})) << all_dc->dump();
  auto one = fe_->call("maintenance.schedule",
                       {{"machine", "s2-m1"}, {"start", "+1h"}, {"duration", "30m"}});
  ASSERT_TRUE(one.ok()) << one.error().str();
  EXPECT_EQ((*one)["shards"], json({"s2"})) << one->dump();
  EXPECT_EQ(one->value("id", uint64_t{0}), region_id + 1);
  auto nowhere = fe_->call("maintenance.schedule",
                           {{"machine", "nobody"}, {"start", "+1h"}, {"duration", "30m"}});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_EQ(nowhere.error().code, rpc::kNotFound) << nowhere.error().str();
  auto forged_id = fe_->call("maintenance.schedule",
                             {{"dc", "dc1"}, {"start", "+1h"}, {"duration", "30m"}, {"id", 5}});
  ASSERT_FALSE(forged_id.ok());
  EXPECT_NE(forged_id.error().message.find("id: is given by the front end"), std::string::npos)
      << forged_id.error().str();
  auto listed = fe_->call("maintenance.ls");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed)["events"].size(), 3u) << listed->dump();  // the dc's on both shards
  auto cancelled = fe_->call("maintenance.cancel", {{"id", region_id}});
  ASSERT_TRUE(cancelled.ok()) << cancelled.error().str();
  EXPECT_EQ((*cancelled)["shards"], json({"s1", "s2"}));
  ASSERT_TRUE(fe_->call("maintenance.cancel", {{"id", region_id + 1}}).ok());
  EXPECT_EQ((*fe_->call("maintenance.ls"))["events"].size(), 0u);
  auto gone = fe_->call("maintenance.cancel", {{"id", region_id}});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, rpc::kNotFound);

  // The web view of the whole region: both shards' jobs and machines on one page.
  auto page = fe_->call("web.page");
  ASSERT_TRUE(page.ok()) << page.error().str();
  std::string html = page->value("html", "");
  for (const char* shown : {"site", "crunch", "s1-m0", "s2-m1", "batch"})
    EXPECT_NE(html.find(shown), std::string::npos) << shown << " missing from the page";
  EXPECT_EQ(html.find("id=\"unreachable\""), std::string::npos);
  // Calls that name a job or a machine find its shard.
  auto show = fe_->call("job.show", {{"name", "crunch"}});
  ASSERT_TRUE(show.ok()) << show.error().str();
  EXPECT_EQ(show->value("entitlement", ""), "batch");
  EXPECT_EQ(show->value("shard", ""), batch_shard) << "job show names the job's shard";
  auto ent_show = fe_->call("entitlement.show", {{"name", "web"}});
  ASSERT_TRUE(ent_show.ok()) << ent_show.error().str();
  EXPECT_EQ(ent_show->value("shard", ""), web_shard) << "entitlement show names its home";
  EXPECT_TRUE(fe_->call("machine.show", {{"machine", "s2-m1"}}).ok());
  auto missing = fe_->call("job.show", {{"name", "nothing"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, rpc::kNotFound);
  ASSERT_TRUE(fe_->call("job.scale", {{"name", "site"}, {"count", 1}}).ok());
  EXPECT_TRUE(wait_for(30, [&] { return running_on("site.") == 1; }));

  // The shard's audit names the operator and the front end that carried the call.
  auto audit = web_cp.call("audit.ls");
  ASSERT_TRUE(audit.ok());
  bool carried = false;
  for (const auto& e : (*audit)["entries"])
    carried |= e.value("method", "") == "job.scale" &&
               e.value("who", "").find(" via ") != std::string::npos;
  EXPECT_TRUE(carried) << audit->dump();

  // weftctl given two front ends, the first of which dies mid-call: a read, or a change
  // that sets a value, is asked again of the other; a stop is not (it may have been
  // done), and weftctl says so and how to look.
  DyingFrontEnd dying(dir_ + "/dying.sock");
  ASSERT_TRUE(dying.ok());
  auto weftctl = [&](const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc =
        std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " WEFTCTL_BIN " --controlplane " +
                     dir_ + "/dying.sock," + fe_->sock() + " " + args + " >" + out + " 2>&1")
                        .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  auto [rc, out] = weftctl("job ls");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("crunch"), std::string::npos) << out;
  EXPECT_NE(out.find("went away before answering job.ls; asking another"), std::string::npos)
      << out;
  std::tie(rc, out) = weftctl("job scale site 2 --detach");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(wait_for(30, [&] { return running_on("site.") == 2; }));
  std::tie(rc, out) = weftctl("job stop crunch");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("may or may not have been done"), std::string::npos) << out;
  EXPECT_TRUE(fe_->call("job.show", {{"name", "crunch"}}).ok()) << "the stop went nowhere";
  EXPECT_EQ(dying.dropped(), 3);
}

TEST_F(Region, AShardWhollyDownStopsNothingElse) {
  ASSERT_TRUE(region_up()) << fe_->call("controlplane.status")->dump();
  add_machines("s1", {a_->sock(), b_->sock()}, 2);
  add_machines("s2", {c_->sock()}, 3);
  ASSERT_TRUE(
      fe_->call("entitlement.create", {{"name", "web"}, {"quota", 2}, {"shard", "s1"}}).ok());
  ASSERT_TRUE(
      fe_->call("entitlement.create", {{"name", "db"}, {"quota", 2}, {"shard", "s2"}}).ok());
  ASSERT_TRUE(fe_->call("job.create", job("site", "web", 2)).ok());
  ASSERT_TRUE(fe_->call("job.create", job("store", "db", 1)).ok());
  ASSERT_TRUE(wait_for(30, [&] { return running_on("site.") == 2 && running_on("store.") == 1; }));
  int before = starts("s1-");

  // Every replica of s1 killed: its tasks run on; s2 scales, creates and replaces, and
  // lists say s1 is away.
  a_->stop(SIGKILL);
  b_->stop(SIGKILL);
  ASSERT_TRUE(fe_->call("job.scale", {{"name", "store"}, {"count", 2}}).ok());
  auto made = fe_->call("job.create", job("cache", "db", 1));  // s1's silence holds up nothing
  ASSERT_TRUE(made.ok()) << made.error().str();
  EXPECT_TRUE(wait_for(30, [&] { return running_on("store.") == 2 && running_on("cache.") == 1; }));
  // One of s2's machines with tasks dies: s2 replaces what it ran.
  auto busy = std::find_if(machines_.begin(), machines_.end(), [](const auto& m) {
    return m->id().rfind("s2-", 0) == 0 && !m->running().empty();
  });
  ASSERT_NE(busy, machines_.end());
  machines_.erase(busy);
  EXPECT_TRUE(wait_for(30, [&] { return running_on("store.") == 2 && running_on("cache.") == 1; }))
      << c_->call("job.show", {{"name", "store"}})->dump();
  EXPECT_EQ(running_on("site."), 2);
  auto jobs = fe_->call("job.ls");
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(shard_of((*jobs)["jobs"], "name", "store"), "s2");
  ASSERT_TRUE(jobs->contains("unreachable")) << jobs->dump();
  EXPECT_EQ((*jobs)["unreachable"][0]["shard"], "s1");
  // weftctl keeps what the front end said (issue 59: its paging loop dropped it): the
  // JSON has the away shard, the tables say it on stderr.
  auto weftctl = [&](const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc =
        std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " WEFTCTL_BIN " --controlplane " +
                     fe_->sock() + " " + args + " >" + out + " 2>&1")
                        .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  for (const char* cmd : {"machine ls", "job ls"}) {
    auto [rc, out] = weftctl(cmd);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("weftctl: shard s1 did not answer"), std::string::npos)
        << cmd << ": " << out;
  }
  auto [jrc, jout] = weftctl("--json machine ls");
  EXPECT_EQ(jrc, 0) << jout;
  json listed = json::parse(jout, nullptr, false);
  ASSERT_TRUE(listed.is_object() && listed.contains("unreachable")) << jout;
  EXPECT_EQ(listed["unreachable"][0]["shard"], "s1") << jout;
  EXPECT_EQ(listed["machines"].size(), 3u) << jout;  // s2's three (s1's are away)
  // The web view shows what answered and says what did not.
  auto page = fe_->call("web.page");
  ASSERT_TRUE(page.ok()) << page.error().str();
  std::string html = page->value("html", "");
  EXPECT_NE(html.find("id=\"unreachable\""), std::string::npos);
  EXPECT_NE(html.find("store"), std::string::npos);
  auto away = fe_->call("job.scale", {{"name", "site"}, {"count", 1}});
  ASSERT_FALSE(away.ok());
  EXPECT_EQ(away.error().code, rpc::kUnavailable) << away.error().str();

  // s1 back (one replica): it resumes from etcd; nothing of its own restarted.
  b_->start();
  ASSERT_TRUE(region_up()) << fe_->call("controlplane.status")->dump();
  ASSERT_TRUE(wait_for(30, [&] { return fe_->call("job.show", {{"name", "site"}}).ok(); }));
  for (int i = 0; i < 10; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(running_on("site."), 2);
  EXPECT_EQ(starts("s1-") - before, 0) << "s1's machines started nothing again";
}

// The same over mutual TLS, as a region runs: each role with a certificate naming it
// (shards OU=shard, front ends OU=frontend), operators with their own; two front ends,
// weftctl given both.
class RegionTls : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-region-tls-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    pki_ = dir_ + "/pki";
    std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
    std::string cmds = tool + " ca " + pki_;
    for (const char* spec : {"s1 --ou shard --dns s1.shard --ip 127.0.0.1",
                             "s2 --ou shard --dns s2.shard --ip 127.0.0.1",
                             "fe --ou frontend --dns fe.region --ip 127.0.0.1",
                             "alice --ou operator", "bob --ou operator", "root --ou admin"})
      cmds += " && " + tool + " issue " + pki_ + " " + spec;
    ASSERT_EQ(std::system(("(" + cmds + ") >/dev/null").c_str()), 0) << cmds;
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    auto tls_lines = [&](const std::string& who) {
      return "tls_ca = \"" + pki_ + "/ca.pem\"\ntls_cert = \"" + pki_ + "/" + who +
             ".pem\"\ntls_key = \"" + pki_ + "/" + who + ".key\"\n";
    };
    for (const char* id : {"s1", "s2"})
      shards_.push_back(
          std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, id, etcd_->client_config(), "2s",
                                    tls_lines(id), std::string("/shards/") + id + "/",
                                    std::string("[region]\nrole = \"shard\"\nshard = \"") + id +
                                        "\"\nprefix = \"/region/\"\n"));
    for (const char* name : {"fe1", "fe2"})
      fes_.push_back(std::make_unique<Replica>(
          WEFT_CONTROLPLANE_BIN, dir_, name, etcd_->client_config(), "2s", tls_lines("fe"),
          "/fe-unused/",
          "[region]\nrole = \"front-end\"\nprefix = \"/region/\"\n[region.shards]\ns1 = \"" +
              shards_[0]->address() + "\"\ns2 = \"" + shards_[1]->address() + "\"\n"));
    for (auto& r : shards_) r->start();
    for (auto& r : fes_) r->start();
  }
  void TearDown() override {
    if (HasFailure())
      for (auto* list : {&shards_, &fes_})
        for (auto& r : *list) std::cerr << "---- " << r->sock() << ":\n" << r->log() << "\n";
    fes_.clear();
    shards_.clear();
    etcd_.reset();
    (void)remove_tree(dir_);
  }
  Result<json> call_as(Replica& r, const std::string& who, const std::string& m,
                       const json& p = json::object()) {
    auto ctx = tls::Context::create(
        {pki_ + "/ca.pem", pki_ + "/" + who + ".pem", pki_ + "/" + who + ".key", ""},
        tls::Role::kClient);
    if (!ctx.ok()) return std::move(ctx).error();
    auto t = rpc::client_tls(*ctx);
    TRY_ASSIGN(auto c, rpc::Client::connect("tls://" + r.address(), rpc::kDefaultMaxLine, &t));
    return c->call(m, p, 5000);
  }
  std::optional<std::string> etcd_get(const std::string& key) {
    return etcd_value(etcd_->client_config(), key);
  }
  bool connected(Replica& fe) {
    auto end = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < end) {
      auto st = fe.call("controlplane.status");
      bool all = st.ok() && st->contains("shards");
      if (all)
        for (const auto& s : (*st)["shards"]) all = all && s.value("connected", false);
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::pair<int, std::string> weftctl(const std::string& who, const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    std::string eps = "tls://" + fes_[0]->address() + ",tls://" + fes_[1]->address();
    int rc =
        std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " WEFTCTL_BIN " --controlplane " +
                     eps + " --tls-ca " + pki_ + "/ca.pem --tls-cert " + pki_ + "/" + who +
                     ".pem --tls-key " + pki_ + "/" + who + ".key " + args + " >" + out + " 2>&1")
                        .c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  }
  std::string dir_, pki_;
  std::unique_ptr<weft::testing::EtcdServer> etcd_;
  std::vector<std::unique_ptr<Replica>> shards_, fes_;
};

TEST_F(RegionTls, TheOperatorIsCheckedAtTheFrontEndAndActsAtTheShardAsThemselves) {
  ASSERT_TRUE(connected(*fes_[0]) && connected(*fes_[1]));
  Machine m("m1");
  m.start_reporting({shards_[1]->sock()}, 100);
  auto made = call_as(*fes_[0], "root", "entitlement.create",
                      {{"name", "team"}, {"quota", 1}, {"owners", {"CN=alice"}}, {"shard", "s2"}});
  ASSERT_TRUE(made.ok()) << made.error().str();
  json spec{{"name", "web"},
            {"entitlement", "team"},
            {"count", 1},
            {"per_task", {{"cpu_milli", 100}, {"mem_mb", 16}}},
            {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
  // alice owns the entitlement; bob is an operator too, but not its owner: the shard,
  // which knows the owners, refuses him by his own certificate.
  Result<json> by_alice = make_error("not yet");
  for (int i = 0; i < 100 && !by_alice.ok(); ++i) {  // once the machine has registered
    by_alice = call_as(*fes_[1], "alice", "job.create", spec);
    if (!by_alice.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(by_alice.ok()) << by_alice.error().str();
  auto by_bob = call_as(*fes_[0], "bob", "job.scale", {{"name", "web"}, {"count", 2}});
  ASSERT_FALSE(by_bob.ok());
  EXPECT_EQ(by_bob.error().code, rpc::kPermissionDenied) << by_bob.error().str();
  // The front end checks the role first: an operator may not make entitlements.
  auto ent = call_as(*fes_[0], "alice", "entitlement.create", {{"name", "mine"}, {"quota", 1}});
  ASSERT_FALSE(ent.ok());
  EXPECT_EQ(ent.error().code, rpc::kPermissionDenied);
  // Only a front end's certificate may carry a caller: alice's, at the shard, may not.
  auto forged = call_as(*shards_[1], "alice", "frontend.forward",
                        {{"method", "job.stop"},
                         {"params", {{"name", "web"}}},
                         {"caller", {{"role", "admin"}, {"who", "root"}}}});
  ASSERT_FALSE(forged.ok());
  EXPECT_EQ(forged.error().code, rpc::kPermissionDenied);
  // The shard's audit names alice (her certificate) and the front end.
  auto audit = shards_[1]->call("audit.ls");
  ASSERT_TRUE(audit.ok());
  bool named = false;
  for (const auto& e : (*audit)["entries"]) {
    std::string who = e.value("who", "");
    size_t via = who.find(" via ");
    named |= e.value("method", "") == "job.create" && e.value("result", "") == "ok" &&
             via != std::string::npos && who.find("CN=alice") < via &&
             who.find("CN=fe", via) != std::string::npos;
  }
  EXPECT_TRUE(named) << audit->dump();

  // A command inside the task through a front end (issue 59: refused there before): the
  // shard checks alice as the owner and its relay and the front end's carry the bytes.
  std::string task;
  for (auto end = Clock::now() + std::chrono::seconds(30); task.empty() && Clock::now() < end;) {
    auto shown = call_as(*fes_[0], "alice", "job.show", {{"name", "web"}});
    if (shown.ok())
      for (const auto& t : (*shown)["tasks"])
        if (t.value("state", "") == "running") task = t["id"];
    if (task.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(task.empty());
  auto [erc, eout] = weftctl("alice", "task exec -T " + task + " -- true </dev/null");
  EXPECT_EQ(erc, 0) << eout;
  EXPECT_EQ(eout, "exec in " + task + " on m1\n");
  std::tie(erc, eout) = weftctl("bob", "task exec -T " + task + " -- true </dev/null");
  EXPECT_NE(erc, 0) << eout;
  EXPECT_EQ(eout.find("exec in"), std::string::npos) << eout;

  // weftctl, unchanged, given both front ends: one killed, the other answers.
  auto [rc, out] = weftctl("alice", "job ls");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("web"), std::string::npos) << out;
  fes_[0]->stop(SIGKILL);
  std::tie(rc, out) = weftctl("alice", "job show web --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"entitlement\": \"team\""), std::string::npos) << out;
}

// Issue 59: a shard took a front end's word for a move's step and for a create. With the
// front end's own certificate, each step the records in etcd do not say is refused with
// the reason, and nothing is done: a forget of an entitlement that is not moving, out to
// itself or to no shard, in and open with no move recorded, a create with no home or
// another shard's.
TEST_F(RegionTls, AShardChecksAFrontEndsStepsAndCreatesAgainstEtcd) {
  ASSERT_TRUE(connected(*fes_[0]) && connected(*fes_[1]));
  auto made = call_as(*fes_[0], "root", "entitlement.create",
                      {{"name", "team"}, {"quota", 1}, {"owners", {"CN=alice"}}, {"shard", "s2"}});
  ASSERT_TRUE(made.ok()) << made.error().str();
  Replica& s1 = *shards_[0];
  Replica& s2 = *shards_[1];
  auto refused = [&](Replica& shard, const json& p, const char* why) {
    auto r = call_as(shard, "fe", "region.move", p);
    ASSERT_FALSE(r.ok()) << why << ": " << p.dump() << " -> " << r->dump();
    EXPECT_EQ(r.error().code, rpc::kConflict) << why << ": " << r.error().str();
    EXPECT_NE(r.error().str().find("in etcd"), std::string::npos) << why << ": " << r.error().str();
  };
  refused(s2, {{"step", "forget"}, {"entitlement", "team"}, {"to", "s9"}}, "forget, no move");
  refused(s2, {{"step", "forget"}, {"entitlement", "team"}, {"to", "s1"}}, "forget to s1");
  refused(s2, {{"step", "out"}, {"entitlement", "team"}, {"to", "s1"}}, "out, no move");
  refused(s2, {{"step", "out"}, {"entitlement", "team"}, {"to", "s2"}}, "out to itself");
  refused(s2, {{"step", "out"}, {"entitlement", "team"}, {"to", "s9"}}, "out to no shard");
  refused(s1,
          {{"step", "in"},
           {"entitlement", "team"},
           {"from", "s2"},
           {"pages", 1},
           {"page", 0},
           {"data", "{}"}},
          "in, no move");
  refused(s1, {{"step", "open"}, {"entitlement", "team"}}, "open, no move");
  // Nothing happened: the entitlement is s2's, unfenced, listed once, its home s2's.
  auto shown = call_as(s2, "root", "entitlement.show", {{"name", "team"}});
  ASSERT_TRUE(shown.ok()) << shown.error().str();
  EXPECT_FALSE(shown->contains("moving")) << shown->dump();
  EXPECT_FALSE(call_as(s1, "root", "entitlement.show", {{"name", "team"}}).ok());
  auto listed = call_as(*fes_[0], "root", "entitlement.ls");
  ASSERT_TRUE(listed.ok()) << listed.error().str();
  EXPECT_EQ((*listed)["entitlements"].size(), 1u) << listed->dump();
  auto home = etcd_get("/region/entitlements/team");
  ASSERT_TRUE(home.has_value());
  EXPECT_NE(home->find("s2"), std::string::npos) << *home;
  // A create carried to a shard without its home claimed there.
  for (auto [shard, name] : {std::pair{&s1, "ghost"}, std::pair{&s1, "team"}}) {
    auto forged = call_as(*shard, "fe", "frontend.forward",
                          {{"method", "entitlement.create"},
                           {"params", {{"name", name}, {"quota", 1}}},
                           {"caller", {{"role", "admin"}, {"who", "root"}}}});
    ASSERT_FALSE(forged.ok()) << name;
    EXPECT_EQ(forged.error().code, rpc::kConflict) << forged.error().str();
    EXPECT_NE(forged.error().str().find("home"), std::string::npos) << forged.error().str();
  }
  EXPECT_FALSE(call_as(s1, "root", "entitlement.show", {{"name", "ghost"}}).ok());
  EXPECT_FALSE(call_as(s1, "root", "entitlement.show", {{"name", "team"}}).ok());
}

// A region whose machines come from two broker groups, one a datacenter, each of two
// replicas: the shards borrow what their entitlements' quotas need from the group of the
// entitlement's datacenter, and give back what they no longer need; the machines follow.
class RegionBroker : public Region {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-region-broker-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    // The sockets are known before anything starts (each replica's directory).
    std::string s1 = dir_ + "/s1/cp.sock", s2 = dir_ + "/s2/cp.sock";
    std::string shards = "[region.shards]\ns1 = \"" + s1 + "\"\ns2 = \"" + s2 + "\"\n";
    std::string groups = "[region.brokers]\n";
    for (const char* dc : {"dc1", "dc2"}) {
      std::string socks = group_socks(dc)[0] + "," + group_socks(dc)[1];
      groups += std::string(dc) + " = \"" + socks + "\"\n";
      for (int i = 0; i < 2; ++i)
        brokers_[dc].push_back(std::make_unique<Replica>(
            WEFT_CONTROLPLANE_BIN, dir_, std::string(dc) + "b" + std::to_string(i),
            etcd_->client_config(), "2s", "", std::string("/broker-") + dc + "/",
            "[region]\nrole = \"broker\"\ngroup = \"" + std::string(dc) +
                "\"\nprefix = \"/region/\"\n" + shards));
    }
    auto shard = [&](const char* id) {
      return std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, id, etcd_->client_config(),
                                       "2s", shard_top(), std::string("/shards/") + id + "/",
                                       std::string("[region]\nrole = \"shard\"\nshard = \"") + id +
                                           "\"\nprefix = \"/region/\"\nreturn_idle = \"1s\"\n" +
                                           groups);
    };
    a_ = shard("s1");
    c_ = shard("s2");
    fe_ = std::make_unique<Replica>(
        WEFT_CONTROLPLANE_BIN, dir_, "fe", etcd_->client_config(), "2s", "", "/fe-unused/",
        "[region]\nrole = \"front-end\"\nprefix = \"/region/\"\n" + shards + groups);
    for (auto& [dc, list] : brokers_)
      for (auto& b : list) b->start();
    for (Replica* r : {a_.get(), c_.get(), fe_.get()}) r->start();
  }
  std::vector<std::string> group_socks(const std::string& dc) const {
    return {dir_ + "/" + dc + "b0/cp.sock", dir_ + "/" + dc + "b1/cp.sock"};
  }
  // More top-level cp.toml lines for the shards.
  virtual std::string shard_top() const { return ""; }
  void TearDown() override {
    if (HasFailure())
      for (auto& [dc, list] : brokers_)
        for (auto& b : list) std::cerr << "---- " << b->sock() << ":\n" << tail(b->log()) << "\n";
    machines_.clear();
    brokers_.clear();
    Region::TearDown();
  }
  Replica& leader_of(const std::string& dc) {
    return brokers_[dc][0]->leading() ? *brokers_[dc][0] : *brokers_[dc][1];
  }
  int held_by(const Replica& r, const std::string& prefix = "") {
    int n = 0;
    for (auto& m : machines_) {
      auto h = m->held();
      n += h.size() == 1 && h[0] == r.sock() && m->connected() && m->id().rfind(prefix, 0) == 0;
    }
    return n;
  }
  std::map<std::string, MachineHolder> records() {
    std::map<std::string, MachineHolder> out;
    auto c = etcd::Client::create(etcd_->client_config());
    if (!c.ok()) return out;
    auto kvs = (*c)->range_prefix("/region/machines/");
    if (!kvs.ok()) return out;
    for (const auto& kv : *kvs)
      if (auto h = parse_machine_holder(kv.key, kv.value); h.ok())
        out[kv.key.substr(std::string("/region/machines/").size())] = *h;
    return out;
  }
  std::map<std::string, int> holders() {
    std::map<std::string, int> n;
    for (const auto& [m, h] : records()) ++n[h.holder.empty() ? "free" : h.holder];
    return n;
  }
  std::map<std::string, std::vector<std::unique_ptr<Replica>>> brokers_;
};

TEST_F(RegionBroker, ShardsBorrowWhatTheirQuotasNeedAndGiveBackWhatTheyDoNot) {
  ASSERT_TRUE(region_up()) << fe_->call("controlplane.status")->dump();
  // Three machines in each datacenter, each registered with its datacenter's brokers.
  for (const char* dc : {"dc1", "dc2"})
    for (int i = 0; i < 3; ++i) {
      machines_.push_back(
          std::make_unique<Machine>(std::string(dc) + "-m" + std::to_string(i), dc));
      machines_.back()->start_reporting(group_socks(dc), 100);
    }
  ASSERT_TRUE(wait_for(30, [&] {
    int n = 0;
    for (auto& m : machines_) n += m->connected();
    return n == 6;
  }));
  ASSERT_TRUE(fe_->call("entitlement.create",
                        {{"name", "web"}, {"quota", 2}, {"dc", "dc1"}, {"shard", "s1"}})
                  .ok());
  ASSERT_TRUE(fe_->call("entitlement.create",
                        {{"name", "db"}, {"quota", 3}, {"dc", "dc2"}, {"shard", "s2"}})
                  .ok());
  // Each shard borrows what its quota needs from its entitlement's datacenter's group;
  // the machines go there.
  ASSERT_TRUE(wait_for(30, [&] { return held_by(*a_, "dc1-") == 2 && held_by(*c_, "dc2-") == 3; }))
      << held_by(*a_) << " " << held_by(*c_) << " " << fe_->call("machine.ls")->dump();
  EXPECT_EQ(held_by(*a_), 2);
  EXPECT_EQ(held_by(*c_), 3);
  auto recs = records();
  for (const auto& [m, rec] : recs) {
    if (!rec.holder.empty()) {
      EXPECT_EQ(rec.broker, m.substr(0, 3)) << m << ": the record names the group that lent it";
    }
  }
  auto h = holders();
  EXPECT_EQ(h["s1"], 2);
  EXPECT_EQ(h["s2"], 3);
  Result<json> made = make_error("not yet");
  for (int i = 0; i < 100 && !made.ok(); ++i) {  // once the machines have registered there
    made = fe_->call("job.create", job("site", "web", 2));
    if (!made.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(made.ok()) << made.error().str();
  ASSERT_TRUE(fe_->call("job.create", job("store", "db", 3)).ok());
  ASSERT_TRUE(wait_for(30, [&] { return running_on("site.") == 2 && running_on("store.") == 3; }));
  // machine ls through the front end: the shards' and each group's free pool.
  auto ms = fe_->call("machine.ls");
  ASSERT_TRUE(ms.ok());
  ASSERT_EQ((*ms)["machines"].size(), 6u) << ms->dump();
  std::map<std::string, int> where;
  for (const auto& m : (*ms)["machines"]) ++where[m.value("shard", "")];
  EXPECT_EQ(where["s1"], 2);
  EXPECT_EQ(where["s2"], 3);
  EXPECT_EQ(where["(brokers dc1)"], 1) << ms->dump();
  int starts_before = starts();
  // Each command named the shard that holds the machine and the epoch its registration
  // there was told: what the agent checks before it acts (HolderFence).
  int fenced = 0;
  for (auto& m : machines_) {
    auto fences = m->fences();
    if (fences.empty()) continue;
    ++fenced;
    std::string reg = m->registered_holder();
    EXPECT_TRUE(reg.rfind("s1@", 0) == 0 || reg.rfind("s2@", 0) == 0) << m->id() << " " << reg;
    EXPECT_NE(reg.substr(3), "0") << m->id() << ": a lend raises the epoch";
    EXPECT_EQ(fences, std::set<std::string>{reg}) << m->id();
  }
  EXPECT_GE(fenced, 3) << "the five tasks' machines";

  // Bad requests to a broker name the field and lend or return nothing.
  Replica& lb = leader_of("dc1");
  for (const json& bad :
       {json{{"shard", "s1"}, {"count", 5000}}, json{{"shard", "s9"}, {"count", 1}},
        json{{"shard", "S/1"}, {"count", 1}}, json{{"count", 1}}}) {
    auto r = lb.call("pool.lend", bad);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_FALSE(r.error().message.empty());
  }
  auto stale = lb.call("pool.return", {{"shard", "s1"}, {"machine", "dc1-m0"}, {"epoch", 999}});
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, rpc::kConflict) << stale.error().str();
  EXPECT_FALSE(lb.call("pool.return", {{"shard", "s1"}, {"machine", "../x"}, {"epoch", 1}}).ok());
  // A machine goes back only to the group that lent it: dc2's brokers refuse one of dc1's.
  for (const auto& [m, rec] : records())
    if (rec.holder == "s1") {
      auto wrong = leader_of("dc2").call("pool.return",
                                         {{"shard", "s1"}, {"machine", m}, {"epoch", rec.epoch}});
      ASSERT_FALSE(wrong.ok()) << m;
      EXPECT_EQ(wrong.error().code, rpc::kConflict) << wrong.error().str();
      break;
    }
  EXPECT_EQ(holders()["s1"], 2);
  EXPECT_EQ(holders()["s2"], 3);

  // dc1's leading broker killed: its other replica takes over; the shards schedule on.
  Replica& leader = leader_of("dc1");
  Replica& other = &leader == brokers_["dc1"][0].get() ? *brokers_["dc1"][1] : *brokers_["dc1"][0];
  leader.stop(SIGKILL);
  ASSERT_TRUE(fe_->call("job.scale", {{"name", "site"}, {"count", 1}}).ok());
  EXPECT_TRUE(wait_for(30, [&] { return running_on("site.") == 1; }));
  ASSERT_TRUE(wait_for(30, [&] { return other.leading(); }));

  // db needs one machine now: s2 gives two back to dc2 after return_idle; they rejoin
  // that group's free pool. web grows: s1 borrows one more from dc1 (its new leader).
  // Nothing else restarts.
  ASSERT_TRUE(fe_->call("job.scale", {{"name", "store"}, {"count", 1}}).ok());
  ASSERT_TRUE(fe_->call("entitlement.update", {{"name", "db"}, {"quota", 1}}).ok());
  ASSERT_TRUE(fe_->call("entitlement.update", {{"name", "web"}, {"quota", 3}}).ok());
  EXPECT_TRUE(wait_for(60,
                       [&] {
                         auto n = holders();
                         return n["s2"] == 1 && n["s1"] == 3 && n["free"] == 2;
                       }))
      << holders()["s1"] << " " << holders()["s2"] << " " << holders()["free"];
  EXPECT_TRUE(wait_for(30, [&] { return held_by(*a_, "dc1-") == 3 && held_by(*c_, "dc2-") == 1; }));
  EXPECT_TRUE(wait_for(30, [&] {
    int back = 0;
    for (auto& m : machines_) {
      back += m->id().rfind("dc2-", 0) == 0 && m->held().empty() && m->connected();
    }
    return back == 2;
  })) << "dc2's two spare machines back with their own brokers";
  EXPECT_EQ(running_on("site."), 1);
  EXPECT_EQ(running_on("store."), 1);
  EXPECT_EQ(starts() - starts_before, 0) << "nothing started again";
}

// The ReBalancer's view across a region (docs/rebalancer.md): an entitlement borrowed
// its machines while a fault domain was down, so its job is crowded in one domain; the
// shard cannot see the domain that came back (its machines wait at the brokers). Its
// ReBalancer finds that another domain would help, the shard borrows a machine avoiding
// the crowded domain (pool.lend's avoid_domains), and a swap moves a task there; the
// machine it left goes back to the brokers. The entitlement holds its quota again.
class RegionBrokerRebalance : public RegionBroker {
 protected:
  std::string shard_top() const override {
    return "rebalancer.enabled = true\nrebalancer.interval = \"1s\"\n";
  }
};

TEST_F(RegionBrokerRebalance, AShardBorrowsAMachineOfTheDomainItsSpreadLacks) {
  ASSERT_TRUE(region_up()) << fe_->call("controlplane.status")->dump();
  // dc1: a0 and a1 in fault domain rA; b0 in rB, down for now.
  for (const char* name : {"a0", "a1", "b0"})
    machines_.push_back(std::make_unique<Machine>(name, "dc1", name[0] == 'a' ? "rA" : "rB"));
  for (int i = 0; i < 2; ++i)
    machines_[static_cast<size_t>(i)]->start_reporting(group_socks("dc1"), 100);
  ASSERT_TRUE(fe_->call("entitlement.create",
                        {{"name", "web"}, {"quota", 2}, {"dc", "dc1"}, {"shard", "s1"}})
                  .ok());
  ASSERT_TRUE(wait_for(30, [&] { return held_by(*a_) == 2; }));
  Result<json> made = make_error("not yet");
  for (int i = 0; i < 100 && !made.ok(); ++i) {  // once the machines have registered there
    made = fe_->call("job.create", job("site", "web", 2));
    if (!made.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(made.ok()) << made.error().str();
  ASSERT_TRUE(wait_for(30, [&] { return running_on("site.") == 2; }));
  // Bad avoid_domains are refused by the broker, naming the field.
  auto bad =
      leader_of("dc1").call("pool.lend", {{"shard", "s1"}, {"count", 1}, {"avoid_domains", "rA"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("avoid_domains: ", 0), 0u) << bad.error().str();
  bad = leader_of("dc1").call("pool.lend",
                              {{"shard", "s1"}, {"count", 1}, {"avoid_domains", {"../x"}}});
  ASSERT_FALSE(bad.ok());
  // rB comes back: it registers with the brokers; s1 borrows it, a task moves there.
  machines_[2]->start_reporting(group_socks("dc1"), 100);
  auto site_on = [&](const std::string& machine) {
    for (auto& m : machines_)
      if (m->id() == machine)
        for (const auto& t : m->running())
          if (t.rfind("site.", 0) == 0) return true;
    return false;
  };
  EXPECT_TRUE(wait_for(60, [&] { return site_on("b0") && running_on("site.") == 2; }))
      << fe_->call("rebalance.status", {{"name", "web"}})->dump(2) << "\n"
      << fe_->call("machine.ls")->dump();
  // The machine the task left goes back to the brokers: s1 holds its quota again.
  EXPECT_TRUE(wait_for(30, [&] { return holders()["s1"] == 2 && holders()["free"] == 1; }))
      << holders()["s1"] << " " << holders()["free"];
  auto audit = a_->call("audit.ls", {{"limit", 100}});
  ASSERT_TRUE(audit.ok());
  int moves = 0;
  for (const auto& e : (*audit)["entries"])
    moves += e["role"] == "rebalancer" &&
             e["result"].get<std::string>().find("spread over fault domains") != std::string::npos;
  EXPECT_EQ(moves, 1) << audit->dump(2);
}

// A region under fire (issue 45's chaos): two shards of two replicas, a broker of two
// replicas, two front ends, six machines lent from the broker, four jobs in two
// entitlements; one after another, each healed as systemd would (an exited process is
// started again): a shard's leader or follower SIGKILLed, the broker's leader SIGKILLed,
// a front end SIGKILLed, etcd killed and restarted, a machine's daemon restarting, a job
// scaled through a front end, an entitlement moved to the other shard (healed once the
// move is done; moves interrupted by kills are RegionMove's), one process cut off from
// etcd (both ways or one way) while the others reach it, a shard replica cut off from the
// front ends and the brokers (testing/link_proxy.h: each process's etcd, the front ends'
// shards and the shards' brokers are reached through links the test holds and heals). Checked
// continuously: never two copies of a task index, every task on a machine held by its entitlement's
// home shard (or, while it moves, by one of its two shards), no job lost; after each fault, within
// 30 s, every fault healed (every process up, a leader for each shard and the broker, both front
// ends reaching them, every machine with a session to its holder, no move under way) and every job
// at its count. WEFT_CHAOS_SECONDS makes it longer; WEFT_CHAOS_SEED replays one.
class RegionChaos : public Region {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-region-chaos-" + random_hex(5));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    etcd_ = std::make_unique<weft::testing::EtcdServer>();
    ASSERT_EQ(etcd_->error(), "");
    auto socks = [&](const char* a, const char* b) {
      return dir_ + "/" + a + "/cp.sock," + dir_ + "/" + b + "/cp.sock";
    };
    std::string shards = "[region.shards]\ns1 = \"" + socks("s1a", "s1b") + "\"\ns2 = \"" +
                         socks("s2a", "s2b") + "\"\n";
    // The front ends reach each shard replica through a link the test can cut.
    std::string fe_shards;
    for (const char* r : {"s1a", "s1b", "s2a", "s2b"}) {
      auto link =
          LinkProxy::unix_socket(dir_ + "/link-" + r + ".sock", dir_ + "/" + r + "/cp.sock");
      ASSERT_TRUE(link) << "cannot make the link to " << r;
      fe_links_.push_back(std::move(link));
    }
    fe_shards = "[region.shards]\ns1 = \"" + fe_links_[0]->endpoint() + "," +
                fe_links_[1]->endpoint() + "\"\ns2 = \"" + fe_links_[2]->endpoint() + "," +
                fe_links_[3]->endpoint() + "\"\n";
    // And every process reaches etcd through one of its own.
    const std::string etcd_url = etcd_->endpoint();
    const auto colon = etcd_url.rfind(':');
    auto etcd_link = [&]() {
      auto link = LinkProxy::tcp("127.0.0.1",
                                 static_cast<uint16_t>(std::atoi(etcd_url.c_str() + colon + 1)));
      EXPECT_TRUE(link) << "cannot make a link to etcd";
      etcd::Config c = etcd_->client_config();
      if (link) c.endpoints = {"http://" + link->endpoint()};
      etcd_links_.push_back(std::move(link));
      return c;
    };
    std::string brokers = socks("b0", "b1");
    // Each shard replica reaches the brokers through links of its own.
    auto broker_links = [&](const std::string& r) {
      std::string out;
      for (const char* b : {"b0", "b1"}) {
        auto link = LinkProxy::unix_socket(dir_ + "/link-" + r + "-" + b + ".sock",
                                           dir_ + "/" + b + "/cp.sock");
        EXPECT_TRUE(link) << "cannot make the link from " << r << " to " << b;
        if (!link) continue;
        out += (out.empty() ? "" : ",") + link->endpoint();
        broker_links_[r].push_back(std::move(link));
      }
      return out;
    };
    for (const char* name : {"b0", "b1"})
      all_.push_back(std::make_unique<Replica>(
          WEFT_CONTROLPLANE_BIN, dir_, name, etcd_link(), "2s", "", "/broker/",
          "[region]\nrole = \"broker\"\nprefix = \"/region/\"\n" + shards));
    for (const char* id : {"s1", "s2"})
      for (const char* r : {"a", "b"})
        all_.push_back(
            std::make_unique<Replica>(WEFT_CONTROLPLANE_BIN, dir_, std::string(id) + r, etcd_link(),
                                      "2s", "", std::string("/shards/") + id + "/",
                                      std::string("[region]\nrole = \"shard\"\nshard = \"") + id +
                                          "\"\nprefix = \"/region/\"\nbrokers = \"" +
                                          broker_links(std::string(id) + r) + "\"\n"));
    for (const char* name : {"fe1", "fe2"})
      all_.push_back(std::make_unique<Replica>(
          WEFT_CONTROLPLANE_BIN, dir_, name, etcd_link(), "2s", "", "/fe-unused/",
          "[region]\nrole = \"front-end\"\nprefix = \"/region/\"\nbrokers = \"" + brokers + "\"\n" +
              fe_shards));
    ASSERT_FALSE(HasFailure());
    for (auto& r : all_) r->start();
  }
  void TearDown() override {
    if (HasFailure()) {
      // More of each log than other tests print: what a chaos run did is in all of them.
      for (auto& r : all_)
        std::cerr << "---- " << r->sock() << ":\n" << tail(r->log(), 40000) << "\n";
      std::cerr << "---- the machines' daemons (UTC):\n";
      for (auto& m : machines_) std::cerr << m->history();
    }
    machines_.clear();
    all_.clear();
    etcd_links_.clear();
    fe_links_.clear();
    broker_links_.clear();
    Region::TearDown();
  }
  // Role by index: 0-1 the broker, 2-3 s1, 4-5 s2, 6-7 the front ends.
  Replica& at(size_t i) { return *all_[i]; }
  Replica* leader_of(size_t first) {
    for (size_t i = first; i < first + 2; ++i)
      if (all_[i]->exited() < 0 && all_[i]->leading()) return all_[i].get();
    return nullptr;
  }
  // Both front ends answer, each reaching every shard and the broker.
  bool fronts_reach_all() {
    for (size_t i = 6; i < 8; ++i) {
      auto st = all_[i]->exited() < 0 ? all_[i]->call("controlplane.status")
                                      : Result<json>(make_error("down"));
      if (!st.ok() || !st->contains("shards")) return false;
      for (const auto& s : (*st)["shards"])
        if (!s.value("connected", false)) return false;
    }
    return true;
  }
  // A front end that answers (either).
  Replica* front() {
    for (size_t i = 6; i < 8; ++i)
      if (all_[i]->exited() < 0 && all_[i]->call("controlplane.status").ok()) return all_[i].get();
    return nullptr;
  }
  // The region up, `machines` machines m0.. reporting to the brokers, and entitlements
  // web (quota 3, on s1) and db (quota `db_quota`, on s2).
  void come_up(int machines, int db_quota) {
    ASSERT_TRUE(wait_for(30, [&] {
      return fronts_reach_all() && leader_of(0) && leader_of(2) && leader_of(4);
    })) << "the region did not come up";
    std::vector<std::string> bsocks{at(0).sock(), at(1).sock()};
    for (int i = 0; i < machines; ++i) {
      machines_.push_back(std::make_unique<Machine>("m" + std::to_string(i)));
      machines_.back()->start_reporting(bsocks, 100);
    }
    ASSERT_TRUE(
        front()->call("entitlement.create", {{"name", "web"}, {"quota", 3}, {"shard", "s1"}}).ok());
    ASSERT_TRUE(
        front()
            ->call("entitlement.create", {{"name", "db"}, {"quota", db_quota}, {"shard", "s2"}})
            .ok());
  }
  // Job `name` of `n` tasks in `ent`, once its shard has machines lent and registered.
  void make_job(const std::string& name, const std::string& ent, int n) {
    Result<json> made = make_error("not yet");
    for (int i = 0; i < 150 && !made.ok(); ++i) {
      Replica* f = front();
      made =
          f ? f->call("job.create", job(name, ent, n)) : Result<json>(make_error("no front end"));
      if (!made.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(made.ok()) << name << ": " << made.error().str();
  }
  std::vector<std::unique_ptr<Replica>> all_;
  // all_[i]'s link to etcd; the front ends' links to s1a, s1b, s2a, s2b.
  std::vector<std::unique_ptr<LinkProxy>> etcd_links_, fe_links_;
  // Each shard replica's links to the brokers, by its name (s1a...).
  std::map<std::string, std::vector<std::unique_ptr<LinkProxy>>> broker_links_;
};

TEST_F(RegionChaos, EveryInvariantHoldsWhileItsPartsDie) {
  weft::testing::ChaosRun run = weft::testing::chaos_run();
  const double seconds = run.seconds;
  const uint64_t seed = run.seed;
  std::mt19937_64& rng = run.rng;
  fe_ = nullptr;  // Region's: this fixture's processes are in all_
  come_up(6, 3);
  if (HasFatalFailure()) return;
  std::map<std::string, int> want{{"w0", 2}, {"w1", 1}, {"d0", 2}, {"d1", 1}};
  for (const auto& [name, n] : want) {
    make_job(name, name[0] == 'w' ? "web" : "db", n);
    if (HasFatalFailure()) return;
  }
  auto begun = Clock::now();
  std::string history;
  auto note = [&](const std::string& what) {
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, "%8.2f s  ",
                  std::chrono::duration<double>(Clock::now() - begun).count());
    history += stamp + what + "\n";
  };
  // One look at the world: exited processes started again (systemd), and the invariants.
  // True when every job runs its count.
  auto tick = [&] {
    bool healed = true;  // every process up, every role led, every machine with a session
    for (auto& r : all_)
      if (r->exited() >= 0) {
        r->start();
        healed = false;
      }
    healed = healed && leader_of(0) && leader_of(2) && leader_of(4) && fronts_reach_all();
    for (auto& m : machines_) healed = healed && m->connected();
    std::map<std::string, std::string> holder;  // machine -> shard, from etcd
    // Where each entitlement may run: its home, and while it moves both of its shards.
    std::map<std::string, std::set<std::string>> may_hold;
    bool moving = false;
    // One read of the region's records a look (holders, homes, moves), at one revision.
    if (auto c = etcd::Client::create(etcd_->client_config()); c.ok())
      if (auto kvs = (*c)->range_prefix("/region/"); kvs.ok())
        for (const auto& kv : *kvs) {
          auto under = [&](const std::string& p, std::string* name) {
            if (kv.key.rfind("/region/" + p, 0) != 0) return false;
            *name = kv.key.substr(std::string("/region/").size() + p.size());
            return true;
          };
          std::string name;
          if (under("machines/", &name)) {
            if (auto h = parse_machine_holder(kv.key, kv.value); h.ok()) holder[name] = h->holder;
          } else if (under("entitlements/", &name)) {
            if (auto h = parse_entitlement_home(kv.key, kv.value); h.ok())
              may_hold[name].insert(*h);
          } else if (under("moves/", &name)) {
            if (auto m = parse_move(kv.key, kv.value); m.ok()) {
              may_hold[name].insert({m->from, m->to});
              moving = true;
            }
          }
        }
    healed = healed && !moving;
    auto world = Machine::snapshot();
    std::map<std::string, int> running;
    std::map<std::string, std::string> index_on;  // "job.index" -> machine
    for (auto& m : machines_)
      for (const auto& t : m->running()) {
        std::string job = t.substr(0, t.find('.'));
        std::string index = t.substr(0, t.rfind('.'));
        auto [it, fresh] = index_on.emplace(index, t + " on " + m->id());
        EXPECT_TRUE(fresh) << index << " runs twice: " << it->second << " and " << t << " on "
                           << m->id() << " (seed " << seed << ")\n"
                           << history;
        // A task runs only where its job's shard holds the machine (what the holder fence
        // and the leases promise: a machine lent elsewhere took nothing of it along).
        if (holder.count(m->id())) {
          const auto& ok = may_hold[job[0] == 'w' ? "web" : "db"];
          EXPECT_TRUE(ok.count(holder[m->id()])) << t << " on " << m->id() << ", held by "
                                                 << holder[m->id()] << " (seed " << seed << ")\n"
                                                 << history;
        }
        ++running[job];
      }
    for (const auto& [job, n] : want)
      if (running[job] != n) return false;
    return healed;
  };
  // Healed within 30 s of `t0`, the fault (the time it took is noted from there). Healing
  // takes a few seconds (10 s under ASan beside the rest of the suite, when etcd went
  // away): the bound is for a region that does not heal, not a race.
  auto settle = [&](const std::string& after, Clock::time_point t0) {
    while (Clock::now() - t0 < std::chrono::seconds(30)) {
      if (tick()) {
        note("  healed, every job at its count, after " +
             std::to_string(
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()) +
             " ms");
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "not healed and at every job's count 30 s after: " << after << " (seed "
                  << seed << ")\nfaults:\n"
                  << history;
    return false;
  };
  auto run_for = [&](double s) {
    auto end = Clock::now() + std::chrono::duration<double>(s);
    while (Clock::now() < end) {
      tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  ASSERT_TRUE(settle("the start", Clock::now()));
  // The faults begin at once: etcd killed within seconds of the jobs' creation once made
  // a dying shard leader declare machines dead while their reports waited for its
  // answers, and the next leader ran their tasks a second time (seeds 776772167,
  // 1742516598; fixed in Manager::check_machines).
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int faults = 0;
  while (Clock::now() < deadline && !HasFailure()) {
    std::uniform_real_distribution<double> pause(0.2, 1.0);
    int kind = static_cast<int>(rng() % 10);
    size_t shard = 2 + 2 * (rng() % 2);  // s1's replicas or s2's
    std::string what;
    auto fault_at = Clock::now();
    switch (kind) {
      case 0:
        what = std::string("the leader of ") + (shard == 2 ? "s1" : "s2") + " killed";
        if (Replica* l = leader_of(shard)) l->stop(SIGKILL);
        break;
      case 1: {
        what = std::string("a follower of ") + (shard == 2 ? "s1" : "s2") + " killed";
        Replica* l = leader_of(shard);
        at(l == &at(shard) ? shard + 1 : shard).stop(SIGKILL);
        break;
      }
      case 2:
        what = "the broker's leader killed";
        if (Replica* l = leader_of(0)) l->stop(SIGKILL);
        break;
      case 3:
        what = "a front end killed";
        at(6 + rng() % 2).stop(SIGKILL);
        break;
      case 4: {
        auto& m = machines_[rng() % machines_.size()];
        what = "machine " + m->id() + "'s daemon restarted";
        m->disconnect();
        break;
      }
      case 6:
        // Every role's etcd gone for a moment: leases may lapse, leaders step down and are
        // elected again; the machines' tasks run on.
        what = "etcd killed and restarted";
        etcd_->kill();
        run_for(pause(rng));
        etcd_->start();
        ASSERT_EQ(etcd_->error(), "") << history;
        break;
      case 5: {
        auto it = std::next(want.begin(), static_cast<long>(rng() % want.size()));
        int n = 1 + static_cast<int>(rng() % 2);
        what = "job " + it->first + " scaled to " + std::to_string(n);
        Result<json> r = make_error("no front end");
        for (int i = 0; i < 100 && !r.ok(); ++i) {  // a shard may be changing leader
          Replica* f = front();
          if (f) r = f->call("job.scale", {{"name", it->first}, {"count", n}});
          if (!r.ok()) run_for(0.2);
        }
        ASSERT_TRUE(r.ok()) << what << ": " << r.error().str() << "\n" << history;
        it->second = n;
        break;
      }
      case 8: {
        // One process cut off from etcd while the others reach it, both ways or one way,
        // for up to three lease TTLs: a leader steps down (and is started again, still cut
        // off, until the link heals), a follower cannot campaign.
        const size_t who = rng() % all_.size();
        const auto held = rng() % 3 == 0 ? LinkProxy::Held::kToServer
                          : rng() % 2    ? LinkProxy::Held::kFromServer
                                         : LinkProxy::Held::kBoth;
        std::uniform_real_distribution<double> cut(0.3, 6.0);
        const double for_s = cut(rng);
        const std::string sock = at(who).sock().substr(dir_.size() + 1);
        what = sock.substr(0, sock.find('/')) + " cut off from etcd (" +
               (held == LinkProxy::Held::kBoth       ? "both ways"
                : held == LinkProxy::Held::kToServer ? "its calls lost"
                                                     : "etcd's answers lost") +
               ") for " + std::to_string(for_s).substr(0, 4) + " s";
        etcd_links_[who]->hold(held);
        run_for(for_s);
        etcd_links_[who]->heal();
        break;
      }
      case 9: {
        // A shard replica cut off from both front ends and from its own calls to the
        // brokers: calls for its entitlements wait or go to the other replica, its
        // borrowing waits; its machines still reach it (the brokers hand them its
        // address, and the machines' own partitions are the single control plane's).
        const size_t r = rng() % fe_links_.size();
        const std::string name = std::string(r < 2 ? "s1" : "s2") + (r % 2 ? "b" : "a");
        std::uniform_real_distribution<double> cut(0.3, 6.0);
        const double for_s = cut(rng);
        what = name + " cut off from the front ends and the brokers for " +
               std::to_string(for_s).substr(0, 4) + " s";
        fe_links_[r]->hold(LinkProxy::Held::kBoth);
        for (auto& link : broker_links_[name]) link->hold(LinkProxy::Held::kBoth);
        run_for(for_s);
        fe_links_[r]->heal();
        for (auto& link : broker_links_[name]) link->heal();
        break;
      }
      case 7: {
        // An entitlement moved to the other shard (it completes while the next faults
        // come; settling waits for it).
        std::string ent = rng() % 2 ? "web" : "db";
        Replica* f = front();
        auto show = f ? f->call("entitlement.show", {{"name", ent}})
                      : Result<json>(make_error("no front end"));
        std::string to = show.ok() && show->value("shard", "") == "s1" ? "s2" : "s1";
        what = "entitlement " + ent + " moved to " + to;
        auto r = f ? f->call("entitlement.move", {{"name", ent}, {"to", to}, {"wait", false}})
                   : Result<json>(make_error("no front end"));
        if (!r.ok()) what += " (not begun: " + r.error().str() + ")";
        break;
      }
    }
    note(what);
    run_for(pause(rng));
    ++faults;
    if (!settle(what, fault_at)) break;
  }
  // Every fault healed: every process up, every machine back with a session.
  EXPECT_TRUE(wait_for(20, [&] {
    for (auto& r : all_)
      if (r->exited() >= 0) return false;
    for (auto& m : machines_)
      if (!m->connected()) return false;
    return true;
  })) << history;
  // No job lost: the region lists every one (once every shard answers).
  Result<json> jobs = make_error("no front end");
  EXPECT_TRUE(wait_for(20, [&] {
    Replica* f = front();
    jobs = f ? f->call("job.ls") : Result<json>(make_error("no front end"));
    return jobs.ok() && !jobs->contains("unreachable");
  })) << (jobs.ok() ? jobs->dump() : jobs.error().str());
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)["jobs"].size(), want.size()) << "a job was lost: " << jobs->dump();
  RecordProperty("faults", faults);
  // What happened, each fault and how long healing took: on failure, and for the long
  // form's figures (docs/testing.md).
  std::fprintf(HasFailure() ? stderr : stdout, "seed %llu, %d faults:\n%s",
               static_cast<unsigned long long>(seed), faults, history.c_str());
  EXPECT_GE(faults, 3) << history;
}

// Moving an entitlement between shards (issue 45; docs/regions.md "Moving an
// entitlement"), on the chaos test's region: web (3 machines, job site of 3) on s1 and
// db (2 machines, job store of 2) on s2, machines lent by the broker.
class RegionMove : public RegionChaos {
 protected:
  void SetUp() override {
    // The shards write the document in pages of 1 KiB: a move here takes several.
    setenv("WEFT_TEST_MOVE_PAGE_BYTES", "1024", 1);
    RegionChaos::SetUp();
    unsetenv("WEFT_TEST_MOVE_PAGE_BYTES");
    fe_ = nullptr;
  }
  void world() {
    come_up(5, 2);
    if (HasFatalFailure()) return;
    for (auto [name, ent, n] : {std::tuple{"site", "web", 3}, std::tuple{"store", "db", 2}}) {
      make_job(name, ent, n);
      if (HasFatalFailure()) return;
    }
    ASSERT_TRUE(
        wait_for(30, [&] { return running_on("site.") == 3 && running_on("store.") == 2; }));
  }
  std::optional<std::string> etcd_get(const std::string& key) {
    return etcd_value(etcd_->client_config(), key);
  }
  std::string home(const std::string& e) {
    auto v = etcd_get("/region/entitlements/" + e);
    if (!v) return "";
    auto h = parse_entitlement_home("home", *v);
    return h.ok() ? *h : "?";
  }
  bool moving(const std::string& e) { return etcd_get("/region/moves/" + e).has_value(); }
  std::map<std::string, MachineHolder> holders() {
    std::map<std::string, MachineHolder> out;
    auto c = etcd::Client::create(etcd_->client_config());
    if (!c.ok()) return out;
    auto kvs = (*c)->range_prefix("/region/machines/");
    if (!kvs.ok()) return out;
    for (const auto& kv : *kvs)
      if (auto h = parse_machine_holder(kv.key, kv.value); h.ok())
        out[kv.key.substr(std::string("/region/machines/").size())] = *h;
    return out;
  }
  // The invariants at one moment: no task id on two machines, and no index of a job
  // running more than `most` copies (2 while a drain makes before it breaks); every
  // running task on a machine held by its job's entitlement's home (or by the shard it
  // is moving from or to while a move is under way). "" when they hold.
  std::string violated(int most) {
    std::map<std::string, std::string> held_by;
    for (const auto& [m, h] : holders()) held_by[m] = h.holder;
    std::string web = home("web");
    auto world = Machine::snapshot();
    std::map<std::string, int> copies, where;
    for (auto& m : machines_)
      for (const auto& t : m->running()) {
        if (++where[t] > 1) return "task " + t + " runs on two machines";
        std::string index = t.substr(0, t.rfind('.'));
        if (++copies[index] > most)
          return "index " + index + " runs " + std::to_string(most + 1) + " copies";
      }
    return "";
  }
  // The entitlement moved and settled: no move recorded, its home `to`, every machine
  // of its job connected to that shard and held by it, `tasks` of its job running.
  bool settled(const std::string& to, int tasks) {
    if (moving("web") || home("web") != to || running_on("site.") != tasks) return false;
    size_t first = to == "s1" ? 2 : 4;
    std::set<std::string> socks{at(first).sock(), at(first + 1).sock()};
    auto h = holders();
    auto world = Machine::snapshot();
    for (auto& m : machines_) {
      bool has_site = false;
      for (const auto& t : m->running()) has_site |= t.rfind("site.", 0) == 0;
      if (!has_site) continue;
      if (h[m->id()].holder != to || !m->connected()) return false;
      auto at_now = m->held();
      if (at_now.empty() || !socks.count(at_now[0])) return false;
    }
    return true;
  }
  // Restarts whatever exited (systemd would).
  void heal() {
    for (auto& r : all_)
      if (r->exited() >= 0) r->start();
  }
};

TEST_F(RegionMove, AnEntitlementMovesInTheMiddleOfAnUpdateAndADrainAndNothingRestarts) {
  world();
  int before = starts();
  std::set<std::string> store_before;
  for (auto& m : machines_)
    for (const auto& t : m->running())
      if (t.rfind("store.", 0) == 0) store_before.insert(t);
  // Starts are held from now on: a rolling update of site replaces one task and waits for
  // it, and a drain of one of its machines starts a copy of its task elsewhere and waits.
  for (auto& m : machines_) m->hold_starts(true);
  json next = job("site", "web", 3);
  next["task"]["argv"] = {"/bin/sleep", "1000000"};
  ASSERT_TRUE(front()->call("job.update", next).ok());
  std::string drained;
  ASSERT_TRUE(wait_for(10, [&] {
    for (auto& m : machines_)
      for (const auto& t : m->running())
        if (t.rfind("site.", 0) == 0 && drained.empty()) drained = m->id();
    return !drained.empty();
  }));
  auto drain = front()->call("machine.drain", {{"machine", drained}});
  ASSERT_TRUE(drain.ok()) << drain.error().str();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int held_starts = starts() - before;
  EXPECT_GE(held_starts, 1) << "the update's first start, held";
  // The invariants, looked at all along from here.
  std::atomic<bool> done{false};
  std::string broken;
  std::thread watch([&] {
    while (!done) {
      if (auto v = violated(2); !v.empty() && broken.empty()) broken = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  // web's machines: those its tasks run on (a machine s1 borrowed and did not need is
  // in s1's free pool, not web's).
  std::map<std::string, MachineHolder> web_machines;
  {
    auto h = holders();
    auto world = Machine::snapshot();
    for (auto& m : machines_)
      for (const auto& t : m->running())
        if (t.rfind("site.", 0) == 0) web_machines[m->id()] = h[m->id()];
  }
  auto moved = front()->call("entitlement.move", {{"name", "web"}, {"to", "s2"}});
  ASSERT_TRUE(moved.ok()) << moved.error().str();
  EXPECT_TRUE(moved->value("moved", false)) << moved->dump();
  EXPECT_GE(moved->value("machines", 0), static_cast<int>(web_machines.size())) << moved->dump();
  EXPECT_EQ(moved->value("jobs", 0), 1) << moved->dump();
  EXPECT_LT(moved->value("fenced_ms", 99999), 5000) << moved->dump();
  EXPECT_EQ(home("web"), "s2");
  EXPECT_FALSE(moving("web"));
  // The old shard has it no more; the new one has it, its job mid-update.
  Replica* s1 = leader_of(2);
  ASSERT_NE(s1, nullptr);
  auto gone = s1->call("entitlement.show", {{"name", "web"}});
  EXPECT_FALSE(gone.ok());
  auto show = front()->call("job.show", {{"name", "site"}});
  ASSERT_TRUE(show.ok()) << show.error().str();
  EXPECT_EQ(show->value("generation", 0), 2) << show->dump();
  auto ent = front()->call("entitlement.show", {{"name", "web"}});
  ASSERT_TRUE(ent.ok());
  EXPECT_EQ(ent->value("shard", ""), "s2");
  EXPECT_FALSE(ent->contains("move")) << ent->dump();
  // Nothing started again while it moved.
  EXPECT_EQ(starts() - before, held_starts);

  // The held starts run: the new shard carries the update and the drain to their end.
  for (auto& m : machines_) m->release_starts();
  EXPECT_TRUE(wait_for(40, [&] {
    if (!settled("s2", 3)) return false;
    auto j = front()->call("job.show", {{"name", "site"}});
    if (!j.ok()) return false;
    int new_gen = 0;
    for (const auto& t : (*j)["tasks"])
      new_gen += t.value("state", "") == "running" && t.value("generation", 0) == 2;
    return new_gen == 3;
  })) << front()->call("job.show", {{"name", "site"}})->dump();
  done = true;
  watch.join();
  EXPECT_EQ(broken, "");
  EXPECT_EQ(violated(1), "") << "one copy of each index once the drain is over";
  // Exactly one start per index of site (its update), none of store's: no restart.
  EXPECT_EQ(starts() - before, 3);
  std::set<std::string> store_after;
  for (auto& m : machines_)
    for (const auto& t : m->running())
      if (t.rfind("store.", 0) == 0) store_after.insert(t);
  EXPECT_EQ(store_after, store_before);
  // web's machines are s2's now, each at the epoch it had at s1, raised by one.
  auto after = holders();
  for (const auto& [m, h] : web_machines) {
    EXPECT_EQ(after[m].holder, "s2") << m;
    EXPECT_EQ(after[m].epoch, h.epoch + 1) << m;
  }
  // And s2 acts for it: a scale through the front end lands there.
  ASSERT_TRUE(front()->call("job.scale", {{"name", "site"}, {"count", 2}}).ok());
  EXPECT_TRUE(wait_for(20, [&] { return running_on("site.") == 2; }));
}

// A move stopped after each of its steps (its front end gone there: the test hook
// WEFT_TEST_MOVE_HOLD_AFTER), and a party killed at that point: the other front end
// carries it on and it completes; one whose new shard stays away past the decide time
// rolls back. Nothing restarts, and no index ever runs twice.
TEST_F(RegionMove, AMoveInterruptedAtEachStepCompletesOrRollsBackOnItsOwn) {
  world();
  int before = starts();
  std::atomic<bool> done{false};
  std::string broken;
  std::thread watch([&] {
    while (!done) {
      if (auto v = violated(1); !v.empty() && broken.empty()) broken = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::string where = "s1";
  // fe1 (index 6) restarted with the hold; `kill` names what dies while it holds.
  struct Case {
    const char* hold;
    std::vector<size_t> kill;  // indexes into all_ (leaders looked up below)
  };
  auto restart_fe1 = [&](const std::string& hold) {
    at(6).stop(SIGKILL);
    if (!hold.empty()) setenv("WEFT_TEST_MOVE_HOLD_AFTER", hold.c_str(), 1);
    at(6).start();
    unsetenv("WEFT_TEST_MOVE_HOLD_AFTER");
    // Every role led again (etcd may have been restarted by the case before) and both
    // front ends reaching them.
    ASSERT_TRUE(wait_for(60, [&] {
      heal();
      return leader_of(0) && leader_of(2) && leader_of(4) && fronts_reach_all();
    }));
  };
  for (const char* hold : {"out", "in", "decided", "open"}) {
    SCOPED_TRACE(hold);
    std::string to = where == "s1" ? "s2" : "s1";
    size_t from_first = where == "s1" ? 2 : 4, to_first = where == "s1" ? 4 : 2;
    restart_fe1(hold);
    auto begun = at(6).call("entitlement.move", {{"name", "web"}, {"to", to}, {"wait", false}});
    ASSERT_TRUE(begun.ok()) << begun.error().str();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    if (std::string(hold) == "out") {
      // Fenced on the old shard: its job refuses changes, saying why.
      auto scale = at(7).call("job.scale", {{"name", "site"}, {"count", 2}});
      ASSERT_FALSE(scale.ok());
      EXPECT_EQ(scale.error().code, rpc::kUnavailable) << scale.error().str();
      auto show = at(7).call("entitlement.show", {{"name", "web"}});
      ASSERT_TRUE(show.ok());
      EXPECT_EQ((*show)["move"].value("to", ""), to) << show->dump();
    }
    if (std::string(hold) == "in" || std::string(hold) == "decided") {
      // Read in on the new shard, so the job is on both: a front end that never looked
      // it up (fe2 restarted) says it is moving, never "stop one" (issue 59).
      at(7).stop(SIGKILL);
      at(7).start();
      ASSERT_TRUE(wait_for(30, [&] { return fronts_reach_all(); }));
      // (job.show goes where job.scale would: to the shard its entitlement's home names.)
      auto shown = at(7).call("job.show", {{"name", "site"}});
      ASSERT_TRUE(shown.ok()) << shown.error().str();
      std::string answered = shown->value("shard", "");
      EXPECT_TRUE(answered == "s1" || answered == "s2") << shown->dump();
    }
    // The front end that drove it dies, and with it: the old shard's leader (out, open),
    // the new one's (in), or etcd (decided).
    at(6).stop(SIGKILL);
    if (std::string(hold) == "out" || std::string(hold) == "open") {
      if (Replica* l = leader_of(from_first)) l->stop(SIGKILL);
    } else if (std::string(hold) == "in") {
      if (Replica* l = leader_of(to_first)) l->stop(SIGKILL);
    } else {
      etcd_->kill();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      etcd_->start();
      ASSERT_EQ(etcd_->error(), "");
    }
    heal();
    EXPECT_TRUE(wait_for(60,
                         [&] {
                           heal();
                           return settled(to, 3);
                         }))
        << hold << ": home " << home("web") << ", moving " << moving("web") << ", running "
        << running_on("site.");
    where = to;
  }
  // The new shard stays away: the move rolls back after the decide time, on its own.
  at(7).stop(SIGKILL);
  setenv("WEFT_TEST_MOVE_DECIDE_MS", "3000", 1);
  at(7).start();
  unsetenv("WEFT_TEST_MOVE_DECIDE_MS");
  restart_fe1("in");
  std::string to = where == "s1" ? "s2" : "s1";
  size_t to_first = where == "s1" ? 4 : 2;
  ASSERT_TRUE(at(6).call("entitlement.move", {{"name", "web"}, {"to", to}, {"wait", false}}).ok());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  at(6).stop(SIGKILL);
  at(to_first).stop(SIGKILL);
  at(to_first + 1).stop(SIGKILL);
  // fe2 takes the move over once fe1's beat is stale, cannot reach the new shard, and
  // rolls back after 3 s; the new shard, back, drops what it read in.
  std::this_thread::sleep_for(std::chrono::seconds(16));
  heal();
  EXPECT_TRUE(wait_for(60,
                       [&] {
                         heal();
                         return settled(where, 3);
                       }))
      << "home " << home("web") << ", moving " << moving("web");
  Replica* back = nullptr;
  ASSERT_TRUE(wait_for(30, [&] { return (back = leader_of(to_first)) != nullptr; }));
  EXPECT_FALSE(back->call("entitlement.show", {{"name", "web"}}).ok())
      << "the new shard dropped what it read in";
  done = true;
  watch.join();
  EXPECT_EQ(broken, "");
  EXPECT_EQ(starts() - before, 0) << "nothing started again";
}

// A shard drained of its entitlements (weftctl shard drain, through a front end): each
// moves to the other shard, nothing restarts, the drained shard is given no new
// entitlement, and weftctl entitlement move / show work through the front end too.
TEST_F(RegionMove, AShardIsDrainedOfItsEntitlementsAndGivenNoNewOne) {
  world();
  int before = starts();
  ASSERT_TRUE(
      front()->call("entitlement.create", {{"name", "spare"}, {"quota", 1}, {"shard", "s1"}}).ok());
  auto weftctl = [&](const std::string& args) {
    std::string out = dir_ + "/weftctl.out";
    int rc =
        std::system(("env -u WEFT_CONTROLPLANE HOME=" + dir_ + " " WEFTCTL_BIN " --controlplane " +
                     at(6).sock() + " " + args + " >" + out + " 2>&1")
                        .c_str());
    return std::pair{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out).value_or("")};
  };
  auto [rc, out] = weftctl("shard drain s1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("moved web to shard s2"), std::string::npos) << out;
  EXPECT_NE(out.find("moved spare to shard s2"), std::string::npos) << out;
  EXPECT_NE(out.find("holds no entitlement now"), std::string::npos) << out;
  EXPECT_TRUE(wait_for(30, [&] { return settled("s2", 3); }));
  EXPECT_EQ(home("spare"), "s2");
  Replica* s1 = leader_of(2);
  ASSERT_NE(s1, nullptr);
  auto left = s1->call("entitlement.ls");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE((*left)["entitlements"].empty()) << left->dump();
  // A new entitlement goes to a shard that is not draining (either front end knows).
  for (size_t fe : {6, 7}) {
    std::string name = "new" + std::to_string(fe);
    auto made = at(fe).call("entitlement.create", {{"name", name}, {"quota", 1}});
    ASSERT_TRUE(made.ok()) << made.error().str();
    EXPECT_EQ(made->value("shard", ""), "s2") << made->dump();
  }
  // weftctl moves one back (s1 may still be named), and shows where it is.
  std::tie(rc, out) = weftctl("entitlement move spare --to s1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("moved from shard s2 to shard s1"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("entitlement show spare --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"shard\": \"s1\""), std::string::npos) << out;
  // Refused with the field named: an unknown shard, the shard it is on.
  std::tie(rc, out) = weftctl("entitlement move spare --to s9");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("to"), std::string::npos) << out;
  std::tie(rc, out) = weftctl("entitlement move spare --to s1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("already"), std::string::npos) << out;
  EXPECT_EQ(starts() - before, 0) << "nothing started again";
}

}  // namespace
}  // namespace weft::cp
