#include "agent/image/service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/units.h"

namespace weft::image {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxConfigBytes = 4u << 20;
constexpr size_t kMaxCacheRecordBytes = 64u << 20;

// Bytes under a directory (files' sizes; directories and links count a block).
uint64_t tree_bytes(const std::string& dir) {
  uint64_t total = 0;
  auto names = list_dir(dir);
  if (!names.ok()) return 0;
  for (const auto& n : *names) {
    std::string p = dir + "/" + n;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      total += 4096 + tree_bytes(p);
    else
      total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

}  // namespace

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
  TRY(s->load());
  return s;
}

Service::Service(EventLoop& loop, ServiceConfig cfg) : loop_(loop), cfg_(std::move(cfg)) {}
Service::~Service() = default;

// ------------------------------------------------------------------ the record

CacheRecord parse_cache_record(std::string_view text) {
  CacheRecord out;
  auto parsed = parse_json_bounded(text, 8);
  if (!parsed.ok() || !parsed->is_object()) return out;
  const json& j = *parsed;
  auto u64 = [](const json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_number_unsigned() ? it->get<uint64_t>() : uint64_t{0};
  };
  static const json kNone = json::object();
  auto member = [](const json& o, const char* k) -> const json& {
    auto it = o.find(k);
    return it == o.end() ? kNone : *it;
  };
  const json& layers = member(j, "layers");
  if (layers.is_object())
    for (const auto& [d, v] : layers.items()) {
      auto dig = oci::parse_digest(d);
      if (!dig.ok() || !v.is_object()) continue;
      out.layers[dig->str()] = {u64(v, "size"), u64(v, "last_used_us")};
    }
  const json& refused = member(j, "refused");
  if (refused.is_object() && refused.size() <= 4096)
    for (const auto& [d, v] : refused.items()) {
      auto dig = oci::parse_digest(d);
      const json& reason = member(v, "reason");
      if (!dig.ok() || !v.is_object() || !reason.is_string()) continue;
      CacheRecord::Refusal r;
      r.reason = reason.get<std::string>().substr(0, 1000);
      r.until_us = u64(v, "until_us");
      r.times = static_cast<uint32_t>(std::min<uint64_t>(u64(v, "times"), 64));
      out.refused[dig->str()] = std::move(r);
    }
  const json& images = member(j, "images");
  if (!images.is_object()) return out;
  for (const auto& [m, v] : images.items()) {
    auto md = oci::parse_digest(m);
    if (!md.ok() || !v.is_object()) continue;
    CacheRecord::Image r;
    const json& pkg = member(v, "package");
    r.package = pkg.is_boolean() && pkg.get<bool>();
    if (!r.package) {
      const json& c = member(v, "config");
      auto cd = c.is_string() ? oci::parse_digest(c.get<std::string>())
                              : Result<oci::Digest>(make_error("no config"));
      if (!cd.ok()) continue;
      r.config = *cd;
    }
    const json& ls = member(v, "layers");
    bool good = ls.is_array() && !ls.empty() && ls.size() <= 1024;
    for (size_t i = 0; good && i < ls.size(); ++i) {
      auto ld = ls[i].is_string() ? oci::parse_digest(ls[i].get<std::string>())
                                  : Result<oci::Digest>(make_error("not a digest"));
      if (ld.ok())
        r.layers.push_back(*ld);
      else
        good = false;
    }
    // A package is one layer, its own digest.
    if (!good || (r.package && (r.layers.size() != 1 || r.layers[0] != *md))) continue;
    r.last_used_us = u64(v, "last_used_us");
    const json& refs = member(v, "refs");
    for (size_t i = 0; refs.is_array() && i < refs.size(); ++i) {
      if (!refs[i].is_string()) continue;
      std::string ref = refs[i].get<std::string>();
      bool valid = r.package ? ref.find("://") != std::string::npos && ref.size() <= 2048
                             : oci::parse_image_ref(ref).ok();
      if (valid) r.refs.insert(ref);
    }
    out.images[md->str()] = std::move(r);
  }
  return out;
}

Status Service::load() {
  std::string path = store_->root() + "/cache.json";
  if (path_exists(path)) {
    TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxCacheRecordBytes));
    CacheRecord rec = parse_cache_record(text);
    for (const auto& [d, l] : rec.layers) layers_[d] = LayerRec{l.size, l.last_used_us};
    refused_ = std::move(rec.refused);
    for (auto& [m, img] : rec.images) {
      ImageRec r;
      r.package = img.package;
      if (!r.package) {
        r.config_digest = *img.config;
        auto text_cfg = store_->read(r.config_digest, kMaxConfigBytes);
        if (!text_cfg.ok()) continue;
        auto cfg = oci::parse_image_config(*text_cfg);
        if (!cfg.ok()) continue;
        r.config = std::move(cfg).value();
      }
      r.layers = std::move(img.layers);
      r.last_used_us = img.last_used_us;
      r.refs = std::move(img.refs);
      for (const auto& ref : r.refs) refs_[ref] = m;
      images_[m] = std::move(r);
    }
  }
  // The store is the truth: a record of a layer that is not there goes, a layer that is
  // there without a record (unpacked just before a crash) is counted.
  for (auto it = layers_.begin(); it != layers_.end();) {
    auto d = oci::parse_digest(it->first);
    if (!d.ok() || !store_->has_layer(*d))
      it = layers_.erase(it);
    else
      ++it;
  }
  for (const char* alg : {"sha256", "sha512"}) {
    auto names = list_dir(store_->root() + "/layers/" + alg);
    if (!names.ok()) continue;
    for (const auto& hex : *names) {
      auto d = oci::parse_digest(std::string(alg) + ":" + hex);
      if (!d.ok() || layers_.count(d->str())) continue;
      LayerRec r;
      r.size = tree_bytes(store_->layer_path(*d));
      struct stat st {};
      if (::stat(store_->blob_path(*d).c_str(), &st) == 0) r.size += st.st_size;
      r.last_used_us = now_realtime_us();
      layers_[d->str()] = r;
    }
  }
  return {};
}

void Service::save() {
  json j{{"version", 1},
         {"layers", json::object()},
         {"images", json::object()},
         {"refused", json::object()}};
  for (const auto& [d, r] : layers_)
    j["layers"][d] = {{"size", r.size}, {"last_used_us", r.last_used_us}};
  for (const auto& [d, r] : refused_)
    j["refused"][d] = {{"reason", r.reason}, {"until_us", r.until_us}, {"times", r.times}};
  for (const auto& [m, r] : images_) {
    json layers = json::array();
    for (const auto& l : r.layers) layers.push_back(l.str());
    j["images"][m] = {{"refs", r.refs}, {"layers", layers}, {"last_used_us", r.last_used_us}};
    if (r.package)
      j["images"][m]["package"] = true;
    else
      j["images"][m]["config"] = r.config_digest.str();
  }
  Status s = write_file_atomic(store_->root() + "/cache.json", j.dump(), 0600);
  if (!s.ok()) log_error("cannot record the image cache", {{"ERROR", s.error().str()}});
}

std::optional<LocalImage> Service::local(const std::string& ref) const {
  auto r = refs_.find(ref);
  if (r == refs_.end()) return std::nullopt;
  auto it = images_.find(r->second);
  if (it == images_.end()) return std::nullopt;
  for (const auto& l : it->second.layers)
    if (!layers_.count(l.str()) || !store_->has_layer(l)) return std::nullopt;
  auto md = oci::parse_digest(r->second);
  if (!md.ok() || it->second.package) return std::nullopt;
  return LocalImage{*md, it->second.config, it->second.layers};
}

std::optional<LocalImage> Service::local_package(const oci::Digest& d) const {
  auto it = images_.find(d.str());
  if (it == images_.end() || !it->second.package) return std::nullopt;
  if (!layers_.count(d.str()) || !store_->has_layer(d)) return std::nullopt;
  return LocalImage{d, {}, {d}};
}

uint64_t Service::size_bytes() const {
  uint64_t total = 0;
  for (const auto& [d, r] : layers_) total += r.size;
  return total;
}

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
    if (local_package(p.manifest_digest)) return maybe_finish(p);
    return fetch_layers(p);
  }
  auto ref = oci::parse_image_ref(p.key);
  if (!ref.ok()) return fail(p.key, ref.error());
  p.ref = *ref;
  // Pinned by digest and already here: nothing to ask the registry.
  if (auto img = local(p.key); img && p.ref.digest) {
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
  if (auto r = refused_.find(d); r != refused_.end()) {
    if (now_realtime_us() < r->second.until_us) {
      jobs_.erase(d);
      // Not fetched or unpacked again: a layer that fills the disk does not refill it.
      return fail(p.key, make_error("layer " + d + " was refused (" + r->second.reason +
                                    "); not tried again before " +
                                    format_rfc3339(static_cast<int64_t>(r->second.until_us)) +
                                    " or `weftctl image prune`"));
    }
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
  LayerRec r;
  r.size = j.unpacking.stats.bytes + static_cast<uint64_t>(std::max<int64_t>(0, j.layer.blob.size));
  r.last_used_us = now_realtime_us();
  layers_[d] = r;
  layer_done(d, {});
}

void Service::layer_done(const std::string& d, const Status& s) {
  auto it = jobs_.find(d);
  if (it == jobs_.end()) return;
  std::unique_ptr<LayerJob> job = std::move(it->second);
  jobs_.erase(it);
  if (!s.ok() && (s.error().errnum == ENOSPC || s.error().errnum == EFBIG)) {
    refuse(d, s.error());
    if (auto dg = oci::parse_digest(d); dg.ok() && !layers_.count(d))
      (void)store_->remove_blob(*dg);
  } else if (s.ok() && refused_.erase(d)) {
    save();
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
  std::string m = p.manifest_digest.str();
  if (!p.url.empty()) {
    ImageRec& r = images_[m];
    r.package = true;
    r.layers = {p.manifest_digest};
    r.refs.insert(p.url);
    refs_[p.url] = m;
  } else if (!p.config_bytes.empty()) {  // pulled now (not found local): record it
    ImageRec& r = images_[m];
    r.config_digest = p.manifest.config.digest;
    auto cfg = oci::parse_image_config(p.config_bytes);
    if (!cfg.ok()) return fail(p.key, cfg.error());
    r.config = std::move(cfg).value();
    r.layers.clear();
    for (const auto& l : p.manifest.layers) r.layers.push_back(l.blob.digest);
    r.refs.insert(p.key);
    // A tag moves: it names this image now, not the one it named before.
    if (auto old = refs_.find(p.key); old != refs_.end() && old->second != m)
      if (auto oi = images_.find(old->second); oi != images_.end()) oi->second.refs.erase(p.key);
    refs_[p.key] = m;
  }
  auto it = images_.find(m);
  if (it == images_.end()) return fail(p.key, make_error("image record lost"));
  uint64_t now = now_realtime_us();
  it->second.last_used_us = now;
  for (const auto& l : it->second.layers)
    if (auto lr = layers_.find(l.str()); lr != layers_.end()) lr->second.last_used_us = now;
  save();
  LocalImage img{p.manifest_digest, it->second.config, it->second.layers};
  std::unique_ptr<Pull> done = std::move(pulls_[p.key]);
  pulls_.erase(done->key);
  for (auto& [t, w] : done->waiters) {
    tickets_.erase(t);
    w.done(img);
  }
  // Over the limit: evicted after the waiters took hold of what they use.
  auto src = loop_.add_defer([this] {
    enforce_soon_.reset();
    enforce_limit();
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

Status Service::check_room(uint64_t need) const {
  Fd root(::open(store_->root().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return sys_error("open " + store_->root());
  return image::check_room(root.get(), need, cfg_.reserve_bytes);
}

void Service::refuse(const std::string& digest, const Error& e) {
  CacheRecord::Refusal& r = refused_[digest];
  r.times = std::min<uint32_t>(r.times + 1, 64);
  // Ten minutes, doubling with each refusal in a row, at most a day.
  uint64_t hold = uint64_t{600} * 1'000'000;
  for (uint32_t i = 1; i < r.times && hold < uint64_t{86400} * 1'000'000; ++i) hold *= 2;
  hold = std::min<uint64_t>(hold, uint64_t{86400} * 1'000'000);
  r.until_us = now_realtime_us() + hold;
  r.reason = e.str().substr(0, 1000);
  log_warn("image layer refused for its size",
           {{"LAYER", digest},
            {"ERROR", r.reason},
            {"UNTIL", format_rfc3339(static_cast<int64_t>(r.until_us))}});
  save();
}

json Service::refused() const {
  json out = json::array();
  uint64_t now = now_realtime_us();
  for (const auto& [d, r] : refused_) {
    if (r.until_us <= now) continue;
    out.push_back({{"layer", d},
                   {"reason", r.reason},
                   {"until", format_rfc3339(static_cast<int64_t>(r.until_us))},
                   {"times", r.times}});
  }
  return out;
}

// ------------------------------------------------------------------ holds and the cache

void Service::hold(const std::string& holder, const LocalImage& img) {
  holds_[holder].insert(img.manifest.str());
  uint64_t now = now_realtime_us();
  if (auto it = images_.find(img.manifest.str()); it != images_.end())
    it->second.last_used_us = now;
  for (const auto& l : img.layers)
    if (auto lr = layers_.find(l.str()); lr != layers_.end()) lr->second.last_used_us = now;
}

void Service::release(const std::string& holder) {
  holds_.erase(holder);
}

bool Service::image_held(const std::string& manifest) const {
  for (const auto& [h, ms] : holds_)
    if (ms.count(manifest)) return true;
  return false;
}

bool Service::layer_held(const std::string& digest) const {
  if (jobs_.count(digest)) return true;  // being made
  for (const auto& [h, ms] : holds_)
    for (const auto& m : ms) {
      auto it = images_.find(m);
      if (it == images_.end()) continue;
      for (const auto& l : it->second.layers)
        if (l.str() == digest) return true;
    }
  // Layers of a pull in progress whose layers are all here already are held too.
  for (const auto& [k, p] : pulls_)
    for (const auto& l : p->manifest.layers)
      if (l.blob.digest.str() == digest) return true;
  return false;
}

void Service::drop_image(const std::string& manifest) {
  auto it = images_.find(manifest);
  if (it == images_.end()) return;
  for (const auto& r : it->second.refs)
    if (auto ri = refs_.find(r); ri != refs_.end() && ri->second == manifest) refs_.erase(ri);
  if (it->second.package) {  // its blob is its layer's: drop_layer removes both
    images_.erase(it);
    return;
  }
  oci::Digest config = it->second.config_digest;
  images_.erase(it);
  bool config_shared = false;
  for (const auto& [m, r] : images_) config_shared |= !r.package && r.config_digest == config;
  if (!config_shared) (void)store_->remove_blob(config);
  if (auto md = oci::parse_digest(manifest); md.ok()) (void)store_->remove_blob(*md);
}

void Service::drop_layer(const std::string& digest) {
  auto d = oci::parse_digest(digest);
  if (!d.ok()) return;
  // The images that need it go first (they cannot run without it).
  std::vector<std::string> gone;
  for (const auto& [m, r] : images_)
    for (const auto& l : r.layers)
      if (l.str() == digest) gone.push_back(m);
  for (const auto& m : gone) drop_image(m);
  Status s = store_->remove_layer(*d);
  if (!s.ok()) {
    log_error("cannot remove a cached layer", {{"LAYER", digest}, {"ERROR", s.error().str()}});
    return;
  }
  (void)store_->remove_blob(*d);
  layers_.erase(digest);
  ++evictions_;
}

void Service::collect_unreferenced_layers() {
  std::vector<std::string> unused;
  for (const auto& [d, r] : layers_) {
    bool needed = layer_held(d);
    for (const auto& [m, img] : images_)
      for (const auto& l : img.layers) needed |= l.str() == d;
    if (!needed) unused.push_back(d);
  }
  for (const auto& d : unused) drop_layer(d);
}

void Service::enforce_limit() {
  bool changed = false;
  while (size_bytes() > cfg_.cache_max_bytes) {
    std::string victim;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [d, r] : layers_) {
      if (layer_held(d) || r.last_used_us >= oldest) continue;
      oldest = r.last_used_us;
      victim = d;
    }
    if (victim.empty()) {
      log_warn("image cache over its limit, and every layer is in use",
               {{"SIZE", std::to_string(size_bytes())},
                {"LIMIT", std::to_string(cfg_.cache_max_bytes)}});
      break;
    }
    log_info("evicting the least recently used layer", {{"LAYER", victim}});
    drop_layer(victim);
    changed = true;
  }
  if (changed) {
    collect_unreferenced_layers();
    save();
  }
}

json Service::list() const {
  json out = json::array();
  for (const auto& [m, r] : images_) {
    uint64_t size = 0;
    for (const auto& l : r.layers)
      if (auto lr = layers_.find(l.str()); lr != layers_.end()) size += lr->second.size;
    json users = json::array();
    for (const auto& [h, ms] : holds_)
      if (ms.count(m)) users.push_back(h);
    out.push_back({{"kind", r.package ? "package" : "image"},
                   {"digest", m},
                   {"refs", r.refs},
                   {"layers", r.layers.size()},
                   {"size", size},
                   {"last_used", format_rfc3339(static_cast<int64_t>(r.last_used_us))},
                   {"used_by", users}});
  }
  return out;
}

Result<json> Service::remove(const std::string& what) {
  std::string m = what;
  if (auto r = refs_.find(what); r != refs_.end()) m = r->second;
  if (!images_.count(m)) {
    Error e = make_error("no image '" + what + "' on this machine");
    e.code = -32001;  // not found
    return e;
  }
  if (image_held(m)) {
    std::string users;
    for (const auto& [h, ms] : holds_)
      if (ms.count(m)) users += (users.empty() ? "" : ", ") + h;
    Error e = make_error("image " + m + " is in use by task " + users);
    e.code = -32003;  // conflict
    return e;
  }
  uint64_t before = size_bytes();
  drop_image(m);
  collect_unreferenced_layers();
  save();
  return json{{"removed", m}, {"freed", before - size_bytes()}};
}

json Service::prune() {
  uint64_t before = size_bytes();
  refused_.clear();
  std::vector<std::string> gone;
  for (const auto& [m, r] : images_)
    if (!image_held(m)) gone.push_back(m);
  for (const auto& m : gone) drop_image(m);
  collect_unreferenced_layers();
  save();
  return json{{"removed", gone}, {"freed", before - size_bytes()}};
}

}  // namespace weft::image
