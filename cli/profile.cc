// weftctl profile: host profiles (weft-sidekick): ls, show, active, plan, switch, verify,
// off, import-tuned, history.
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

struct ProfileOptions {
  std::string name, tuned_path;
  int limit = 20;
  bool no_wait = false;
};

std::unique_ptr<rpc::Client> sidekick_client(const Globals& g) {
  return connect_or_die(g.sidekick, "weft-sidekick", "--sidekick");
}

// `profile switch`: the switch, then (unless --no-wait) huge pages converging shown.
int profile_switch(const Globals& g, const ProfileOptions& opts) {
  auto sk = sidekick_client(g);
  json r = call_or_die(*sk, "profile.switch", {{"name", opts.name}});
  int rc = report_profile(r, g.json_out);
  bool converging = false;
  for (const auto& k : r.value("knobs", json::array()))
    converging |= k.value("status", "") == "converging";
  if (!converging || opts.no_wait) return rc;
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
  return 0;
}

// `profile import-tuned`: a TuneD profile converted by the sidekick; 3 when some of it
// could not be.
int profile_import_tuned(const Globals& g, const ProfileOptions& opts) {
  auto sk = sidekick_client(g);
  std::string file = opts.tuned_path;
  if (path_exists(file + "/tuned.conf")) file += "/tuned.conf";
  auto text = read_file_bounded(file, kMaxTomlBytes);
  if (!text.ok()) die(text.error().str(), 1);
  std::string name = opts.tuned_path;
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
}

}  // namespace

void add_profile_commands(CLI::App& app, Handlers& h) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* profile = app.add_subcommand("profile", "host profiles (weft-sidekick)");
  profile->require_subcommand(1);
  CLI::App* ls = profile->add_subcommand("ls", "list profiles");
  h.on(ls, [](const Globals& g) {
    auto sk = sidekick_client(g);
    json r = call_or_die(*sk, "profile.ls", json::object());
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {{"NAME", "ACTIVE", "DESCRIPTION"}};
      for (const auto& p : r["profiles"])
        rows.push_back(
            {str_or(p, "name"), p.value("active", false) ? "*" : "",
             p.value("valid", true) ? str_or(p, "description") : "INVALID: " + str_or(p, "error")});
      print_table(rows);
    });
    return 0;
  });
  CLI::App* show = profile->add_subcommand("show", "a profile's compiled knobs");
  show->add_option("name", o->name, "profile")->required();
  h.on(show, [o](const Globals& g) {
    auto sk = sidekick_client(g);
    json r = call_or_die(*sk, "profile.show", {{"name", o->name}});
    print_json_or(g, r, [&] {
      std::cout << r["name"].get<std::string>() << ": " << str_or(r, "description") << "\n";
      std::vector<std::vector<std::string>> rows = {
          {"KNOB", "VALUE", "CMP", "CLASS", "REQUIRED", "SOURCE"}};
      for (const auto& k : r["knobs"])
        rows.push_back({str_or(k, "id"), str_or(k, "value"), str_or(k, "cmp"), str_or(k, "class"),
                        k.value("required", true) ? "yes" : "no", str_or(k, "source")});
      print_table(rows);
    });
    return 0;
  });
  CLI::App* active =
      profile->add_subcommand("active", "the active profile and its last verification");
  h.on(active, [](const Globals& g) {
    auto sk = sidekick_client(g);
    json r = call_or_die(*sk, "profile.active", json::object());
    print_json_or(g, r, [&] {
      std::cout << str_or(r, "profile", "none") << " (" << str_or(r, "state") << ")\n";
    });
    return 0;
  });
  CLI::App* plan = profile->add_subcommand("plan", "what switching to a profile would change");
  plan->add_option("name", o->name, "profile")->required();
  h.on(plan, [o](const Globals& g) {
    auto sk = sidekick_client(g);
    json r = call_or_die(*sk, "profile.plan", {{"name", o->name}});
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
    return 0;
  });
  CLI::App* switch_to =
      profile->add_subcommand("switch", "switch to a profile (only changed knobs are written)");
  switch_to->add_option("name", o->name, "profile")->required();
  switch_to->add_flag("--no-wait", o->no_wait,
                      "do not follow huge pages converging in the background");
  h.on(switch_to, [o](const Globals& g) { return profile_switch(g, *o); });
  CLI::App* verify =
      profile->add_subcommand("verify", "compare the machine with the active profile");
  h.on(verify, [](const Globals& g) {
    auto sk = sidekick_client(g);
    return report_profile(call_or_die(*sk, "profile.verify", json::object()), g.json_out);
  });
  CLI::App* off = profile->add_subcommand("off", "restore every setting weft changed");
  h.on(off, [](const Globals& g) {
    auto sk = sidekick_client(g);
    return report_profile(call_or_die(*sk, "profile.off", json::object()), g.json_out);
  });
  CLI::App* import_tuned = profile->add_subcommand(
      "import-tuned", "convert a TuneD profile (tuned.conf) to weft's format");
  import_tuned->add_option("path", o->tuned_path, "TuneD profile directory or tuned.conf")
      ->required();
  h.on(import_tuned, [o](const Globals& g) { return profile_import_tuned(g, *o); });
  CLI::App* history = profile->add_subcommand("history", "past switches");
  history->add_option("-n,--limit", o->limit, "how many");
  h.on(history, [o](const Globals& g) {
    auto sk = sidekick_client(g);
    json r = call_or_die(*sk, "profile.history", {{"limit", o->limit}});
    print_json_or(g, r, [&] {
      std::vector<std::vector<std::string>> rows = {
          {"ID", "FROM", "TO", "STATE", "STARTED", "DETAIL"}};
      for (const auto& sw : r["switches"])
        rows.push_back({str_or(sw, "id"), str_or(sw, "from"), str_or(sw, "to"), str_or(sw, "state"),
                        str_or(sw, "started_at"), str_or(sw, "detail")});
      print_table(rows);
    });
    return 0;
  });
}

}  // namespace weft::cli
