#include "agent/exec_sessions.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <optional>

#include "agent/readiness.h"
#include "agent/spawn.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/rpc/protocol.h"

namespace weft::agent {

using json = nlohmann::json;

namespace {

constexpr size_t kReadChunk = 32 * 1024;

}  // namespace

// One command: its weft-init (`pidfd`), and the agent's ends of its input and output
// (a terminal: `in` and `out[0]` are the master, twice; pipes: three of them).
struct ExecSessions::Exec {
  uint64_t n = 0;
  std::string task;
  rpc::Session* session = nullptr;
  bool tty = false;
  Fd pidfd;
  Source exit_io;
  std::optional<int> status;  // weft-init's exit status once it ended
  Fd in;
  Source in_io;
  std::string pending_in;  // accepted, not yet written
  bool eof_asked = false;
  uint64_t in_written = 0, in_acked = 0;  // written to the command; said to the caller
  Fd out[2];
  Source out_io[2];
  uint64_t out_sent = 0, out_acked = 0;
  Source drain_timer;
};

ExecSessions::ExecSessions(EventLoop& loop, Reaper& reaper, Ended ended)
    : loop_(loop), reaper_(reaper), ended_(std::move(ended)) {
  // A command that closed its input makes the next write fail with EPIPE, not kill us.
  ::signal(SIGPIPE, SIG_IGN);
}

ExecSessions::~ExecSessions() {
  *alive_ = false;
  // The agent is stopping: the commands go (their cgroups with the tasks' or at the
  // next start's cleanup).
  for (auto& [n, e] : execs_)
    if (e->pidfd.valid()) (void)signal_pidfd(e->pidfd.get(), SIGKILL);
}

void ExecSessions::watch_session(rpc::Session* s) {
  if (watched_.count(s)) return;
  watched_[s] = true;
  std::weak_ptr<bool> alive = alive_;
  s->watch_close([this, alive, s] {
    if (alive.lock()) session_closed(s);
  });
}

void ExecSessions::session_closed(rpc::Session* s) {
  watched_.erase(s);
  std::vector<uint64_t> gone;
  for (auto& [n, e] : execs_)
    if (e->session == s) gone.push_back(n);
  for (uint64_t n : gone) {
    auto it = execs_.find(n);
    it->second->session = nullptr;  // nothing more is said on it
    finish(n, "the session closed");
  }
}

Result<json> ExecSessions::start(rpc::Session* session, const std::string& task,
                                 const ExecOptions& options, const Plan& plan) {
  if (!session) return make_error("task.exec is served on sessions only");
  if (execs_.size() >= kMax)
    return make_error("this machine runs " + std::to_string(kMax) + " execs already")
        .with_code(rpc::kConflict);
  size_t of_task = 0;
  for (const auto& [n, e] : execs_) of_task += e->task == task;
  if (of_task >= kMaxPerTask)
    return make_error("task " + task + " has " + std::to_string(kMaxPerTask) + " execs already")
        .with_code(rpc::kConflict);
  const uint64_t n = ++next_;
  TRY_ASSIGN(ExecStart how, plan(n));
  auto r = spawn(session, task, options, n, how);
  if (!r.ok()) (void)ended_(task, n);  // its cgroup goes (nothing ran in it)
  return r;
}

Result<json> ExecSessions::spawn(rpc::Session* session, const std::string& task,
                                 const ExecOptions& options, uint64_t n, const ExecStart& how) {
  auto e = std::make_unique<Exec>();
  e->n = n;
  e->task = task;
  e->session = session;
  e->tty = options.tty;
  Fd child[3];
  if (options.tty) {
    Fd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master.valid() || ::unlockpt(master.get()) < 0) return sys_error("a terminal");
    struct winsize ws {};
    ws.ws_row = options.rows;
    ws.ws_col = options.cols;
    (void)::ioctl(master.get(), TIOCSWINSZ, &ws);
    Fd slave(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave.valid()) return sys_error("a terminal's other end");
    Fd again(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!again.valid()) return sys_error("dup");
    for (int i = 0; i < 3; ++i) {
      child[i] = Fd(::fcntl(slave.get(), F_DUPFD_CLOEXEC, 3));
      if (!child[i].valid()) return sys_error("dup");
    }
    e->in = std::move(master);
    e->out[0] = std::move(again);
  } else {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) return sys_error("pipe");
    child[0] = Fd(fds[0]);
    e->in = Fd(fds[1]);
    for (int i = 0; i < 2; ++i) {
      if (::pipe2(fds, O_CLOEXEC) < 0) return sys_error("pipe");
      e->out[i] = Fd(fds[0]);
      child[i + 1] = Fd(fds[1]);
    }
  }
  for (Fd* f : {&e->in, &e->out[0], &e->out[1]})
    if (f->valid()) (void)::fcntl(f->get(), F_SETFL, ::fcntl(f->get(), F_GETFL) | O_NONBLOCK);
  SpawnRequest req = join_request(how.init_path, how.cgroup_dir, how.pidfd, how.init_argv);
  for (int i = 0; i < 3; ++i) req.stdio[i] = child[i].get();
  TRY_ASSIGN(Spawned spawned, spawn_init(req));
  for (Fd& f : child) f.reset();  // the command's ends are the command's alone
  e->pidfd = std::move(spawned.pidfd);
  TRY_ASSIGN(e->exit_io,
             loop_.add_io(e->pidfd.get(), EPOLLIN, [this, n](uint32_t) { on_exit(n); }));
  Exec& ref = *e;
  execs_[n] = std::move(e);
  watch_session(session);
  arm_output(ref, 0);
  arm_output(ref, 1);
  log_info("exec started", {{"TASK", task}, {"EXEC", std::to_string(n)}});
  return json{{"exec", n}};
}

void ExecSessions::arm_output(Exec& e, int stream) {
  const bool open = e.out[stream].valid() && e.out_sent - e.out_acked < kWindow;
  if (!open) {
    e.out_io[stream].reset();
    return;
  }
  if (e.out_io[stream].active()) return;
  const uint64_t n = e.n;
  auto io = loop_.add_io(e.out[stream].get(), EPOLLIN,
                         [this, n, stream](uint32_t) { on_output(n, stream); });
  if (io.ok()) e.out_io[stream] = std::move(io).value();
}

void ExecSessions::on_output(uint64_t n, int stream) {
  auto it = execs_.find(n);
  if (it == execs_.end()) return;
  Exec& e = *it->second;
  const uint64_t room = kWindow - std::min(kWindow, e.out_sent - e.out_acked);
  char buf[kReadChunk];
  ssize_t r = ::read(e.out[stream].get(), buf, std::min<uint64_t>(room, sizeof buf));
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {  // the end (a terminal says EIO once no process holds its other end)
    e.out_io[stream].reset();
    e.out[stream].reset();
    return maybe_finish(e);
  }
  e.out_sent += static_cast<uint64_t>(r);
  if (e.session)
    e.session->notify("task.exec.output",
                      json{{"exec", n},
                           {"stream", stream == 0 ? "stdout" : "stderr"},
                           {"data", base64_encode(std::string_view(buf, static_cast<size_t>(r)))},
                           {"ack", e.in_written}});
  e.in_acked = e.in_written;
  arm_output(e, stream);
}

void ExecSessions::input(rpc::Session* session, const json& p) {
  if (!p.is_object() || !p.contains("exec") || !p["exec"].is_number_unsigned()) return;
  auto it = execs_.find(p["exec"].get<uint64_t>());
  if (it == execs_.end() || it->second->session != session) return;
  Exec& e = *it->second;
  if (p.value("close", false) == true) {
    kill(e);
    return;
  }
  if (p.contains("ack") && p["ack"].is_number_unsigned()) {
    e.out_acked = std::clamp<uint64_t>(p["ack"].get<uint64_t>(), e.out_acked, e.out_sent);
    arm_output(e, 0);
    arm_output(e, 1);
  }
  if (e.tty && p.contains("rows") && p.contains("cols")) {
    auto rows = exec_dimension(p, "rows", 24);
    auto cols = exec_dimension(p, "cols", 80);
    if (rows.ok() && cols.ok() && e.in.valid()) {
      struct winsize ws {};
      ws.ws_row = *rows;
      ws.ws_col = *cols;
      (void)::ioctl(e.in.get(), TIOCSWINSZ, &ws);
    }
  }
  if (p.contains("data") && p["data"].is_string()) {
    auto data = base64_decode(p["data"].get_ref<const std::string&>());
    if (!data.ok()) return finish(e.n, "input that is not base64");
    if (e.pending_in.size() + data->size() > kWindow)
      return finish(e.n, "input beyond its window (" + std::to_string(kWindow) + " bytes)");
    if (!e.eof_asked) e.pending_in += *data;
  }
  if (p.value("eof", false) == true && !e.eof_asked) {
    // A terminal has no end of its input: ^D says it to the line discipline.
    if (e.tty) e.pending_in += '\x04';
    e.eof_asked = true;
  }
  arm_input(e);
}

void ExecSessions::arm_input(Exec& e) {
  if (!e.in.valid()) return;
  if (e.pending_in.empty()) {
    e.in_io.reset();
    if (e.eof_asked && !e.tty) e.in.reset();  // the command reads its end of file
    return;
  }
  if (e.in_io.active()) return;
  const uint64_t n = e.n;
  auto io = loop_.add_io(e.in.get(), EPOLLOUT, [this, n](uint32_t) { on_input(n); });
  if (io.ok()) e.in_io = std::move(io).value();
}

void ExecSessions::on_input(uint64_t n) {
  auto it = execs_.find(n);
  if (it == execs_.end()) return;
  Exec& e = *it->second;
  ssize_t w = ::write(e.in.get(), e.pending_in.data(), e.pending_in.size());
  if (w < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (w < 0) {  // the command closed its input: what is left goes nowhere
    e.in_written += e.pending_in.size();
    e.pending_in.clear();
    e.in_io.reset();
    e.in.reset();
  } else {
    e.in_written += static_cast<uint64_t>(w);
    e.pending_in.erase(0, static_cast<size_t>(w));
    arm_input(e);
  }
  // The caller may send more: say how much was written.
  if (e.session && e.in_written != e.in_acked) {
    e.session->notify("task.exec.output", json{{"exec", n}, {"ack", e.in_written}});
    e.in_acked = e.in_written;
  }
}

void ExecSessions::on_exit(uint64_t n) {
  auto it = execs_.find(n);
  if (it == execs_.end()) return;
  Exec& e = *it->second;
  siginfo_t info{};
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(e.pidfd.get()), &info,
               WEXITED | WNOHANG) < 0 ||
      info.si_pid == 0)
    return;
  e.exit_io.reset();
  e.pidfd.reset();
  e.status = info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  auto t = loop_.add_timer_in(kDrainUs, [this, n] { finish(n); });
  if (t.ok()) e.drain_timer = std::move(t).value();
  maybe_finish(e);
}

void ExecSessions::maybe_finish(Exec& e) {
  if (e.status && !e.out[0].valid() && !e.out[1].valid()) finish(e.n);
}

void ExecSessions::kill(Exec& e) {
  if (!e.status) e.status = 128 + SIGKILL;
  finish(e.n, "closed by the caller");
}

void ExecSessions::finish(uint64_t n, std::string error) {
  auto it = execs_.find(n);
  if (it == execs_.end()) return;
  std::unique_ptr<Exec> e = std::move(it->second);
  execs_.erase(it);
  if (e->pidfd.valid()) {  // ended before its command did: it goes
    e->exit_io.reset();
    (void)signal_pidfd(e->pidfd.get(), SIGKILL);
    reaper_.adopt(std::move(e->pidfd));
  }
  if (e->session) {
    json done{{"exec", n}};
    if (e->status) {
      done["status"] = *e->status;
      if (*e->status == 125) error = "cannot enter the task (is it ending?)";
      if (*e->status == 126) error = "cannot take the task's identity or confinement";
    }
    if (!error.empty()) done["error"] = error;
    e->session->notify("task.exec.exit", std::move(done));
  }
  log_info("exec ended", {{"TASK", e->task},
                          {"EXEC", std::to_string(n)},
                          {"STATUS", e->status ? std::to_string(*e->status) : "-"},
                          {"WHY", error.empty() ? "exited" : error}});
  if (!ended_(e->task, n)) {
    leaving_[{e->task, n}] = 600;
    retry_ended();
  }
}

void ExecSessions::retry_ended() {
  if (leaving_timer_.active() || leaving_.empty()) return;
  auto t = loop_.add_timer_in(100'000, [this] {
    leaving_timer_.reset();
    for (auto it = leaving_.begin(); it != leaving_.end();) {
      if (ended_(it->first.first, it->first.second) || --it->second <= 0)
        it = leaving_.erase(it);
      else
        ++it;
    }
    retry_ended();
  });
  if (t.ok()) leaving_timer_ = std::move(t).value();
}

}  // namespace weft::agent
