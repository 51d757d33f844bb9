// The web view's page as a pure function of the listings (web_view.h).
#include "controlplane/web/web_view.h"

#include <gtest/gtest.h>

namespace weft::cp {
namespace {

using nlohmann::json;

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

TEST(WebView, EveryMachineEntitlementJobAndEventIsDrawnAndNothingIsTrusted) {
  FleetSnapshot s;
  s.now_wall_us = 1'800'000'000'000'000;
  const char* states[] = {"ok", "degraded", "failed", "dead", "drained"};
  for (int i = 0; i < 100; ++i)
    s.machines.push_back({{"machine", "m" + std::to_string(i)},
                          {"state", states[i % 5]},
                          {"dc", i < 60 ? "east" : "west"},
                          {"domain", "rack" + std::to_string(i % 4)},
                          {"entitlement", i < 10 ? "web" : ""},
                          {"tasks", i < 10 ? 2 : 0}});
  s.entitlements.push_back(
      {{"name", "web"}, {"quota", 12}, {"machines", 10}, {"profile", "dev"}, {"owners", {"CN=a"}}});
  s.entitlements.push_back({{"name", "<script>alert(1)</script>"}, {"quota", 1}, {"machines", 0}});
  s.jobs.push_back({{"name", "site"},
                    {"entitlement", "web"},
                    {"count", 20},
                    {"ready", 18},
                    {"current", 5},
                    {"generation", 3},
                    {"stopping", false}});
  s.jobs.push_back({{"name", "etl"},
                    {"entitlement", "web"},
                    {"count", 3},
                    {"ready", 3},
                    {"current", 3},
                    {"generation", 1},
                    {"kind", "batch"},
                    {"completions", 10},
                    {"succeeded", 4},
                    {"outcome", ""}});
  s.jobs.push_back({{"name", "api"},
                    {"entitlement", "web"},
                    {"count", 4},
                    {"ready", 4},
                    {"current", 1},
                    {"generation", 2},
                    {"canary", true}});
  s.maintenance.push_back({{"id", 7},
                           {"target_kind", "domain"},
                           {"target", "rack1"},
                           {"start_us", s.now_wall_us + 3'600'000'000},
                           {"duration_us", 7'200'000'000},
                           {"state", "scheduled"},
                           {"reboot", true},
                           {"reason", "a & b"}});
  s.events.push_back({{"seq", 9},
                      {"at_us", s.now_wall_us - 5'000'000},
                      {"job", "site"},
                      {"task", "site.0.3"},
                      {"machine", "m1"},
                      {"what", "failed"},
                      {"detail", "exit status 3 <b>"}});
  std::string html = render_fleet_html(s);
  EXPECT_EQ(count_of(html, "<tr class=\"event what-failed\">"), 1u);
  EXPECT_NE(html.find("<td>5 s</td><td>site</td><td>site.0.3</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("exit status 3 &lt;b&gt;"), std::string::npos);
  EXPECT_EQ(count_of(html, "<rect class=\"machine "), 100u);
  EXPECT_EQ(count_of(html, "class=\"machine state-failed\""), 20u);
  EXPECT_EQ(count_of(html, "<svg class=\"grid\""), 2u);  // one per data centre
  EXPECT_EQ(count_of(html, "data-entitlement=\"web\" x="), 10u);
  EXPECT_NE(html.find("100 machines · 20 ok · 20 degraded · 20 failed · 20 dead · 20 drained"),
            std::string::npos);
  EXPECT_NE(html.find("<td class=\"used\">10 / 12</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"rollout\">5 of 20 updated</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"rollout\">running 4/10 completed</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"rollout\">1 of 4 updated (canaries: weftctl job promote)</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<td class=\"ready\">18 / 20</td>"), std::string::npos);
  EXPECT_EQ(count_of(html, "<tr class=\"maintenance\">"), 1u);
  EXPECT_NE(html.find("a &amp; b"), std::string::npos);
  // Names are the operators' input: escaped, never markup.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
}

// Issue 48: what tasks use, by job and by machine, with its age; none yet: the page says
// it is asking.
TEST(WebView, WhatTasksUseIsShownByJobAndMachineWithItsAge) {
  FleetSnapshot s;
  std::string waiting = render_fleet_html(s);
  EXPECT_NE(waiting.find("Asking the machines"), std::string::npos);
  s.usage = {{"age_s", 4},
             {"silent", {"m9"}},
             {"jobs",
              {{{"job", "web<1>"},
                {"entitlement", "svc"},
                {"tasks", 3},
                {"cpu_milli", 1500},
                {"cpu_request_milli", 3000},
                {"mem_bytes", 300 * 1024 * 1024},
                {"mem_request_mb", 600},
                {"io_read_bps", 2048},
                {"io_write_bps", 4096}}}},
             {"machines",
              {{{"machine", "m1"},
                {"tasks", 2},
                {"cpu_milli", 1000},
                {"cpu_capacity_milli", 4000},
                {"mem_bytes", 200 * 1024 * 1024},
                {"mem_capacity_mb", 8192}}}}};
  std::string html = render_fleet_html(s);
  EXPECT_NE(html.find("as of 4 s ago; no answer from 1 machine(s)"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr class=\"usage-job\" data-job=\"web&lt;1&gt;\"><td>web&lt;1&gt;</td>"
                      "<td>svc</td><td>3</td><td class=\"cpu\">1.50 / 3.00</td>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<td class=\"mem\">300 / 600</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>2 / 4</td></tr>"), std::string::npos);  // KiB/s read / write
  EXPECT_NE(html.find("<td>m1</td><td>2</td><td class=\"cpu\">1.00 / 4.00</td>"),
            std::string::npos);
  EXPECT_EQ(count_of(html, "<tr class=\"usage-machine\""), 1u);
}

TEST(WebView, AnEmptyFleetIsAPage) {
  std::string html = render_fleet_html(FleetSnapshot{});
  EXPECT_NE(html.find("0 machines"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

}  // namespace
}  // namespace weft::cp
