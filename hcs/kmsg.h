// Kernel log records (/dev/kmsg) parsed into typed health events.
//
// A /dev/kmsg record is "PRIO,SEQ,TIMESTAMP_US,FLAGS[,...];MESSAGE" followed by optional
// continuation lines " KEY=VALUE". parse_kmsg_record() splits it; classify() turns the
// message into an event type by matching the phrases kernels have printed for years
// (tested against messages from several kernel versions in kmsg_test.cc). Pure
// functions, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace weft::hcs {

struct KmsgRecord {
  int priority = 6;  // syslog level (facility stripped)
  uint64_t seq = 0;
  uint64_t ts_us = 0;  // since boot
  std::string message;
};

enum class KernelEvent {
  kNone,
  kOomKillMemcg,   // a cgroup hit its own memory limit: the task's business, not the machine's
  kOomKillGlobal,  // the machine ran out of memory
  kHungTask,
  kIoError,
  kFsError,       // ext4/xfs/btrfs errors, read-only remounts after errors
  kMachineCheck,  // MCE and other hardware errors: fatal, latched
  kOops,          // oops, BUG, general protection fault, soft/hard lockup
};

const char* event_name(KernelEvent e);
// Fatal hardware faults stay latched until an operator clears them; everything else
// counts in sliding windows.
bool event_latches(KernelEvent e);

std::optional<KmsgRecord> parse_kmsg_record(const std::string& raw);

// The classifier sees records one at a time; an OOM kill's constraint line arrives
// before the "Killed process" line, so it keeps that much state.
class KmsgClassifier {
 public:
  KernelEvent classify(const KmsgRecord& r);

 private:
  std::optional<bool> pending_oom_memcg_;  // from the last "oom-kill:constraint=..." line
};

}  // namespace weft::hcs
