// `weftctl task exec ID -- CMD...` (docs/operations.md, "A command inside a task"): a
// command inside a running task of the cluster, with a terminal (-t; the default when
// stdin and stdout are terminals) or with pipes (-T), its input and output carried over
// the session with the control plane. The exit status is the command's.
#include <string>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "cli/task.h"
#include "common/base64.h"
#include "common/exec_request.h"

namespace weft::cli {

namespace {

// What the agent takes before it acknowledges (agent/exec_sessions.h kWindow).
constexpr uint64_t kWindow = 256 * 1024;

volatile sig_atomic_t g_resized = 0;
void on_winch(int) {
  g_resized = 1;
}

// The caller's terminal in raw mode while the command runs (every key goes to the task's
// terminal, ^C included), put back as it was whatever happens.
class RawTerminal {
 public:
  RawTerminal() {
    if (::tcgetattr(0, &saved_) < 0) return;
    struct termios raw = saved_;
    ::cfmakeraw(&raw);
    if (::tcsetattr(0, TCSANOW, &raw) == 0) active_ = true;
  }
  ~RawTerminal() {
    if (active_) ::tcsetattr(0, TCSANOW, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  struct termios saved_ {};
  bool active_ = false;
};

void window_size(uint16_t* rows, uint16_t* cols) {
  struct winsize ws {};
  if (::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
    *rows = std::min<uint16_t>(ws.ws_row, 1000);
    *cols = std::min<uint16_t>(ws.ws_col, 1000);
  }
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// One exec's state on the caller's side.
struct Stream {
  uint64_t exec = 0;
  uint64_t written = 0, acked_out = 0;  // output written here; said to the agent
  uint64_t sent_in = 0, acked_in = 0;   // input sent; the agent's acknowledgement
  bool done = false;
  std::optional<int> status;
  std::string error;
};

struct TaskExecOptions {
  std::string id;
  std::vector<std::string> command;
  bool tty = false, no_tty = false;
};

// Runs it: the command's exit code.
int task_exec(const TaskExecOptions& c, const Globals& g) {
  if (c.tty && c.no_tty) die("--tty and --no-tty: give one of them");
  ExecRequest req;
  req.task = c.id;
  req.command = c.command;
  req.options.tty = c.tty || (!c.no_tty && ::isatty(0) && ::isatty(1));
  if (req.options.tty) {
    window_size(&req.options.rows, &req.options.cols);
    if (const char* term = std::getenv("TERM")) req.term = term;
  }
  json params = exec_request_json(req);
  // The same reader the control plane and the agent use: a bad command is said here.
  if (auto checked = parse_exec_request(params); !checked.ok()) {
    if (checked.error().message.find("term") != std::string::npos) {
      req.term.clear();  // an unusual TERM here: the task gets xterm
      params = exec_request_json(req);
    } else {
      die(checked.error().str());
    }
  }

  CpClient cp(g);
  Stream st;
  rpc::Dispatcher d;
  d.add("task.exec.output", [&](const json& p, const rpc::CallContext&) -> Result<json> {
    if (p.value("exec", uint64_t{0}) != st.exec || st.exec == 0) return json();
    if (p.contains("ack") && p["ack"].is_number_unsigned())
      st.acked_in = std::max(st.acked_in, p["ack"].get<uint64_t>());
    if (p.contains("data") && p["data"].is_string()) {
      auto data = base64_decode(p["data"].get_ref<const std::string&>());
      if (data.ok()) {
        (void)write_all(p.value("stream", "stdout") == "stderr" ? 2 : 1, *data);
        st.written += data->size();
      }
    }
    return json();
  });
  d.add("task.exec.exit", [&](const json& p, const rpc::CallContext&) -> Result<json> {
    if (p.value("exec", uint64_t{0}) != st.exec || st.exec == 0) return json();
    st.done = true;
    if (p.contains("status") && p["status"].is_number_integer()) st.status = p["status"].get<int>();
    st.error = p.value("error", "");
    return json();
  });
  cp.raw().set_dispatcher(&d);
  json started = call_or_die(cp, "task.exec", params, 30000);
  st.exec = started.value("exec", uint64_t{0});
  if (st.exec == 0) die("the control plane started no exec");
  rpc::Client& client = cp.raw();

  std::optional<RawTerminal> raw;
  if (req.options.tty && ::isatty(0)) raw.emplace();
  struct sigaction sa {};
  sa.sa_handler = on_winch;
  ::sigaction(SIGWINCH, &sa, nullptr);  // no SA_RESTART: poll returns to say it
  bool stdin_open = true;
  std::string lost;
  while (!st.done) {
    // Output already here (read during the call) is handled before waiting.
    if (auto s = client.pump(); !s.ok()) {
      lost = s.error().message;
      break;
    }
    if (st.done) break;
    if (st.written != st.acked_out) {
      (void)client.notify("task.exec.input", {{"exec", st.exec}, {"ack", st.written}});
      st.acked_out = st.written;
    }
    if (g_resized) {
      g_resized = 0;
      uint16_t rows = 24, cols = 80;
      window_size(&rows, &cols);
      if (req.options.tty)
        (void)client.notify("task.exec.input", {{"exec", st.exec}, {"rows", rows}, {"cols", cols}});
    }
    const bool room = st.sent_in - st.acked_in < kWindow;
    pollfd fds[2] = {{client.fd(), POLLIN, 0}, {0, POLLIN, 0}};
    int n = ::poll(fds, stdin_open && room ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("poll: " + std::string(std::strerror(errno)));
    if (stdin_open && room && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[32 * 1024];
      size_t want = std::min<uint64_t>(sizeof buf, kWindow - (st.sent_in - st.acked_in));
      ssize_t r = ::read(0, buf, want);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        stdin_open = false;
        (void)client.notify("task.exec.input", {{"exec", st.exec}, {"eof", true}});
      } else {
        st.sent_in += static_cast<uint64_t>(r);
        (void)client.notify(
            "task.exec.input",
            {{"exec", st.exec},
             {"data", base64_encode(std::string_view(buf, static_cast<size_t>(r)))}});
      }
    }
  }
  raw.reset();
  if (!lost.empty()) die("the session with the control plane ended: " + lost);
  if (!st.error.empty() && !(st.status && st.error == "closed by the caller"))
    std::cerr << "weftctl: exec in " << c.id << ": " << st.error << "\n";
  if (!st.status) return 1;
  return *st.status;
}

}  // namespace

void add_task_exec_command(CLI::App* task, Handlers& h) {
  auto o = std::make_shared<TaskExecOptions>();
  CLI::App* exec = task->add_subcommand(
      "exec",
      "run a command inside a running task of the cluster (its namespaces, root, user and "
      "confinement), with a terminal or pipes, through the control plane; for operators of "
      "its entitlement, audited with the command line");
  exec->add_option("id", o->id, "the task's id (job.index.N: weftctl task ls --cluster)")
      ->required();
  exec->add_option("command", o->command, "the command and its arguments, after --")->required();
  exec->add_flag("-t,--tty", o->tty, "a terminal (the default when stdin and stdout are ones)");
  exec->add_flag("-T,--no-tty", o->no_tty, "pipes, even at a terminal");
  exec->footer(
      "Example: weftctl task exec web.0.1 -- sh\n"
      "         weftctl task exec -T web.0.1 -- tar -C /data -cf - . > data.tar");
  h.on(exec, [o](const Globals& g) { return task_exec(*o, g); });
}

}  // namespace weft::cli
