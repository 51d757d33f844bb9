// weftctl job events: what happened to a job's tasks, oldest first.
#include "cli/cluster.h"

#include <cstdio>
#include <ctime>

namespace weft::cli {

namespace {

struct JobEventsOptions {
  std::string name;
  int64_t after = 0, limit = 100;
};

}  // namespace

void add_job_events_commands(CLI::App* job, Handlers& h) {
  auto o = std::make_shared<JobEventsOptions>();
  CLI::App* cmd =
      job->add_subcommand("events",
                          "what happened to a job's tasks (placed, running, ready, failed and why, "
                          "moved, restarted and by whom), oldest first");
  cmd->add_option("name", o->name, "job name")->required();
  cmd->add_option("--after", o->after, "only events after this number (the last page's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--limit", o->limit, "at most this many (default 100)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  h.on(cmd, [o](const Globals& g) {
    json r = call_or_die(*cp_client(g), "job.events",
                         {{"name", o->name}, {"after", o->after}, {"limit", o->limit}});
    print_json_or(g, r, [&] {
      const json& events = r.value("events", json::array());
      for (const auto& e : events) {
        char when[32] = "-";
        time_t t = static_cast<time_t>(e.value("at_us", uint64_t{0}) / 1'000'000);
        struct tm tmv;
        if (gmtime_r(&t, &tmv)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
        std::printf("%6s %s  %-28s %-12s %-14s %s\n", str_or(e, "seq").c_str(), when,
                    str_or(e, "task").c_str(), str_or(e, "machine").c_str(),
                    str_or(e, "what").c_str(), e.value("detail", "").c_str());
      }
      if (events.empty())
        std::printf("(no events after %lld)\n", static_cast<long long>(o->after));
      else
        std::printf("(next page: --after %s)\n", str_or(r, "next").c_str());
    });
    return 0;
  });
}

}  // namespace weft::cli
