// The machine's image cache through the agent's local API (docs/images.md, `weftctl
// image`): image.ls, image.pull (also the control plane's prefetch before a rolling
// update), image.rm and image.prune. The cache itself is image::Service's.
#pragma once

#include <nlohmann/json.hpp>

#include "agent/agent_conf.h"
#include "agent/image/service.h"
#include "common/rpc/session.h"

namespace weft::agent {

class ImageCalls {
 public:
  using json = nlohmann::json;
  ImageCalls(const AgentConfig& cfg, image::Service& images) : cfg_(cfg), images_(images) {}
  // The calls, the changing ones behind `guard`.
  void add_to(rpc::Dispatcher& d, const rpc::Guard& guard);
  // {"image": ref, "package": {url, sha256}, "wait": bool}: either or both.
  Result<json> pull(const json& p, const rpc::CallContext& c);

 private:
  Result<json> ls(const json& p, const rpc::CallContext& c);
  Result<json> rm(const json& p, const rpc::CallContext& c);
  Result<json> prune(const json& p, const rpc::CallContext& c);

  const AgentConfig& cfg_;
  image::Service& images_;
};

}  // namespace weft::agent
