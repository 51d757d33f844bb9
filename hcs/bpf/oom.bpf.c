// SPDX-License-Identifier: GPL-2.0
// OOM kills, told apart: a memory cgroup at its own limit (the task's business) or the
// whole machine out of memory (the machine's). Attached to the oom:mark_victim
// tracepoint as a BTF-typed raw tracepoint, so it costs nothing until a kill happens.
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"

char LICENSE[] SEC("license") = "GPL";

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 256 * 1024);
} oom_events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, WEFT_OOM_NCOUNTERS);
  __type(key, __u32);
  __type(value, __u64);
} oom_counters SEC(".maps");

static __always_inline void bump(__u32 which) {
  __u64* v = bpf_map_lookup_elem(&oom_counters, &which);
  if (v) *v += 1;
}

// Per memory cgroup: how many of its MEMCG_OOM events have been matched to a kill.
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);   // struct mem_cgroup address
  __type(value, __u64); // OOM events already matched
} oom_matched SEC(".maps");

// A memory-cgroup OOM raises the cgroup's MEMCG_OOM event (memory.events "oom") before
// its kill, so a kill whose memcg (or an ancestor) has an unmatched OOM event is a memcg
// kill; a machine-wide OOM raises none. Events can outnumber kills (an OOM that found
// memory after all), so a match consumes one event and unmatched ones are capped.
static __always_inline int memcg_oom_event(struct mem_cgroup* memcg) {
  int oom_ev = bpf_core_enum_value(enum memcg_memory_event, MEMCG_OOM);
  for (int depth = 0; depth < 8 && memcg; depth++) {
    __u64 key = (__u64)memcg;
    __u64 events = BPF_CORE_READ(memcg, memory_events[oom_ev].counter);
    __u64* matched = bpf_map_lookup_elem(&oom_matched, &key);
    __u64 m = matched ? *matched : 0;
    if (events > m + 64) m = events - 64;  // events long before are not credit
    if (events > m) {
      m += 1;
      bpf_map_update_elem(&oom_matched, &key, &m, BPF_ANY);
      return 1;
    }
    struct cgroup_subsys_state* parent = BPF_CORE_READ(memcg, css.parent);
    memcg = (struct mem_cgroup*)parent;  // css is the first member of struct mem_cgroup
  }
  return 0;
}

// Kernels without memory_events: a memcg OOM happens when a charge would take a page
// counter over its max, so one of the victim's counters sits at (or within a huge page
// of) its limit. Unlimited counters have max at PAGE_COUNTER_MAX (LONG_MAX / PAGE_SIZE).
static __always_inline int memcg_at_limit(struct mem_cgroup* memcg) {
  struct page_counter* pc = &memcg->memory;
  const unsigned long unlimited = 0x7fffffffffffffffUL / 4096;
  for (int depth = 0; depth < 8 && pc; depth++) {
    unsigned long max = BPF_CORE_READ(pc, max);
    long usage = BPF_CORE_READ(pc, usage.counter);
    if (max < unlimited && usage >= 0 && (unsigned long)usage + 512 >= max) return 1;
    pc = BPF_CORE_READ(pc, parent);
  }
  return 0;
}

SEC("tp_btf/mark_victim")
int BPF_PROG(weft_mark_victim, struct task_struct* task) {
  int memcg_id = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
  struct cgroup_subsys_state* css = BPF_CORE_READ(task, cgroups, subsys[memcg_id]);
  // css is the first member of struct mem_cgroup.
  struct mem_cgroup* memcg = (struct mem_cgroup*)css;
  int is_memcg = 0;
  if (memcg)
    is_memcg = bpf_core_field_exists(memcg->memory_events) ? memcg_oom_event(memcg)
                                                           : memcg_at_limit(memcg);
  bump(is_memcg ? WEFT_OOM_MEMCG : WEFT_OOM_GLOBAL);

  struct weft_oom_event* e = bpf_ringbuf_reserve(&oom_events, sizeof(*e), 0);
  if (!e) {
    bump(WEFT_OOM_RINGBUF_FULL);
    return 0;
  }
  e->ts_ns = bpf_ktime_get_ns();
  e->pid = BPF_CORE_READ(task, tgid);
  e->memcg = is_memcg;
  BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
  e->cgroup_id = 0;
  e->cgroup[0] = 0;
  if (css) {
    struct kernfs_node* kn = BPF_CORE_READ(css, cgroup, kn);
    if (kn) {
      e->cgroup_id = BPF_CORE_READ(kn, id);
      const char* name = BPF_CORE_READ(kn, name);
      bpf_probe_read_kernel_str(e->cgroup, sizeof(e->cgroup), name);
    }
  }
  bpf_ringbuf_submit(e, 0);
  return 0;
}
