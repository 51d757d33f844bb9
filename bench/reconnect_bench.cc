// The reconnect storm (issue 13): N simulated machines hold sessions to a real
// weft-controlplane on 127.0.0.1; the control plane is SIGKILLed and started again, and
// every machine reconnects at once with the agent's link backoff (common/cp_link.cc:
// 500 ms doubling to 30 s). Timed until every machine is registered again, with the
// control plane's CPU over the storm, and its CPU at rest (each machine reporting
// every heartbeat) — over plaintext, over mutual TLS, and over TLS resuming sessions
// (tickets kept by the control plane across its restart, tls_ticket_keys).
//
// One event loop simulates every machine; each has its own certificate (CN and SAN DNS
// = its machine id, OU=machine) signed in-process by a weft-pki CA, and its own source
// address in 127.0.0.0/8 (the control plane caps sessions per address).
//
//   build/bench/reconnect_bench [--machines 2000] [--rest 20] [--modes plain,tls,resume]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/sim_util.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rpc/session.h"
#include "common/strings.h"
#include "common/tls.h"
#include "testing/ports.h"

using namespace weft;
using namespace weft::bench;
using json = nlohmann::json;

namespace {

enum class Mode { kPlain, kTls, kResume };
const char* mode_name(Mode m) {
  return m == Mode::kPlain ? "plaintext" : m == Mode::kTls ? "TLS" : "TLS+resumption";
}

struct Machine {
  std::string id;
  in_addr source{};
  std::shared_ptr<tls::Context> ctx;
  Dialer dialer;
  Source retry, report;
  std::unique_ptr<rpc::Session> session;
  SSL* ssl = nullptr;  // owned by session
  bool registered = false;
  uint64_t backoff_us = 500'000;
};

class Simulator {
 public:
  Simulator(EventLoop& loop, Mode mode, uint16_t port, uint64_t heartbeat_us)
      : loop_(loop), mode_(mode), port_(port), heartbeat_us_(heartbeat_us) {}
  ~Simulator() {
    for (auto& m : machines_) m->session.reset();
  }
  bool add(const std::string& id, const std::string& pki, int index) {
    auto m = std::make_unique<Machine>();
    m->id = id;
    // 127.1.x.y: one source address per 200 machines, under the per-address cap.
    m->source.s_addr = htonl((127u << 24) | (1u << 16) | static_cast<uint32_t>(index / 200 + 1));
    if (mode_ != Mode::kPlain) {
      auto ctx = tls::Context::create(
          {pki + "/ca.pem", pki + "/" + id + ".pem", pki + "/" + id + ".key", ""},
          tls::Role::kClient);
      if (!ctx.ok()) {
        std::fprintf(stderr, "%s\n", ctx.error().str().c_str());
        return false;
      }
      m->ctx = *ctx;
    }
    machines_.push_back(std::move(m));
    return true;
  }
  void connect_all() {
    for (auto& m : machines_) connect(*m);
  }
  size_t registered() const { return registered_; }
  size_t handshakes() const { return handshakes_; }
  size_t resumed() const { return resumed_; }
  size_t refused() const { return refused_; }
  void reset_counters() { handshakes_ = resumed_ = refused_ = 0; }

 private:
  void connect(Machine& m) {
    m.retry.reset();
    m.dialer.dial(loop_, m.source, port_, [this, &m](Fd fd) {
      if (!fd.valid()) {
        retry_later(m);
        return;
      }
      start_session(m, std::move(fd));
    });
  }
  void start_session(Machine& m, Fd fd) {
    int fdnum = fd.get();
    m.session = std::make_unique<rpc::Session>(loop_, std::move(fd), rpc::Peer{}, nullptr);
    m.ssl = nullptr;
    if (m.ctx) {
      auto ssl = m.ctx->new_ssl(fdnum, "127.0.0.1");
      if (!ssl.ok()) {
        m.session.reset();
        retry_later(m);
        return;
      }
      m.ssl = *ssl;
      m.session->use_tls(m.ssl, 10'000'000);
    }
    m.session->set_on_close([this, &m] {
      if (m.registered) --registered_;
      m.registered = false;
      m.report.reset();
      m.ssl = nullptr;
      auto d = loop_.add_defer([this, &m] {
        m.session.reset();
        retry_later(m);
      });
      if (d.ok()) m.retry = std::move(d).value();
    });
    (void)m.session->start();
    m.session->call("machine.register", {{"machine", m.id}, {"cpu_milli", 8000}, {"mem_mb", 32768}},
                    [this, &m](Result<json> r) {
                      if (!r.ok()) {
                        ++refused_;
                        return;  // the session closes or the next report retries
                      }
                      m.registered = true;
                      m.backoff_us = 500'000;
                      ++registered_;
                      if (m.ssl) {
                        ++handshakes_;
                        if (SSL_session_reused(m.ssl)) ++resumed_;
                      }
                      schedule_report(m);
                    });
  }
  void schedule_report(Machine& m) {
    auto t = loop_.add_timer_in(heartbeat_us_, [this, &m] {
      if (!m.session || !m.registered) return;
      m.session->call("machine.report", {{"machine", m.id}, {"tasks", json::object()}},
                      [](Result<json>) {});
      schedule_report(m);
    });
    if (t.ok()) m.report = std::move(t).value();
  }
  void retry_later(Machine& m) {
    auto t = loop_.add_timer_in(m.backoff_us, [this, &m] { connect(m); });
    if (t.ok()) m.retry = std::move(t).value();
    m.backoff_us = std::min<uint64_t>(m.backoff_us * 2, 30'000'000);
  }

  EventLoop& loop_;
  Mode mode_;
  uint16_t port_;
  uint64_t heartbeat_us_;
  std::vector<std::unique_ptr<Machine>> machines_;
  size_t registered_ = 0, handshakes_ = 0, resumed_ = 0, refused_ = 0;
};

struct Figures {
  double first_s = 0, first_cpu = 0, rest_cpu_pct = 0, storm_s = 0, storm_cpu = 0;
  long rss_kib = 0;
  size_t handshakes = 0, resumed = 0, refused = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reconnect_bench: every machine reconnecting after a control-plane restart"};
  int machines = 2000;
  double rest_s = 20, heartbeat_s = 2;
  std::string modes = "plain,tls,resume";
  app.add_option("--machines", machines, "simulated machines (sessions)");
  app.add_option("--rest", rest_s, "seconds at rest to measure steady-state CPU");
  app.add_option("--heartbeat", heartbeat_s, "heartbeat interval, seconds");
  app.add_option("--modes", modes, "plain, tls, resume (comma-separated)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LogLevel::kError);  // the simulated machines' own handshake warnings
  if (!raise_nofile(static_cast<uint64_t>(machines) + 64)) {
    std::fprintf(stderr, "reconnect_bench: RLIMIT_NOFILE is too low for %d machines\n", machines);
    return 2;
  }
  std::string dir = std::filesystem::temp_directory_path() / ("weft-reconnect-" + random_hex(5));
  std::string pki = dir + "/pki";
  std::string tool = std::string(WEFT_SOURCE_DIR) + "/scripts/weft-pki";
  if (std::system(("(" + tool + " ca " + pki + " && " + tool + " issue " + pki +
                   " cp --ip 127.0.0.1) >/dev/null")
                      .c_str()) != 0 ||
      !issue_machine_certs(pki, machines)) {
    std::fprintf(stderr, "reconnect_bench: could not make certificates in %s\n", pki.c_str());
    return 1;
  }
  std::printf("reconnect_bench: %d machines, heartbeat %.1f s, %d CPUs\n", machines, heartbeat_s,
              static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  std::vector<std::pair<Mode, Figures>> results;
  for (Mode mode : {Mode::kPlain, Mode::kTls, Mode::kResume}) {
    const char* key = mode == Mode::kPlain ? "plain" : mode == Mode::kTls ? "tls" : "resume";
    if (modes.find(key) == std::string::npos) continue;
    std::string run = dir + "/" + key;
    (void)mkdir_p(run);
    uint16_t port = weft::testing::free_tcp_port();
    std::string conf =
        "socket = \"" + run + "/cp.sock\"\nstate_dir = \"" + run +
        "/state\"\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\nheartbeat_interval = \"" +
        std::to_string(static_cast<int>(heartbeat_s * 1000)) + "ms\"\nlog_level = \"warning\"\n";
    if (mode != Mode::kPlain)
      conf += "tls_ca = \"" + pki + "/ca.pem\"\ntls_cert = \"" + pki + "/cp.pem\"\ntls_key = \"" +
              pki + "/cp.key\"\n";
    if (mode == Mode::kTls) conf += "tls_resumption = false\n";
    (void)write_file(run + "/cp.toml", conf);
    auto loop = std::move(EventLoop::create()).value();
    Simulator sim(*loop, mode, port, static_cast<uint64_t>(heartbeat_s * 1e6));
    for (int i = 0; i < machines; ++i) {
      if (!sim.add(machine_name(i), pki, i)) return 1;
    }
    Figures f;
    pid_t cp = start_controlplane(run + "/cp.toml", run + "/cp.log");
    (void)wait_controlplane(run + "/cp.sock");
    double cpu0 = cpu_seconds(cp);
    sim.connect_all();
    f.first_s = run_until(
        *loop, [&] { return sim.registered() == static_cast<size_t>(machines); }, 120);
    f.first_cpu = cpu_seconds(cp) - cpu0;
    // At rest: every machine reports every heartbeat.
    double rest0 = cpu_seconds(cp);
    run_until(
        *loop, [] { return false; }, rest_s);
    f.rest_cpu_pct = 100 * (cpu_seconds(cp) - rest0) / rest_s;
    f.rss_kib = rss_kib(cp);
    // The storm: SIGKILL, start again, every machine back.
    kill(cp, SIGKILL);
    waitpid(cp, nullptr, 0);
    sim.reset_counters();
    // Let every simulated session see its end before the new process listens.
    run_until(
        *loop, [&] { return sim.registered() == 0; }, 10);
    cp = start_controlplane(run + "/cp.toml", run + "/cp.log");
    f.storm_s = run_until(
        *loop, [&] { return sim.registered() == static_cast<size_t>(machines); }, 120);
    f.storm_cpu = cpu_seconds(cp);
    f.handshakes = sim.handshakes();
    f.resumed = sim.resumed();
    f.refused = sim.refused();
    kill(cp, SIGTERM);
    waitpid(cp, nullptr, 0);
    std::printf(
        "%-15s first connect %6.2f s (cp CPU %5.2f s) | at rest %5.1f%% of a core, RSS %ld MiB "
        "| restart storm: all %d back in %6.2f s, cp CPU %5.2f s, %zu handshakes, %zu resumed, "
        "%zu registrations refused\n",
        mode_name(mode), f.first_s, f.first_cpu, f.rest_cpu_pct, f.rss_kib / 1024, machines,
        f.storm_s, f.storm_cpu, f.handshakes, f.resumed, f.refused);
    std::fflush(stdout);
    results.emplace_back(mode, f);
  }
  const Figures* plain = nullptr;
  for (const auto& [m, f] : results)
    if (m == Mode::kPlain) plain = &f;
  if (plain && plain->rest_cpu_pct > 0)
    for (const auto& [m, f] : results)
      if (m != Mode::kPlain)
        std::printf("%s / plaintext: at rest %.2fx CPU, storm %.2fx time, %.2fx CPU\n",
                    mode_name(m), f.rest_cpu_pct / plain->rest_cpu_pct,
                    plain->storm_s > 0 ? f.storm_s / plain->storm_s : 0,
                    plain->storm_cpu > 0 ? f.storm_cpu / plain->storm_cpu : 0);
  (void)remove_tree(dir);
  return 0;
}
