#include "hcs/kmsg.h"

#include <cstdlib>

namespace weft::hcs {

namespace {

bool has(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace

const char* event_name(KernelEvent e) {
  switch (e) {
    case KernelEvent::kNone:
      return "none";
    case KernelEvent::kOomKillMemcg:
      return "oom-kill-memcg";
    case KernelEvent::kOomKillGlobal:
      return "oom-kill-global";
    case KernelEvent::kHungTask:
      return "hung-task";
    case KernelEvent::kIoError:
      return "io-error";
    case KernelEvent::kFsError:
      return "fs-error";
    case KernelEvent::kMachineCheck:
      return "machine-check";
    case KernelEvent::kOops:
      return "oops";
  }
  return "none";
}

bool event_latches(KernelEvent e) {
  return e == KernelEvent::kMachineCheck;
}

std::optional<KmsgRecord> parse_kmsg_record(const std::string& raw) {
  auto semi = raw.find(';');
  if (semi == std::string::npos) return std::nullopt;
  std::string head = raw.substr(0, semi);
  KmsgRecord r;
  char* end = nullptr;
  long prio = std::strtol(head.c_str(), &end, 10);
  if (end == head.c_str() || *end != ',') return std::nullopt;
  r.priority = static_cast<int>(prio & 7);
  const char* p = end + 1;
  r.seq = std::strtoull(p, &end, 10);
  if (*end != ',') return std::nullopt;
  p = end + 1;
  r.ts_us = std::strtoull(p, &end, 10);
  if (*end != ',' && *end != ';' && *end != '\0') return std::nullopt;
  std::string msg = raw.substr(semi + 1);
  auto nl = msg.find('\n');  // continuation lines (" SUBSYSTEM=...") are not needed
  if (nl != std::string::npos) msg.resize(nl);
  r.message = msg;
  return r;
}

KernelEvent KmsgClassifier::classify(const KmsgRecord& r) {
  const std::string& m = r.message;
  // OOM: 5.x+ prints "oom-kill:constraint=CONSTRAINT_MEMCG,..." before the kill line;
  // older kernels print "Memory cgroup out of memory: Killed process" for memcg kills.
  if (m.rfind("oom-kill:constraint=", 0) == 0) {
    pending_oom_memcg_ = has(m, "CONSTRAINT_MEMCG");
    return KernelEvent::kNone;
  }
  if (has(m, "Memory cgroup out of memory: Kill")) {
    pending_oom_memcg_.reset();
    return KernelEvent::kOomKillMemcg;
  }
  if (has(m, "Out of memory: Kill")) {
    bool memcg = pending_oom_memcg_.value_or(false);
    pending_oom_memcg_.reset();
    return memcg ? KernelEvent::kOomKillMemcg : KernelEvent::kOomKillGlobal;
  }
  if (has(m, "mce: [Hardware Error]") || has(m, "Machine check events logged") ||
      has(m, "[Hardware Error]: ") || (has(m, "EDAC ") && has(m, " UE ")))
    return KernelEvent::kMachineCheck;
  if (has(m, "INFO: task ") && has(m, "blocked for more than")) return KernelEvent::kHungTask;
  if (has(m, "EXT4-fs error") ||
      (has(m, "EXT4-fs (") && has(m, "Remounting filesystem read-only")) ||
      (has(m, "XFS (") && (has(m, "Corruption") || has(m, "metadata I/O error") ||
                           has(m, "Filesystem has been shut down"))) ||
      has(m, "BTRFS error") || has(m, "BTRFS critical"))
    return KernelEvent::kFsError;
  if (has(m, "I/O error, dev ") || has(m, "Buffer I/O error on dev") ||
      has(m, "blk_update_request: I/O error") || has(m, "critical medium error, dev ") ||
      (has(m, "nvme") && has(m, "I/O Cmd") && has(m, "timeout")))
    return KernelEvent::kIoError;
  if (m.rfind("BUG: ", 0) == 0 || m.rfind("Oops: ", 0) == 0 || has(m, "kernel BUG at ") ||
      has(m, "general protection fault") || has(m, "watchdog: BUG: soft lockup") ||
      has(m, "Watchdog detected hard LOCKUP") || has(m, "Kernel panic - not syncing"))
    return KernelEvent::kOops;
  return KernelEvent::kNone;
}

}  // namespace weft::hcs
