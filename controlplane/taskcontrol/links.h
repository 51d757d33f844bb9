// The control plane's sessions to TaskControllers (docs/taskcontrol.md). One link per job
// that names a controller: it connects (never blocking the loop), sends
// `taskcontrol.plan` with a sequence number whenever asked (one call unanswered at a
// time; an ask meanwhile goes when the answer comes), checks the answer (the same
// sequence number, a list of operation ids) and hands the acknowledged ids over. A
// controller that has not answered an ask within its timeout (connect refused, hung,
// malformed answers) is reported unreachable, and reachable again at its next good
// answer. A hung call is abandoned (the session closed) after the timeout; reconnects
// back off from 0.5 s to 30 s.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event.h"
#include "common/job_spec.h"
#include "common/result.h"
#include "common/rpc/client.h"
#include "common/tls.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"

namespace weft::cp {

// The controller's answer to taskcontrol.plan: {"seq": <the call's>, "ack": [op id, ...]}.
// Errors name the field. At most kMaxAcks ids of at most 300 characters.
inline constexpr size_t kMaxAcks = 100000;
Result<std::vector<std::string>> parse_plan_answer(const nlohmann::json& r, uint64_t seq);

class TaskControlLinks {
 public:
  struct Token {};
  struct Hooks {
    // The plan's params for this job (the link adds "seq").
    std::function<nlohmann::json(const std::string& job)> plan;
    // A good answer: the operation ids the controller acknowledged.
    std::function<void(const std::string& job, const std::vector<std::string>& acks)> acked;
    // The controller became unreachable (true) or answered again (false).
    std::function<void(const std::string& job, bool unreachable)> reachability;
  };
  TaskControlLinks(EventLoop& loop, Hooks hooks) : loop_(loop), hooks_(std::move(hooks)) {}
  // Mutual TLS (a client context with the control plane's certificate) on every TCP
  // controller session from now on, verifying the controller's certificate names the
  // job's task_controller.identity. Without it sessions are plaintext (a control plane
  // without TLS, for development). Unix-socket controllers are local: never TLS.
  // A null context with the control plane's TLS configured (its client context could not
  // be made): TCP controllers are not spoken to at all, never in plaintext.
  void set_tls(std::shared_ptr<tls::Context> ctx) {
    tls_ = std::move(ctx);
    tls_required_ = true;
  }
  ~TaskControlLinks();
  TaskControlLinks(const TaskControlLinks&) = delete;
  TaskControlLinks& operator=(const TaskControlLinks&) = delete;

  // The jobs that name a controller now: links for new ones, a new link when the address
  // changed, none for jobs gone.
  void sync(const std::map<std::string, TaskControllerSpec>& jobs);
  // Sends the job's plan now (or when the call in flight is answered).
  void ask(const std::string& job, uint64_t now_us);
  // Checks timeouts (call it every few hundred ms or more often).
  void check(uint64_t now_us);
  bool unreachable(const std::string& job) const;
  bool has(const std::string& job) const { return links_.count(job) != 0; }
  size_t size() const { return links_.size(); }

 private:
  struct Link {
    std::string job;
    TaskControllerSpec spec;
    std::unique_ptr<rpc::ConnectAttempt> attempt;
    std::unique_ptr<rpc::Session> session;
    Source retry, later;
    uint64_t backoff_us = 500'000;
    uint64_t seq = 0;
    bool in_flight = false, again = false, unreachable = false;
    uint64_t sent_us = 0;
    uint64_t waiting_since_us = 0;  // the oldest ask not answered yet (0: none)
    // Callbacks hold it weakly: a link dropped (its job gone) while a connect or a call
    // is under way is never touched again. Last, so that it goes first.
    std::shared_ptr<Token> token = std::make_shared<Token>();
  };
  void connect(Link& l);
  void send(Link& l, uint64_t now_us);
  void drop_session(Link& l);
  void retry_later(Link& l);
  void answered(Link& l, Result<nlohmann::json> r, uint64_t seq);

  std::shared_ptr<tls::Context> tls_;
  bool tls_required_ = false;
  EventLoop& loop_;
  Hooks hooks_;
  std::map<std::string, std::unique_ptr<Link>> links_;
};

// The plan a job's TaskController is asked about (docs/taskcontrol.md): the job's tasks
// (machine, state, readiness), the operations that wait for its consent (a task on a
// machine with planned maintenance names the event and its deadline), that maintenance
// from its notice on, and `completed`: the operations done since it last acknowledged.
// A pure function of the scheduler, the allocator and the maintenance calendar.
nlohmann::json build_plan(const std::string& job, const Scheduler& sched, const Allocator& alloc,
                          const Maintenance& maintenance,
                          const std::vector<std::string>& completed);

}  // namespace weft::cp
