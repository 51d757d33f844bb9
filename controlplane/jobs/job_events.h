// A job's events (weftctl job events, docs/jobs.md "Events"): what happened to its tasks
// (placed, running, ready, failed with the reason, lost, moved, stopped) and what was
// asked of them (restarts, moves, with who or why), numbered, newest last. Kept in the
// leader's memory, the last kPerJob of each job, and as notes (store/notes.h) for the
// next leader: what one tick (a second) recorded for a job is one note, "job-events/<job>/
// <seq of its first>", an array of events (and at once, with any write of the job's own
// row: an operator's change to a job also keeps its events up to it); a job with more
// than kMaxNotes of them has them written again as one. The numbers go on across leaders (a
// `--follow` keeps its place).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controlplane/store/notes.h"

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
  // The events of jobs `keep` says no to go, their notes with them (jobs that are gone:
  // their events stay until the jobs kept outnumber the live ones by far).
  template <class Keep>
  void keep_only(Keep keep, Notes& notes) {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (keep(it->first)) {
        ++it;
        continue;
      }
      forget_notes(it->first, notes);
      it = jobs_.erase(it);
    }
  }
  size_t jobs() const { return jobs_.size(); }

  // The notes for what was recorded since the last save, of the `max_jobs` jobs that
  // waited longest (a control plane creating a thousand jobs writes them over a few
  // ticks, not in one burst that holds its loop).
  static constexpr size_t kSaveJobs = 200;
  void save(Notes& notes, size_t max_jobs = kSaveJobs);
  // Now, for these jobs (those an operator's change writes: its answer says their events
  // up to it are kept).
  void save_jobs(const std::set<std::string>& jobs, Notes& notes);
  static constexpr const char* kNotePrefix = "job-events/";
  static constexpr size_t kMaxNotes = 16;  // a job's, before they are written as one
  // The events the notes under kNotePrefix hold (a new leader's, before any record()):
  // the last kPerJob of each job, numbered as they were. A note that is not an array of
  // events is left out, with a warning, and erased through `out`.
  void restore(const std::map<std::string, nlohmann::json>& notes, Notes& out);

  // The latest `n` events of every job, newest first, each with its "job".
  nlohmann::json latest(size_t n) const;
  static nlohmann::json to_json(const Event& e);

 private:
  static std::string note_key(const std::string& job, uint64_t first_seq);
  void save_one(const std::string& job, Notes& notes);
  void forget_notes(const std::string& job, Notes& notes);
  std::map<std::string, std::deque<Event>> jobs_;
  uint64_t seq_ = 0;
  // Per job: its notes as written (the seq of the first event of each, how many), and
  // how many of its newest events no note holds yet.
  struct Saved {
    std::deque<std::pair<uint64_t, size_t>> notes;
    size_t unsaved = 0;
  };
  std::map<std::string, Saved> saved_;
  std::deque<std::string> dirty_;  // jobs with unsaved events, the longest waiting first
};

}  // namespace weft::cp
