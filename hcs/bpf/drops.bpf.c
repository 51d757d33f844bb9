// SPDX-License-Identifier: GPL-2.0
// Packets the kernel dropped, counted by drop reason (enum skb_drop_reason, kernels
// 5.17+), in every network namespace. weft-hcs names the reasons from the kernel's BTF.
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"

char LICENSE[] SEC("license") = "GPL";

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, WEFT_DROP_REASONS);
  __type(key, __u32);
  __type(value, __u64);
} drop_reasons SEC(".maps");

SEC("tp_btf/kfree_skb")
int BPF_PROG(weft_kfree_skb, struct sk_buff* skb, void* location, int reason) {
  // Newer kernels put a subsystem in the upper 16 bits; the core reasons are below.
  __u32 r = (__u32)reason & 0xffff;
  if (r >= WEFT_DROP_REASONS) r = WEFT_DROP_REASONS - 1;
  __u64* v = bpf_map_lookup_elem(&drop_reasons, &r);
  if (v) *v += 1;
  return 0;
}
