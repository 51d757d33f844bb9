#include "hcs/probes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "common/fs.h"

namespace weft::hcs {

using json = nlohmann::json;

namespace {

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", v);
  return b;
}

class PsiProbe : public Probe {
 public:
  PsiProbe(HostPaths host, std::string res, double deg, double fail)
      : host_(std::move(host)), res_(std::move(res)), deg_(deg), fail_(fail) {}
  std::string name() const override { return "psi-" + res_; }
  Sample run(uint64_t) override {
    Sample s;
    auto text = read_file(host_.proc("pressure/" + res_));
    if (!text.ok()) {
      s.detail = "no PSI: " + text.error().str();
      return s;  // UNKNOWN, never OK
    }
    double some = -1, full = -1;
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
    s.metrics = {{"some_avg10", some}, {"full_avg10", full}};
    double severe = res_ == "cpu" || full < 0 ? some : full;
    if (severe >= fail_) {
      s.health = Health::kFailed;
      s.detail = res_ + " pressure " + pct(severe) + " over 10 s";
    } else if (some >= deg_) {
      s.health = Health::kDegraded;
      s.detail = res_ + " pressure " + pct(some) + " over 10 s";
    } else {
      s.health = Health::kOk;
    }
    return s;
  }

 private:
  HostPaths host_;
  std::string res_;
  double deg_, fail_;
};

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
        for (const auto& o : split(f[5], ','))
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

class LinkProbe : public Probe {
 public:
  LinkProbe(HostPaths host, std::string ifname, int flap_limit, uint64_t window)
      : host_(std::move(host)), if_(std::move(ifname)), flap_limit_(flap_limit), window_(window) {}
  std::string name() const override { return "link:" + if_; }
  Sample run(uint64_t now_us) override {
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

 private:
  void note(bool up, uint64_t now_us) {
    if (last_ && *last_ != up) changes_.push_back(now_us);
    last_ = up;
    while (!changes_.empty() && now_us - changes_.front() > window_) changes_.pop_front();
  }
  HostPaths host_;
  std::string if_;
  int flap_limit_;
  uint64_t window_;
  std::optional<bool> last_;
  std::deque<uint64_t> changes_;
};

class ExecProbe : public Probe {
 public:
  ExecProbe(std::string name, std::vector<std::string> argv, uint64_t timeout)
      : name_(std::move(name)), argv_(std::move(argv)), timeout_(timeout) {}
  std::string name() const override { return "exec:" + name_; }
  Sample run(uint64_t) override {
    Sample s;
    int out[2];
    if (argv_.empty() || ::pipe2(out, O_CLOEXEC) < 0) {
      s.detail = "cannot run";
      return s;
    }
    std::vector<char*> a;
    for (auto& x : argv_) a.push_back(x.data());
    a.push_back(nullptr);
    pid_t p = ::fork();
    if (p == 0) {
      ::dup2(out[1], 1);
      int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 2);
      ::setpgid(0, 0);
      ::execvp(a[0], a.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string output;
    uint64_t deadline = now_monotonic_us() + timeout_;
    int status = 0;
    bool done = false, timed_out = false;
    while (!done) {
      uint64_t now = now_monotonic_us();
      if (now >= deadline) {
        timed_out = true;
        ::kill(-p, SIGKILL);
        ::waitpid(p, &status, 0);
        break;
      }
      pollfd pf{out[0], POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>((deadline - now) / 1000) + 1) > 0) {
        char buf[4096];
        ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n > 0 && output.size() < 65536) output.append(buf, static_cast<size_t>(n));
        if (n == 0) {
          ::waitpid(p, &status, 0);
          done = true;
        }
      }
    }
    ::close(out[0]);
    std::string first = output.substr(0, output.find('\n'));
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

 private:
  std::string name_;
  std::vector<std::string> argv_;
  uint64_t timeout_;
};

}  // namespace

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

void KmsgProbe::observe(const KmsgRecord& r, uint64_t now_us) {
  KernelEvent e = classifier_.classify(r);
  if (e == KernelEvent::kNone) return;
  if (event_latches(e)) latched_ = r.message;
  events_.emplace_back(now_us, e);
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
