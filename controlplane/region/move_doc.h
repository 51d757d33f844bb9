// An entitlement on its way from one shard of a region to another (docs/regions.md,
// "Moving an entitlement"): everything the shard it goes to needs to carry on exactly
// where the other stopped — the entitlement, its machines (with the holder epoch each
// is handed over at), its jobs with their placements, ports and TaskControl state, and
// its tasks with their states and readiness — named by machine name, not by either
// shard's ids. The old shard writes it when it fences the entitlement; the new one reads
// it as hostile input (it crossed the network through a front end): parse_move_doc is
// strict, names the field it refuses, and is fuzzed (fuzz/fuzz_move_doc.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "controlplane/entitlements/profile_rolls.h"
#include "controlplane/machines/broker.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

struct MoveDoc {
  EntitlementSpec entitlement;
  struct Machine {
    Broker::Persisted state;  // info.id is the machine's name
    uint64_t epoch = 0;       // its holder epoch at the old shard (0: not lent)
    // HCS's last verdict at the old shard: the new one can place on the machine before
    // HCS is heard again there (issue 59: it waited for HCS's next keepalive).
    std::string verdict = "unknown";
  };
  std::vector<Machine> machines;
  struct Job {
    Scheduler::MovedJob job;  // spec.entitlement_id is the old shard's (remapped)
    std::optional<Request> request;
    std::vector<std::string> placement;  // machine names by task index
    std::vector<std::vector<uint16_t>> dynamic_ports;
  };
  std::vector<Job> jobs;
  struct Task {
    TaskRecord record;    // machine and entitlement unset: the new shard's ids
    std::string machine;  // its machine's name
    uint64_t age_us = 0;  // how long it has been in its state
  };
  std::vector<Task> tasks;
  // A host profile roll under way over its machines (every name one of `machines`).
  std::optional<ProfileRolls::Moved> profile_roll;
  uint64_t task_seq = 0;  // the old shard's task id sequence: the new one goes past it
};

nlohmann::json move_doc_to_json(const MoveDoc& d);
// Every name refers to something in the document: a task's job and machine, a job's
// placement machines, the entitlement of each job. Errors name the field
// ("jobs[2].placement[5]", ...).
Result<MoveDoc> parse_move_doc(const nlohmann::json& j);

}  // namespace weft::cp
