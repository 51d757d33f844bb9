#include "hcs/probes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <cstdio>
#include <optional>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/client.h"
#include "common/strings.h"

namespace weft::hcs {

using json = nlohmann::json;

namespace {

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", v);
  return b;
}

class DiskProbe : public Probe {
 public:
  DiskProbe(HostPaths host, std::string mp, double free, double inodes, StatFs statfs)
      : host_(std::move(host)),
        mp_(std::move(mp)),
        free_(free),
        inodes_(inodes),
        statfs_(statfs ? statfs : [](const std::string& p, struct statvfs* o) {
          return ::statvfs(p.c_str(), o);
        }) {}
  std::string name() const override { return "disk:" + mp_; }
  Sample run(uint64_t) override {
    Sample s;
    auto info = read_file(host_.proc("self/mountinfo"));
    bool found = false, ro = false;
    if (info.ok()) {
      for (const auto& line : split(*info, '\n')) {
        auto f = split(line, ' ');
        if (f.size() < 6 || f[4] != mp_) continue;
        found = true;  // the last entry for a mount point is the one on top
        ro = false;
        // The filesystem's own (superblock) options, after the " - " separator: what a
        // remount-ro after errors changes. The per-mount options (field 6) are also "ro"
        // inside a sandbox such as ProtectSystem=strict, which says nothing about the
        // machine.
        auto sep = std::find(f.begin() + 6, f.end(), "-");
        if (sep == f.end() || sep + 3 >= f.end()) continue;
        for (const auto& o : split(*(sep + 3), ','))
          if (o == "ro") ro = true;
      }
    }
    if (!found) {
      s.detail = mp_ + " is not mounted";
      s.health = Health::kFailed;
      return s;
    }
    struct statvfs st {};
    if (statfs_(mp_, &st) != 0 || st.f_blocks == 0) {
      s.detail = "statvfs " + mp_ + " failed";
      return s;
    }
    double free_pct = 100.0 * static_cast<double>(st.f_bavail) / static_cast<double>(st.f_blocks);
    double inode_pct =
        st.f_files ? 100.0 * static_cast<double>(st.f_favail) / static_cast<double>(st.f_files)
                   : 100.0;
    s.metrics = {{"free_pct", free_pct}, {"inodes_free_pct", inode_pct}, {"read_only", ro}};
    if (ro) {
      s.health = Health::kFailed;
      s.detail = mp_ + " is mounted read-only";
    } else if (free_pct < free_ || inode_pct < inodes_) {
      s.health =
          free_pct < free_ / 2 || inode_pct < inodes_ / 2 ? Health::kFailed : Health::kDegraded;
      s.detail = mp_ + ": " + pct(free_pct) + " space and " + pct(inode_pct) + " inodes free";
    } else {
      s.health = Health::kOk;
    }
    return s;
  }

 private:
  HostPaths host_;
  std::string mp_;
  double free_, inodes_;
  StatFs statfs_;
};

class ExecProbe : public Probe {
 public:
  ExecProbe(std::string name, std::vector<std::string> argv, uint64_t timeout)
      : name_(std::move(name)), argv_(std::move(argv)), timeout_(timeout) {}
  ~ExecProbe() override { abandon(); }
  std::string name() const override { return "exec:" + name_; }

  // Synchronous (tests, tools): spawn, wait with poll, judge.
  Sample run(uint64_t) override {
    if (!spawn()) return cannot_run();
    uint64_t deadline = now_monotonic_us() + timeout_;
    int status = 0;
    bool timed_out = false;
    for (;;) {
      uint64_t now = now_monotonic_us();
      if (now >= deadline) {
        timed_out = true;
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      pollfd pf{out_.get(), POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>((deadline - now) / 1000) + 1) > 0 && !read_some()) {
        ::waitpid(pid_, &status, 0);
        break;
      }
    }
    return finish(status, timed_out);
  }

  // On the event loop: the script runs while other probes and the API go on. Its output
  // is read as it comes, its exit seen through a pidfd, its timeout a timer.
  void start(EventLoop& loop, uint64_t now_us, std::function<void(Sample)> done) override {
    if (pid_ > 0) return;  // the previous run is still going; it will report
    if (!spawn()) {
      done(cannot_run());
      return;
    }
    done_ = std::move(done);
    (void)now_us;
    pidfd_ = Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    auto out = loop.add_io(out_.get(), EPOLLIN, [this](uint32_t) {
      if (!read_some()) out_src_.reset();  // EOF: the exit comes through the pidfd
    });
    auto exit = pidfd_.valid()
                    ? loop.add_io(pidfd_.get(), EPOLLIN, [this](uint32_t) { reap(false); })
                    : Result<Source>(make_error("pidfd_open"));
    auto timer = loop.add_timer_in(timeout_, [this] {
      ::kill(-pid_, SIGKILL);
      reap(true);
    });
    if (!out.ok() || !exit.ok() || !timer.ok()) {
      ::kill(-pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
      auto d = std::move(done_);
      d(cannot_run());
      return;
    }
    out_src_ = std::move(out).value();
    exit_src_ = std::move(exit).value();
    timer_ = std::move(timer).value();
  }

 private:
  Sample cannot_run() const {
    Sample s;
    s.detail = "cannot run " + (argv_.empty() ? std::string("(no command)") : argv_[0]);
    return s;
  }
  bool spawn() {
    int fds[2];
    if (argv_.empty() || ::pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) return false;
    std::vector<char*> a;
    for (auto& x : argv_) a.push_back(x.data());
    a.push_back(nullptr);
    pid_t p = ::fork();
    if (p < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (p == 0) {
      ::dup2(fds[1], 1);
      int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 2);
      ::setpgid(0, 0);
      ::execvp(a[0], a.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = Fd(fds[0]);
    pid_ = p;
    output_.clear();
    return true;
  }
  // Reads what is there; false at EOF.
  bool read_some() {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(out_.get(), buf, sizeof buf);
      if (n > 0) {
        if (output_.size() < 65536) output_.append(buf, static_cast<size_t>(n));
        continue;
      }
      return !(n == 0);  // n < 0: EAGAIN, more later
    }
  }
  void reap(bool timed_out) {
    int status = 0;
    if (::waitpid(pid_, &status, timed_out ? 0 : WNOHANG) == 0) return;  // not yet
    read_some();
    out_src_.reset();
    exit_src_.reset();
    timer_.reset();
    Sample s = finish(status, timed_out);
    auto d = std::move(done_);
    if (d) d(s);
  }
  Sample finish(int status, bool timed_out) {
    pid_ = -1;
    out_ = Fd();
    pidfd_ = Fd();
    Sample s;
    std::string first = output_.substr(0, output_.find('\n'));
    if (timed_out) {
      s.health = Health::kFailed;
      s.detail = "timed out after " + std::to_string(timeout_ / 1000) + " ms";
      return s;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    s.metrics = {{"exit_code", code}};
    s.health = code == 0 ? Health::kOk : code == 1 ? Health::kDegraded : Health::kFailed;
    s.detail = first.empty() && code != 0 ? "exit code " + std::to_string(code) : first;
    return s;
  }
  // The daemon is going away with a script still running: kill it, leave no zombie.
  void abandon() {
    out_src_.reset();
    exit_src_.reset();
    timer_.reset();
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }

  std::string name_;
  std::vector<std::string> argv_;
  uint64_t timeout_;
  pid_t pid_ = -1;
  Fd out_, pidfd_;
  std::string output_;
  Source out_src_, exit_src_, timer_;
  std::function<void(Sample)> done_;
};

class SocketProbe : public Probe {
 public:
  SocketProbe(std::string name, std::string socket, std::string method, int timeout_ms)
      : name_(std::move(name)),
        socket_(std::move(socket)),
        method_(std::move(method)),
        timeout_ms_(timeout_ms) {}
  std::string name() const override { return "daemon:" + name_; }
  Sample run(uint64_t) override {
    Sample s;
    uint64_t t0 = now_monotonic_us();
    auto c = rpc::Client::connect(socket_);
    if (!c.ok()) {
      s.health = Health::kFailed;
      s.detail = name_ + " is not answering on " + socket_ + ": " + c.error().str();
      return s;
    }
    auto r = (*c)->call(method_, json::object(), timeout_ms_);
    double ms = static_cast<double>(now_monotonic_us() - t0) / 1000.0;
    s.metrics = {{"latency_ms", ms}, {"socket", socket_}};
    if (!r.ok()) {
      s.health = Health::kFailed;
      s.detail = name_ + " " + method_ + " failed: " + r.error().str();
    } else if (ms > timeout_ms_ / 2.0) {
      s.health = Health::kDegraded;
      s.detail =
          name_ + " answered " + method_ + " in " + std::to_string(static_cast<int>(ms)) + " ms";
    } else {
      s.health = Health::kOk;
    }
    return s;
  }

 private:
  std::string name_, socket_, method_;
  int timeout_ms_;
};

}  // namespace

Sample PsiProbe::run(uint64_t now_us) {
  Sample s;
  auto text = read_file(host_.proc("pressure/" + res_));
  if (!text.ok()) {
    s.detail = "no PSI: " + text.error().str();
    return s;  // UNKNOWN, never OK
  }
  double some = -1, full = -1;
  if (auto at = text->find("total="); at != std::string::npos && text->rfind("some", 0) == 0)
    remember_total(std::strtoull(text->c_str() + at + 6, nullptr, 10));
  for (const auto& line : split(*text, '\n')) {
    auto at = line.find("avg10=");
    if (at == std::string::npos) continue;
    double v = std::strtod(line.c_str() + at + 6, nullptr);
    if (line.rfind("some", 0) == 0) some = v;
    if (line.rfind("full", 0) == 0) full = v;
  }
  if (some < 0) {
    s.detail = "unreadable PSI";
    return s;
  }
  bool recent_trigger = last_trigger_us_ && now_us >= last_trigger_us_ &&
                        now_us - last_trigger_us_ <= 2 * kTriggerWindowUs;
  s.metrics = {{"some_avg10", some},
               {"full_avg10", full},
               {"triggers", triggers_},
               {"spurious_triggers", spurious_},
               {"trigger_armed", armed_at_ != 0}};
  double severe = res_ == "cpu" || full < 0 ? some : full;
  if (severe >= fail_) {
    s.health = Health::kFailed;
    s.detail = res_ + " pressure " + pct(severe) + " over 10 s";
  } else if (some >= deg_) {
    s.health = Health::kDegraded;
    s.detail = res_ + " pressure " + pct(some) + " over 10 s";
  } else if (recent_trigger) {
    s.health = Health::kDegraded;
    s.detail = res_ + " stalled over " + pct(deg_) + " of a 2 s window (PSI trigger)";
  } else {
    s.health = Health::kOk;
  }
  return s;
}

uint64_t PsiProbe::stall_threshold_us() const {
  return std::max<uint64_t>(
      static_cast<uint64_t>(deg_ / 100.0 * static_cast<double>(kTriggerWindowUs)), 1000);
}

std::optional<uint64_t> PsiProbe::read_some_total() {
  auto text = read_file(host_.proc("pressure/" + res_));
  if (!text.ok() || text->rfind("some", 0) != 0) return std::nullopt;
  auto at = text->find("total=");
  if (at == std::string::npos) return std::nullopt;
  return std::strtoull(text->c_str() + at + 6, nullptr, 10);
}

void PsiProbe::remember_total(uint64_t total) {
  uint64_t mono = now_monotonic_us();
  totals_.emplace_back(mono, total);
  while (totals_.size() > 1 && mono - totals_[1].first >= 2 * kTriggerWindowUs)
    totals_.pop_front();  // keep one reading at least two windows old
}

bool PsiProbe::triggered(uint64_t now_us) {
  auto total = read_some_total();
  uint64_t mono = now_monotonic_us();
  // A real trigger means at least the threshold of stall within the last window (which
  // starts no earlier than the arming). Stall time cannot outrun wall time, so since an
  // earlier reading the total must have grown by the threshold less the part of the
  // window before that reading. The reference is the newest reading at least a window
  // old, or else the oldest.
  bool real = true;
  if (total && !totals_.empty()) {
    auto ref = totals_.front();
    for (const auto& r : totals_)
      if (mono - r.first >= kTriggerWindowUs) ref = r;
    uint64_t elapsed = mono - ref.first;
    // The kernel's window starts a window ago, or at arming (no stall before counts).
    uint64_t start = std::max(mono > kTriggerWindowUs ? mono - kTriggerWindowUs : 0, armed_at_);
    uint64_t uncovered = ref.first > start ? ref.first - start : 0;
    uint64_t need = stall_threshold_us() > uncovered ? stall_threshold_us() - uncovered : 0;
    real = *total - std::min(*total, ref.second) >= need;
    log_debug("PSI trigger", {{"RESOURCE", res_},
                              {"GROWTH_US", std::to_string(*total - std::min(*total, ref.second))},
                              {"NEED_US", std::to_string(need)},
                              {"ELAPSED_US", std::to_string(elapsed)}});
  }
  if (total) remember_total(*total);
  if (!real) {
    ++spurious_;
    return false;
  }
  last_trigger_us_ = now_us;
  ++triggers_;
  return true;
}

Result<Fd> PsiProbe::arm_trigger() {
  std::string path = host_.proc("pressure/" + res_);
  Fd fd(::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return sys_error("open " + path);
  std::string trig =
      "some " + std::to_string(stall_threshold_us()) + " " + std::to_string(kTriggerWindowUs);
  // The kernel takes the trigger string with its terminating NUL.
  if (::write(fd.get(), trig.c_str(), trig.size() + 1) < 0)
    return sys_error("write a PSI trigger to " + path);
  if (auto t = read_some_total()) remember_total(*t);
  armed_at_ = now_monotonic_us();
  return fd;
}

Sample LinkProbe::run(uint64_t now_us) {
  Sample s;
  auto carrier = read_file(host_.sys("class/net/" + if_ + "/carrier"));
  if (!carrier.ok()) {
    // Reading carrier of a link that is administratively down fails with EINVAL.
    bool exists = path_exists(host_.sys("class/net/" + if_));
    s.health = exists ? Health::kFailed : Health::kUnknown;
    s.detail = exists ? if_ + " is down" : if_ + " does not exist";
    if (exists) note(false, now_us);
    return s;
  }
  bool up = trim(*carrier) == "1";
  note(up, now_us);
  s.metrics = {{"carrier", up}, {"changes_in_window", changes_.size()}};
  if (!up) {
    s.health = Health::kFailed;
    s.detail = if_ + " has no carrier";
  } else if (static_cast<int>(changes_.size()) > flap_limit_) {
    s.health = Health::kDegraded;
    s.detail = if_ + " carrier changed " + std::to_string(changes_.size()) + " times recently";
  } else {
    s.health = Health::kOk;
  }
  return s;
}

void LinkProbe::note(bool up, uint64_t now_us) {
  if (last_ && *last_ != up) changes_.push_back(now_us);
  last_ = up;
  while (!changes_.empty() && now_us - changes_.front() > window_) changes_.pop_front();
}

std::unique_ptr<Probe> make_socket_probe(std::string name, std::string socket, std::string method,
                                         int timeout_ms) {
  return std::make_unique<SocketProbe>(std::move(name), std::move(socket), std::move(method),
                                       timeout_ms);
}

std::unique_ptr<Probe> make_psi_probe(HostPaths host, std::string resource, double degraded_pct,
                                      double failed_pct) {
  return std::make_unique<PsiProbe>(std::move(host), std::move(resource), degraded_pct, failed_pct);
}

std::unique_ptr<Probe> make_disk_probe(HostPaths host, std::string mount_point, double min_free_pct,
                                       double min_inodes_pct, StatFs statfs) {
  return std::make_unique<DiskProbe>(std::move(host), std::move(mount_point), min_free_pct,
                                     min_inodes_pct, std::move(statfs));
}

std::unique_ptr<Probe> make_link_probe(HostPaths host, std::string ifname, int flap_limit,
                                       uint64_t window_us) {
  return std::make_unique<LinkProbe>(std::move(host), std::move(ifname), flap_limit, window_us);
}

std::unique_ptr<Probe> make_exec_probe(std::string name, std::vector<std::string> argv,
                                       uint64_t timeout_us) {
  return std::make_unique<ExecProbe>(std::move(name), std::move(argv), timeout_us);
}

KernelEvent KmsgProbe::observe(const KmsgRecord& r, uint64_t now_us) {
  KernelEvent e = classifier_.classify(r);
  if (e == KernelEvent::kNone) return e;
  if (event_latches(e)) latched_ = r.message;
  events_.emplace_back(now_us, e);
  while (events_.size() > 100'000) events_.pop_front();  // bounded under a log flood
  return e;
}

std::map<std::string, int> KmsgProbe::counts(uint64_t now_us) {
  while (!events_.empty() && now_us - events_.front().first > window_us_) events_.pop_front();
  std::map<std::string, int> c;
  for (const auto& [t, e] : events_) c[event_name(e)]++;
  return c;
}

Sample KmsgProbe::run(uint64_t now_us) {
  Sample s;
  auto c = counts(now_us);
  s.metrics = c;
  int io = c["io-error"] + c["fs-error"];
  if (!latched_.empty()) {
    s.health = Health::kFailed;
    s.detail = "hardware error (latched until cleared): " + latched_;
  } else if (c["oops"] > 0 || io >= io_errors_failed_) {
    s.health = Health::kFailed;
    s.detail = c["oops"] > 0 ? "kernel oops/BUG in the last window"
                             : std::to_string(io) + " I/O or filesystem errors in the last window";
  } else if (c["oom-kill-global"] > 0 || c["hung-task"] > 0 || io > 0) {
    s.health = Health::kDegraded;
    s.detail = c["oom-kill-global"] > 0 ? "machine-wide OOM kills"
               : c["hung-task"] > 0     ? "hung tasks"
                                        : "I/O errors";
  } else {
    s.health = Health::kOk;  // memcg OOM kills are the task's business: counted, not judged
  }
  return s;
}

}  // namespace weft::hcs
