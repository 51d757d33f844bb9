// SPDX-License-Identifier: GPL-2.0
// TCP retransmissions, in every network namespace (the /proc/net/snmp fallback sees only
// weft-hcs's own). A per-CPU counter: no locking, no events, read once per probe cycle.
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} tcp_retrans SEC(".maps");

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(weft_tcp_retransmit, const struct sock* sk, const struct sk_buff* skb) {
  __u32 zero = 0;
  __u64* v = bpf_map_lookup_elem(&tcp_retrans, &zero);
  if (v) *v += 1;
  return 0;
}
