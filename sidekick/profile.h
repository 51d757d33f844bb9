// Host profiles: TOML files (docs/profiles.md) parsed and compiled into a flat list of
// typed knobs. Parsing and compiling do no I/O beyond reading profile files; every
// error names the file and line, and nothing is applied until a whole profile compiles.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace weft::sidekick {

// How a knob's current value is compared with the desired one.
enum class Comparator { kEqual, kAtLeast, kCpuList, kMask };
// What applying it costs: runtime writes, disruptive (a link flaps), slow (converges in
// the background), reboot (verified against /proc/cmdline after the next boot).
enum class KnobClass { kRuntime, kDisruptive, kSlow, kReboot };

struct Knob {
  std::string id;      // unique and stable: "sysctl:net.core.somaxconn", "thp:enabled"
  std::string family;  // sysctl, hugepages, thp, cpu, cgroup, kernel
  std::string key;     // family-specific address, e.g. "net.core.somaxconn", "2048kB/node0"
  std::string value;   // desired value, canonical text
  Comparator cmp = Comparator::kEqual;
  KnobClass klass = KnobClass::kRuntime;
  bool required = true;
  int order = 0;             // apply order (dependencies first); rollback is the reverse
  std::string source;        // "web.toml:12"
  uint64_t deadline_us = 0;  // slow knobs: how long convergence may take (0 = default)
  bool wait = false;         // slow knobs: the switch waits for convergence
};

struct Profile {
  std::string name;
  std::string description;
  std::vector<std::string> includes;  // as written
  std::vector<std::string> files;     // every file read, includes first
  std::vector<Knob> knobs;            // compiled, sorted by (order, id)
};

// Profile directories in lookup order: the first that has NAME.toml wins, so
// /etc/weft/profiles.d overrides /usr/share/weft/profiles.
struct ProfilePath {
  std::vector<std::string> dirs;
};

// Loads NAME (with its includes, later wins) and compiles it.
Result<Profile> load_profile(const ProfilePath& path, const std::string& name);
// Parses one profile text on its own (no includes) — for tests and validation.
Result<Profile> parse_profile_text(const std::string& text, const std::string& file_name);
// Names of every profile in the path (first occurrence wins).
std::vector<std::string> list_profiles(const ProfilePath& path);

const char* comparator_name(Comparator c);
const char* class_name(KnobClass k);
// True when `current` satisfies `desired` under `cmp`.
bool knob_satisfied(Comparator cmp, const std::string& desired, const std::string& current);
// "0-2,4" -> {0,1,2,4}; empty optional on bad input.
std::optional<std::vector<int>> parse_cpulist(const std::string& s);

}  // namespace weft::sidekick
