#include "controlplane/store/notes.h"

namespace weft::cp {

bool Notes::valid_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxKey || key.front() == '/' || key.back() == '/') return false;
  char prev = 0;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/';
    if (!ok || (c == '/' && prev == '/')) return false;
    prev = c;
  }
  return key.find("..") == std::string_view::npos;
}

std::map<std::string, nlohmann::json> Notes::take_loaded(const std::string& prefix) {
  std::map<std::string, nlohmann::json> out;
  for (auto it = loaded_.lower_bound(prefix);
       it != loaded_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
    out.insert(loaded_.extract(it++));
  return out;
}

}  // namespace weft::cp
