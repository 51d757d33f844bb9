// Every daemon's configuration file, weftctl.toml and the control plane's secrets key
// file; the first byte picks which ('w': weftctl.toml, 'k': a key file, whose sealing
// must round-trip; else its value modulo 4 a daemon).
#include <cstdint>
#include <string>

#include "agent/agent_conf.h"
#include "cli/cli_config.h"
#include "common/secret_box.h"
#include "controlplane/daemon/cp_conf.h"
#include "hcs/hcs_conf.h"
#include "sidekick/sidekick_conf.h"

using namespace weft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] == 'w') {
    (void)parse_cli_config(text, "weftctl.toml");
    return 0;
  }
  if (data[0] == 'k') {
    auto box = SecretBox::parse(text, "secrets.key");
    if (box.ok()) {
      std::string sealed = (*box)->seal(text, "fuzz/task.env.X");
      auto opened = (*box)->open(sealed, "fuzz/task.env.X");
      if (!opened.ok() || *opened != text) __builtin_trap();
      if ((*box)->open(sealed, "fuzz/task.env.Y").ok()) __builtin_trap();  // bound to its place
    }
    return 0;
  }
  switch (data[0] % 4) {
    case 0:
      (void)agent::parse_agent_config(text, "agent.toml");
      break;
    case 1:
      (void)sidekick::parse_sidekick_config(text, "sidekick.toml");
      break;
    case 2:
      (void)hcs::parse_hcs_config(text, "hcs.toml");
      break;
    default:
      (void)cp::parse_cp_config(text, "controlplane.toml");
      break;
  }
  return 0;
}
