// Image and package tasks (agent/image/): fetching until the image and the package are
// local (one after the other), then started (or failed with the reason); the layers held
// while the task may run, and given back when it may not.
#pragma once

#include <string>

#include "agent/image/service.h"
#include "agent/image_calls.h"
#include "agent/task.h"
#include "common/result.h"

namespace weft::agent {

class Manager;

class Fetching {
 public:
  explicit Fetching(Manager& m) : m_(m) {}
  // Image and package tasks: fetching until the image and the package are local (one
  // after the other), then started (or failed with the reason); holds their layers
  // while the task may run. have_local() takes hold of what is here already and says
  // whether anything is missing.
  bool have_local(Task& t);
  void begin_fetch(Task& t);
  void on_fetched(const std::string& id, bool package, Result<image::LocalImage> img);
  void release_image(Task& t);

 private:
  friend class Manager;
  friend class TaskApi;
  friend class CpCalls;
  Manager& m_;
  std::unique_ptr<image::Service> images_;
  std::unique_ptr<ImageCalls> image_calls_;  // image.* (image_calls.h)
};

}  // namespace weft::agent
