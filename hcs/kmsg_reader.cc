#include "hcs/kmsg_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/clock.h"
#include "common/log.h"
#include "common/paths.h"

namespace weft::hcs {

Result<std::unique_ptr<KmsgReader>> KmsgReader::open(EventLoop& loop, Db& db,
                                                     const std::string& host_root, KmsgProbe& probe,
                                                     OomProbe* oom, Fresh fresh) {
  std::unique_ptr<KmsgReader> r(new KmsgReader(db, probe, oom, std::move(fresh)));
  TRY_ASSIGN(Stmt m, db.prepare("SELECT value FROM meta WHERE key = 'kmsg_seq'"));
  TRY_ASSIGN(bool row, m.step());
  if (row) r->last_seq_ = std::strtoull(m.col_text(0).c_str(), nullptr, 10);
  std::string path = HostPaths(host_root).root() == "/" ? "/dev/kmsg" : host_root + "/dev/kmsg";
  r->fd_ = Fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!r->fd_.valid()) {
    log_warn("cannot read the kernel log; the kernel-log probe stays unknown",
             {{"ERROR", sys_error("open /dev/kmsg").str()}});
    return r;
  }
  KmsgReader* self = r.get();
  TRY_ASSIGN(r->src_, loop.add_io(r->fd_.get(), EPOLLIN, [self](uint32_t) { self->read(); }));
  return r;
}

void KmsgReader::read() {
  char buf[8192];
  uint64_t now = now_realtime_us();
  bool fresh = false;
  for (;;) {
    ssize_t n = ::read(fd_.get(), buf, sizeof buf - 1);
    if (n < 0) {
      if (errno == EPIPE) continue;  // records were overwritten before we read them
      break;                         // EAGAIN: caught up
    }
    auto rec = parse_kmsg_record(std::string(buf, static_cast<size_t>(n)));
    if (!rec || rec->seq <= last_seq_) continue;  // seen before a restart
    last_seq_ = rec->seq;
    uint64_t mono = now_monotonic_us();
    uint64_t age = mono > rec->ts_us ? mono - rec->ts_us : 0;
    uint64_t at = now > age ? now - age : 0;
    KernelEvent e = probe_.observe(*rec, at);
    if (oom_) oom_->observe_kmsg(e, at);
    if (e != KernelEvent::kNone && age < 60'000'000) fresh = true;
  }
  if (fresh) fresh_(now);
  if (auto st = db_.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES ('kmsg_seq', ?1)");
      st.ok()) {
    st->bind(1, std::to_string(last_seq_));
    (void)st->run();
  }
}

}  // namespace weft::hcs
