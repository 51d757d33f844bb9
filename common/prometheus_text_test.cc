#include "common/prometheus_text.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

TEST(PrometheusText, SumsAMetricOverItsLabelSets) {
  const char* body =
      "# HELP http_in_flight Requests being served.\n"
      "# TYPE http_in_flight gauge\n"
      "http_in_flight{route=\"/a\",code=\"2\\\"00\\\\\"} 3\n"
      "http_in_flight{route=\"/b\"} 4.5 1700000000000\n"
      "http_in_flight_total 99\n"
      "other{x=\"http_in_flight\"} 7\r\n"
      "\n"
      "  # indented comment\n"
      "http_in_flight 0.5\n";
  auto v = prometheus_sum(body, "http_in_flight");
  ASSERT_TRUE(v.ok()) << v.error().str();
  EXPECT_DOUBLE_EQ(*v, 8.0);
  EXPECT_DOUBLE_EQ(prometheus_sum(body, "other").value(), 7.0);
  EXPECT_DOUBLE_EQ(prometheus_sum("x 1e3\n", "x").value(), 1000.0);
}

TEST(PrometheusText, RefusesWhatIsNotTheFormatWithTheLine) {
  struct Case {
    const char* body;
    const char* error;
  } cases[] = {
      {"x\n", "line 1: a value"},
      {"x 1\n{a=\"b\"} 2\n", "line 2: a sample must start"},
      {"x{a=b} 1\n", "quoted"},
      {"x{a=\"b} 1\n", "not closed"},
      {"x{a=\"\\q\"} 1\n", "bad escape"},
      {"x{a=\"b\" c=\"d\"} 1\n", "',' or '}'"},
      {"x one\n", "not a number"},
      {"x 1 abc\n", "bad timestamp"},
      {"x 1 12 extra\n", "after the timestamp"},
      {"x NaN\n", "not finite"},
      {"x +Inf\n", "not finite"},
      {"y 1\n", "no sample of x"},
      {"", "no sample of x"},
  };
  for (const auto& c : cases) {
    auto r = prometheus_sum(c.body, "x");
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_NE(r.error().str().find(c.error), std::string::npos)
        << c.body << ": " << r.error().str();
  }
  EXPECT_FALSE(prometheus_sum(std::string(kMaxMetricsBody + 1, '#'), "x").ok());
  EXPECT_TRUE(valid_metric_name("http_requests:rate5m"));
  EXPECT_FALSE(valid_metric_name("9x"));
  EXPECT_FALSE(valid_metric_name(""));
  EXPECT_FALSE(valid_metric_name("a-b"));
}

}  // namespace
}  // namespace weft
