#include "agent/agent_conf.h"

#include <gtest/gtest.h>

namespace weft::agent {
namespace {

TEST(AgentConfig, ParsesAndDefaults) {
  auto c = parse_agent_config(
      "socket = \"/run/x.sock\"\nstate_dir = \"/var/lib/x\"\ncontrol_plane = \"cp:7000\"\n"
      "[labels]\ndc = \"ash\"\nrack = \"r12\"\n",
      "agent.toml");
  ASSERT_TRUE(c.ok()) << c.error().str();
  EXPECT_EQ(c->socket, "/run/x.sock");
  EXPECT_EQ(c->labels.at("rack"), "r12");
  EXPECT_EQ(c->socket_group, "weft");
  auto d = parse_agent_config("", "agent.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->socket, "/run/weft/agent.sock");
}

TEST(AgentConfig, ErrorsNameLine) {
  auto bad_key = parse_agent_config("socket = \"/x\"\nsoket = \"/y\"\n", "agent.toml");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_EQ(bad_key.error().field, "agent.toml:2");
  auto rel = parse_agent_config("\n\nstate_dir = \"relative\"\n", "agent.toml");
  ASSERT_FALSE(rel.ok());
  EXPECT_EQ(rel.error().field, "agent.toml:3");
  auto type = parse_agent_config("socket = 5\n", "agent.toml");
  ASSERT_FALSE(type.ok());
  EXPECT_EQ(type.error().field, "agent.toml:1");
  auto level = parse_agent_config("log_level = \"loud\"\n", "agent.toml");
  EXPECT_FALSE(level.ok());
}

}  // namespace
}  // namespace weft::agent
