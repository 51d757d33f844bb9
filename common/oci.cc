#include "common/oci.h"

#include <sys/utsname.h>

#include <cctype>

#include <nlohmann/json.hpp>

#include "common/json_bounded.h"

namespace weft::oci {

using json = nlohmann::json;

namespace {

bool is_lower_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}
bool is_alnum_lower(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
bool is_alnum(char c) {
  return is_alnum_lower(c) || (c >= 'A' && c <= 'Z');
}

// A repository path component: [a-z0-9]+ joined by ".", "_", "__" or runs of "-".
bool valid_component(std::string_view c) {
  if (c.empty() || !is_alnum_lower(c.front()) || !is_alnum_lower(c.back())) return false;
  for (size_t i = 0; i < c.size(); ++i) {
    char ch = c[i];
    if (is_alnum_lower(ch)) continue;
    if (ch == '.' || ch == '_') {
      // "." and "_" alone, or "__"; never next to another separator otherwise
      size_t j = i;
      while (j < c.size() && (c[j] == '.' || c[j] == '_')) ++j;
      std::string_view sep = c.substr(i, j - i);
      if (sep != "." && sep != "_" && sep != "__") return false;
      i = j - 1;
      continue;
    }
    if (ch == '-') {
      size_t j = i;
      while (j < c.size() && c[j] == '-') ++j;
      if (j < c.size() && !is_alnum_lower(c[j])) return false;
      i = j - 1;
      continue;
    }
    return false;
  }
  return true;
}

// host[:port]: DNS labels of letters, digits and '-', or a bracketed IPv6 address.
bool valid_registry(std::string_view r) {
  if (r.empty() || r.size() > 255) return false;
  std::string_view host = r;
  if (r.front() == '[') {
    size_t close = r.find(']');
    if (close == std::string_view::npos) return false;
    for (char c : r.substr(1, close - 1))
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')) return false;
    std::string_view rest = r.substr(close + 1);
    if (rest.empty()) return true;
    if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return false;
    for (char c : rest.substr(1))
      if (c < '0' || c > '9') return false;
    return true;
  }
  size_t colon = r.find(':');
  if (colon != std::string_view::npos) {
    std::string_view port = r.substr(colon + 1);
    if (port.empty() || port.size() > 5) return false;
    for (char c : port)
      if (c < '0' || c > '9') return false;
    if (std::stoul(std::string(port)) > 65535) return false;
    host = r.substr(0, colon);
  }
  if (host.empty()) return false;
  size_t start = 0;
  while (start <= host.size()) {
    size_t dot = host.find('.', start);
    std::string_view label =
        host.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return false;
    for (char c : label)
      if (!is_alnum(c) && c != '-') return false;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return true;
}

bool valid_tag(std::string_view t) {
  if (t.empty() || t.size() > 128) return false;
  if (!is_alnum(t.front()) && t.front() != '_') return false;
  for (char c : t)
    if (!is_alnum(c) && c != '_' && c != '.' && c != '-') return false;
  return true;
}

Result<std::string> string_member(const json& j, const char* key, const std::string& where,
                                  bool required, size_t max = 1024) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return field_error(where + key, "is missing");
    return std::string();
  }
  if (!it->is_string()) return field_error(where + key, "must be a string");
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max) return field_error(where + key, "is longer than " + std::to_string(max));
  return s;
}

Result<std::vector<std::string>> string_list(const json& j, const char* key,
                                             const std::string& where, size_t max_items,
                                             size_t max_len) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return field_error(where + key, "must be a list of strings");
  if (it->size() > max_items)
    return field_error(where + key, "has more than " + std::to_string(max_items) + " entries");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    std::string f = where + key + "[" + std::to_string(i) + "]";
    if (!v.is_string()) return field_error(f, "must be a string");
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() > max_len) return field_error(f, "is longer than " + std::to_string(max_len));
    if (s.find('\0') != std::string::npos) return field_error(f, "contains a NUL byte");
    out.push_back(s);
  }
  return out;
}

Result<Descriptor> parse_descriptor(const json& j, const std::string& where) {
  if (!j.is_object()) return field_error(where, "must be an object (a descriptor)");
  Descriptor d;
  TRY_ASSIGN(d.media_type, string_member(j, "mediaType", where + ".", true, 255));
  TRY_ASSIGN(std::string digest, string_member(j, "digest", where + ".", true, 200));
  auto parsed = parse_digest(digest);
  if (!parsed.ok()) return field_error(where + ".digest", parsed.error().message);
  d.digest = *parsed;
  TRY_ASSIGN(d.size, int_member(j, "size", -1, 0, kMaxBlobBytes, where + "."));
  if (d.size < 0) return field_error(where + ".size", "is missing");
  if (auto u = j.find("urls"); u != j.end() && !u->is_null() && !(u->is_array() && u->empty()))
    return field_error(where + ".urls",
                       "blobs from outside the registry (foreign layers) are not fetched");
  return d;
}

Result<Platform> parse_platform(const json& j, const std::string& where) {
  if (!j.is_object()) return field_error(where, "must be an object");
  Platform p;
  TRY_ASSIGN(p.os, string_member(j, "os", where + ".", true, 64));
  TRY_ASSIGN(p.architecture, string_member(j, "architecture", where + ".", true, 64));
  TRY_ASSIGN(p.variant, string_member(j, "variant", where + ".", false, 64));
  return p;
}

Result<Manifest> parse_image_manifest(const json& doc, bool docker) {
  TRY_ASSIGN(int64_t version, int_member(doc, "schemaVersion", -1, 0, 100));
  if (version != 2) return field_error("schemaVersion", "must be 2");
  auto c = doc.find("config");
  if (c == doc.end()) return field_error("config", "is missing");
  Manifest m;
  TRY_ASSIGN(m.config, parse_descriptor(*c, "config"));
  if (m.config.media_type != kOciConfig && m.config.media_type != kDockerConfig)
    return field_error("config.mediaType",
                       "is " + m.config.media_type + ", not an image configuration");
  if (m.config.size > static_cast<int64_t>(kMaxConfigBytes))
    return field_error("config.size", "is larger than " + std::to_string(kMaxConfigBytes));
  auto ls = doc.find("layers");
  if (ls == doc.end() || !ls->is_array()) return field_error("layers", "must be a list");
  if (ls->size() > kMaxLayers)
    return field_error("layers", "has more than " + std::to_string(kMaxLayers) + " layers");
  for (size_t i = 0; i < ls->size(); ++i) {
    std::string where = "layers[" + std::to_string(i) + "]";
    TRY_ASSIGN(Descriptor d, parse_descriptor((*ls)[i], where));
    Layer l{d, Compression::kNone};
    const std::string& t = d.media_type;
    if (t == "application/vnd.oci.image.layer.v1.tar")
      l.compression = Compression::kNone;
    else if (t == "application/vnd.oci.image.layer.v1.tar+gzip" ||
             t == "application/vnd.docker.image.rootfs.diff.tar.gzip")
      l.compression = Compression::kGzip;
    else if (t == "application/vnd.oci.image.layer.v1.tar+zstd")
      l.compression = Compression::kZstd;
    else
      return field_error(where + ".mediaType",
                         "is " + t + ", not a layer weft unpacks (tar, " + "tar+gzip or tar+zstd)");
    (void)docker;
    m.layers.push_back(std::move(l));
  }
  return m;
}

Result<std::vector<IndexEntry>> parse_index(const json& doc) {
  TRY_ASSIGN(int64_t version, int_member(doc, "schemaVersion", -1, 0, 100));
  if (version != 2) return field_error("schemaVersion", "must be 2");
  auto ms = doc.find("manifests");
  if (ms == doc.end() || !ms->is_array()) return field_error("manifests", "must be a list");
  if (ms->size() > kMaxIndexEntries)
    return field_error("manifests",
                       "has more than " + std::to_string(kMaxIndexEntries) + " entries");
  std::vector<IndexEntry> out;
  for (size_t i = 0; i < ms->size(); ++i) {
    std::string where = "manifests[" + std::to_string(i) + "]";
    IndexEntry e;
    TRY_ASSIGN(e.manifest, parse_descriptor((*ms)[i], where));
    if (auto p = (*ms)[i].find("platform"); p != (*ms)[i].end() && !p->is_null()) {
      TRY_ASSIGN(e.platform, parse_platform(*p, where + ".platform"));
      e.has_platform = true;
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

Result<Digest> parse_digest(std::string_view s) {
  size_t colon = s.find(':');
  if (colon == std::string_view::npos)
    return make_error("a digest is <algorithm>:<hex>, e.g. sha256:<64 hex digits>");
  std::string_view algo = s.substr(0, colon), hex = s.substr(colon + 1);
  size_t want = algo == "sha256" ? 64 : algo == "sha512" ? 128 : 0;
  if (want == 0)
    return make_error("digest algorithm '" + std::string(algo.substr(0, 32)) +
                      "' is not sha256 or sha512");
  if (hex.size() != want || !is_lower_hex(hex))
    return make_error("a " + std::string(algo) + " digest is " + std::to_string(want) +
                      " lowercase hex digits");
  return Digest{std::string(algo), std::string(hex)};
}

std::string ImageRef::str() const {
  std::string s = registry + "/" + repository;
  if (!tag.empty()) s += ":" + tag;
  if (digest) s += "@" + digest->str();
  return s;
}

ImageRef ImageRef::pinned(const Digest& d) const {
  ImageRef r = *this;
  r.tag.clear();
  r.digest = d;
  return r;
}

Result<ImageRef> parse_image_ref(std::string_view s) {
  if (s.empty()) return make_error("an image reference is <registry>/<repository>:<tag>");
  if (s.size() > 512) return make_error("an image reference is at most 512 characters");
  ImageRef r;
  std::string_view rest = s;
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    auto d = parse_digest(rest.substr(at + 1));
    if (!d.ok()) return make_error("image '" + std::string(s) + "': " + d.error().message);
    r.digest = *d;
    rest = rest.substr(0, at);
  }
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos)
    return make_error("image '" + std::string(s) +
                      "' names no registry: write <registry>/<repository>:<tag>, e.g. "
                      "docker.io/library/busybox:1.36");
  std::string_view registry = rest.substr(0, slash);
  if (registry != "localhost" && registry.find('.') == std::string_view::npos &&
      registry.find(':') == std::string_view::npos && registry.front() != '[')
    return make_error("image '" + std::string(s) + "': '" + std::string(registry) +
                      "' is not a registry (a host with a dot or a port, or localhost): "
                      "write <registry>/<repository>:<tag>");
  if (!valid_registry(registry))
    return make_error("image '" + std::string(s) + "': '" + std::string(registry) +
                      "' is not a valid registry host[:port]");
  r.registry = std::string(registry);
  std::string_view path = rest.substr(slash + 1);
  // The tag follows the last ':' after the last '/'.
  size_t last_slash = path.rfind('/');
  size_t colon = path.rfind(':');
  if (colon != std::string_view::npos &&
      (last_slash == std::string_view::npos || colon > last_slash)) {
    std::string_view tag = path.substr(colon + 1);
    if (!valid_tag(tag))
      return make_error("image '" + std::string(s) + "': tag '" + std::string(tag.substr(0, 130)) +
                        "' is not valid (letters, digits, '_', '.', '-'; at most 128)");
    r.tag = std::string(tag);
    path = path.substr(0, colon);
  }
  if (path.empty() || path.size() > 255)
    return make_error("image '" + std::string(s) + "' names no repository");
  size_t start = 0;
  while (true) {
    size_t next = path.find('/', start);
    std::string_view comp =
        path.substr(start, next == std::string_view::npos ? std::string_view::npos : next - start);
    if (!valid_component(comp))
      return make_error("image '" + std::string(s) + "': repository component '" +
                        std::string(comp) +
                        "' is not valid (lowercase letters and digits, joined by '.', '_', "
                        "'__' or '-')");
    if (next == std::string_view::npos) break;
    start = next + 1;
  }
  r.repository = std::string(path);
  if (r.tag.empty() && !r.digest) r.tag = "latest";
  return r;
}

std::string manifest_accept_header() {
  return std::string(kOciIndex) + ", " + kOciManifest + ", " + kDockerList + ", " + kDockerManifest;
}

Platform host_platform() {
  Platform p;
  utsname u{};
  uname(&u);
  std::string m = u.machine;
  if (m == "x86_64")
    p.architecture = "amd64";
  else if (m == "aarch64" || m == "arm64") {
    p.architecture = "arm64";
    p.variant = "v8";
  } else if (m.rfind("armv7", 0) == 0) {
    p.architecture = "arm";
    p.variant = "v7";
  } else if (m.rfind("armv6", 0) == 0) {
    p.architecture = "arm";
    p.variant = "v6";
  } else if (m == "i386" || m == "i686")
    p.architecture = "386";
  else
    p.architecture = m;  // ppc64le, s390x, riscv64 are their own names
  return p;
}

Result<ManifestDoc> parse_manifest(std::string_view body, std::string_view media_type) {
  if (body.size() > kMaxManifestBytes)
    return make_error("manifest larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  auto parsed = parse_json_bounded(body, 16);
  if (!parsed.ok()) return make_error("manifest is not JSON: " + parsed.error().message);
  const json& doc = *parsed;
  if (!doc.is_object()) return make_error("manifest is not a JSON object");
  std::string type(media_type.substr(0, media_type.find(';')));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  TRY_ASSIGN(std::string own, string_member(doc, "mediaType", "", false, 255));
  if (type.empty() || type == "application/json") type = own;
  if (type.empty()) {
    // An OCI document may leave its type to the response: the shape tells.
    type = doc.contains("manifests") ? kOciIndex : kOciManifest;
  }
  if (!own.empty() && own != type)
    return field_error("mediaType", "says " + own + " but the registry sent " + type);
  ManifestDoc out;
  if (type == kOciIndex || type == kDockerList) {
    out.is_index = true;
    TRY_ASSIGN(out.entries, parse_index(doc));
  } else if (type == kOciManifest || type == kDockerManifest) {
    TRY_ASSIGN(out.manifest, parse_image_manifest(doc, type == kDockerManifest));
  } else {
    return make_error("manifest type '" + type.substr(0, 100) +
                      "' is not an OCI or Docker schema 2 manifest or index");
  }
  return out;
}

Result<Descriptor> select_platform(const std::vector<IndexEntry>& entries, const Platform& p) {
  const IndexEntry* best = nullptr;
  for (const auto& e : entries) {
    if (!e.has_platform || e.platform.os != p.os || e.platform.architecture != p.architecture)
      continue;
    if (!e.platform.variant.empty() && !p.variant.empty() && e.platform.variant != p.variant)
      continue;
    if (!e.platform.variant.empty() && p.variant.empty()) continue;
    if (e.manifest.media_type != kOciManifest && e.manifest.media_type != kDockerManifest) continue;
    if (!best || (e.platform.variant == p.variant && best->platform.variant != p.variant))
      best = &e;
  }
  if (best) return best->manifest;
  std::string offered;
  for (const auto& e : entries)
    if (e.has_platform && e.platform.os != "unknown") {
      if (!offered.empty()) offered += ", ";
      offered += e.platform.os + "/" + e.platform.architecture +
                 (e.platform.variant.empty() ? "" : "/" + e.platform.variant);
      if (offered.size() > 400) break;
    }
  return make_error("the image has no manifest for " + p.os + "/" + p.architecture +
                    (p.variant.empty() ? "" : "/" + p.variant) + " (it offers " +
                    (offered.empty() ? "none" : offered) + ")");
}

Result<ImageConfig> parse_image_config(std::string_view body) {
  if (body.size() > kMaxConfigBytes)
    return make_error("image configuration larger than " + std::to_string(kMaxConfigBytes));
  auto parsed = parse_json_bounded(body, 32);
  if (!parsed.ok()) return make_error("image configuration is not JSON: " + parsed.error().message);
  const json& doc = *parsed;
  if (!doc.is_object()) return make_error("image configuration is not a JSON object");
  ImageConfig c;
  TRY_ASSIGN(c.platform.os, string_member(doc, "os", "", true, 64));
  TRY_ASSIGN(c.platform.architecture, string_member(doc, "architecture", "", true, 64));
  TRY_ASSIGN(c.platform.variant, string_member(doc, "variant", "", false, 64));
  if (auto cfg = doc.find("config"); cfg != doc.end() && !cfg->is_null()) {
    if (!cfg->is_object()) return field_error("config", "must be an object");
    TRY_ASSIGN(c.entrypoint, string_list(*cfg, "Entrypoint", "config.", 4096, 128 << 10));
    TRY_ASSIGN(c.cmd, string_list(*cfg, "Cmd", "config.", 4096, 128 << 10));
    TRY_ASSIGN(c.env, string_list(*cfg, "Env", "config.", 4096, 128 << 10));
    for (size_t i = 0; i < c.env.size(); ++i)
      if (c.env[i].find('=') == std::string::npos || c.env[i].front() == '=')
        return field_error("config.Env[" + std::to_string(i) + "]", "is not NAME=value");
    TRY_ASSIGN(c.working_dir, string_member(*cfg, "WorkingDir", "config.", false, 4096));
    if (!c.working_dir.empty() && c.working_dir.front() != '/')
      return field_error("config.WorkingDir", "must be an absolute path");
    TRY_ASSIGN(c.user, string_member(*cfg, "User", "config.", false, 256));
  }
  auto rootfs = doc.find("rootfs");
  if (rootfs == doc.end() || !rootfs->is_object())
    return field_error("rootfs", "must be an object");
  TRY_ASSIGN(std::string type, string_member(*rootfs, "type", "rootfs.", true, 32));
  if (type != "layers") return field_error("rootfs.type", "must be \"layers\"");
  TRY_ASSIGN(auto ids, string_list(*rootfs, "diff_ids", "rootfs.", kMaxLayers, 200));
  for (size_t i = 0; i < ids.size(); ++i) {
    auto d = parse_digest(ids[i]);
    if (!d.ok())
      return field_error("rootfs.diff_ids[" + std::to_string(i) + "]", d.error().message);
    c.diff_ids.push_back(*d);
  }
  return c;
}

}  // namespace weft::oci
