// weft-hcs's manager: runs every probe each interval on the event loop, and single probes
// as soon as an event says their answer may have changed (a kernel log record, a link
// event from rtnetlink, a PSI trigger, an OOM kill from BPF). A sample worse than the
// probe's state is confirmed by re-sampling every confirm_interval, so entering FAILED
// takes fail_after samples in seconds. Keeps each probe's hysteresis state (persisted in
// sqlite so it survives a restart), records transitions, and answers the local API.
// Nothing is published as a verdict until one full probe cycle has run after start.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/cp_link.h"
#include "common/event.h"
#include "common/fs.h"
#include "common/link_watch.h"
#include "common/metrics.h"
#include "common/rpc/server.h"
#include "common/store.h"
#include "hcs/hcs_conf.h"
#include "hcs/kernel_probes.h"
#include "hcs/kmsg_reader.h"
#include "hcs/probes.h"

namespace weft::hcs {

class Manager {
 public:
  static Result<std::unique_ptr<Manager>> create(HcsConfig cfg);
  ~Manager();
  Status start();
  Status run() { return loop_->run(); }

 private:
  Manager(HcsConfig cfg, std::unique_ptr<EventLoop> loop)
      : cfg_(std::move(cfg)), loop_(std::move(loop)) {}
  void cycle();
  // Samples one probe now (an event, a confirmation) and feeds its hysteresis.
  void sample(Probe& p, uint64_t now_us);
  // A sample arrived (at once, or later from a script): hysteresis, history, persistence,
  // and a confirmation re-sample when it is a suspicion.
  void feed(Probe& p, Sample s, uint64_t now_us);
  void on_link(const LinkEvent& e);
  void add_probe(std::unique_ptr<Probe> p) { probes_.push_back(std::move(p)); }
  Status persist(const std::string& probe, const ProbeState& st);
  void record_transition(const std::string& probe, Health from, Health to,
                         const std::string& detail);
  void register_methods();
  // The API (api.cc): one handler per method, listed in register_methods' table.
  Result<nlohmann::json> api_health_verdict(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_health_probes(const nlohmann::json& p, const rpc::CallContext& c);
  Result<nlohmann::json> api_health_history(const nlohmann::json& p, const rpc::CallContext& c);
  nlohmann::json verdict_json() const;
  // The session to weft-controlplane (cfg_.control_plane): health.report with the
  // machine verdict on connect, on every change and every heartbeat interval.
  Status cp_start();
  void cp_check_verdict();

  HcsConfig cfg_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Db> db_;
  std::vector<std::unique_ptr<Probe>> probes_;
  std::vector<LinkProbe*> link_probes_;
  std::unique_ptr<LinkWatch> link_watch_;
  std::vector<std::pair<Fd, Source>> psi_triggers_;
  std::map<std::string, Source> confirm_;   // pending confirmation re-samples
  std::map<std::string, Source> deferred_;  // event samples held back by the rate limit
  std::map<std::string, uint64_t> last_event_sample_us_;  // rate limit for event samples
  std::map<std::string, ProbeState> states_;
  std::map<std::string, Sample> last_;
  bool published_ = false;
  bool cycled_ = false;  // the first cycle has started every probe
  std::unique_ptr<KmsgReader> kmsg_;
  Source timer_;
  Source sighup_;  // re-reads the control-plane TLS files
  rpc::Dispatcher methods_;
  std::unique_ptr<rpc::Server> server_;
  int weft_gid_ = -1;
  std::unique_ptr<ControlPlaneLink> cp_;
  std::string cp_reported_;  // the verdict last sent
  // Prometheus /metrics (docs/metrics.md).
  void register_metrics();
  struct Metrics {
    metrics::Registry registry;
    std::unique_ptr<metrics::HttpServer> http;
    metrics::HistogramVec probe_seconds{"probe"};
    std::map<std::pair<std::string, std::string>, uint64_t> samples;  // by probe, result
  } metrics_;
};

}  // namespace weft::hcs
