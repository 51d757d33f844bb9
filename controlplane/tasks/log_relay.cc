#include "controlplane/tasks/log_relay.h"

#include <algorithm>

#include "common/clock.h"
#include "common/rpc/protocol.h"

namespace weft::cp {

using nlohmann::json;

namespace {

constexpr uint64_t kPollUs = 250'000;  // a long poll asks the agent again this often
// Per connection: 4 MiB/s, bursts of 1 MiB. A read asks for no more than is left; below
// kMinGrant it waits for the bucket to fill.
constexpr double kBytesPerUs = 4.0 * 1024 * 1024 / 1e6;
constexpr double kBurst = 1024 * 1024;
constexpr double kMinGrant = 4096;

bool terminal_name(const std::string& s) {
  return s == "exited" || s == "failed" || s == "stopped";
}

}  // namespace

LogRelay::Peer& LogRelay::peer(rpc::Session* s) {
  auto [it, fresh] = peers_.try_emplace(s);
  if (fresh) {
    it->second.tokens = kBurst;
    it->second.at_us = now_monotonic_us();
    s->watch_close([this, s] {
      peers_.erase(s);
      for (auto& [id, r] : reads_)
        if (r->caller == s) r->caller = nullptr;
    });
  }
  return it->second;
}

Status LogRelay::admit(rpc::Session* caller, const std::string& who) {
  if (peer(caller).in_flight >= kMaxPerConnection || reads_.size() >= kMaxReads)
    return make_error("too many log reads in flight; try again").with_code(rpc::kUnavailable);
  // (At most kMaxReads reads to count: no index kept for this.)
  if (static_cast<size_t>(std::count_if(reads_.begin(), reads_.end(), [&](const auto& r) {
        return r.second->read.who == who;
      })) >= kMaxPerIdentity)
    return make_error(who + " has " + std::to_string(kMaxPerIdentity) +
                      " log reads in flight, the most one identity may; try again")
        .with_code(rpc::kUnavailable);
  return {};
}

bool LogRelay::first_read(rpc::Session* caller, const std::string& task) {
  Peer& p = peer(caller);
  if (!p.audited.insert(task).second) return false;
  if (p.audited.size() > 4096) p.audited.clear();  // bounded; audited again later
  return true;
}

void LogRelay::start(rpc::Session* caller, Read read) {
  auto r = std::make_unique<InFlight>();
  r->reply = caller->defer_reply();
  r->caller = caller;
  r->deadline_us = now_monotonic_us() + read.wait_us;
  r->read = std::move(read);
  ++peer(caller).in_flight;
  uint64_t id = next_id_++;
  reads_.emplace(id, std::move(r));
  step(id);
}

void LogRelay::step(uint64_t id) {
  auto it = reads_.find(id);
  if (it == reads_.end()) return;
  InFlight& r = *it->second;
  if (!r.caller) return done(id, make_error("the caller went away"));
  Peer& p = peers_[r.caller];
  uint64_t now = now_monotonic_us();
  p.tokens = std::min(kBurst, p.tokens + static_cast<double>(now - p.at_us) * kBytesPerUs);
  p.at_us = now;
  if (p.tokens < kMinGrant) {
    // Over its rate: this read waits for the bucket, however long it may wait.
    auto wait = static_cast<uint64_t>((kMinGrant - p.tokens) / kBytesPerUs) + 1;
    auto t = loop_.add_timer_in(wait, [this, id] { step(id); });
    if (!t.ok()) return done(id, std::move(t).error());
    r.timer = std::move(t).value();
    return;
  }
  rpc::Session* agent = hooks_.agent(r.read.machine);
  if (!agent)
    return done(id, make_error("machine " + hooks_.machine_name(r.read.machine) +
                               " is not connected; the logs of " + r.read.task + " are on it")
                        .with_code(rpc::kUnavailable));
  json ask = r.read.ask;
  ask["max_bytes"] = std::min<size_t>(r.read.max_bytes, static_cast<size_t>(p.tokens));
  agent->call("task.logs", std::move(ask), [this, id](Result<json> got) {
    auto found = reads_.find(id);
    if (found == reads_.end()) return;
    InFlight& read = *found->second;
    const std::string machine = hooks_.machine_name(read.read.machine);
    if (!got.ok()) {
      Error e = std::move(got).error();
      if (e.code == rpc::kMethodNotFound)
        e = make_error("the agent of machine " + machine +
                       " is too old to serve logs to the control plane")
                .with_code(rpc::kUnavailable);
      return done(id, std::move(e).wrap("machine " + machine));
    }
    json j = std::move(got).value();
    if (!j.is_object() || !j.contains("data") || !j["data"].is_string())
      return done(id, make_error("machine " + machine + " sent a malformed log chunk"));
    std::string state =
        j.contains("state") && j["state"].is_string() ? j["state"].get<std::string>() : "";
    const auto& data = j["data"].get_ref<const std::string&>();
    if (read.caller) peers_[read.caller].tokens -= static_cast<double>(data.size());
    bool more_later =
        data.empty() && !terminal_name(state) && now_monotonic_us() + kPollUs < read.deadline_us;
    if (!more_later) {
      j["task"] = read.read.task;
      j["machine"] = machine;
      return done(id, std::move(j));
    }
    // A long poll: nothing new yet; ask again from the cursor the agent gave.
    read.read.ask.erase("tail");
    if (j.contains("cursor")) read.read.ask["cursor"] = j["cursor"];
    auto t = loop_.add_timer_in(kPollUs, [this, id] { step(id); });
    if (!t.ok()) return done(id, std::move(t).error());
    read.timer = std::move(t).value();
  });
}

void LogRelay::done(uint64_t id, Result<json> r) {
  auto it = reads_.find(id);
  if (it == reads_.end()) return;
  std::unique_ptr<InFlight> read = std::move(it->second);
  reads_.erase(it);
  if (read->caller)
    if (auto p = peers_.find(read->caller); p != peers_.end()) --p->second.in_flight;
  read->reply(std::move(r));
}

}  // namespace weft::cp
