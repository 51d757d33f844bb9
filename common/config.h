// TOML configuration helpers (toml++). Every error names the file and line.
//
// Typical use in a daemon's config loader:
//   TRY_ASSIGN(auto doc, TomlDoc::load(path));
//   TRY(doc.only_keys(doc.root(), "", {"socket", "state_dir", "labels"}));
//   TRY_ASSIGN(auto sock, doc.get_string(doc.root(), "socket"));   // optional<string>
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/toml.h"

#include "common/result.h"

namespace weft {

// Configs, job files and profiles are small; anything larger is refused unread.
inline constexpr size_t kMaxTomlBytes = 4u << 20;

class TomlDoc {
 public:
  static Result<TomlDoc> load(const std::string& path);
  static Result<TomlDoc> parse(const std::string& text, const std::string& name);

  const toml::table& root() const { return table_; }
  const std::string& name() const { return name_; }
  // "agent.toml:12" for a node, or the file name when the node has no source position.
  std::string where(const toml::node& n) const;

  // Fails on the first key of `t` not in `allowed`, naming it and its line.
  // `more`: further allowed keys shared by several files (e.g. kControlPlaneTlsKeys).
  Status only_keys(const toml::table& t, const std::string& prefix,
                   std::initializer_list<const char*> allowed,
                   const std::vector<std::string>& more = {}) const;
  Result<std::optional<std::string>> get_string(const toml::table& t, const char* key) const;
  // Each key of `fields` present in `t` is read as a string into its target; an absent
  // one leaves its target (the default) as it was.
  Status read_strings(const toml::table& t,
                      std::initializer_list<std::pair<const char*, std::string*>> fields) const;
  Result<std::optional<int64_t>> get_int(const toml::table& t, const char* key) const;
  Result<std::optional<bool>> get_bool(const toml::table& t, const char* key) const;
  // An array of strings, or nullopt when absent.
  Result<std::optional<std::vector<std::string>>> get_string_list(const toml::table& t,
                                                                  const char* key) const;
  // A sub-table, or nullptr when absent; an error if the key is not a table.
  Result<const toml::table*> get_table(const toml::table& t, const char* key) const;
  // A table of string values (labels and the like).
  Result<std::map<std::string, std::string>> get_string_map(const toml::table& t,
                                                            const char* key) const;

 private:
  TomlDoc(toml::table t, std::string name) : table_(std::move(t)), name_(std::move(name)) {}
  Error type_error(const toml::node& n, const char* key, const char* want) const;
  toml::table table_;
  std::string name_;
};

}  // namespace weft
