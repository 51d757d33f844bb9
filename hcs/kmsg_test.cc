// The kernel-log classifier against real messages from several kernel versions.
#include "hcs/kmsg.h"

#include <gtest/gtest.h>

namespace weft::hcs {
namespace {

KernelEvent classify_all(std::initializer_list<const char*> lines) {
  KmsgClassifier c;
  KernelEvent last = KernelEvent::kNone;
  for (const char* l : lines) {
    auto r = parse_kmsg_record(l);
    EXPECT_TRUE(r) << l;
    if (!r) continue;
    KernelEvent e = c.classify(*r);
    if (e != KernelEvent::kNone) last = e;
  }
  return last;
}

TEST(Kmsg, ParsesRecords) {
  auto r = parse_kmsg_record(
      "3,1234,5678901,-;EXT4-fs error (device sda1): ext4_lookup:1839: inode #2\n SUBSYSTEM=block");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->priority, 3);
  EXPECT_EQ(r->seq, 1234u);
  EXPECT_EQ(r->ts_us, 5678901u);
  EXPECT_EQ(r->message, "EXT4-fs error (device sda1): ext4_lookup:1839: inode #2");
  auto fac = parse_kmsg_record("30,9,100,c,caller=T1;hello");  // facility 3, level 6, extra fields
  ASSERT_TRUE(fac);
  EXPECT_EQ(fac->priority, 6);
  EXPECT_FALSE(parse_kmsg_record("no separator"));
  EXPECT_FALSE(parse_kmsg_record("x,1,2,-;msg"));
}

TEST(Kmsg, OomKillsMemcgVersusGlobal) {
  // 5.x/6.x: a memory cgroup hitting memory.max.
  EXPECT_EQ(
      classify_all(
          {"6,10,1,-;dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
           "6,11,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
           "oom_memcg=/system.slice/weft-tasks.service/tasks/ab12,task_memcg=/system.slice/"
           "weft-tasks.service/tasks/ab12,task=dd,pid=812,uid=0",
           "3,12,3,-;Memory cgroup out of memory: Killed process 812 (dd) total-vm:266500kB, "
           "anon-rss:64000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:300kB oom_score_adj:0"}),
      KernelEvent::kOomKillMemcg);
  // 6.x: the whole machine out of memory.
  EXPECT_EQ(
      classify_all(
          {"6,20,1,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
           "global_oom,task_memcg=/user.slice,task=stress,pid=900,uid=1000",
           "3,21,2,-;Out of memory: Killed process 900 (stress) total-vm:9000000kB, "
           "anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:16000kB "
           "oom_score_adj:0"}),
      KernelEvent::kOomKillGlobal);
  // 4.x: no constraint line, "Kill process" wording.
  EXPECT_EQ(classify_all(
                {"3,30,1,-;Out of memory: Kill process 1234 (java) score 900 or sacrifice child"}),
            KernelEvent::kOomKillGlobal);
  EXPECT_EQ(classify_all({"3,31,1,-;Memory cgroup out of memory: Kill process 4321 (python) score "
                          "1000 or sacrifice child"}),
            KernelEvent::kOomKillMemcg);
}

TEST(Kmsg, OtherEvents) {
  EXPECT_EQ(classify_all({"3,1,1,-;INFO: task jbd2/sda1-8:312 blocked for more than 120 seconds."}),
            KernelEvent::kHungTask);
  EXPECT_EQ(
      classify_all(
          {"3,1,1,-;blk_update_request: I/O error, dev sdb, sector 2048 op 0x0:(READ) flags 0x0"}),
      KernelEvent::kIoError);  // 4.x/5.x
  EXPECT_EQ(classify_all({"3,1,1,-;I/O error, dev sdb, sector 2048 op 0x1:(WRITE) flags 0x800 "
                          "phys_seg 1 prio class 0"}),
            KernelEvent::kIoError);  // 5.15+/6.x
  EXPECT_EQ(
      classify_all({"3,1,1,-;Buffer I/O error on dev sdb1, logical block 0, async page read"}),
      KernelEvent::kIoError);
  EXPECT_EQ(classify_all({"2,1,1,-;EXT4-fs error (device nvme0n1p2): ext4_find_entry:1455: inode "
                          "#2: comm ls: reading directory lblock 0"}),
            KernelEvent::kFsError);
  EXPECT_EQ(classify_all({"2,1,1,-;EXT4-fs (sda1): Remounting filesystem read-only"}),
            KernelEvent::kFsError);
  EXPECT_EQ(classify_all({"1,1,1,-;XFS (dm-0): Corruption detected. Unmount and run xfs_repair"}),
            KernelEvent::kFsError);
  EXPECT_EQ(classify_all({"2,1,1,-;XFS (sdc): metadata I/O error in \"xfs_imap_to_bp+0x5c/0xa0\" "
                          "at daddr 0x40 len 32 error 5"}),
            KernelEvent::kFsError);
  EXPECT_EQ(classify_all({"2,1,1,-;mce: [Hardware Error]: Machine check events logged"}),
            KernelEvent::kMachineCheck);
  EXPECT_EQ(classify_all({"0,1,1,-;mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank "
                          "4: be00000000800400"}),
            KernelEvent::kMachineCheck);
  EXPECT_EQ(
      classify_all({"4,1,1,-;BUG: kernel NULL pointer dereference, address: 0000000000000008"}),
      KernelEvent::kOops);
  EXPECT_EQ(classify_all({"4,1,1,-;Oops: 0000 [#1] PREEMPT SMP NOPTI"}), KernelEvent::kOops);
  EXPECT_EQ(classify_all(
                {"0,1,1,-;watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [kworker/1:2:4711]"}),
            KernelEvent::kOops);
  EXPECT_EQ(classify_all({"4,1,1,-;general protection fault, probably for non-canonical address "
                          "0xdead000000000100: 0000 [#1] SMP"}),
            KernelEvent::kOops);
  // Ordinary chatter is not an event.
  EXPECT_EQ(
      classify_all(
          {"6,1,1,-;e1000e 0000:00:1f.6 eth0: NIC Link is Up 1000 Mbps Full Duplex",
           "6,2,1,-;\"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.",
           "5,3,1,-;EXT4-fs (sda1): mounted filesystem with ordered data mode. Quota mode: none."}),
      KernelEvent::kNone);
  EXPECT_TRUE(event_latches(KernelEvent::kMachineCheck));
  EXPECT_FALSE(event_latches(KernelEvent::kOomKillGlobal));
}

}  // namespace
}  // namespace weft::hcs
