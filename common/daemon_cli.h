// The command line every weft daemon takes: -c/--config (its file, /etc/weft/<name>.toml
// by default) and --check-config, and the configuration read from it (common/daemon.h's
// load_config_or_defaults: the defaults when no file was named and none is at the default
// path). A daemon adds its own options beside these.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "common/daemon.h"
#include "common/log.h"

namespace weft {

class DaemonCommandLine {
 public:
  // `ident` names the daemon in the journal and in errors ("weft-agent").
  DaemonCommandLine(CLI::App& app, std::string ident, std::string default_config)
      : app_(app), ident_(std::move(ident)), config_path_(std::move(default_config)) {
    app.add_option("-c,--config", config_path_, "configuration file");
    app.add_flag("--check-config", check_only_, "validate the configuration and exit");
  }
  // After parsing: the journal's identifier set, the configuration read (errors printed
  // as "<ident>: <error>"; nothing means exit 2) and its log level applied.
  template <class Config, class Loader>
  std::optional<Config> load(Loader loader) const {
    log_set_ident(ident_);
    auto cfg =
        load_config_or_defaults<Config>(ident_, config_path_, app_.count("--config") > 0, loader);
    if (cfg) log_set_level_name(cfg->log_level);  // validated with the config
    return cfg;
  }
  bool check_only() const { return check_only_; }
  const std::string& config_path() const { return config_path_; }

 private:
  CLI::App& app_;
  std::string ident_, config_path_;
  bool check_only_ = false;
};

}  // namespace weft
