// Job files: the TOML an operator writes for `weftctl job create|update FILE`, turned
// into the params of the control plane's job.create / job.update (docs/jobs.md).
//
//   name = "web"                 # job name: letters, digits, '-' and '_'
//   entitlement = "frontend"     # the entitlement whose machines run it
//   count = 6                    # tasks
//   max_unavailable = 2          # rolling updates replace this many at a time
//   machine_type = "T1"          # optional hard constraint
//   [resources]                  # reserved per task on the machine
//   cpu = 0.5                    # cores (or "500m")
//   memory = "256M"
//   [task]                       # weft-agent's task spec (docs/task-spec.md), minus name
//   argv = ["/usr/bin/web", "--port", "8080"]
//
// Every error names the file and line.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

Result<nlohmann::json> parse_job_file(const std::string& text, const std::string& name);
Result<nlohmann::json> load_job_file(const std::string& path);

}  // namespace weft
