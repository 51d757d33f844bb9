// weftctl top (docs/operations.md): what running tasks use, through the control plane,
// by job (the default), task or machine.
#include "cli/cluster.h"

#include <cstdio>

namespace weft::cli {

namespace {

std::string mib(const json& row, const char* key) {
  if (!row.contains(key) || !row[key].is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", row[key].get<double>() / (1 << 20));
  return buf;
}
std::string cores(const json& row, const char* key) {
  if (!row.contains(key) || !row[key].is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", row[key].get<double>() / 1000);
  return buf;
}
std::string kib_s(const json& row, const char* key) {
  if (!row.contains(key) || !row[key].is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", row[key].get<double>() / 1024);
  return buf;
}

}  // namespace

namespace {

struct TopOptions {
  std::string of = "jobs", job, entitlement, machine;
};

}  // namespace

void add_top_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<TopOptions>();
  CLI::App* top = app.add_subcommand(
      "top",
      "what running tasks use (CPU, memory, I/O), by job, task or machine, as their "
      "agents last measured it");
  top->add_option("of", o->of, "jobs (the default), tasks or machines")
      ->check(CLI::IsMember({"jobs", "tasks", "machines"}));
  top->add_option("--job", o->job, "only this job's tasks");
  top->add_option("--entitlement", o->entitlement, "only this entitlement's jobs");
  top->add_option("--machine", o->machine, "only the tasks on this machine");
  h.on(top, [o](const Globals& g) {
    json params{{"of", o->of}};
    if (!o->job.empty()) params["job"] = o->job;
    if (!o->entitlement.empty()) params["entitlement"] = o->entitlement;
    if (!o->machine.empty()) params["machine"] = o->machine;
    json r = call_or_die(*cp_client(g), "top", params, 10000);
    print_json_or(g, r, [&] {
      const json& rows = r.value("rows", json::array());
      const bool tasks = o->of == "tasks", machines = o->of == "machines";
      std::printf("%-36s %7s %9s %9s %9s %9s %9s\n",
                  tasks      ? "TASK"
                  : machines ? "MACHINE"
                             : "JOB",
                  tasks ? "STATE" : "TASKS", "CPU", machines ? "CPU_CAP" : "CPU_REQ", "MEM_MIB",
                  machines ? "MEM_CAP" : "MEM_REQ", "IO_KIB/S");
      for (const auto& row : rows) {
        std::string name = str_or(row, tasks ? "task" : machines ? "machine" : "job");
        std::string count = tasks ? str_or(row, "state") : str_or(row, "tasks");
        std::string cpu_cap = cores(row, machines ? "cpu_capacity_milli" : "cpu_request_milli");
        std::string mem_cap = str_or(row, machines ? "mem_capacity_mb" : "mem_request_mb");
        json io = json::object();
        if (row.contains("io_read_bps"))
          io["io"] = row.value("io_read_bps", 0.0) + row.value("io_write_bps", 0.0);
        std::printf("%-36s %7s %9s %9s %9s %9s %9s\n", name.c_str(), count.c_str(),
                    cores(row, "cpu_milli").c_str(), cpu_cap.c_str(), mib(row, "mem_bytes").c_str(),
                    mem_cap.c_str(), kib_s(io, "io").c_str());
      }
      if (rows.empty()) std::printf("(no running tasks)\n");
      const json& silent = r.value("silent", json::array());
      if (!silent.empty()) {
        std::printf("\nno answer from %zu machines:", silent.size());
        for (const auto& m : silent) std::printf(" %s", m.get<std::string>().c_str());
        std::printf("\n");
      }
      std::printf("(CPU in cores over the agents' last %s ms; memory now)\n",
                  str_or(r, "interval_ms").c_str());
    });
    return 0;
  });
}

}  // namespace weft::cli
