#include "common/config.h"

#include <algorithm>
#include <cstring>

#include "common/fs.h"

namespace weft {

Result<TomlDoc> TomlDoc::load(const std::string& path) {
  TRY_ASSIGN(std::string text, read_file_bounded(path, kMaxTomlBytes));
  return parse(text, path);
}

namespace {

// toml++ builds (and later destroys) one nested table per dotted-key part, recursively:
// a 400 KB key "a.a.a...." exhausts any stack. Keys nest only through dots on one line
// (headers are absolute, inline tables cannot span lines, and toml++ caps nested
// values at 256), so bounding the dots outside strings and comments on each line bounds
// the depth. The line of the first offence is returned, 0 when there is none.
size_t line_with_too_many_dots(const std::string& text, size_t max_dots) {
  size_t line = 1, dots = 0;
  enum { kNone, kBasic, kLiteral, kMultiBasic, kMultiLiteral } str = kNone;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      dots = 0;
      comment = false;
      if (str == kBasic || str == kLiteral) str = kNone;  // unterminated: toml++ reports it
      continue;
    }
    if (comment) continue;
    auto triple = [&](char q) { return text.compare(i, 3, std::string(3, q)) == 0; };
    switch (str) {
      case kNone:
        if (c == '#') {
          comment = true;
        } else if (c == '"') {
          str = triple('"') ? kMultiBasic : kBasic;
          if (str == kMultiBasic) i += 2;
        } else if (c == '\'') {
          str = triple('\'') ? kMultiLiteral : kLiteral;
          if (str == kMultiLiteral) i += 2;
        } else if (c == '.' && ++dots > max_dots) {
          return line;
        }
        break;
      case kBasic:
        if (c == '\\')
          ++i;
        else if (c == '"')
          str = kNone;
        break;
      case kLiteral:
        if (c == '\'') str = kNone;
        break;
      case kMultiBasic:
        if (c == '\\')
          ++i;
        else if (triple('"'))
          str = kNone, i += 2;
        break;
      case kMultiLiteral:
        if (triple('\'')) str = kNone, i += 2;
        break;
    }
  }
  return 0;
}

}  // namespace

Result<TomlDoc> TomlDoc::parse(const std::string& text, const std::string& name) {
  if (size_t bad = line_with_too_many_dots(text, 64))
    return field_error(name + ":" + std::to_string(bad),
                       "more than 64 '.' outside strings on one line (keys nest too deep)");
  try {
    return TomlDoc(toml::parse(text, name), name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return field_error(name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column),
                       std::string(e.description()));
  }
}

std::string TomlDoc::where(const toml::node& n) const {
  const auto& s = n.source();
  if (s.begin.line == 0) return name_;
  return name_ + ":" + std::to_string(s.begin.line);
}

Status TomlDoc::only_keys(const toml::table& t, const std::string& prefix,
                          std::initializer_list<const char*> allowed,
                          const std::vector<std::string>& more) const {
  for (const auto& [k, v] : t) {
    std::string_view key = k.str();
    bool ok =
        std::any_of(allowed.begin(), allowed.end(), [key](const char* a) { return key == a; }) ||
        std::any_of(more.begin(), more.end(), [key](const std::string& a) { return key == a; });
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      for (const auto& a : more) list += (list.empty() ? "" : ", ") + a;
      return field_error(
          where(v), "unknown key '" + prefix + std::string(k.str()) + "' (known: " + list + ")");
    }
  }
  return {};
}

Error TomlDoc::type_error(const toml::node& n, const char* key, const char* want) const {
  return field_error(where(n), std::string("'") + key + "' must be " + want);
}

Result<std::optional<std::string>> TomlDoc::get_string(const toml::table& t,
                                                       const char* key) const {
  const toml::node* n = t.get(key);
  if (!n) return std::optional<std::string>();
  if (auto v = n->value<std::string>(); v && n->is_string()) return std::optional(*v);
  return type_error(*n, key, "a string");
}

Status TomlDoc::read_strings(
    const toml::table& t,
    std::initializer_list<std::pair<const char*, std::string*>> fields) const {
  for (auto [key, out] : fields) {
    TRY_ASSIGN(auto v, get_string(t, key));
    if (v) *out = *v;
  }
  return {};
}

Result<std::optional<int64_t>> TomlDoc::get_int(const toml::table& t, const char* key) const {
  const toml::node* n = t.get(key);
  if (!n) return std::optional<int64_t>();
  if (n->is_integer()) return std::optional<int64_t>(n->as_integer()->get());
  return type_error(*n, key, "an integer");
}

Result<std::optional<bool>> TomlDoc::get_bool(const toml::table& t, const char* key) const {
  const toml::node* n = t.get(key);
  if (!n) return std::optional<bool>();
  if (n->is_boolean()) return std::optional<bool>(n->as_boolean()->get());
  return type_error(*n, key, "true or false");
}

Result<std::optional<std::vector<std::string>>> TomlDoc::get_string_list(const toml::table& t,
                                                                         const char* key) const {
  const toml::node* n = t.get(key);
  if (!n) return std::optional<std::vector<std::string>>();
  if (!n->is_array()) return type_error(*n, key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& v : *n->as_array()) {
    if (!v.is_string()) return type_error(v, key, "a list of strings");
    out.push_back(v.as_string()->get());
  }
  return std::optional(std::move(out));
}

Result<const toml::table*> TomlDoc::get_table(const toml::table& t, const char* key) const {
  const toml::node* n = t.get(key);
  if (!n) return static_cast<const toml::table*>(nullptr);
  if (!n->is_table()) return type_error(*n, key, "a table");
  return n->as_table();
}

Result<std::map<std::string, std::string>> TomlDoc::get_string_map(const toml::table& t,
                                                                   const char* key) const {
  std::map<std::string, std::string> out;
  TRY_ASSIGN(const toml::table* sub, get_table(t, key));
  if (!sub) return out;
  for (const auto& [k, v] : *sub) {
    if (!v.is_string()) {
      return field_error(
          where(v), std::string("'") + key + "." + std::string(k.str()) + "' must be a string");
    }
    out[std::string(k.str())] = v.as_string()->get();
  }
  return out;
}

}  // namespace weft
