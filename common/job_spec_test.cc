#include "common/job_spec.h"

#include <gtest/gtest.h>

#include "common/task_spec.h"

namespace weft {
namespace {

using json = nlohmann::json;

json valid() {
  return {{"name", "web"},
          {"entitlement", "frontend"},
          {"count", 3},
          {"task", {{"argv", {"/bin/sleep", "infinity"}}}}};
}

TEST(JobSpec, ErrorsNameTheField) {
  auto with = [](std::initializer_list<std::pair<const char*, json>> changes) {
    json j = valid();
    for (const auto& [k, v] : changes) {
      if (v.is_null())
        j.erase(k);
      else
        j[k] = v;
    }
    return j;
  };
  struct Case {
    json j;
    std::string field;
  } cases[] = {
      {json::array(), "job"},
      {with({{"name", nullptr}}), "name"},
      {with({{"name", "a.b"}}), "name"},
      {with({{"name", "-a"}}), "name"},
      // Task ids "<job>.<index>.<n>" must fit the agent's 63-character task names.
      {with({{"name", std::string(33, 'a')}}), "name"},
      {with({{"entitlement", nullptr}}), "entitlement"},
      {with({{"entitlement", 1}}), "entitlement"},
      {with({{"count", 0}}), "count"},
      {with({{"count", "x"}}), "count"},
      {with({{"count", 4294967297ull}}), "count"},
      {with({{"count", 18446744073709551615ull}}), "count"},
      {with({{"count", 100001}}), "count"},
      {with({{"per_task", {{"cpu_milli", -1}}}}), "per_task.cpu_milli"},
      {with({{"per_task", {{"mem_mb", "lots"}}}}), "per_task.mem_mb"},
      {with({{"per_task", {{"cpu_milli", 4294967297000ll}}}}), "per_task.cpu_milli"},
      {with({{"per_task", {{"disk", 1}}}}), "per_task.disk"},
      {with({{"max_unavailable", 0}}), "max_unavailable"},
      {with({{"placement", "random"}}), "placement"},
      {with({{"colour", "blue"}}), "colour"},
      {with({{"task", "sleep"}}), "task"},
      {with({{"task", nullptr}}), "task"},
      // What the agent would refuse is refused here, with the agent's field.
      {with({{"task", {{"argv", {"x"}}, {"limits", {{"memory", "1G"}}}}}}), "task.limits"},
      {with({{"task", {{"argv", json::array()}}}}), "task.argv"},
      {with({{"task", {{"argv", {"x"}}, {"resources", {{"memory_max", "lots"}}}}}}),
       "task.resources.memory_max"},
      {with({{"task", {{"argv", {"x"}}, {"name", "mine"}}}}), "task.name"},
      {with({{"task", {{"argv", {"x"}}, {"owner", "controlplane"}}}}), "task.owner"},
      {with({{"task_controller", "127.0.0.1:7400"}}), "task_controller"},
      {with({{"task_controller", json::object()}}), "task_controller.address"},
      {with({{"task_controller", {{"address", 7400}}}}), "task_controller.address"},
      {with({{"task_controller", {{"address", "no port"}}}}), "task_controller.address"},
      {with({{"task_controller", {{"address", "h:1"}, {"timeout_ms", 5}}}}),
       "task_controller.timeout_ms"},
      {with({{"task_controller", {{"address", "h:1"}, {"when_unreachable", "panic"}}}}),
       "task_controller.when_unreachable"},
      {with({{"task_controller", {{"address", "h:1"}, {"shards", 3}}}}), "task_controller.shards"},
      {with({{"task_controller", {{"address", "h:1"}, {"job", "ctl"}, {"port", 1}}}}),
       "task_controller.address"},
      {with({{"task_controller", {{"address", "h:1"}, {"port", 1}}}}), "task_controller.port"},
      {with({{"task_controller", {{"job", "ctl"}}}}), "task_controller.port"},
      {with({{"task_controller", {{"job", "ctl"}, {"port", 0}}}}), "task_controller.port"},
      {with({{"task_controller", {{"job", "ctl"}, {"port", 70000}}}}), "task_controller.port"},
      {with({{"task_controller", {{"job", "no such/name"}, {"port", 1}}}}), "task_controller.job"},
  };
  for (const auto& c : cases) {
    auto r = parse_job_spec(c.j);
    ASSERT_FALSE(r.ok()) << c.j.dump();
    EXPECT_EQ(r.error().field, c.field) << c.j.dump() << " -> " << r.error().str();
  }
}

TEST(JobSpec, RoundTripsAndDefaults) {
  auto s = parse_job_spec(valid());
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->max_unavailable, 1);
  EXPECT_EQ(s->placement, PlacementPolicy::kSpread);
  s->per_task = {250, 64};
  s->placement = PlacementPolicy::kPack;
  auto back = parse_job_spec(to_json(*s));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->count, 3);
  EXPECT_EQ(back->per_task, s->per_task);
  EXPECT_EQ(back->placement, PlacementPolicy::kPack);
  EXPECT_EQ(back->task, s->task);
  EXPECT_FALSE(back->controller);
  // A TaskController, with its defaults, and back.
  json j = valid();
  j["task_controller"] = {{"address", "10.0.0.5:7400"}};
  auto c = parse_job_spec(j);
  ASSERT_TRUE(c.ok()) << c.error().str();
  ASSERT_TRUE(c->controller);
  EXPECT_EQ(c->controller->timeout_ms, 10000u);
  EXPECT_FALSE(c->controller->wait_when_unreachable);
  c->controller->wait_when_unreachable = true;
  auto again = parse_job_spec(to_json(*c));
  ASSERT_TRUE(again.ok()) << again.error().str();
  EXPECT_EQ(again->controller, c->controller);
  // A controller that is a task of another job, and back; never the job itself.
  j["task_controller"] = {{"job", "shard-ctl"}, {"port", 7400}};
  auto by_job = parse_job_spec(j);
  ASSERT_TRUE(by_job.ok()) << by_job.error().str();
  EXPECT_EQ(by_job->controller->job, "shard-ctl");
  EXPECT_EQ(by_job->controller->port, 7400);
  EXPECT_TRUE(by_job->controller->address.empty());
  auto back_by_job = parse_job_spec(to_json(*by_job));
  ASSERT_TRUE(back_by_job.ok()) << back_by_job.error().str();
  EXPECT_EQ(back_by_job->controller, by_job->controller);
  j["task_controller"] = {{"job", j["name"]}, {"port", 7400}};
  auto itself = parse_job_spec(j);
  ASSERT_FALSE(itself.ok());
  EXPECT_EQ(itself.error().field, "task_controller.job");
}

TEST(JobSpec, EveryTaskIdFitsTheAgentsTaskNames) {
  json j = valid();
  j["name"] = std::string(kMaxJobNameLength, 'j');
  j["count"] = kMaxTasksPerJob;
  auto s = parse_job_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  std::string id = make_task_id(s->name, kMaxTasksPerJob - 1, UINT64_MAX);
  auto t = parse_task_spec(task_run_params(*s, id));
  ASSERT_TRUE(t.ok()) << t.error().str();
  EXPECT_EQ(t->name, id);
  EXPECT_EQ(t->owner, "controlplane");
}

TEST(JobSpec, PortsAndDiscoveryDrain) {
  json j{{"name", "web"},
         {"entitlement", "e"},
         {"ports", {{"http", 0}, {"admin", 9100}}},
         {"discovery_drain", "5s"},
         {"task", {{"argv", {"/bin/true"}}, {"readiness", {{"type", "http"}, {"port", "http"}}}}}};
  auto s = parse_job_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  EXPECT_EQ(s->ports.at("admin"), 9100);
  EXPECT_EQ(s->discovery_drain_us, 5'000'000u);
  auto back = parse_job_spec(to_json(*s));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->ports, s->ports);
  EXPECT_EQ(back->discovery_drain_us, s->discovery_drain_us);
  // Each task gets its own numbers in its task spec.
  json run = task_run_params(*s, "web.0.1", {{"http", 20005}, {"admin", 9100}});
  EXPECT_EQ(run["ports"]["http"], 20005);
  json bad = j;
  bad["task"]["ports"] = {{"x", 1}};
  EXPECT_EQ(parse_job_spec(bad).error().field, "task.ports");
  bad = j;
  bad["ports"]["Bad"] = 1;
  EXPECT_EQ(parse_job_spec(bad).error().field, "ports.Bad");
  bad = j;
  bad["discovery_drain"] = "2h";
  EXPECT_EQ(parse_job_spec(bad).error().field, "discovery_drain");
  bad = j;
  bad["task"]["readiness"]["port"] = "grpc";
  EXPECT_EQ(parse_job_spec(bad).error().field, "task.readiness.port");
}

TEST(JobSpec, AutoscaleIsReadCheckedAndGivenBack) {
  json j = valid();
  j["per_task"] = {{"cpu_milli", 500}, {"mem_mb", 0}};
  j["autoscale"] = {
      {"min", 2}, {"max", 10}, {"target", 0.6}, {"scale_down_window", "2m"}, {"predictive", true}};
  auto s = parse_job_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  ASSERT_TRUE(s->autoscale);
  EXPECT_EQ(s->autoscale->min, 2);
  EXPECT_EQ(s->autoscale->max, 10);
  EXPECT_EQ(s->autoscale->metric, AutoscaleMetric::kCpu);
  EXPECT_DOUBLE_EQ(s->autoscale->target, 0.6);
  EXPECT_DOUBLE_EQ(s->autoscale->tolerance, 0.1);
  EXPECT_EQ(s->autoscale->down_window_us, 120'000'000u);
  EXPECT_TRUE(s->autoscale->predictive);
  EXPECT_FALSE(s->autoscale->paused);
  auto back = parse_job_spec(to_json(*s));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->autoscale, s->autoscale);
  struct Case {
    json autoscale;
    const char* field;
  } cases[] = {
      {json::array(), "autoscale"},
      {{{"max", 3}}, "autoscale.min"},
      {{{"min", 1}}, "autoscale.max"},
      {{{"min", 0}, {"max", 3}}, "autoscale.min"},
      {{{"min", 4}, {"max", 3}}, "autoscale.max"},
      {{{"min", 1}, {"max", 3}, {"metric", "gpu"}}, "autoscale.metric"},
      {{{"min", 1}, {"max", 3}, {"metric", "memory"}}, "autoscale.metric"},  // no mem_mb
      {{{"min", 1}, {"max", 3}, {"target", 0}}, "autoscale.target"},
      {{{"min", 1}, {"max", 3}, {"target", "high"}}, "autoscale.target"},
      {{{"min", 1}, {"max", 3}, {"tolerance", 0.9}}, "autoscale.tolerance"},
      {{{"min", 1}, {"max", 3}, {"scale_down_window", "2h"}}, "autoscale.scale_down_window"},
      {{{"min", 1}, {"max", 3}, {"predictive", "yes"}}, "autoscale.predictive"},
      {{{"min", 1}, {"max", 3}, {"cooldown", 1}}, "autoscale.cooldown"},
  };
  for (const auto& c : cases) {
    json bad = j;
    bad["autoscale"] = c.autoscale;
    auto r = parse_job_spec(bad);
    ASSERT_FALSE(r.ok()) << c.autoscale.dump();
    EXPECT_EQ(r.error().field, c.field) << c.autoscale.dump() << ": " << r.error().str();
  }
  // An app metric: one of the job's named ports, a path, a metric name; target required.
  json app = j;
  app["ports"] = {{"http", 0}};
  app["autoscale"] = {{"min", 1},
                      {"max", 5},
                      {"metric", "app"},
                      {"target", 20},
                      {"app_metric", {{"port", "http"}, {"name", "http_in_flight"}}}};
  auto a = parse_job_spec(app);
  ASSERT_TRUE(a.ok()) << a.error().str();
  EXPECT_EQ(a->autoscale->metric, AutoscaleMetric::kApp);
  EXPECT_EQ(a->autoscale->app.path, "/metrics");
  EXPECT_DOUBLE_EQ(a->autoscale->target, 20);
  EXPECT_EQ(parse_job_spec(to_json(*a))->autoscale, a->autoscale);
  struct AppCase {
    const char* key;
    json value;
    const char* field;
  } app_cases[] = {
      {"port", "grpc", "autoscale.app_metric.port"},
      {"path", "metrics", "autoscale.app_metric.path"},
      {"name", "http-in-flight", "autoscale.app_metric.name"},
      {"scheme", "https", "autoscale.app_metric.scheme"},
  };
  for (const auto& c : app_cases) {
    json bad = app;
    bad["autoscale"]["app_metric"][c.key] = c.value;
    EXPECT_EQ(parse_job_spec(bad).error().field, c.field) << c.key;
  }
  json no_target = app;
  no_target["autoscale"].erase("target");
  EXPECT_EQ(parse_job_spec(no_target).error().field, "autoscale.target");
  json no_metric = app;
  no_metric["autoscale"].erase("app_metric");
  EXPECT_EQ(parse_job_spec(no_metric).error().field, "autoscale.app_metric");
  json stray = j;
  stray["autoscale"]["app_metric"] = {{"port", "http"}, {"name", "x"}};
  EXPECT_EQ(parse_job_spec(stray).error().field, "autoscale.app_metric");
  // The ReBalancer may move the job's tasks unless it says not to.
  EXPECT_TRUE(parse_job_spec(valid())->rebalance);
  json fixed = valid();
  fixed["rebalance"] = false;
  EXPECT_FALSE(parse_job_spec(fixed)->rebalance);
  EXPECT_FALSE(parse_job_spec(to_json(*parse_job_spec(fixed)))->rebalance);
  fixed["rebalance"] = "no";
  EXPECT_EQ(parse_job_spec(fixed).error().field, "rebalance");
  // cpu needs a reservation of CPU to be a fraction of
  json no_cpu = valid();
  no_cpu["autoscale"] = {{"min", 1}, {"max", 3}};
  EXPECT_EQ(parse_job_spec(no_cpu).error().field, "autoscale.metric");
}

// The control plane's per-job text is the same object as the per-task JSON, with a
// region's holder keys spliced in, and the agent's validator takes it.
TEST(JobSpec, TaskRunTextIsTaskRunParams) {
  json j{{"name", "web"},
         {"entitlement", "e1"},
         {"count", 2},
         {"ports", {{"http", 0}, {"admin", 9100}}},
         {"task", {{"argv", {"/bin/echo", "a \"quoted\" word", "ünïcode"}}, {"user", "nobody"}}}};
  auto s = parse_job_spec(j);
  ASSERT_TRUE(s.ok()) << s.error().str();
  std::string body = task_run_body(*s);
  std::map<std::string, uint16_t> mine{{"http", 20005}, {"admin", 9100}};
  EXPECT_EQ(json::parse(task_run_text(body, "web.1.7", mine)),
            task_run_params(*s, "web.1.7", mine));
  EXPECT_EQ(json::parse(task_run_text(body, "web.1.7", s->ports)), task_run_params(*s, "web.1.7"));
  json fenced = json::parse(task_run_text(body, "web.0.3", mine, R"(,"holder":"s1","epoch":3)"));
  EXPECT_EQ(fenced["holder"], "s1");
  EXPECT_EQ(fenced["epoch"], 3);
  EXPECT_EQ(fenced["name"], "web.0.3");
  EXPECT_TRUE(parse_task_spec(json::parse(task_run_text(body, "web.0.3", mine))).ok());
  // A job without ports: no "ports" key at all.
  json plain = j;
  plain.erase("ports");
  auto p = parse_job_spec(plain);
  ASSERT_TRUE(p.ok()) << p.error().str();
  json run = json::parse(task_run_text(task_run_body(*p), "web.0.1", {}));
  EXPECT_FALSE(run.contains("ports"));
  EXPECT_EQ(run, task_run_params(*p, "web.0.1"));
}

}  // namespace
}  // namespace weft
