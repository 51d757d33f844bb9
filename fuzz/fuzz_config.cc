// Every daemon's configuration file and weftctl.toml; the first byte picks which ('w':
// weftctl.toml, else its value modulo 4 a daemon).
#include <cstdint>
#include <string>

#include "agent/agent_conf.h"
#include "common/cli_config.h"
#include "controlplane/cp_conf.h"
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
