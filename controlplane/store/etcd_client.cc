#include "controlplane/store/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <mutex>

#include "common/fs.h"
#include "etcd/rpc.grpc.pb.h"

namespace weft::etcd {

namespace pb = etcdserverpb;

namespace {

constexpr size_t kPage = 1000;
constexpr int kMaxAnswer = 256 << 20;  // a page of keys is far smaller

Kv to_kv(const pb::KeyValue& k) {
  Kv kv;
  kv.key = k.key();
  kv.value = k.value();
  kv.create_revision = k.create_revision();
  kv.mod_revision = k.mod_revision();
  kv.lease = k.lease();
  return kv;
}

std::vector<Kv> to_kvs(const pb::RangeResponse& r) {
  std::vector<Kv> out;
  out.reserve(static_cast<size_t>(r.kvs_size()));
  for (const auto& k : r.kvs()) out.push_back(to_kv(k));
  return out;
}

std::chrono::system_clock::time_point deadline_in(uint64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// A member that cannot be reached, or did not answer in time: another may serve.
bool try_next(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

struct Client::Impl {
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
  };
  std::vector<Member> members;
  std::mutex mu;
  grpc::ClientContext* waiting = nullptr;  // the wait_deleted() in progress

  // Runs `rpc` on the current member, then each other once; the first answer ends it.
  template <class Rpc>
  Status call(Client& c, const char* what, Rpc rpc) {
    std::string last_error;
    for (size_t tried = 0; tried < members.size(); ++tried) {
      Member& m = members[c.current_];
      // A member gRPC knows to be unreachable is passed over while another may answer.
      if (tried + 1 < members.size() &&
          m.channel->GetState(true) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        last_error = m.endpoint + ": unreachable";
        c.current_ = (c.current_ + 1) % members.size();
        continue;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline_in(c.cfg_.timeout_ms));
      // Waits for the connection (within the deadline) rather than failing at once while
      // it is being made: the calling thread is then the one that drives it.
      ctx.set_wait_for_ready(true);
      grpc::Status st = rpc(m, ctx);
      if (st.ok()) return {};
      last_error = m.endpoint + ": " + st.error_message();
      if (!try_next(st)) return make_error(std::string("etcd ") + what + " at " + last_error);
      c.current_ = (c.current_ + 1) % members.size();
    }
    return make_error(std::string("no etcd member answered ") + what + ": " + last_error);
  }
};

Result<std::vector<Kv>> parse_range(const std::string& wire) {
  pb::RangeResponse r;
  if (!r.ParseFromString(wire)) return make_error("etcd answered a malformed range");
  return to_kvs(r);
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Client::Client(Config cfg) : cfg_(std::move(cfg)), impl_(std::make_unique<Impl>()) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::create(Config cfg) {
  if (cfg.endpoints.empty()) return field_error("endpoints", "names no etcd member");
  std::shared_ptr<grpc::ChannelCredentials> tls;
  for (const auto& e : cfg.endpoints) {
    bool https = e.rfind("https://", 0) == 0;
    if (!https && e.rfind("http://", 0) != 0)
      return field_error("endpoints", "\"" + e + "\" is not an http:// or https:// URL");
    if (https && !tls) {
      grpc::SslCredentialsOptions o;
      if (!cfg.ca.empty()) {
        TRY_ASSIGN(o.pem_root_certs, read_file(cfg.ca));
      }
      if (!cfg.cert.empty()) {
        TRY_ASSIGN(o.pem_cert_chain, read_file(cfg.cert));
      }
      if (!cfg.key.empty()) {
        TRY_ASSIGN(o.pem_private_key, read_file(cfg.key));
      }
      tls = grpc::SslCredentials(o);
    }
  }
  std::unique_ptr<Client> c(new Client(std::move(cfg)));
  for (const auto& e : c->cfg_.endpoints) {
    bool https = e.rfind("https://", 0) == 0;
    std::string target = e.substr(https ? 8 : 7);
    while (!target.empty() && target.back() == '/') target.pop_back();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxAnswer);
    // A member back from a restart is found again within a second, not after gRPC's
    // default backoff (up to two minutes). (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left
    // alone: it is also the connect timeout, and calls have deadlines of their own.)
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    Impl::Member m;
    m.endpoint = e;
    m.channel =
        grpc::CreateCustomChannel(target, https ? tls : grpc::InsecureChannelCredentials(), args);
    m.kv = pb::KV::NewStub(m.channel);
    m.lease = pb::Lease::NewStub(m.channel);
    m.watch = pb::Watch::NewStub(m.channel);
    c->impl_->members.push_back(std::move(m));
  }
  return c;
}

Result<std::vector<Kv>> Client::range(const std::string& key, const std::string& end, size_t limit,
                                      bool descend, int64_t at_revision, int64_t* header_revision) {
  pb::RangeRequest req;
  req.set_key(key);
  if (!end.empty()) req.set_range_end(end);
  req.set_limit(static_cast<int64_t>(limit));
  if (at_revision > 0) req.set_revision(at_revision);
  if (descend) {
    req.set_sort_order(pb::RangeRequest::DESCEND);
    req.set_sort_target(pb::RangeRequest::KEY);
  }
  pb::RangeResponse resp;
  TRY(impl_->call(*this, "range", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.kv->Range(&ctx, req, &resp);
  }));
  if (header_revision) *header_revision = resp.header().revision();
  return to_kvs(resp);
}

Result<std::vector<Kv>> Client::range_prefix(const std::string& prefix, int64_t* revision) {
  std::vector<Kv> all;
  std::string from = prefix, end = prefix_end(prefix);
  int64_t at = 0;  // the first page's revision: every later page is read at it
  for (;;) {
    TRY_ASSIGN(auto page, range(from, end, kPage, false, at, at == 0 ? &at : nullptr));
    if (revision) *revision = at;
    size_t n = page.size();
    for (auto& kv : page) all.push_back(std::move(kv));
    if (n < kPage) return all;
    from = all.back().key + std::string(1, '\0');
  }
}

Result<std::vector<Kv>> Client::last(const std::string& prefix, size_t limit) {
  return range(prefix, prefix_end(prefix), limit, true);
}

Result<std::optional<Kv>> Client::get(const std::string& key) {
  TRY_ASSIGN(auto kvs, range(key, "", 1, false));
  if (kvs.empty()) return std::optional<Kv>();
  return std::optional<Kv>(std::move(kvs.front()));
}

Result<TxnResult> Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& ops) {
  pb::TxnRequest req;
  for (const auto& c : compares) {
    pb::Compare* cmp = req.add_compare();
    cmp->set_key(c.key);
    cmp->set_result(pb::Compare::EQUAL);
    if (c.target == Compare::Target::kCreate) {
      cmp->set_target(pb::Compare::CREATE);
      cmp->set_create_revision(c.create_revision);
    } else {
      cmp->set_target(pb::Compare::VALUE);
      cmp->set_value(c.value);
    }
  }
  for (const auto& o : ops) {
    pb::RequestOp* op = req.add_success();
    switch (o.kind) {
      case Op::Kind::kPut: {
        pb::PutRequest* put = op->mutable_request_put();
        put->set_key(o.key);
        put->set_value(o.value);
        if (o.lease) put->set_lease(o.lease);
        break;
      }
      case Op::Kind::kDelete:
        op->mutable_request_delete_range()->set_key(o.key);
        break;
      case Op::Kind::kDeleteRange: {
        pb::DeleteRangeRequest* del = op->mutable_request_delete_range();
        del->set_key(o.key);
        del->set_range_end(o.range_end);
        break;
      }
    }
  }
  pb::TxnResponse resp;
  TRY(impl_->call(*this, "transaction", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.kv->Txn(&ctx, req, &resp);
  }));
  TxnResult r;
  r.succeeded = resp.succeeded();
  r.revision = resp.header().revision();
  return r;
}

Result<int64_t> Client::lease_grant(int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  TRY(impl_->call(*this, "lease grant", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.lease->LeaseGrant(&ctx, req, &resp);
  }));
  if (resp.id() == 0) return make_error("etcd granted no lease: " + resp.error());
  return resp.id();
}

Result<int64_t> Client::lease_keepalive(int64_t id) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(id);
  pb::LeaseKeepAliveResponse resp;
  TRY(impl_->call(*this, "lease keepalive", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    // One request and its answer on a stream of its own: the call's deadline bounds it.
    auto stream = m.lease->LeaseKeepAlive(&ctx);
    bool answered = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    if (answered) ctx.TryCancel();  // the answer is here: no need to wait for the end
    grpc::Status st = stream->Finish();
    if (answered) return grpc::Status::OK;
    return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended unanswered")
                   : st;
  }));
  return resp.ttl();  // 0: the lease is gone
}

Status Client::lease_revoke(int64_t id) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  pb::LeaseRevokeResponse resp;
  return impl_->call(*this, "lease revoke", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.lease->LeaseRevoke(&ctx, req, &resp);
  });
}

Status Client::ping() {
  TRY(get("weft-ping"));
  return {};
}

Result<bool> Client::wait_deleted(const std::string& key, int64_t after_revision,
                                  uint64_t timeout_ms) {
  return watch_until(key, "", after_revision, timeout_ms, true);
}

Result<bool> Client::wait_changed(const std::string& prefix, int64_t after_revision,
                                  uint64_t timeout_ms) {
  return watch_until(prefix, prefix_end(prefix), after_revision, timeout_ms, false);
}

Result<bool> Client::watch_until(const std::string& key, const std::string& range_end,
                                 int64_t after_revision, uint64_t timeout_ms, bool deletes_only) {
  Impl::Member& m = impl_->members[current_];
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_in(timeout_ms));
  ctx.set_wait_for_ready(true);
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->waiting = &ctx;
  }
  pb::WatchRequest req;
  pb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(key);
  if (!range_end.empty()) create->set_range_end(range_end);
  create->set_start_revision(after_revision + 1);
  if (deletes_only) create->add_filters(pb::WatchCreateRequest::NOPUT);
  bool fired = false;
  auto stream = m.watch->Watch(&ctx);
  if (stream->Write(req)) {
    pb::WatchResponse resp;
    while (!fired && stream->Read(&resp)) {
      // Compacted past our revision, or cancelled by etcd: read again.
      if (resp.compact_revision() > 0 || resp.canceled()) fired = true;
      for (const auto& ev : resp.events()) fired |= !deletes_only || ev.type() == pb::Event::DELETE;
    }
  }
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->waiting = nullptr;
  }
  ctx.TryCancel();
  grpc::Status st = stream->Finish();
  if (fired) return true;
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      st.error_code() == grpc::StatusCode::CANCELLED)
    return false;
  current_ = (current_ + 1) % impl_->members.size();  // this member failed: another next
  return make_error("etcd watch at " + m.endpoint + ": " + st.error_message());
}

void Client::cancel_waits() {
  std::lock_guard<std::mutex> g(impl_->mu);
  if (impl_->waiting) impl_->waiting->TryCancel();
}

}  // namespace weft::etcd
