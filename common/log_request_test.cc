// task.logs's parameters (common/log_request.h), as the agent and the control plane read
// them.
#include "common/log_request.h"

#include <gtest/gtest.h>

namespace weft {
namespace {

using nlohmann::json;

TEST(LogRequest, DefaultsCapsAndEveryBadFieldNamed) {
  auto d = parse_log_request(json::object(), 1000, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->stream, "stdout");
  EXPECT_FALSE(d->cursor);
  EXPECT_FALSE(d->tail);
  // As the wire gives them (a positive JSON number parses as unsigned).
  auto r = parse_log_request(json::parse(R"({"stream": "stderr", "max_bytes": 1000000,
                                             "cursor": {"seq": 4, "offset": 99}, "tail": 10})"),
                             1000, 10);
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ(r->stream, "stderr");
  EXPECT_EQ(r->max_bytes, 1000u);  // capped, not refused
  ASSERT_TRUE(r->cursor);
  EXPECT_EQ(r->cursor->seq, 4u);
  EXPECT_EQ(r->cursor->offset, 99u);
  EXPECT_EQ(r->tail, 10u);
  EXPECT_TRUE(parse_log_request({{"cursor", nullptr}}, 1000, 10).ok());
  for (auto [text, field] : std::initializer_list<std::pair<const char*, const char*>>{
           {R"({"stream": "stdin"})", "stream"},
           {R"({"stream": 1})", "stream"},
           {R"({"max_bytes": 0})", "max_bytes"},
           {R"({"max_bytes": -5})", "max_bytes"},
           {R"({"cursor": "x"})", "cursor"},
           {R"({"cursor": {"seq": 1}})", "cursor"},
           {R"({"cursor": {"seq": 4294967296, "offset": 0}})", "cursor"},
           {R"({"cursor": {"seq": 1, "offset": -1}})", "cursor"},
           {R"({"cursor": {"seq": 1, "offset": 18446744073709551615}})", "cursor.offset"},
           {R"({"cursor": {"seq": 1, "offset": 9223372036854775808}})", "cursor.offset"},
           {R"({"tail": 11})", "tail"},
           {R"({"tail": "3"})", "tail"}}) {
    json bad = json::parse(text);
    auto e = parse_log_request(bad, 1000, 10);
    ASSERT_FALSE(e.ok()) << bad.dump();
    EXPECT_EQ(e.error().field, field) << bad.dump() << ": " << e.error().str();
  }
}

}  // namespace
}  // namespace weft
