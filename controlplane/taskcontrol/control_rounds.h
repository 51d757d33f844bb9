// TaskControl's rounds (docs/taskcontrol.md): the links to every controlled job's
// TaskController kept in step with the jobs every second (a controller that is a task of
// another job follows that task), each one's plan asked every second and on change, the
// operations it acknowledges granted by the scheduler, and the fallback when it cannot
// be reached. The Manager owns one and gives it the scheduler, allocator and maintenance
// calendar to read, and three hooks: where a controller task is reached, and what to do
// with the commands a grant or a fallback produced.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event.h"
#include "common/tls.h"
#include "controlplane/machines/machine_links.h"
#include "controlplane/maintenance/maintenance.h"
#include "controlplane/scheduling/allocator.h"
#include "controlplane/scheduling/scheduler.h"
#include "controlplane/taskcontrol/links.h"

namespace weft::cp {

class ControlRounds {
 public:
  struct Hooks {
    // Where a controller that is a task of another job is reached now ("" = none ready).
    std::function<std::string(const TaskControllerSpec&)> address;
    // The scheduler granted `acks` of `job`: these commands are to be written and sent.
    std::function<void(const std::string& job, const std::vector<std::string>& acks,
                       std::vector<Command> cmds)>
        granted;
    // A fallback's commands (the controller unreachable, or back).
    std::function<void(std::vector<Command> cmds)> apply;
  };
  ControlRounds(EventLoop& loop, Scheduler& sched, const Allocator& alloc,
                const Maintenance& maintenance, Hooks hooks);
  // The first round; `tls`: the control plane's client context for TCP controllers
  // (null with TLS configured: TCP controllers are not spoken to).
  void start(bool use_tls, std::shared_ptr<tls::Context> tls);
  // A round now (a new controller, or new operations to ask about).
  void round();
  // The job's plan now, if it has a controller.
  void ask(const std::string& job);
  bool unreachable(const std::string& job) const { return links_->unreachable(job); }

 private:
  nlohmann::json plan(const std::string& job);
  void acked(const std::string& job, const std::vector<std::string>& acks);
  void reachability(const std::string& job, bool unreachable);

  EventLoop& loop_;
  Scheduler& sched_;
  const Allocator& alloc_;
  const Maintenance& maintenance_;
  Hooks hooks_;
  std::unique_ptr<TaskControlLinks> links_;
  std::map<std::string, std::vector<std::string>> completed_;  // not yet told
  Source timer_;
};

// The address of a controller named by its job (task_controller.job): its first ready
// task's machine (the agent session's address) and the port; "" when none is ready.
std::string controller_address(const Scheduler& sched, const MachineSessions& sessions,
                               const TaskControllerSpec& c);

}  // namespace weft::cp
