// A job's events (weftctl job events, docs/jobs.md "Events"): what happened to its tasks
// (placed, running, ready, failed with the reason, lost, moved, stopped) and what was
// asked of them (restarts, moves, with who or why), numbered, newest last. Kept in the
// leader's memory, the last kPerJob of each job; a new leader starts with none (the
// audit log keeps who did what).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::cp {

class JobEvents {
 public:
  struct Event {
    uint64_t seq = 0;
    uint64_t at_us = 0;  // wall clock
    std::string task, machine, what, detail;
  };
  static constexpr size_t kPerJob = 256;

  void record(const std::string& job, Event e);
  // Events of `job` after `after` (a seq), at most `limit`, oldest first; `next` is what to
  // ask after next time (the last one's seq, or `after` when there is none).
  std::vector<Event> list(const std::string& job, uint64_t after, size_t limit,
                          uint64_t* next) const;
  // The events of jobs `keep` says no to go (jobs that are gone: their events stay until
  // the jobs kept outnumber the live ones by far).
  template <class Keep>
  void keep_only(Keep keep) {
    std::erase_if(jobs_, [&](const auto& j) { return !keep(j.first); });
  }
  size_t jobs() const { return jobs_.size(); }

  // The latest `n` events of every job, newest first, each with its "job".
  nlohmann::json latest(size_t n) const;
  static nlohmann::json to_json(const Event& e);

 private:
  std::map<std::string, std::deque<Event>> jobs_;
  uint64_t seq_ = 0;
};

}  // namespace weft::cp
