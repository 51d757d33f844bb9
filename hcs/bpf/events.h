/* Shared between the BPF programs (C, vmlinux.h types) and weft-hcs (C++). */
#ifndef WEFT_HCS_BPF_EVENTS_H
#define WEFT_HCS_BPF_EVENTS_H

#define WEFT_OOM_COMM_LEN 16
#define WEFT_OOM_CGROUP_LEN 64
#define WEFT_DROP_REASONS 256 /* reasons above are counted in the last slot */

/* One OOM kill, sent through the ring buffer. */
struct weft_oom_event {
  unsigned long long ts_ns;     /* bpf_ktime_get_ns() */
  unsigned long long cgroup_id; /* the victim's memory cgroup (kernfs id) */
  unsigned int pid;
  unsigned int memcg; /* 1: a memory cgroup was at its limit; 0: machine-wide OOM */
  char comm[WEFT_OOM_COMM_LEN];
  char cgroup[WEFT_OOM_CGROUP_LEN]; /* the memory cgroup's directory name */
};

/* Per-CPU counters of oom.bpf.c. */
enum weft_oom_counter {
  WEFT_OOM_MEMCG = 0,
  WEFT_OOM_GLOBAL = 1,
  WEFT_OOM_RINGBUF_FULL = 2,
  WEFT_OOM_NCOUNTERS = 3,
};

#endif
