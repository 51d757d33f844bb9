#include "controlplane/region/checks.h"

#include "common/rpc/protocol.h"
#include "controlplane/region/etcd_worker.h"
#include "controlplane/region/records.h"

namespace weft::cp {

namespace {

Error refused(const std::string& what) {
  return make_error(what).with_code(rpc::kConflict);
}

std::string said(const std::optional<MoveRecord>& m) {
  if (!m) return "no move of it is recorded";
  return "its move is recorded at step " + m->step + " from " + m->from + " to " + m->to;
}

// The records of one entitlement, as read together.
struct Records {
  std::optional<MoveRecord> move;
  std::optional<std::string> home;
};

Result<Records> read_records(etcd::Client& c, const std::string& prefix, const std::string& name) {
  Records r;
  const std::string mk = move_key(prefix, name), hk = entitlement_home_key(prefix, name);
  TRY_ASSIGN(auto m, c.get(mk));
  if (m) {
    TRY_ASSIGN(MoveRecord rec, parse_move(mk, m->value));
    r.move = std::move(rec);
  }
  TRY_ASSIGN(auto h, c.get(hk));
  if (h) {
    TRY_ASSIGN(std::string shard, parse_entitlement_home(hk, h->value));
    r.home = std::move(shard);
  }
  return r;
}

}  // namespace

Status check_move_step(const std::string& name, const std::string& step, const std::string& me,
                       const std::string& other, const std::optional<MoveRecord>& move,
                       const std::optional<std::string>& home) {
  const bool at_export = move && move->step == "export";
  const bool at_release = move && move->step == "release";
  const bool at_rollback = move && move->step == "rollback";
  const bool home_mine = home && *home == me;
  bool ok = false;
  std::string wanted;
  if (step == "out") {
    ok = at_export && move->from == me && move->to == other;
    wanted = "a move from this shard to " + other + " at step export";
  } else if (step == "page") {
    ok = at_export && move->from == me;
    wanted = "a move from this shard at step export";
  } else if (step == "in") {
    ok = at_export && move->to == me && move->from == other;
    wanted = "a move from " + other + " to this shard at step export";
  } else if (step == "open") {
    // Asked again after the move ended: nothing moves, the answer is the first one's.
    ok = (at_release && move->to == me) || (!move && home_mine);
    wanted = "a move to this shard at step release";
  } else if (step == "forget") {
    ok = (at_release && move->from == me && move->to == other) ||
         (!move && home && *home == other && other != me);
    wanted =
        "a move from this shard to " + other + " at step release (or its home at " + other + ")";
  } else if (step == "drop") {
    ok = (at_rollback && move->to == me) || (!move && !home_mine);
    wanted = "a move to this shard at step rollback";
  } else if (step == "unfence") {
    ok = (at_rollback && move->from == me) || (!move && home_mine);
    wanted = "a move from this shard at step rollback";
  } else {
    return field_error("step", "must be out, page, in, open, forget, drop or unfence");
  }
  if (ok) return {};
  return refused("step " + step + " of entitlement " + name + " refused: it needs " + wanted +
                 " in etcd, and " + said(move) + " (its home: " + home.value_or("none") + ")");
}

Result<std::unique_ptr<RegionChecks>> RegionChecks::create(EventLoop& loop, etcd::Config cfg,
                                                           std::string prefix, std::string me) {
  TRY_ASSIGN(auto worker, EtcdWorker::create(loop, std::move(cfg)));
  return std::unique_ptr<RegionChecks>(
      new RegionChecks(std::move(worker), std::move(prefix), std::move(me)));
}

void RegionChecks::move_step(const std::string& name, const std::string& step,
                             const std::string& other, std::function<void(Status)> done) {
  std::weak_ptr<bool> alive = alive_;
  etcd_->post([prefix = prefix_, me = me_, name, step, other, done,
               alive](etcd::Client& c) -> EtcdWorker::Then {
    Result<Records> r = read_records(c, prefix, name);
    return [r = std::move(r), me, name, step, other, done, alive] {
      if (!alive.lock()) return;
      if (!r.ok())
        return done(make_error("cannot read the move's record from etcd: " + r.error().str())
                        .with_code(rpc::kUnavailable));
      done(check_move_step(name, step, me, other, r->move, r->home));
    };
  });
}

void RegionChecks::home_is_mine(const std::string& name, std::function<void(Status)> done) {
  std::weak_ptr<bool> alive = alive_;
  etcd_->post([prefix = prefix_, me = me_, name, done, alive](etcd::Client& c) -> EtcdWorker::Then {
    Result<Records> r = read_records(c, prefix, name);
    return [r = std::move(r), me, name, done, alive] {
      if (!alive.lock()) return;
      if (!r.ok())
        return done(make_error("cannot read the entitlement's home from etcd: " + r.error().str())
                        .with_code(rpc::kUnavailable));
      if (!r->home)
        return done(refused("entitlement " + name +
                            " has no home claimed in etcd: a front end claims it before it "
                            "carries the create here"));
      if (*r->home != me)
        return done(refused("entitlement " + name + "'s home in etcd is shard " + *r->home +
                            ", not this one"));
      done(Status{});
    };
  });
}

}  // namespace weft::cp
