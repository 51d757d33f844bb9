#include "agent/image/cache.h"

#include <sys/stat.h>

#include <algorithm>

#include "common/clock.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/log.h"

namespace weft::image {

using json = nlohmann::json;

namespace {

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

Status Cache::load() {
  std::string path = store_.root() + "/cache.json";
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
        auto text_cfg = store_.read(r.config_digest, kMaxConfigBytes);
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
    if (!d.ok() || !store_.has_layer(*d))
      it = layers_.erase(it);
    else
      ++it;
  }
  for (const char* alg : {"sha256", "sha512"}) {
    auto names = list_dir(store_.root() + "/layers/" + alg);
    if (!names.ok()) continue;
    for (const auto& hex : *names) {
      auto d = oci::parse_digest(std::string(alg) + ":" + hex);
      if (!d.ok() || layers_.count(d->str())) continue;
      LayerRec r;
      r.size = tree_bytes(store_.layer_path(*d));
      struct stat st {};
      if (::stat(store_.blob_path(*d).c_str(), &st) == 0) r.size += st.st_size;
      r.last_used_us = now_realtime_us();
      layers_[d->str()] = r;
    }
  }
  return {};
}

void Cache::save() {
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
  Status s = write_file_atomic(store_.root() + "/cache.json", j.dump(), 0600);
  if (!s.ok()) log_error("cannot record the image cache", {{"ERROR", s.error().str()}});
}

std::optional<LocalImage> Cache::local(const std::string& ref) const {
  auto r = refs_.find(ref);
  if (r == refs_.end()) return std::nullopt;
  auto it = images_.find(r->second);
  if (it == images_.end()) return std::nullopt;
  for (const auto& l : it->second.layers)
    if (!layers_.count(l.str()) || !store_.has_layer(l)) return std::nullopt;
  auto md = oci::parse_digest(r->second);
  if (!md.ok() || it->second.package) return std::nullopt;
  return LocalImage{*md, it->second.config, it->second.layers};
}

std::optional<LocalImage> Cache::local_package(const oci::Digest& d) const {
  auto it = images_.find(d.str());
  if (it == images_.end() || !it->second.package) return std::nullopt;
  if (!layers_.count(d.str()) || !store_.has_layer(d)) return std::nullopt;
  return LocalImage{d, {}, {d}};
}

uint64_t Cache::size_bytes() const {
  uint64_t total = 0;
  for (const auto& [d, r] : layers_) total += r.size;
  return total;
}

void Cache::refuse(const std::string& digest, const Error& e) {
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

json Cache::refused() const {
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

void Cache::add_layer(const std::string& digest, uint64_t size) {
  layers_[digest] = LayerRec{size, now_realtime_us()};
}

void Cache::add_package(const std::string& url, const oci::Digest& d) {
  ImageRec& r = images_[d.str()];
  r.package = true;
  r.layers = {d};
  r.refs.insert(url);
  refs_[url] = d.str();
}

void Cache::add_image(const std::string& ref, const oci::Digest& manifest,
                      const oci::Digest& config_digest, oci::ImageConfig config,
                      std::vector<oci::Digest> layers) {
  std::string m = manifest.str();
  ImageRec& r = images_[m];
  r.config_digest = config_digest;
  r.config = std::move(config);
  r.layers = std::move(layers);
  r.refs.insert(ref);
  // A tag moves: it names this image now, not the one it named before.
  if (auto old = refs_.find(ref); old != refs_.end() && old->second != m)
    if (auto oi = images_.find(old->second); oi != images_.end()) oi->second.refs.erase(ref);
  refs_[ref] = m;
}

std::optional<LocalImage> Cache::use(const oci::Digest& manifest) {
  auto it = images_.find(manifest.str());
  if (it == images_.end()) return std::nullopt;
  uint64_t now = now_realtime_us();
  it->second.last_used_us = now;
  for (const auto& l : it->second.layers)
    if (auto lr = layers_.find(l.str()); lr != layers_.end()) lr->second.last_used_us = now;
  save();
  return LocalImage{manifest, it->second.config, it->second.layers};
}

const CacheRecord::Refusal* Cache::refusal(const std::string& digest) const {
  auto r = refused_.find(digest);
  if (r == refused_.end() || now_realtime_us() >= r->second.until_us) return nullptr;
  return &r->second;
}

void Cache::accept(const std::string& digest) {
  if (refused_.erase(digest)) save();
}

// ------------------------------------------------------------------ holds and eviction

void Cache::hold(const std::string& holder, const LocalImage& img) {
  holds_[holder].insert(img.manifest.str());
  uint64_t now = now_realtime_us();
  if (auto it = images_.find(img.manifest.str()); it != images_.end())
    it->second.last_used_us = now;
  for (const auto& l : img.layers)
    if (auto lr = layers_.find(l.str()); lr != layers_.end()) lr->second.last_used_us = now;
}

void Cache::release(const std::string& holder) {
  holds_.erase(holder);
}

bool Cache::image_held(const std::string& manifest) const {
  for (const auto& [h, ms] : holds_)
    if (ms.count(manifest)) return true;
  return false;
}

bool Cache::layer_held(const std::string& digest) const {
  if (busy_(digest)) return true;  // being made, or a pull in progress needs it
  for (const auto& [h, ms] : holds_)
    for (const auto& m : ms) {
      auto it = images_.find(m);
      if (it == images_.end()) continue;
      for (const auto& l : it->second.layers)
        if (l.str() == digest) return true;
    }
  return false;
}

void Cache::drop_image(const std::string& manifest) {
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
  if (!config_shared) (void)store_.remove_blob(config);
  if (auto md = oci::parse_digest(manifest); md.ok()) (void)store_.remove_blob(*md);
}

void Cache::drop_layer(const std::string& digest) {
  auto d = oci::parse_digest(digest);
  if (!d.ok()) return;
  // The images that need it go first (they cannot run without it).
  std::vector<std::string> gone;
  for (const auto& [m, r] : images_)
    for (const auto& l : r.layers)
      if (l.str() == digest) gone.push_back(m);
  for (const auto& m : gone) drop_image(m);
  Status s = store_.remove_layer(*d);
  if (!s.ok()) {
    log_error("cannot remove a cached layer", {{"LAYER", digest}, {"ERROR", s.error().str()}});
    return;
  }
  (void)store_.remove_blob(*d);
  layers_.erase(digest);
  ++evictions_;
}

void Cache::collect_unreferenced_layers() {
  std::vector<std::string> unused;
  for (const auto& [d, r] : layers_) {
    bool needed = layer_held(d);
    for (const auto& [m, img] : images_)
      for (const auto& l : img.layers) needed |= l.str() == d;
    if (!needed) unused.push_back(d);
  }
  for (const auto& d : unused) drop_layer(d);
}

void Cache::enforce_limit() {
  bool changed = false;
  while (size_bytes() > max_bytes_) {
    std::string victim;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [d, r] : layers_) {
      if (layer_held(d) || r.last_used_us >= oldest) continue;
      oldest = r.last_used_us;
      victim = d;
    }
    if (victim.empty()) {
      log_warn("image cache over its limit, and every layer is in use",
               {{"SIZE", std::to_string(size_bytes())}, {"LIMIT", std::to_string(max_bytes_)}});
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

json Cache::list() const {
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

Result<json> Cache::remove(const std::string& what) {
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

json Cache::prune() {
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
