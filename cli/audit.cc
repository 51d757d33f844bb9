// weftctl audit: the control plane's audit log (ls).
#include "cli/cluster.h"

#include <time.h>

#include <algorithm>

#include "common/clock.h"
#include "common/units.h"

namespace weft::cli {

namespace {

struct AuditOptions {
  std::string since;
  int64_t limit = 1000;
};

int audit_ls(const Globals& g, const AuditOptions& o) {
  json p{{"limit", o.limit}};
  if (!o.since.empty()) {
    auto us = parse_duration_us(o.since);
    if (!us.ok()) die("--since: " + us.error().str(), 2);
    int64_t now = static_cast<int64_t>(now_realtime_us());
    p["since_wall_us"] = std::max<int64_t>(0, now - static_cast<int64_t>(*us));
  }
  json r = call_or_die(*cp_client(g), "audit.ls", p);
  print_json_or(g, r, [&] {
    std::vector<std::vector<std::string>> rows = {
        {"TIME", "WHO", "ROLE", "METHOD", "TARGET", "RESULT"}};
    for (const auto& e : r["entries"]) {
      time_t t = static_cast<time_t>(e.value("at_wall_us", int64_t{0}) / 1'000'000);
      char when[32] = "-";
      struct tm tmv;
      if (gmtime_r(&t, &tmv)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
      rows.push_back({when, str_or(e, "who"), str_or(e, "role"), str_or(e, "method"),
                      str_or(e, "target"), str_or(e, "result")});
    }
    print_table(rows);
  });
  return 0;
}

}  // namespace

void add_audit_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<AuditOptions>();
  CLI::App* audit = app.add_subcommand("audit", "the control plane's audit log");
  audit->require_subcommand(1);
  CLI::App* list =
      audit->add_subcommand("ls", "operator calls that changed the cluster or were refused");
  list->add_option("--since", o->since, "only entries this recent (e.g. 30m, 2h, 7d)");
  list->add_option("--limit", o->limit, "at most this many, the latest (default 1000)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  h.on(list, [o](const Globals& g) { return audit_ls(g, *o); });
}

}  // namespace weft::cli
