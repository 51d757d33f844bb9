// A task as the agent holds it: its durable record (agent/task_store.h) and what only
// this process holds (its pidfd and watchers, its checks' state, its pull), and what one
// incarnation's start decided before anything was made.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/cgroup.h"
#include "agent/identity.h"
#include "agent/image/service.h"
#include "agent/readiness.h"
#include "agent/start_plan.h"
#include "agent/task_store.h"
#include "common/event.h"
#include "common/fs.h"

namespace weft::agent {

// A task: its durable record (agent/task_store.h) and what only this process holds.
struct Task : TaskRecord {
  Fd pidfd;
  Source watch;
  Source timer;
  bool is_child = false;
  bool kill_sent = false;  // this agent wrote cgroup.kill for the current incarnation
  // It failed before its program ran (setup or exec): told to the control plane, which
  // holds an index that fails so again and again. Not stored.
  bool setup_failed = false;
  // Who its current incarnation runs as (its image's user included); readiness exec
  // checks run as the same. Not stored: recomputed when a restarted agent needs it.
  std::optional<Identity> identity;
  // Readiness (agent/readiness.h): reported "ready" while running and available. Not
  // stored: a restarted agent checks again before it says ready.
  bool ready = false;
  uint64_t check_passes = 0, check_failures = 0;  // in a row
  std::string check_detail;                       // why the last check failed
  Source check_timer;
  std::unique_ptr<CheckRun> check;
  // Liveness (docs/jobs.md): its check's state, and why this agent killed the current
  // incarnation when it did (said in the task's reason). Not stored.
  Probe live;
  std::string killed_for;
  // An image or package task: its pull while fetching, and the image and package once
  // local (held in the cache while the task may run).
  uint64_t fetch_ticket = 0;
  image::PullProgress fetch;
  std::optional<image::LocalImage> image;
  std::optional<image::LocalImage> package;
  // When this agent began the current incarnation's start (before its cgroup) and saw it end
  // (reaped, its cgroup empty), on the host's monotonic clock, which every agent of one
  // host shares: what a history of starts and stops is checked on. Not stored.
  uint64_t started_mono_us = 0, finished_mono_us = 0;
  // Where the last start's time went (phase, microseconds), for task.run's reply.
  std::vector<std::pair<const char*, uint64_t>> start_phases;
};

// What one incarnation's start decided before anything was made (Manager::plan_incarnation).
struct IncarnationPlan {
  LimitPlan limits;      // the cgroup's writes
  StartPlan start;       // the spec under its image, its root, its bind mounts' sources
  Identity identity;     // who its main process runs as
  bool bridged = false;  // its network namespace is made here and plugged into the bridge
};

}  // namespace weft::agent
