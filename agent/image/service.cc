#include "agent/image/service.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/units.h"

namespace weft::image {

using json = nlohmann::json;

// The registry client's sink over a store ingest.
// A blob of unknown size (a package) stops at `max` bytes: a server sending forever
// does not fill the disk. (Not in the anonymous namespace: Service::LayerJob holds one.)
namespace service_detail {
class IngestSink : public registry::BlobSink {
 public:
  // `size` < 0: unknown (a package), so at most `max` bytes.
  IngestSink(std::unique_ptr<BlobStore::Ingest> in, uint64_t* received, int64_t size, uint64_t max)
      : in_(std::move(in)), received_(received), size_(size), max_(size < 0 ? max : UINT64_MAX) {}
  uint64_t offset() const override { return in_->offset(); }
  std::optional<uint64_t> size() const override {
    if (size_ < 0) return std::nullopt;
    return static_cast<uint64_t>(size_);
  }
  Status restart() override { return in_->restart(); }
  Status append(const void* data, size_t n) override {
    if (in_->offset() + n > max_)
      return make_error("larger than " + format_size(max_) + " (the image cache's limit)");
    TRY(in_->append(data, n));
    *received_ += n;
    return {};
  }
  BlobStore::Ingest& ingest() { return *in_; }

 private:
  std::unique_ptr<BlobStore::Ingest> in_;
  uint64_t* received_;
  int64_t size_;
  uint64_t max_;
};
}  // namespace service_detail
using service_detail::IngestSink;

struct Service::Pull {
  std::string key;  // the reference as asked ("package <digest>" for a package)
  oci::ImageRef ref;
  std::string url;  // a package's
  struct Waiter {
    OnProgress progress;
    Done done;
  };
  std::map<uint64_t, Waiter> waiters;
  oci::Digest manifest_digest;
  oci::Manifest manifest;
  std::string config_bytes;
  std::set<std::string> waiting_layers;  // digests not yet unpacked
  bool failed = false;
  Source soon;
};

struct Service::LayerJob {
  oci::Layer layer;
  oci::ImageRef ref;  // the repository to fetch it from
  std::string url;    // or, for a package, its URL
  std::set<std::string> pulls;
  uint64_t received = 0;  // bytes of this download (a resumed one counts from its offset)
  std::unique_ptr<IngestSink> sink;
  BlobStore::Unpacking unpacking;
  Source watch;
};

Result<std::unique_ptr<Service>> Service::open(EventLoop& loop, std::string root,
                                               ServiceConfig cfg) {
  std::unique_ptr<Service> s(new Service(loop, std::move(cfg)));
  TRY_ASSIGN(s->store_, BlobStore::open(root));
  TRY_ASSIGN(s->client_, registry::Client::create(loop, s->cfg_.registry));
  Service* self = s.get();
  s->cache_ = std::make_unique<Cache>(*s->store_, s->cfg_.cache_max_bytes,
                                      [self](const std::string& d) { return self->busy(d); });
  TRY(s->cache_->load());
  return s;
}

Service::Service(EventLoop& loop, ServiceConfig cfg) : loop_(loop), cfg_(std::move(cfg)) {}
Service::~Service() = default;

// ------------------------------------------------------------------ pulls

uint64_t Service::pull(const std::string& ref, OnProgress progress, Done done) {
  return enqueue(ref, std::move(progress), std::move(done), [](Pull&) {});
}

uint64_t Service::pull_package(const std::string& url, const oci::Digest& d, OnProgress progress,
                               Done done) {
  // One download per tarball, whichever URL names it.
  return enqueue("package " + d.str(), std::move(progress), std::move(done), [&](Pull& p) {
    p.url = url;
    p.manifest_digest = d;
  });
}

uint64_t Service::enqueue(const std::string& key, OnProgress progress, Done done,
                          const std::function<void(Pull&)>& init) {
  uint64_t ticket = next_ticket_++;
  tickets_[ticket] = key;
  auto& p = pulls_[key];
  bool fresh = !p;
  if (fresh) {
    p = std::make_unique<Pull>();
    p->key = key;
    init(*p);
  }
  p->waiters[ticket] = Pull::Waiter{std::move(progress), std::move(done)};
  if (fresh) {
    // Never from inside the call: the first step runs on the loop.
    auto src = loop_.add_defer([this, key] {
      auto it = pulls_.find(key);
      if (it != pulls_.end()) start_pull(*it->second);
    });
    if (src.ok())
      p->soon = std::move(src).value();
    else
      fail(key, src.error());
  }
  return ticket;
}

void Service::cancel(uint64_t ticket) {
  auto t = tickets_.find(ticket);
  if (t == tickets_.end()) return;
  auto p = pulls_.find(t->second);
  if (p != pulls_.end()) p->second->waiters.erase(ticket);
  tickets_.erase(t);
}

void Service::start_pull(Pull& p) {
  p.soon.reset();
  if (!p.url.empty()) {  // a package: one layer, its own digest, nothing else to ask
    oci::Layer l;
    l.blob.media_type = "application/x-tar";
    l.blob.digest = p.manifest_digest;
    l.blob.size = -1;
    p.manifest.layers = {l};
    if (cache_->local_package(p.manifest_digest)) return maybe_finish(p);
    return fetch_layers(p);
  }
  auto ref = oci::parse_image_ref(p.key);
  if (!ref.ok()) return fail(p.key, ref.error());
  p.ref = *ref;
  // Pinned by digest and already here: nothing to ask the registry.
  if (auto img = cache_->local(p.key); img && p.ref.digest) {
    p.manifest_digest = img->manifest;
    return maybe_finish(p);
  }
  std::string key = p.key;
  client_->manifest(p.ref, [this, key](Result<registry::FetchedManifest> m) {
    on_manifest(key, std::move(m), false);
  });
}

void Service::on_manifest(const std::string& key, Result<registry::FetchedManifest> m,
                          bool from_index) {
  auto it = pulls_.find(key);
  if (it == pulls_.end()) return;
  Pull& p = *it->second;
  if (!m.ok()) return fail(key, m.error());
  auto doc = oci::parse_manifest(m->bytes, m->media_type);
  if (!doc.ok()) return fail(key, std::move(doc).error().wrap("manifest " + m->digest.str()));
  if (doc->is_index) {
    if (from_index) return fail(key, make_error("an index names another index"));
    auto d = oci::select_platform(doc->entries, oci::host_platform());
    if (!d.ok()) return fail(key, d.error());
    client_->manifest(p.ref, d->digest, [this, key](Result<registry::FetchedManifest> m2) {
      on_manifest(key, std::move(m2), true);
    });
    return;
  }
  p.manifest_digest = m->digest;
  p.manifest = doc->manifest;
  if (Status s = store_->put(m->digest, m->bytes); !s.ok()) return fail(key, s.error());
  const oci::Descriptor& cfg = p.manifest.config;
  if (cfg.size < 0 || static_cast<uint64_t>(cfg.size) > kMaxConfigBytes)
    return fail(
        key, make_error("image config of " + std::to_string(cfg.size) + " bytes (at most 4 MiB)"));
  if (store_->has_blob(cfg.digest)) return on_config(key, {});
  // The config is small: fetched whole into the store (verified there).
  auto in = store_->ingest(cfg.digest, cfg.size);
  if (!in.ok()) return fail(key, in.error());
  auto received = std::make_shared<uint64_t>(0);
  auto sink = std::make_shared<IngestSink>(std::move(in).value(), received.get(), cfg.size,
                                           kMaxConfigBytes);
  client_->blob(p.ref, cfg.digest, sink.get(), [this, key, sink, received](Status s) {
    if (s.ok()) s = sink->ingest().commit();
    on_config(key, std::move(s));
  });
}

void Service::on_config(const std::string& key, Status s) {
  auto it = pulls_.find(key);
  if (it == pulls_.end()) return;
  Pull& p = *it->second;
  if (!s.ok()) return fail(key, std::move(s).error().wrap("image config"));
  auto text = store_->read(p.manifest.config.digest, kMaxConfigBytes);
  if (!text.ok()) return fail(key, text.error());
  auto cfg = oci::parse_image_config(*text);
  if (!cfg.ok()) return fail(key, std::move(cfg).error().wrap("image config"));
  if (!cfg->diff_ids.empty() && cfg->diff_ids.size() != p.manifest.layers.size())
    return fail(key,
                make_error("the image config lists " + std::to_string(cfg->diff_ids.size()) +
                           " layers, the manifest " + std::to_string(p.manifest.layers.size())));
  p.config_bytes = std::move(text).value();
  fetch_layers(p);
}

void Service::fetch_layers(Pull& p) {
  for (const auto& l : p.manifest.layers) {
    std::string d = l.blob.digest.str();
    if (store_->has_layer(l.blob.digest)) continue;
    p.waiting_layers.insert(d);
  }
  // Copy: start_layer may finish a layer (and this pull) at once.
  std::string key = p.key;
  std::vector<oci::Layer> todo;
  for (const auto& l : p.manifest.layers)
    if (p.waiting_layers.count(l.blob.digest.str())) todo.push_back(l);
  report_progress(p);
  for (const auto& l : todo) {
    auto it = pulls_.find(key);
    if (it == pulls_.end()) return;
    start_layer(*it->second, l);
  }
  auto it = pulls_.find(key);
  if (it != pulls_.end()) maybe_finish(*it->second);
}

void Service::start_layer(Pull& p, const oci::Layer& l) {
  std::string d = l.blob.digest.str();
  auto& job = jobs_[d];
  if (job) {  // already on its way for another pull: share it
    job->pulls.insert(p.key);
    return;
  }
  if (const auto* r = cache_->refusal(d)) {
    jobs_.erase(d);
    // Not fetched or unpacked again: a layer that fills the disk does not refill it.
    return fail(p.key, make_error("layer " + d + " was refused (" + r->reason +
                                  "); not tried again before " +
                                  format_rfc3339(static_cast<int64_t>(r->until_us)) +
                                  " or `weftctl image prune`"));
  }
  job = std::make_unique<LayerJob>();
  job->layer = l;
  job->ref = p.ref;
  job->url = p.url;
  job->pulls.insert(p.key);
  if (store_->has_blob(l.blob.digest)) return start_unpack(*job);
  if (l.blob.size > 0 && static_cast<uint64_t>(l.blob.size) > cfg_.cache_max_bytes)
    return layer_done(d, errno_error(EFBIG, "layer " + d + " is " +
                                                format_size(static_cast<uint64_t>(l.blob.size)) +
                                                ", more than the image cache's limit of " +
                                                format_size(cfg_.cache_max_bytes)));
  auto in = store_->ingest(l.blob.digest, l.blob.size);
  if (!in.ok()) return layer_done(d, in.error());
  job->received = (*in)->offset();
  if (l.blob.size > 0 && static_cast<uint64_t>(l.blob.size) > job->received) {
    // Known before the first byte: a blob the disk cannot take above the reserve.
    if (Status room = check_room(static_cast<uint64_t>(l.blob.size) - job->received); !room.ok()) {
      (void)(*in)->restart();
      return layer_done(d, std::move(room).error().wrap("layer " + d));
    }
  }
  job->sink = std::make_unique<IngestSink>(std::move(in).value(), &job->received, l.blob.size,
                                           cfg_.cache_max_bytes);
  ++downloads_;
  uint64_t resumed_at = job->received;
  auto done = [this, d, resumed_at](Status s) {
    auto it = jobs_.find(d);
    if (it != jobs_.end() && it->second->received >= resumed_at)
      downloaded_bytes_ += it->second->received - resumed_at;
    on_blob(d, std::move(s));
  };
  if (job->url.empty())
    client_->blob(p.ref, l.blob.digest, job->sink.get(), std::move(done));
  else
    client_->fetch(job->url, job->sink.get(), std::move(done));
  for (const auto& key : job->pulls)
    if (auto it = pulls_.find(key); it != pulls_.end()) report_progress(*it->second);
}

void Service::on_blob(const std::string& d, Status s) {
  auto it = jobs_.find(d);
  if (it == jobs_.end()) return;
  LayerJob& j = *it->second;
  if (s.ok()) s = j.sink->ingest().commit();
  // A download the disk could not take keeps nothing of it for a resume.
  if (!s.ok() && s.error().errnum == ENOSPC) (void)j.sink->ingest().restart();
  j.sink.reset();
  if (!s.ok())
    return layer_done(d, std::move(s).error().wrap((j.url.empty() ? "layer " : "package ") + d));
  start_unpack(j);
}

void Service::start_unpack(LayerJob& j) {
  std::string d = j.layer.blob.digest.str();
  if (!j.url.empty()) j.layer.compression = oci::Compression::kAny;  // the unpacker tells
  UnpackLimits limits = cfg_.limits;
  limits.max_bytes = std::min(limits.max_bytes, cfg_.cache_max_bytes);
  limits.reserve_bytes = cfg_.reserve_bytes;
  auto u = store_->begin_unpack(j.layer.blob.digest, j.layer.compression, limits);
  if (!u.ok()) return layer_done(d, u.error());
  j.unpacking = std::move(u).value();
  if (j.unpacking.done) return on_unpacked(d);
  auto w =
      loop_.add_io(j.unpacking.child.pidfd.get(), EPOLLIN, [this, d](uint32_t) { on_unpacked(d); });
  if (!w.ok()) {
    (void)store_->finish_unpack(j.unpacking, true);
    return on_unpacked(d);
  }
  j.watch = std::move(w).value();
}

void Service::on_unpacked(const std::string& d) {
  auto it = jobs_.find(d);
  if (it == jobs_.end()) return;
  LayerJob& j = *it->second;
  j.watch.reset();
  auto dir = store_->finish_unpack(j.unpacking, true);
  if (!dir.ok()) return layer_done(d, dir.error());
  cache_->add_layer(
      d, j.unpacking.stats.bytes + static_cast<uint64_t>(std::max<int64_t>(0, j.layer.blob.size)));
  layer_done(d, {});
}

void Service::layer_done(const std::string& d, const Status& s) {
  auto it = jobs_.find(d);
  if (it == jobs_.end()) return;
  std::unique_ptr<LayerJob> job = std::move(it->second);
  jobs_.erase(it);
  if (!s.ok() && (s.error().errnum == ENOSPC || s.error().errnum == EFBIG)) {
    cache_->refuse(d, s.error());
    if (auto dg = oci::parse_digest(d); dg.ok() && !store_->has_layer(*dg))
      (void)store_->remove_blob(*dg);
  } else if (s.ok()) {
    cache_->accept(d);
  }
  for (const auto& key : job->pulls) {
    auto p = pulls_.find(key);
    if (p == pulls_.end()) continue;
    if (!s.ok()) {
      fail(key, s.error());
      continue;
    }
    p->second->waiting_layers.erase(d);
    report_progress(*p->second);
    maybe_finish(*p->second);
  }
}

std::optional<PullProgress> Service::progress(uint64_t ticket) {
  auto t = tickets_.find(ticket);
  if (t == tickets_.end()) return std::nullopt;
  auto p = pulls_.find(t->second);
  if (p == pulls_.end()) return std::nullopt;
  return progress_of(*p->second);
}

void Service::report_progress(Pull& p) {
  PullProgress pr = progress_of(p);
  for (auto& [t, w] : p.waiters)
    if (w.progress) w.progress(pr);
}

PullProgress Service::progress_of(const Pull& p) const {
  PullProgress pr;
  for (const auto& l : p.manifest.layers) {
    std::string d = l.blob.digest.str();
    auto j = jobs_.find(d);
    if (l.blob.size < 0) {  // a package: its size is known once it is here
      uint64_t n = j != jobs_.end() ? j->second->received : 0;
      pr.total += n;
      pr.done += n;
      continue;
    }
    uint64_t size = static_cast<uint64_t>(l.blob.size);
    pr.total += size;
    if (!p.waiting_layers.count(d)) {
      pr.done += size;
    } else if (j != jobs_.end()) {
      pr.done += j->second->sink ? std::min(j->second->received, size) : size;
    }
  }
  return pr;
}

void Service::maybe_finish(Pull& p) {
  if (p.failed || !p.waiting_layers.empty() || !p.manifest_digest.hex.size()) return;
  if (!p.url.empty()) {
    cache_->add_package(p.url, p.manifest_digest);
  } else if (!p.config_bytes.empty()) {  // pulled now (not found local): record it
    auto cfg = oci::parse_image_config(p.config_bytes);
    if (!cfg.ok()) return fail(p.key, cfg.error());
    std::vector<oci::Digest> layers;
    for (const auto& l : p.manifest.layers) layers.push_back(l.blob.digest);
    cache_->add_image(p.key, p.manifest_digest, p.manifest.config.digest, std::move(cfg).value(),
                      std::move(layers));
  }
  std::optional<LocalImage> img = cache_->use(p.manifest_digest);
  if (!img) return fail(p.key, make_error("image record lost"));
  std::unique_ptr<Pull> done = std::move(pulls_[p.key]);
  pulls_.erase(done->key);
  for (auto& [t, w] : done->waiters) {
    tickets_.erase(t);
    w.done(*img);
  }
  // Over the limit: evicted after the waiters took hold of what they use.
  auto src = loop_.add_defer([this] {
    enforce_soon_.reset();
    cache_->enforce_limit();
  });
  if (src.ok()) enforce_soon_ = std::move(src).value();
}

void Service::fail(const std::string& key, const Error& e) {
  auto it = pulls_.find(key);
  if (it == pulls_.end()) return;
  std::unique_ptr<Pull> p = std::move(it->second);
  pulls_.erase(it);
  p->failed = true;
  for (auto& [d, job] : jobs_) job->pulls.erase(key);  // the job goes on for others
  log_warn("image pull failed", {{"IMAGE", key}, {"ERROR", e.str()}});
  for (auto& [t, w] : p->waiters) {
    tickets_.erase(t);
    w.done(e);
  }
}

bool Service::busy(const std::string& digest) const {
  if (jobs_.count(digest)) return true;
  // Layers of a pull in progress whose layers are all here already are held too.
  for (const auto& [k, p] : pulls_)
    for (const auto& l : p->manifest.layers)
      if (l.blob.digest.str() == digest) return true;
  return false;
}

Status Service::check_room(uint64_t need) const {
  Fd root(::open(store_->root().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return sys_error("open " + store_->root());
  return image::check_room(root.get(), need, cfg_.reserve_bytes);
}

}  // namespace weft::image
