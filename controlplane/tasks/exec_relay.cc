#include "controlplane/tasks/exec_relay.h"

#include <vector>

#include "common/rpc/protocol.h"

namespace weft::cp {

using json = nlohmann::json;

void ExecRelay::watch(rpc::Session* s) {
  if (watched_.count(s)) return;
  watched_[s] = true;
  std::weak_ptr<bool> alive = alive_;
  s->watch_close([this, alive, s] {
    if (alive.lock()) closed(s);
  });
}

Status ExecRelay::admit(rpc::Session* caller, const std::string& who, bool shared) const {
  if (!caller) return make_error("task.exec is served on sessions only");
  if (execs_.size() >= kMax)
    return make_error("this control plane carries " + std::to_string(kMax) + " execs already")
        .with_code(rpc::kConflict);
  size_t mine = 0, theirs = 0;
  for (const auto& [id, e] : execs_) {
    mine += e.caller == caller;
    theirs += e.who == who;
  }
  if (!shared && mine >= kMaxPerCaller)
    return make_error("this connection has " + std::to_string(kMaxPerCaller) + " execs already")
        .with_code(rpc::kConflict);
  if (theirs >= kMaxPerOperator)
    return make_error(who + " has " + std::to_string(kMaxPerOperator) + " execs already")
        .with_code(rpc::kConflict);
  return {};
}

void ExecRelay::start(rpc::Session* caller, const std::string& who, rpc::Session* upstream,
                      const std::string& method, json params, rpc::ReplyFn reply, bool shared) {
  if (auto s = admit(caller, who, shared); !s.ok()) return reply(std::move(s).error());
  if (!upstream)
    return reply(make_error(upstream_ + " is unreachable now").with_code(rpc::kUnavailable));
  const uint64_t id = ++next_;
  Exec& e = execs_[id];
  e.caller = caller;
  e.upstream = upstream;
  e.who = who;
  watch(caller);
  watch(upstream);
  std::weak_ptr<bool> alive = alive_;
  upstream->call(method, std::move(params), [this, alive, id, upstream, reply](Result<json> r) {
    if (!alive.lock()) return;
    auto it = execs_.find(id);
    uint64_t n =
        r.ok() && r->is_object() && (*r).contains("exec") && (*r)["exec"].is_number_unsigned()
            ? (*r)["exec"].get<uint64_t>()
            : 0;
    if (it == execs_.end()) {  // the caller left meanwhile: it goes
      if (n != 0 && !upstream->closed())
        upstream->notify("task.exec.input", json{{"exec", n}, {"close", true}});
      return;
    }
    if (n == 0) {
      execs_.erase(it);
      if (!r.ok()) return reply(std::move(r).error());
      return reply(make_error(upstream_ + " did not start the exec"));
    }
    it->second.upstream_exec = n;
    by_upstream_[{upstream, n}] = id;
    json out = std::move(r).value();
    out["exec"] = id;
    reply(std::move(out));
  });
}

void ExecRelay::end(uint64_t id, const std::string& why) {
  auto it = execs_.find(id);
  if (it == execs_.end()) return;
  Exec e = std::move(it->second);
  execs_.erase(it);
  if (e.upstream_exec != 0) {
    by_upstream_.erase({e.upstream, e.upstream_exec});
    if (!e.upstream->closed())
      e.upstream->notify("task.exec.input", json{{"exec", e.upstream_exec}, {"close", true}});
  }
  if (!e.caller->closed()) e.caller->notify("task.exec.exit", json{{"exec", id}, {"error", why}});
}

void ExecRelay::from_caller(rpc::Session* caller, const json& p) {
  if (!p.is_object() || !p.contains("exec") || !p["exec"].is_number_unsigned()) return;
  const uint64_t id = p["exec"].get<uint64_t>();
  auto it = execs_.find(id);
  if (it == execs_.end() || it->second.caller != caller || it->second.upstream_exec == 0) return;
  json q = exec_input_fields(p);
  if (q.contains("ack")) {
    Result<std::optional<uint64_t>> ack = it->second.window.ack(*caller, q["ack"].get<uint64_t>());
    if (!ack.ok()) return end(id, ack.error().message);
    if (*ack)
      q["ack"] = **ack;
    else
      q.erase("ack");
  }
  if (q.empty()) return;
  q["exec"] = it->second.upstream_exec;
  it->second.upstream->notify("task.exec.input", std::move(q));
}

void ExecRelay::from_upstream(rpc::Session* upstream, const json& p, bool exit) {
  if (!p.is_object() || !p.contains("exec") || !p["exec"].is_number_unsigned()) return;
  const uint64_t n = p["exec"].get<uint64_t>();
  auto b = by_upstream_.find({upstream, n});
  if (b == by_upstream_.end()) {
    // Nobody reads it (its caller left): the upstream stops it.
    if (!exit) upstream->notify("task.exec.input", json{{"exec", n}, {"close", true}});
    return;
  }
  const uint64_t id = b->second;
  auto it = execs_.find(id);
  json q = exec_output_fields(p, exit);
  q["exec"] = id;
  if (it != execs_.end()) {
    Exec& e = it->second;
    const uint64_t bytes =
        q.contains("data") ? base64_decoded_size(q["data"].get_ref<const std::string&>()) : 0;
    e.caller->notify(exit ? "task.exec.exit" : "task.exec.output", std::move(q));
    e.window.gave(*e.caller, bytes);
  }
  if (exit) {
    by_upstream_.erase(b);
    execs_.erase(id);
  }
}

void ExecRelay::closed(rpc::Session* s) {
  watched_.erase(s);
  std::vector<uint64_t> gone;
  for (const auto& [id, e] : execs_)
    if (e.caller == s || e.upstream == s) gone.push_back(id);
  for (uint64_t id : gone) {
    Exec e = std::move(execs_[id]);
    execs_.erase(id);
    if (e.upstream_exec != 0) by_upstream_.erase({e.upstream, e.upstream_exec});
    if (e.caller == s) {
      if (e.upstream_exec != 0 && !e.upstream->closed())
        e.upstream->notify("task.exec.input", json{{"exec", e.upstream_exec}, {"close", true}});
    } else if (!e.caller->closed()) {
      e.caller->notify("task.exec.exit", json{{"exec", id}, {"error", upstream_ + " went away"}});
    }
  }
}

}  // namespace weft::cp
