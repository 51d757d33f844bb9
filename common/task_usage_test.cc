#include "common/task_usage.h"

#include <gtest/gtest.h>

#include <tuple>

namespace weft {
namespace {

using json = nlohmann::json;

TEST(TaskUsage, AnswerGoesAndComesBack) {
  UsageReport r;
  r.interval_ms = 5000;
  r.tasks["web.0.1"] = TaskUsage{250, 64 << 20, 4096, 0};
  r.tasks["web.1.2"] = TaskUsage{0, 1, 2, 3};
  json j = to_json(r);
  EXPECT_EQ(j["tasks"]["web.0.1"], json::array({250, 64 << 20, 4096, 0}));
  auto back = parse_usage_report(j);
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->interval_ms, 5000u);
  EXPECT_EQ(back->tasks, r.tasks);
}

TEST(TaskUsage, ErrorsNameTheField) {
  struct Case {
    json j;
    const char* field;
  } cases[] = {
      {json::array(), "usage"},
      {{{"interval_ms", -1}}, "interval_ms"},
      {{{"tasks", json::array()}}, "tasks"},
      {{{"tasks", {{"a", json::array({1, 2, 3})}}}}, "tasks.a"},
      {{{"tasks", {{"a", json::array({1, 2, 3, -4})}}}}, "tasks.a[3]"},
      {{{"tasks", {{"a", json::array({1.5, 2, 3, 4})}}}}, "tasks.a[0]"},
      {{{"tasks", {{"a", json::array({1, uint64_t{1} << 60, 3, 4})}}}}, "tasks.a[1]"},
      {{{"tasks", {{"a", "busy"}}}}, "tasks.a"},
  };
  for (const auto& c : cases) {
    auto r = parse_usage_report(c.j);
    ASSERT_FALSE(r.ok()) << c.j.dump();
    EXPECT_EQ(r.error().field, c.field) << c.j.dump();
  }
  EXPECT_EQ(parse_usage_request(json{{"tasks", {"a", 1}}}).error().field, "tasks[1]");
  EXPECT_EQ(parse_usage_request(json{{"task", {"a"}}}).error().field, "task");
  EXPECT_EQ(parse_usage_request(json{{"tasks", "a"}}).error().field, "tasks");
  auto ok = parse_usage_request(json{{"tasks", {"a", "b"}}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->tasks.size(), 2u);
  EXPECT_TRUE(parse_usage_request(json()).value().tasks.empty());
  json group{{"tasks", {"a"}}, {"port", "http"}, {"path", "/metrics"}, {"name", "inflight"}};
  auto scrape = parse_usage_request(json{{"scrape", {group}}});
  ASSERT_TRUE(scrape.ok()) << scrape.error().str();
  ASSERT_EQ(scrape->scrape.size(), 1u);
  EXPECT_EQ(scrape->scrape[0].name, "inflight");
  EXPECT_EQ(to_json(*scrape)["scrape"][0], group);
  for (auto [key, value, field] : {std::tuple{"path", json("metrics"), "scrape[0].path"},
                                   std::tuple{"name", json("in-flight"), "scrape[0].name"},
                                   std::tuple{"port", json(8080), "scrape[0].port"},
                                   std::tuple{"extra", json(1), "scrape[0].extra"}}) {
    json bad = group;
    bad[key] = value;
    EXPECT_EQ(parse_usage_request(json{{"scrape", {bad}}}).error().field, field) << key;
  }
  // The metric, when scraped, is a fifth figure; the reasons of failed scrapes beside.
  UsageReport r;
  r.tasks["a"] = TaskUsage{1, 2, 3, 4, 17.5};
  r.scrape_errors["b"] = "connection refused";
  auto back = parse_usage_report(to_json(r));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->tasks, r.tasks);
  EXPECT_EQ(back->scrape_errors, r.scrape_errors);
  EXPECT_EQ(parse_usage_report(json{{"tasks", {{"a", {1, 2, 3, 4, "x"}}}}}).error().field,
            "tasks.a[4]");
}

}  // namespace
}  // namespace weft
