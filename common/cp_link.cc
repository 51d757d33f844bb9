#include "common/cp_link.h"

#include <sys/socket.h>
#include <unistd.h>
#include <cctype>

#include <algorithm>
#include <random>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/paths.h"
#include "common/strings.h"

namespace weft {

namespace {

std::vector<std::string> configured_endpoints(const std::string& endpoint) {
  std::vector<std::string> list = split_endpoints(endpoint);
  if (list.empty()) list.push_back(endpoint);  // refused by connect()
  return list;
}

}  // namespace

ControlPlaneLink::ControlPlaneLink(EventLoop& loop, std::string endpoint, std::string who,
                                   const rpc::Dispatcher* commands, Hello hello, Report report,
                                   bool insecure_tcp)
    : loop_(loop),
      rotation_(configured_endpoints(endpoint), std::random_device{}()),
      who_(std::move(who)),
      commands_(commands),
      hello_(std::move(hello)),
      report_(std::move(report)),
      insecure_tcp_(insecure_tcp) {}

ControlPlaneLink::~ControlPlaneLink() {
  report_timer_.reset();
  retry_timer_.reset();
  watchdog_.reset();
  reaper_.reset();
  attempt_.reset();
  session_.reset();
}

void ControlPlaneLink::connect() {
  retry_timer_.reset();
  auto ep = rpc::parse_endpoint(endpoint());
  if (!ep.ok()) return connected(ep.error());
  if (!ep->is_unix && !insecure_tcp_ && !tls_)
    return connected(make_error("a TCP control plane needs TLS (control_plane_tls_*)"));
  // Never a blocking connect here: with SYNs dropped it would hold the loop for minutes.
  attempt_ = rpc::ConnectAttempt::start(loop_, *ep, kControlPlaneConnectTimeoutUs,
                                        [this](Result<Fd> fd) { connected(std::move(fd)); });
}

void ControlPlaneLink::connected(Result<Fd> fd) {
  attempt_.reset();  // finished; ConnectAttempt allows its callback to destroy it
  // Parsed before the connect; an unparsable endpoint arrives here as `fd`'s error.
  auto ep = rpc::parse_endpoint(endpoint());
  if (fd.ok() && ep->is_unix) {
    if (auto s = check_control_plane_peer(fd->get()); !s.ok()) fd = std::move(s).error();
  }
  if (!fd.ok()) {
    log_debug("control plane not reachable",
              {{"ENDPOINT", endpoint()}, {"ERROR", fd.error().str()}});
    lost();
    return;
  }
  SSL* ssl = nullptr;
  if (tls_ && !ep->is_unix) {
    auto r = tls_->new_ssl(fd->get(), server_name_.empty() ? ep->host : server_name_);
    if (!r.ok()) {
      log_warn("cannot start TLS to the control plane", {{"ERROR", r.error().str()}});
      lost();
      return;
    }
    ssl = *r;
  }
  session_ = std::make_unique<rpc::Session>(loop_, std::move(fd).value(), rpc::Peer{}, commands_);
  // The hello is queued until the handshake has verified the control plane.
  if (ssl) session_->use_tls(ssl, kControlPlaneConnectTimeoutUs);
  if (!session_->start().ok()) {
    lost();
    return;
  }
  uint64_t gen = ++generation_;
  session_->watch_close([this] {
    // Not from inside the session's own callback: drop it on the next iteration.
    auto d = loop_.add_defer([this] { lost(); });
    if (d.ok()) reaper_ = std::move(d).value();
  });
  // A replica that accepts the connection but never answers (a frozen process: the
  // kernel still accepts) must not hold the link: on to the next one.
  auto w = loop_.add_timer_in(kControlPlaneHelloTimeoutUs, [this, gen] {
    if (gen != generation_ || !session_ || accepted_) return;
    log_warn("the control plane did not answer " + who_ + "'s hello; trying the next replica",
             {{"ENDPOINT", endpoint()}});
    ++generation_;  // the hello's failure is this, already said
    session_->close();
  });
  if (w.ok()) watchdog_ = std::move(w).value();
  hello_(*session_, [this, gen](Result<nlohmann::json> r) {
    if (gen != generation_ || !session_) return;
    if (!r.ok()) {
      if (r.error().code == rpc::kMoved) {
        // A region's machine that belongs to another control plane (docs/regions.md):
        // the shard that holds it now, or back to the brokers ("").
        moved(r.error().leader);
      } else if (r.error().code == rpc::kNotLeader) {
        // A replica that follows: go where it says the leader is, if that is one of ours,
        // else on to the next endpoint; at once, not after a backoff.
        rotation_.follower_named(r.error().leader);
        log_debug("the control plane follows; trying the leader",
                  {{"ENDPOINT", endpoint()}, {"LEADER", r.error().leader}});
      } else {
        log_warn("the control plane refused " + who_ + "'s hello",
                 {{"ENDPOINT", endpoint()}, {"ERROR", r.error().str()}});
      }
      session_->close();
      return;
    }
    accepted_ = true;
    watchdog_.reset();
    rotation_.accepted();
    if (r->is_object() && r->contains("heartbeat_interval_ms") &&
        (*r)["heartbeat_interval_ms"].is_number_unsigned())
      interval_us_ =
          std::max<uint64_t>((*r)["heartbeat_interval_ms"].get<uint64_t>() * 1000, 100'000);
    log_info(who_ + " connected to the control plane", {{"ENDPOINT", endpoint()}});
    report_now();
  });
}

void ControlPlaneLink::moved(const std::string& to) {
  log_info(who_ + ": the machine belongs to another control plane; going there",
           {{"FROM", endpoint()}, {"TO", to.empty() ? "the configured endpoints" : to}});
  rotation_.moved(to.empty() ? std::vector<std::string>{} : split_endpoints(to));
}

void ControlPlaneLink::report_now() {
  if (!accepted_ || !session_ || session_->closed()) return;
  // Every report is answered; a control plane silent for three intervals is gone even if
  // its socket is not (frozen, or cut off behind a proxy): the next replica is tried, so
  // the machine reaches a new leader before that leader counts it dead.
  uint64_t silent = now_monotonic_us() - session_->last_heard_us();
  if (silent > silence_limit_us()) {
    log_warn(who_ + ": the control plane stopped answering; trying the next replica",
             {{"ENDPOINT", endpoint()}, {"SILENT_MS", std::to_string(silent / 1000)}});
    session_->close();
    return;
  }
  report_(*session_);
  schedule_report();
}

void ControlPlaneLink::schedule_report() {
  report_timer_.reset();
  auto t = loop_.add_timer_in(interval_us_, [this] { report_now(); });
  if (t.ok()) report_timer_ = std::move(t).value();
}

void ControlPlaneLink::lost() {
  if (accepted_) log_info(who_ + " lost the control plane; retrying", {{"ENDPOINT", endpoint()}});
  accepted_ = false;
  reaper_.reset();
  report_timer_.reset();
  watchdog_.reset();
  session_.reset();
  if (retry_timer_.active()) return;
  // The next replica, or a backoff after a round without a leader (cp_rotation.h).
  uint64_t delay = rotation_.next_delay_us();
  auto t = loop_.add_timer_in(delay, [this] { connect(); });
  if (t.ok()) retry_timer_ = std::move(t).value();
}

Status check_control_plane_endpoint(const std::string& value, const std::string& where,
                                    bool insecure, bool tls) {
  if (value.empty()) return {};
  auto list = split_endpoints(value);
  if (list.empty())
    return field_error(where, "'control_plane' must be unix:/path, /path or host:port");
  for (const auto& one : list) {
    auto ep = rpc::parse_endpoint(one);
    if (!ep.ok())
      return field_error(where,
                         "'control_plane' must be unix:/path, /path or host:port (or a "
                         "comma-separated list of them): \"" +
                             one + "\" is not");
    if (!ep->is_unix && !insecure && !tls)
      return field_error(where,
                         "a TCP control_plane needs TLS (control_plane_tls_ca, _cert, _key): "
                         "without it anyone who can bind that port could run tasks as root "
                         "here; use unix:/path, or set insecure_control_plane = true (tests)");
  }
  return {};
}

Status read_control_plane_tls(const TomlDoc& doc, const toml::table& t, ControlPlaneTls* out) {
  for (auto [key, dst] : {std::pair{"control_plane_tls_ca", &out->files.ca_file},
                          {"control_plane_tls_cert", &out->files.cert_file},
                          {"control_plane_tls_key", &out->files.key_file},
                          {"control_plane_tls_crl", &out->files.crl_file},
                          {"control_plane_name", &out->server_name}}) {
    TRY_ASSIGN(auto v, doc.get_string(t, key));
    if (v) *dst = *v;
  }
  bool any =
      !out->files.ca_file.empty() || !out->files.cert_file.empty() || !out->files.key_file.empty();
  if (!any) return {};
  auto where = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : doc.where(t); };
  for (auto [key, v] : {std::pair{"control_plane_tls_ca", &out->files.ca_file},
                        {"control_plane_tls_cert", &out->files.cert_file},
                        {"control_plane_tls_key", &out->files.key_file}})
    if (v->empty())
      return field_error(where(key), std::string("'") + key +
                                         "' is required with the other control_plane_tls keys");
  return {};
}

Result<std::unique_ptr<ControlPlaneLink>> make_control_plane_link(
    EventLoop& loop, const std::string& endpoint, const std::string& who,
    const rpc::Dispatcher* commands, ControlPlaneLink::Hello hello, ControlPlaneLink::Report report,
    bool insecure_tcp, const ControlPlaneTls& tls) {
  auto link = std::make_unique<ControlPlaneLink>(loop, endpoint, who, commands, std::move(hello),
                                                 std::move(report), insecure_tcp);
  if (tls.files.enabled()) {
    TRY(tls::check_config(tls.files, "control_plane_"));  // errors name this file's keys
    TRY_ASSIGN(auto ctx, tls::Context::create(tls.files, tls::Role::kClient));
    link->use_tls(std::move(ctx), tls.server_name);
  }
  return link;
}

Status check_control_plane_peer(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return sys_error("read the control plane's credentials");
  if (cred.uid == 0 || cred.uid == ::getuid()) return {};
  log_warn("refusing a control plane socket served by an unprivileged user",
           {{"PEER_UID", std::to_string(cred.uid)}, {"PEER_PID", std::to_string(cred.pid)}});
  return make_error("the control plane socket is served by uid " + std::to_string(cred.uid) +
                    ", not root")
      .with_code(rpc::kPermissionDenied);
}

Status check_machine_name(const std::string& field, const std::string& value, bool required) {
  if (value.empty()) return required ? field_error(field, "is required") : Status{};
  if (value.size() > kMaxMachineName)
    return field_error(field, "is longer than " + std::to_string(kMaxMachineName) + " characters");
  for (char c : value)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-')
      return field_error(field, "may hold letters, digits, '.', '_', ':' and '-' only");
  // Never "." or "..", nor an option: it names files, and is printed and completed.
  if (!std::isalnum(static_cast<unsigned char>(value[0])))
    return field_error(field, "must start with a letter or a digit");
  return {};
}

Status check_control_plane_tls_files(const ControlPlaneTls& tls) {
  if (!tls.files.enabled()) return {};
  return tls::check_config(tls.files, "control_plane_");
}

bool valid_profile_name(std::string_view n) {
  if (n.empty() || n.size() > 64 || n[0] == '.') return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string resolve_machine_id(const std::string& configured, const std::string& host_root) {
  if (!configured.empty()) return configured;
  auto id = read_file(HostPaths(host_root).etc("machine-id"));
  if (id.ok() && !trim(*id).empty()) return trim(*id);
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

void reload_control_plane_tls(ControlPlaneLink* link) {
  if (!link) {
    log_info("SIGHUP: no control plane configured; nothing to reload");
    return;
  }
  if (auto s = link->reload_tls(); !s.ok())
    log_error("SIGHUP: control-plane TLS files not reloaded; the previous ones stay in use: " +
              s.error().str());
  else
    log_info("SIGHUP: control-plane TLS files reloaded; the next connection uses them");
}

}  // namespace weft
