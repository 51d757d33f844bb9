#include "controlplane/exec_relay.h"

#include <vector>

#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;

namespace {

// What a caller's input may carry to the agent (the agent checks each again): the
// window's worth of bytes in base64, and a few numbers and flags.
constexpr size_t kMaxDataChars = 400 * 1024;

json input_fields(const json& p) {
  json q = json::object();
  if (auto d = p.find("data");
      d != p.end() && d->is_string() && d->get_ref<const std::string&>().size() <= kMaxDataChars)
    q["data"] = *d;
  for (const char* flag : {"eof", "close"})
    if (auto f = p.find(flag); f != p.end() && f->is_boolean()) q[flag] = *f;
  for (const char* number : {"ack", "rows", "cols"})
    if (auto n = p.find(number); n != p.end() && n->is_number_unsigned()) q[number] = *n;
  return q;
}

json output_fields(const json& p, bool exit) {
  json q = json::object();
  if (exit) {
    if (auto s = p.find("status"); s != p.end() && s->is_number_integer()) q["status"] = *s;
    if (auto e = p.find("error");
        e != p.end() && e->is_string() && e->get_ref<const std::string&>().size() <= 1024)
      q["error"] = *e;
    return q;
  }
  if (auto s = p.find("stream"); s != p.end() && (*s == "stdout" || *s == "stderr"))
    q["stream"] = *s;
  if (auto d = p.find("data");
      d != p.end() && d->is_string() && d->get_ref<const std::string&>().size() <= kMaxDataChars)
    q["data"] = *d;
  if (auto a = p.find("ack"); a != p.end() && a->is_number_unsigned()) q["ack"] = *a;
  return q;
}

}  // namespace

void ExecRelay::watch(rpc::Session* s) {
  if (watched_.count(s)) return;
  watched_[s] = true;
  std::weak_ptr<bool> alive = alive_;
  s->watch_close([this, alive, s] {
    if (alive.lock()) closed(s);
  });
}

Status ExecRelay::admit(rpc::Session* caller, MachineId m, const std::string& machine_name) const {
  if (!caller) return make_error("task.exec is served on sessions only");
  if (execs_.size() >= kMax)
    return make_error("the control plane carries " + std::to_string(kMax) + " execs already")
        .with_code(rpc::kConflict);
  size_t mine = 0;
  for (const auto& [id, e] : execs_) mine += e.caller == caller;
  if (mine >= kMaxPerCaller)
    return make_error("this connection has " + std::to_string(kMaxPerCaller) + " execs already")
        .with_code(rpc::kConflict);
  if (!agent_(m))
    return make_error("machine " + machine_name + " has no session with the control plane")
        .with_code(rpc::kUnavailable);
  return {};
}

void ExecRelay::start(rpc::Session* caller, MachineId m, const std::string& machine_name,
                      json params, rpc::ReplyFn reply) {
  if (auto s = admit(caller, m, machine_name); !s.ok()) return reply(std::move(s).error());
  rpc::Session* agent = agent_(m);
  const uint64_t id = ++next_;
  execs_[id] = Exec{caller, agent, 0};
  watch(caller);
  watch(agent);
  std::weak_ptr<bool> alive = alive_;
  agent->call("task.exec", std::move(params),
              [this, alive, id, agent, machine_name, reply](Result<json> r) {
                if (!alive.lock()) return;
                auto it = execs_.find(id);
                uint64_t n = r.ok() && r->is_object() && (*r).contains("exec") &&
                                     (*r)["exec"].is_number_unsigned()
                                 ? (*r)["exec"].get<uint64_t>()
                                 : 0;
                if (it == execs_.end()) {  // the caller left meanwhile: it goes
                  if (n != 0 && !agent->closed())
                    agent->notify("task.exec.input", json{{"exec", n}, {"close", true}});
                  return;
                }
                if (n == 0) {
                  execs_.erase(it);
                  if (!r.ok()) return reply(std::move(r).error());
                  return reply(make_error("machine " + machine_name + " did not start the exec"));
                }
                it->second.agent_exec = n;
                by_agent_[{agent, n}] = id;
                reply(json{{"exec", id}, {"machine", machine_name}});
              });
}

void ExecRelay::from_caller(rpc::Session* caller, const json& p) {
  if (!p.is_object() || !p.contains("exec") || !p["exec"].is_number_unsigned()) return;
  auto it = execs_.find(p["exec"].get<uint64_t>());
  if (it == execs_.end() || it->second.caller != caller || it->second.agent_exec == 0) return;
  json q = input_fields(p);
  q["exec"] = it->second.agent_exec;
  it->second.agent->notify("task.exec.input", std::move(q));
}

void ExecRelay::from_agent(rpc::Session* agent, const json& p, bool exit) {
  if (!p.is_object() || !p.contains("exec") || !p["exec"].is_number_unsigned()) return;
  const uint64_t n = p["exec"].get<uint64_t>();
  auto b = by_agent_.find({agent, n});
  if (b == by_agent_.end()) {
    // Nobody reads it (its caller left): the agent stops it.
    if (!exit) agent->notify("task.exec.input", json{{"exec", n}, {"close", true}});
    return;
  }
  const uint64_t id = b->second;
  auto it = execs_.find(id);
  json q = output_fields(p, exit);
  q["exec"] = id;
  if (it != execs_.end())
    it->second.caller->notify(exit ? "task.exec.exit" : "task.exec.output", std::move(q));
  if (exit) {
    by_agent_.erase(b);
    execs_.erase(id);
  }
}

void ExecRelay::closed(rpc::Session* s) {
  watched_.erase(s);
  std::vector<uint64_t> gone;
  for (const auto& [id, e] : execs_)
    if (e.caller == s || e.agent == s) gone.push_back(id);
  for (uint64_t id : gone) {
    Exec e = execs_[id];
    execs_.erase(id);
    if (e.agent_exec != 0) by_agent_.erase({e.agent, e.agent_exec});
    if (e.caller == s) {
      if (e.agent_exec != 0 && !e.agent->closed())
        e.agent->notify("task.exec.input", json{{"exec", e.agent_exec}, {"close", true}});
    } else if (!e.caller->closed()) {
      e.caller->notify("task.exec.exit",
                       json{{"exec", id}, {"error", "the machine's agent went away"}});
    }
  }
}

}  // namespace weft::cp
