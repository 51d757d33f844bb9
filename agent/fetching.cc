#include "agent/fetching.h"

#include "agent/manager.h"

namespace weft::agent {

using json = nlohmann::json;

bool Fetching::have_local(Task& t) {
  if (!t.spec.image.empty() && !t.image) {
    if (auto img = images_->cache().local(t.spec.image)) t.image = *img;
  }
  if (t.spec.package && !t.package) {
    auto d = oci::parse_digest("sha256:" + t.spec.package->sha256);
    if (d.ok())
      if (auto pkg = images_->cache().local_package(*d)) t.package = *pkg;
  }
  if (t.image) images_->cache().hold(t.id, *t.image);
  if (t.package) images_->cache().hold(t.id, *t.package);
  return (t.spec.image.empty() || t.image) && (!t.spec.package || t.package);
}

void Fetching::begin_fetch(Task& t) {
  t.state = TaskState::kFetching;
  t.fetch = {};
  if (auto st = m_.save(t); !st.ok())
    log_error("could not record task", {{"TASK_ID", t.id}, {"ERROR", st.error().str()}});
  std::string id = t.id;
  auto progress = [this, id](const image::PullProgress& p) {
    if (auto it = m_.tasks_.find(id); it != m_.tasks_.end()) it->second->fetch = p;
  };
  if (t.spec.image.empty() && !t.spec.package) return m_.fail_task(t, "nothing to fetch");
  // The image first, then the package; with both here already (a restart while
  // fetching), the service finds them local and answers on the loop.
  bool image_next = !t.spec.image.empty() && (!t.image || !t.spec.package || t.package);
  if (image_next) {
    log_info("fetching the task's image", {{"TASK_ID", id}, {"IMAGE", t.spec.image}});
    t.fetch_ticket = images_->pull(
        t.spec.image, progress,
        [this, id](Result<image::LocalImage> img) { on_fetched(id, false, std::move(img)); });
  } else {
    const PackageSpec& pkg = *t.spec.package;
    auto d = oci::parse_digest("sha256:" + pkg.sha256);
    if (!d.ok()) return m_.fail_task(t, "package: " + d.error().str());
    log_info("fetching the task's package", {{"TASK_ID", id}, {"URL", pkg.url}});
    t.fetch_ticket = images_->pull_package(
        pkg.url, *d, progress,
        [this, id](Result<image::LocalImage> img) { on_fetched(id, true, std::move(img)); });
  }
  m_.update_status();
}

void Fetching::on_fetched(const std::string& id, bool package, Result<image::LocalImage> img) {
  auto it = m_.tasks_.find(id);
  if (it == m_.tasks_.end()) return;
  Task& t = *it->second;
  t.fetch_ticket = 0;
  if (t.state != TaskState::kFetching) return;
  if (!img.ok()) {
    // A manifest or config the agent refuses (too many layers, an unknown media type)
    // is refused the same way on every machine: the control plane holds the index with
    // the reason rather than pulling it again elsewhere (a registry that did not answer
    // is not such a refusal).
    t.setup_failed = !img.error().field.empty();
    return m_.fail_task(t, package ? "package " + t.spec.package->url + ": " + img.error().str()
                                   : "image " + t.spec.image + ": " + img.error().str());
  }
  (package ? t.package : t.image) = *img;
  images_->cache().hold(t.id, *img);
  if (!have_local(t)) return begin_fetch(t);  // the package after the image
  Status s = m_.start_incarnation(t);
  if (!s.ok()) m_.fail_task(t, "start failed: " + s.error().str());
}

void Fetching::release_image(Task& t) {
  if (t.fetch_ticket) images_->cancel(std::exchange(t.fetch_ticket, 0));
  images_->cache().release(t.id);
}

}  // namespace weft::agent
