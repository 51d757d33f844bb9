#include "cli/profile.h"

#include <functional>
#include <thread>

#include "common/config.h"
#include "common/fs.h"

namespace weft::cli {

namespace {

// Prints a switch/verify/off report and returns its exit code: 0 ok, 1 failed,
// 3 degraded, 4 reboot required, 5 drift.
int report_profile(const json& r, bool as_json) {
  if (as_json) {
    std::cout << r.dump(2) << "\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"KNOB", "STATUS", "FROM", "TO", "SOURCE"}};
    for (const auto& k : r.value("knobs", json::array()))
      rows.push_back({str_or(k, "id"), str_or(k, "status"), str_or(k, "from"), str_or(k, "to"),
                      str_or(k, "source")});
    if (rows.size() > 1) print_table(rows);
    std::cout << "outcome: " << r.value("outcome", "?");
    if (r.contains("error")) std::cout << ": " << r["error"].get<std::string>();
    std::cout << "\n";
  }
  return r.value("exit_code", 1);
}

}  // namespace

void add_profile_commands(CLI::App& app, ProfileCommands& c) {
  c.profile = app.add_subcommand("profile", "host profiles (weft-sidekick)");
  c.profile->require_subcommand(1);
  c.ls = c.profile->add_subcommand("ls", "list profiles");
  c.show = c.profile->add_subcommand("show", "a profile's compiled knobs");
  c.show->add_option("name", c.name, "profile")->required();
  c.active = c.profile->add_subcommand("active", "the active profile and its last verification");
  c.plan = c.profile->add_subcommand("plan", "what switching to a profile would change");
  c.plan->add_option("name", c.name, "profile")->required();
  c.switch_to =
      c.profile->add_subcommand("switch", "switch to a profile (only changed knobs are written)");
  c.switch_to->add_option("name", c.name, "profile")->required();
  c.switch_to->add_flag("--no-wait", c.no_wait,
                        "do not follow huge pages converging in the background");
  c.verify = c.profile->add_subcommand("verify", "compare the machine with the active profile");
  c.off = c.profile->add_subcommand("off", "restore every setting weft changed");
  c.import_tuned = c.profile->add_subcommand(
      "import-tuned", "convert a TuneD profile (tuned.conf) to weft's format");
  c.import_tuned->add_option("path", c.tuned_path, "TuneD profile directory or tuned.conf")
      ->required();
  c.history = c.profile->add_subcommand("history", "past switches");
  c.history->add_option("-n,--limit", c.limit, "how many");
}

int run_profile_commands(const ProfileCommands& c, const Globals& g) {
  if (!c.profile->parsed()) return -1;
  auto sk = connect_or_die(g.sidekick, "weft-sidekick", "--sidekick");
  if (c.ls->parsed()) {
    json r = call_or_die(*sk, "profile.ls", json::object());
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"NAME", "ACTIVE", "DESCRIPTION"}};
      for (const auto& p : r["profiles"])
        rows.push_back(
            {str_or(p, "name"), p.value("active", false) ? "*" : "",
             p.value("valid", true) ? str_or(p, "description") : "INVALID: " + str_or(p, "error")});
      print_table(rows);
    });
  } else if (c.show->parsed()) {
    json r = call_or_die(*sk, "profile.show", {{"name", c.name}});
    print_json_or(g, r, [&] {
      std::cout << r["name"].get<std::string>() << ": " << str_or(r, "description") << "\n";
      std::vector<std::vector<std::string>> rows = {
          {"KNOB", "VALUE", "CMP", "CLASS", "REQUIRED", "SOURCE"}};
      for (const auto& k : r["knobs"])
        rows.push_back({str_or(k, "id"), str_or(k, "value"), str_or(k, "cmp"), str_or(k, "class"),
                        k.value("required", true) ? "yes" : "no", str_or(k, "source")});
      print_table(rows);
    });
  } else if (c.active->parsed()) {
    json r = call_or_die(*sk, "profile.active", json::object());
    print_json_or(g, r, [&] {
      std::cout << str_or(r, "profile", "none") << " (" << str_or(r, "state") << ")\n";
    });
  } else if (c.plan->parsed()) {
    json r = call_or_die(*sk, "profile.plan", {{"name", c.name}});
    print_json_or(g, r, [&] {
      for (const auto& k : r.value("conflicts", json::array()))
        std::cerr << "conflict: " << str_or(k, "knob") << " also set by " << str_or(k, "owner")
                  << " (" << str_or(k, "detail") << ")\n";
      std::vector<std::vector<std::string>> rows = {{"KNOB", "FROM", "TO", "CLASS", "SOURCE"}};
      for (const auto& k : r["changes"])
        rows.push_back({str_or(k, "id"), str_or(k, "from"), str_or(k, "to"), str_or(k, "class"),
                        str_or(k, "source")});
      print_table(rows);
      std::cout << r["changes"].size() << " to change, " << r.value("unchanged", 0)
                << " already right\n";
      for (const auto& a : r.value("reboot_pending", json::array()))
        std::cout << "needs a reboot: kernel argument " << a.get<std::string>() << "\n";
    });
  } else if (c.switch_to->parsed()) {
    json r = call_or_die(*sk, "profile.switch", {{"name", c.name}});
    int rc = report_profile(r, g.json_out);
    bool converging = false;
    for (const auto& k : r.value("knobs", json::array()))
      converging |= k.value("status", "") == "converging";
    if (!converging || c.no_wait) return rc;
    // Slow knobs (huge pages) converge in the background: show their progress.
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      json a = call_or_die(*sk, "profile.active", json::object());
      bool pending = false, failed = false;
      std::string line;
      for (const auto& k : a.value("convergence", json::array())) {
        line += "  " + str_or(k, "id") + " " + str_or(k, "progress") + " " + str_or(k, "state");
        pending |= k.value("state", "") == "converging";
        failed |= k.value("state", "") == "failed";
      }
      if (g.json_out)
        std::cout << a["convergence"].dump() << "\n";
      else
        std::cout << "converging:" << line << "\n";
      std::cout.flush();
      if (!pending) return failed ? 1 : rc;
    }
  } else if (c.verify->parsed()) {
    return report_profile(call_or_die(*sk, "profile.verify", json::object()), g.json_out);
  } else if (c.off->parsed()) {
    return report_profile(call_or_die(*sk, "profile.off", json::object()), g.json_out);
  } else if (c.import_tuned->parsed()) {
    std::string file = c.tuned_path;
    if (path_exists(file + "/tuned.conf")) file += "/tuned.conf";
    auto text = read_file_bounded(file, kMaxTomlBytes);
    if (!text.ok()) die(text.error().str(), 1);
    std::string name = c.tuned_path;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    if (name.size() > 11 && name.compare(name.size() - 11, 11, "/tuned.conf") == 0)
      name.resize(name.size() - 11);
    name = name.substr(name.rfind('/') + 1);
    json r = call_or_die(*sk, "profile.import_tuned", {{"text", *text}, {"name", name}});
    if (g.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      std::cout << r["toml"].get<std::string>();
      for (const auto& u : r["unconverted"])
        std::cerr << "not converted: " << u.get<std::string>() << "\n";
    }
    return r["unconverted"].empty() ? 0 : 3;
  } else if (c.history->parsed()) {
    json r = call_or_die(*sk, "profile.history", {{"limit", c.limit}});
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {
          {"ID", "FROM", "TO", "STATE", "STARTED", "DETAIL"}};
      for (const auto& h : r["switches"])
        rows.push_back({str_or(h, "id"), str_or(h, "from"), str_or(h, "to"), str_or(h, "state"),
                        str_or(h, "started_at"), str_or(h, "detail")});
      print_table(rows);
    });
  }
  return 0;
}

}  // namespace weft::cli
