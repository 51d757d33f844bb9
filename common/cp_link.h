// A machine daemon's session to weft-controlplane (weft-agent, weft-sidekick and
// weft-hcs each open one). The link connects, says hello (the daemon's first call, e.g.
// machine.register), then calls the daemon's periodic report every interval until the
// session closes; it reconnects with exponential backoff (0.5 s doubling to 30 s, 2 s
// while a follower answers, jittered, reset by an accepted hello: cp_rotation.h). A control plane
// that leaves the hello unanswered for 5 s, or every report for three intervals, counts as gone (a
// frozen process keeps its socket). `endpoint` may list several control plane replicas separated by
// commas: the link tries them in turn and follows a follower's "not the leader" answer. Requests
// the control plane sends down the session (commands) are answered through the daemon's dispatcher.
// While the control plane is away nothing on the machine changes: the daemons keep what they run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/cp_rotation.h"
#include "common/event.h"
#include "common/rpc/client.h"

namespace weft {

class ControlPlaneLink {
 public:
  // hello sends the first call on a fresh session and must call done with its reply:
  // an error closes the session (and retries later); a reply carrying
  // "heartbeat_interval_ms" sets the report interval.
  using Done = std::function<void(Result<nlohmann::json>)>;
  using Hello = std::function<void(rpc::Session&, Done)>;
  using Report = std::function<void(rpc::Session&)>;

  // `insecure_tcp` allows a plain TCP endpoint (unauthenticated: anyone who can bind
  // that port can command this machine); without it only a Unix-socket control plane
  // owned by root or by this daemon's user is accepted.
  ControlPlaneLink(EventLoop& loop, std::string endpoint, std::string who,
                   const rpc::Dispatcher* commands, Hello hello, Report report,
                   bool insecure_tcp = false);
  ~ControlPlaneLink();
  ControlPlaneLink(const ControlPlaneLink&) = delete;
  ControlPlaneLink& operator=(const ControlPlaneLink&) = delete;

  // Mutual TLS to a TCP control plane (before start()): the control plane's certificate
  // must carry `server_name` (default: the endpoint's host); nothing is sent to it, and
  // no command from it runs, before the handshake has verified it.
  void use_tls(std::shared_ptr<tls::Context> ctx, std::string server_name) {
    tls_ = std::move(ctx);
    server_name_ = std::move(server_name);
  }
  void start() { connect(); }
  // SIGHUP: re-reads this machine's certificate, key, CA bundle and CRL; the next
  // connection uses them, the session up now carries on. On error the old files stay.
  Status reload_tls() { return tls_ ? tls_->reload() : Status{}; }
  // The session once its hello was accepted, else null.
  rpc::Session* session() { return accepted_ ? session_.get() : nullptr; }
  // Sends the periodic report now (and restarts the interval), e.g. on a change.
  void report_now();
  uint64_t interval_us() const { return interval_us_; }

 private:
  const std::string& endpoint() const { return rotation_.current(); }
  // A region (docs/regions.md): the machine is held by the control plane at `to` (its
  // replicas' endpoints), or belongs to the configured ones again ("").
  void moved(const std::string& to);
  void connect();
  void connected(Result<Fd> fd);
  void lost();
  void schedule_report();
  uint64_t silence_limit_us() const { return std::max<uint64_t>(3 * interval_us_, 1'000'000); }

  EventLoop& loop_;
  // The control plane's endpoints (replicas: docs/replicas.md), the one in use, and
  // where a follower's redirect points.
  EndpointRotation rotation_;  // which replica next, and the backoff
  std::string who_;
  const rpc::Dispatcher* commands_;
  Hello hello_;
  Report report_;
  std::unique_ptr<rpc::Session> session_;
  std::unique_ptr<rpc::ConnectAttempt> attempt_;
  bool insecure_tcp_ = false;
  std::shared_ptr<tls::Context> tls_;
  std::string server_name_;
  bool accepted_ = false;
  Source report_timer_, retry_timer_, reaper_;
  Source watchdog_;  // the hello's deadline
  uint64_t interval_us_ = 5'000'000;
  uint64_t generation_ = 0;  // which session a late hello reply belongs to
};

using rpc::split_endpoints;

// How long one connect (name resolution included) may take before the link retries.
inline constexpr uint64_t kControlPlaneConnectTimeoutUs = 5'000'000;
// How long a control plane may take to answer the hello before the next one is tried.
inline constexpr uint64_t kControlPlaneHelloTimeoutUs = 5'000'000;

// Checks a configured control_plane endpoint ("" = none); the error names `where`. A TCP
// endpoint needs TLS (`tls`), or `insecure` (insecure_control_plane = true, for tests).
Status check_control_plane_endpoint(const std::string& value, const std::string& where,
                                    bool insecure, bool tls = false);

// A machine daemon's SIGHUP (systemctl reload): the link's TLS files are read again,
// logged either way (`link` may be null: no control plane configured).
void reload_control_plane_tls(ControlPlaneLink* link);

// The TLS keys of a machine daemon's control-plane session, the same in agent.toml,
// sidekick.toml and hcs.toml: control_plane_tls_ca, control_plane_tls_cert,
// control_plane_tls_key, control_plane_tls_crl (optional) and control_plane_name (the
// name the control plane's certificate must carry; default: the endpoint's host).
struct ControlPlaneTls {
  tls::Config files;
  std::string server_name;
};
inline const std::vector<std::string> kControlPlaneTlsKeys = {
    "control_plane_tls_ca", "control_plane_tls_cert", "control_plane_tls_key",
    "control_plane_tls_crl", "control_plane_name"};
// Reads them from a daemon's configuration table; errors name the file and line.
Status read_control_plane_tls(const TomlDoc& doc, const toml::table& t, ControlPlaneTls* out);
// The link of a machine daemon: with TLS when configured (files read now, so a bad file
// fails the daemon's start rather than each connect).
Result<std::unique_ptr<ControlPlaneLink>> make_control_plane_link(
    EventLoop& loop, const std::string& endpoint, const std::string& who,
    const rpc::Dispatcher* commands, ControlPlaneLink::Hello hello, ControlPlaneLink::Report report,
    bool insecure_tcp, const ControlPlaneTls& tls);

// The control plane at the other end of a Unix socket must be root or this process's
// own user: an unprivileged user who binds the socket path must not command the machine.
Status check_control_plane_peer(int fd);

// The machine's id as every weft daemon reports it: the configured one, else
// /etc/machine-id under host_root, else the host name.
std::string resolve_machine_id(const std::string& configured, const std::string& host_root);
// A machine's id and its labels (dc, domain, type), checked alike by the daemons that
// send them and the control plane that stores and lists them: 1-253 characters of
// [A-Za-z0-9._:-] starting with a letter or digit (a hostname, an FQDN, a machine-id;
// never "." or ".."). `field` names it in the error;
// an empty label is allowed where `required` is false.
Status check_machine_name(const std::string& field, const std::string& value, bool required);
inline constexpr size_t kMaxMachineName = 253;
// A host profile's name, checked alike by weft-sidekick (which loads NAME.toml from its
// profile directories) and the control plane (an entitlement's profile): 1-64 characters
// of [A-Za-z0-9._-], not starting with '.'. No '/', so never a path.
bool valid_profile_name(std::string_view name);
// --check-config of a machine daemon: the TLS files it names hold what they should (a
// CA, a certificate, its unencrypted key not readable by every user), as the start
// will read them.
Status check_control_plane_tls_files(const ControlPlaneTls& tls);
// The most profile names a sidekick reports (profile.report's "profiles").
inline constexpr size_t kMaxReportedProfiles = 256;
// The most ports a machine reports as its own at registration ("reserved_ports").
inline constexpr size_t kMaxReservedPorts = 4096;
// health.report's "problems": at most this many, each an object of at most this many
// bytes as JSON (weft-hcs cuts what it sends to fit; the control plane refuses more).
inline constexpr size_t kMaxReportedProblems = 64;
inline constexpr size_t kMaxProblemBytes = 1024;

}  // namespace weft
