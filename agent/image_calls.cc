#include "agent/image_calls.h"

#include <memory>
#include <optional>

#include "common/json_bounded.h"
#include "common/oci.h"
#include "common/task_spec.h"

namespace weft::agent {

using json = nlohmann::json;

void ImageCalls::add_to(rpc::Dispatcher& d, const rpc::Guard& guard) {
  // Guarded: changes the cache, root or the socket group only.
  static const rpc::Method<ImageCalls> kMethods[] = {
      {"image.ls", &ImageCalls::ls},
      {"image.pull", &ImageCalls::pull, rpc::kPrivileged},
      {"image.rm", &ImageCalls::rm, rpc::kPrivileged},
      {"image.prune", &ImageCalls::prune, rpc::kPrivileged},
  };
  rpc::add_methods(d, this, kMethods, guard);
}

Result<json> ImageCalls::ls(const json&, const rpc::CallContext&) {
  return json{{"images", images_.cache().list()},
              {"size", images_.cache().size_bytes()},
              {"limit", cfg_.image_cache_max},
              {"reserve", cfg_.image_reserve},
              {"refused", images_.cache().refused()},
              {"blob_downloads", images_.blob_downloads()},
              {"downloaded_bytes", images_.downloaded_bytes()},
              {"evictions", images_.cache().evictions()}};
}

// {"image": ref, "package": {url, sha256}, "wait": bool}: either or both. Without
// wait (or off a session) the fetch starts and the call answers at once; with it, the
// answer comes when both are local, or with the first failure.
Result<json> ImageCalls::pull(const json& p, const rpc::CallContext& c) {
  if (!p.is_object()) return field_error("params", "must be an object");
  std::string canonical;
  if (p.contains("image")) {
    TRY_ASSIGN(std::string ref, string_member(p, "image"));
    auto parsed = oci::parse_image_ref(ref);
    if (!parsed.ok()) return field_error("image", parsed.error().message);
    canonical = parsed->str();
  }
  std::optional<PackageSpec> pkg;
  std::optional<oci::Digest> pkg_digest;
  if (p.contains("package")) {
    TRY_ASSIGN(PackageSpec parsed, parse_package_spec(p["package"]));
    auto d = oci::parse_digest("sha256:" + parsed.sha256);
    if (!d.ok()) return field_error("package.sha256", d.error().message);
    pkg = std::move(parsed);
    pkg_digest = *d;
  }
  if (canonical.empty() && !pkg) return field_error("image", "is required (or package)");
  bool wait = p.contains("wait") && p["wait"].is_boolean() && p["wait"].get<bool>();
  json started{{"started", true}};
  if (!canonical.empty()) started["image"] = canonical;
  if (pkg) started["package"] = pkg_digest->str();
  if (!wait || !c.session) {
    // A prefetch: local soon; nothing holds it until a task does.
    if (!canonical.empty()) images_.pull(canonical, {}, [](Result<image::LocalImage>) {});
    if (pkg) images_.pull_package(pkg->url, *pkg_digest, {}, [](Result<image::LocalImage>) {});
    return started;
  }
  // One answer for both: the first failure, or everything once the last is here.
  struct Join {
    int left = 0;
    bool answered = false;
    json out = json::object();
    rpc::ReplyFn reply;
  };
  auto join = std::make_shared<Join>();
  join->reply = c.session->defer_reply();
  join->left = (canonical.empty() ? 0 : 1) + (pkg ? 1 : 0);
  auto done = [join](const char* key, Result<image::LocalImage> img) {
    if (join->answered) return;
    if (!img.ok()) {
      join->answered = true;
      return join->reply(std::move(img).error().wrap(key));
    }
    json layers = json::array();
    for (const auto& l : img->layers) layers.push_back(l.str());
    if (std::string(key) == "image") {
      join->out["manifest"] = img->manifest.str();
      join->out["layers"] = layers;
    } else {
      join->out["package"] = img->manifest.str();
    }
    if (--join->left == 0) {
      join->answered = true;
      join->reply(join->out);
    }
  };
  if (!canonical.empty()) {
    join->out["image"] = canonical;
    images_.pull(canonical, {},
                 [done](Result<image::LocalImage> img) { done("image", std::move(img)); });
  }
  if (pkg)
    images_.pull_package(pkg->url, *pkg_digest, {}, [done](Result<image::LocalImage> img) {
      done("package", std::move(img));
    });
  return json();
}

Result<json> ImageCalls::rm(const json& p, const rpc::CallContext&) {
  TRY_ASSIGN(std::string what, string_member(p, "image"));
  if (auto parsed = oci::parse_image_ref(what); parsed.ok()) what = parsed->str();
  return images_.cache().remove(what);
}

Result<json> ImageCalls::prune(const json&, const rpc::CallContext&) {
  return images_.cache().prune();
}

}  // namespace weft::agent
