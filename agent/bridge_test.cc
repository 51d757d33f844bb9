#include "agent/bridge.h"

#include <gtest/gtest.h>

namespace weft::agent {
namespace {

constexpr uint32_t kNet = 0x0a590000;  // 10.89.0.0

TEST(AddressPool, HandsOutAddressesInTurnAndAFreedOneLast) {
  AddressPool pool(kNet, 29);  // .0 network, .1 bridge, .2-.6 tasks, .7 broadcast
  EXPECT_EQ(pool.gateway(), kNet + 1);
  std::vector<uint32_t> got;
  for (const char* t : {"a", "b", "c", "d", "e"}) {
    auto a = pool.take(t);
    ASSERT_TRUE(a.ok()) << a.error().str();
    got.push_back(*a);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{kNet + 2, kNet + 3, kNet + 4, kNet + 5, kNet + 6}));
  EXPECT_EQ(*pool.take("c"), kNet + 4);  // a task asking again keeps its own
  auto full = pool.take("f");
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().str().find("every address"), std::string::npos);
  pool.release("b");
  EXPECT_FALSE(pool.in_use(kNet + 3));
  EXPECT_EQ(*pool.take("f"), kNet + 3);
  pool.release("a");
  pool.release("d");
  // In turn from where the last search ended: .5 (d's) before .2 (a's).
  EXPECT_EQ(*pool.take("g"), kNet + 5);
  EXPECT_EQ(*pool.take("h"), kNet + 2);
}

TEST(AddressPool, ARestartedAgentHoldsWhatItsTasksHad) {
  AddressPool pool(kNet, 24);
  EXPECT_TRUE(pool.hold(kNet + 40, "a"));
  EXPECT_TRUE(pool.hold(kNet + 40, "a"));    // again: fine
  EXPECT_FALSE(pool.hold(kNet + 40, "b"));   // another's
  EXPECT_FALSE(pool.hold(kNet + 1, "b"));    // the bridge's
  EXPECT_FALSE(pool.hold(kNet + 255, "b"));  // the broadcast
  EXPECT_FALSE(pool.hold(0x0a5a0005, "b"));  // not of the subnet
  EXPECT_EQ(*pool.take("a"), kNet + 40);
  EXPECT_EQ(*pool.take("c"), kNet + 41);  // after the highest held
  EXPECT_EQ(pool.held(), 2u);
}

TEST(BridgeRules, TheTableReplacesItselfAndPublishesEachPortOnBothProtocols) {
  BridgeRules r;
  r.bridge = "br-tasks";
  r.net = kNet;
  r.prefix = 16;
  r.published["t1"] = Published{kNet + 2, {20001, 20002}};
  r.published["t2"] = Published{kNet + 3, {9100}};
  std::string s = bridge_ruleset(r);
  EXPECT_EQ(nft_table("br-tasks"), "weft_br_tasks");
  // One transaction: declared, deleted, written again.
  EXPECT_EQ(s.rfind("table ip weft_br_tasks {}\ndelete table ip weft_br_tasks\n", 0), 0u) << s;
  for (const char* rule :
       {"tcp dport 20001 dnat to 10.89.0.2:20001", "udp dport 20002 dnat to 10.89.0.2:20002",
        "tcp dport 9100 dnat to 10.89.0.3:9100",
        "ip saddr 10.89.0.0/16 oifname != \"br-tasks\" masquerade",
        "oifname \"br-tasks\" ct status dnat accept", "oifname \"br-tasks\" drop",
        "iifname \"br-tasks\" ip saddr != 10.89.0.0/16 drop", "iifname \"br-tasks\" drop"})
    EXPECT_NE(s.find(rule), std::string::npos) << rule << "\n" << s;
  EXPECT_EQ(s.find("dport {"), std::string::npos);  // no host port is open to tasks
  // Between tasks' ports of the bridge: ARP, and published ports both ways; then drop.
  auto between = s.find("chain between_tasks {");
  ASSERT_NE(between, std::string::npos) << s;
  EXPECT_NE(s.find("table bridge weft_br_tasks {}\ndelete table bridge weft_br_tasks\n"),
            std::string::npos);
  for (const char* rule : {"ether type arp accept", "ip daddr 10.89.0.3 tcp dport 9100 accept",
                           "ip saddr 10.89.0.3 udp sport 9100 udp dport 32768-60999 accept",
                           "ip saddr 10.89.0.3 tcp sport 9100 tcp flags & (syn | ack) != syn "
                           "accept",
                           "    drop\n"})
    EXPECT_NE(s.find(rule, between), std::string::npos) << rule;
  // Never a published source port alone: it would let a task reach any port of another.
  EXPECT_EQ(s.find("sport 9100 accept"), std::string::npos) << s;
  EXPECT_NE(s.find("oifname \"br-tasks\" ip daddr 10.89.0.2 tcp dport 20001 accept"),
            std::string::npos);
  r.host_ports = {8600, 53};
  r.published.clear();
  s = bridge_ruleset(r);
  EXPECT_NE(s.find("iifname \"br-tasks\" udp dport { 8600, 53 } accept"), std::string::npos) << s;
  EXPECT_EQ(s.find("dnat to"), std::string::npos);
  // The accept comes before the drop.
  EXPECT_LT(s.find("dport { 8600, 53 } accept"), s.find("iifname \"br-tasks\" drop"));
}

TEST(BridgeRules, AVethIsNamedForItsAddress) {
  EXPECT_EQ(Bridge::veth_name(kNet + 2), "wv0a590002");
  EXPECT_EQ(ipv4_text(kNet + 258), "10.89.1.2");
}

}  // namespace
}  // namespace weft::agent
