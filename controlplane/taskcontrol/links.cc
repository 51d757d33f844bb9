#include "controlplane/taskcontrol/links.h"

#include <algorithm>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {
constexpr uint64_t kMaxBackoffUs = 30'000'000;
}  // namespace

Result<std::vector<std::string>> parse_plan_answer(const json& r, uint64_t seq) {
  if (!r.is_object()) return field_error("result", "must be an object {seq, ack}");
  auto s = r.find("seq");
  if (s == r.end() || !s->is_number_integer() ||
      (!s->is_number_unsigned() && s->get<int64_t>() < 0) || s->get<uint64_t>() != seq)
    return field_error("seq", "must be the plan's sequence number " + std::to_string(seq));
  auto ack = r.find("ack");
  if (ack == r.end() || !ack->is_array())
    return field_error("ack", "must be a list of operation ids");
  if (ack->size() > kMaxAcks)
    return field_error("ack", "more than " + std::to_string(kMaxAcks) + " ids");
  std::vector<std::string> out;
  out.reserve(ack->size());
  for (const auto& id : *ack) {
    if (!id.is_string() || id.get_ref<const std::string&>().size() > 300)
      return field_error("ack", "must hold operation ids (strings of at most 300 characters)");
    out.push_back(id.get<std::string>());
  }
  return out;
}

TaskControlLinks::~TaskControlLinks() = default;

void TaskControlLinks::sync(const std::map<std::string, TaskControllerSpec>& jobs) {
  for (auto it = links_.begin(); it != links_.end();) {
    auto j = jobs.find(it->first);
    if (j == jobs.end() || !(j->second.address == it->second->spec.address))
      it = links_.erase(it);
    else
      ++it;
  }
  for (const auto& [job, spec] : jobs) {
    auto& l = links_[job];
    if (!l) {
      l = std::make_unique<Link>();
      l->job = job;
    }
    l->spec = spec;  // timeout and when_unreachable may change on an update
  }
}

void TaskControlLinks::ask(const std::string& job, uint64_t now) {
  auto it = links_.find(job);
  if (it == links_.end()) return;
  Link& l = *it->second;
  if (l.waiting_since_us == 0) l.waiting_since_us = now;
  if (l.in_flight) {
    l.again = true;
    return;
  }
  if (!l.session) {
    l.again = true;  // sent once connected
    if (!l.attempt && !l.retry.active()) connect(l);
    return;
  }
  send(l, now);
}

void TaskControlLinks::connect(Link& l) {
  auto ep = rpc::parse_endpoint(l.spec.address);
  // No address: a controller job with no ready task yet. Its asks time out (unreachable)
  // until one is ready, which is a new address and so a new link.
  if (!ep.ok()) return;
  std::weak_ptr<Token> alive = l.token;
  Link* link = &l;
  l.attempt = rpc::ConnectAttempt::start(
      loop_, *ep, l.spec.timeout_ms * 1000, [this, alive, link](Result<Fd> fd) {
        if (alive.expired()) return;
        Link& me = *link;
        me.attempt.reset();  // finished (ConnectAttempt allows its callback to destroy it)
        if (!fd.ok()) {
          log_debug("task controller not reachable",
                    {{"JOB", me.job}, {"ADDRESS", me.spec.address}, {"ERROR", fd.error().str()}});
          retry_later(me);
          return;
        }
        SSL* ssl = nullptr;
        auto target = rpc::parse_endpoint(me.spec.address);
        if (tls_required_ && target.ok() && !target->is_unix) {
          // Only the controller the job names: its certificate, from this CA, names it.
          auto r = !tls_ ? Result<SSL*>(make_error("no TLS context for task controllers"))
                   : me.spec.identity.empty()
                       ? Result<SSL*>(make_error("the job names no task_controller.identity"))
                       : tls_->new_ssl(fd->get(), me.spec.identity);
          if (!r.ok()) {
            log_warn("no TLS session to the task controller",
                     {{"JOB", me.job}, {"ADDRESS", me.spec.address}, {"ERROR", r.error().str()}});
            retry_later(me);
            return;
          }
          ssl = *r;
        }
        me.session =
            std::make_unique<rpc::Session>(loop_, std::move(fd).value(), rpc::Peer{}, nullptr);
        if (ssl) me.session->use_tls(ssl, me.spec.timeout_ms * 1000);
        me.session->set_on_close([this, alive, link] {
          if (alive.expired()) return;
          drop_session(*link);
        });
        if (!me.session->start().ok()) {
          drop_session(me);
          return;
        }
        if (me.again) send(me, now_monotonic_us());
      });
}

void TaskControlLinks::drop_session(Link& l) {
  l.in_flight = false;
  if (!l.session) return;
  // Not destroyed from inside its own callbacks: after this loop iteration.
  std::shared_ptr<rpc::Session> gone(std::move(l.session));
  gone->set_on_close({});
  gone->close();
  auto d = loop_.add_defer([gone] {});
  if (d.ok()) l.later = std::move(d).value();
  retry_later(l);
}

void TaskControlLinks::retry_later(Link& l) {
  std::weak_ptr<Token> alive = l.token;
  Link* link = &l;
  auto t = loop_.add_timer_in(l.backoff_us, [this, alive, link] {
    if (alive.expired()) return;
    link->retry.reset();
    if (link->again && !link->session && !link->attempt) connect(*link);
  });
  if (t.ok()) l.retry = std::move(t).value();
  l.backoff_us = std::min(l.backoff_us * 2, kMaxBackoffUs);
}

void TaskControlLinks::send(Link& l, uint64_t now) {
  // No session (a TLS handshake that failed at once closed it): the ask waits for the
  // next session, as when it was asked while connecting.
  if (!l.session) {
    l.again = true;
    return;
  }
  json params = hooks_.plan(l.job);
  uint64_t seq = ++l.seq;
  params["seq"] = seq;
  l.again = false;
  l.in_flight = true;
  l.sent_us = now;
  std::weak_ptr<Token> alive = l.token;
  Link* link = &l;
  l.session->call("taskcontrol.plan", std::move(params), [this, alive, link, seq](Result<json> r) {
    if (alive.expired()) return;
    answered(*link, std::move(r), seq);
  });
}

void TaskControlLinks::answered(Link& l, Result<json> r, uint64_t seq) {
  l.in_flight = false;
  Result<std::vector<std::string>> acks =
      r.ok() ? parse_plan_answer(*r, seq) : Result<std::vector<std::string>>(r.error());
  if (!acks.ok()) {
    log_warn("the task controller's answer is refused",
             {{"JOB", l.job}, {"ADDRESS", l.spec.address}, {"ERROR", acks.error().str()}});
    // Not an answer: the ask still waits (the timeout runs on), asked again next time.
    l.again = true;
    return;
  }
  l.backoff_us = 500'000;
  l.waiting_since_us = 0;
  std::string job = l.job;
  if (std::exchange(l.unreachable, false)) {
    log_info("task controller answering again", {{"JOB", job}, {"ADDRESS", l.spec.address}});
    hooks_.reachability(job, false);
  }
  hooks_.acked(job, *acks);
  // The hooks may have synced links away; look the job up again.
  auto it = links_.find(job);
  if (it != links_.end() && it->second->again && it->second->session && !it->second->in_flight)
    send(*it->second, now_monotonic_us());
}

void TaskControlLinks::check(uint64_t now) {
  std::vector<std::string> lost;
  for (auto& [job, lp] : links_) {
    Link& l = *lp;
    uint64_t timeout = l.spec.timeout_ms * 1000;
    if (l.in_flight && now - l.sent_us > timeout) drop_session(l);  // hung: try afresh
    if (l.waiting_since_us != 0 && now - l.waiting_since_us > timeout && !l.unreachable) {
      l.unreachable = true;
      lost.push_back(job);
    }
  }
  for (const auto& job : lost) {
    auto it = links_.find(job);
    if (it == links_.end()) continue;
    log_warn("task controller unreachable",
             {{"JOB", job},
              {"ADDRESS", it->second->spec.address},
              {"THEN", it->second->spec.wait_when_unreachable ? "waiting" : "max_unavailable"}});
    hooks_.reachability(job, true);
  }
}

bool TaskControlLinks::unreachable(const std::string& job) const {
  auto it = links_.find(job);
  return it != links_.end() && it->second->unreachable;
}

json build_plan(const std::string& job, const Scheduler& sched, const Allocator& alloc,
                const Maintenance& maintenance, const std::vector<std::string>& completed) {
  auto spec = sched.job(job);
  json tasks = json::array();
  for (const auto& t : sched.operations().controlled_tasks(job)) {
    json e{{"task", t.task},
           {"index", t.index},
           {"generation", t.generation},
           {"machine", alloc.spec(t.machine_id).name},
           {"state", task_state_name(t.state)},
           {"ready", t.ready}};
    if (!t.message.empty()) e["message"] = t.message;
    tasks.push_back(std::move(e));
  }
  // Planned maintenance of the machines the job's tasks run on (docs/maintenance.md):
  // the controller hears of it from the notice on, with the deadline.
  std::map<uint64_t, std::set<std::string>> notices;        // event -> the job's machines in it
  std::map<std::string, const MaintenanceEvent*> first_of;  // machine -> earliest event
  for (const auto& t : sched.operations().controlled_tasks(job)) {
    std::string name = alloc.spec(t.machine_id).name;
    for (const auto* e : maintenance.affecting(name)) {
      notices[e->id].insert(name);
      auto& f = first_of[name];
      if (!f || e->start_us < f->start_us) f = e;
    }
  }
  json pending = json::array();
  for (const auto& op : sched.operations().pending_operations(job)) {
    json o{{"op", op.id},
           {"kind", op.kind},
           {"task", op.task},
           {"index", op.index},
           {"reason", op.reason}};
    auto t = sched.tasks().find(op.task);
    if (t != sched.tasks().end()) {
      auto f = first_of.find(alloc.spec(t->second.machine).name);
      if (f != first_of.end()) {
        o["reason"] = "maintenance " + std::to_string(f->second->id) +
                      (f->second->reason.empty() ? "" : ": " + f->second->reason);
        o["maintenance"] = f->second->id;
        o["deadline"] = format_rfc3339(f->second->start_us);
      }
    }
    pending.push_back(std::move(o));
  }
  json windows = json::array();
  for (const auto& [id, machines] : notices) {
    const MaintenanceEvent& e = maintenance.events().at(id);
    windows.push_back({{"id", id},
                       {"machines", machines},
                       {"start", format_rfc3339(e.start_us)},
                       {"end", format_rfc3339(e.end_us())},
                       {"reason", e.reason},
                       {"reboot", e.reboot},
                       {"state", e.state}});
  }
  return json{{"job", job},
              {"generation", sched.generation(job)},
              {"count", spec ? spec->count : 0},
              {"max_unavailable", spec ? spec->max_unavailable : 0},
              {"tasks", std::move(tasks)},
              {"pending", std::move(pending)},
              {"maintenance", std::move(windows)},
              {"completed", completed}};
}

}  // namespace weft::cp
