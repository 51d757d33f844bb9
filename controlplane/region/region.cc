#include "controlplane/region/region.h"

namespace weft::cp {

const char* region_role_name(RegionRole r) {
  switch (r) {
    case RegionRole::kShard:
      return "shard";
    case RegionRole::kFrontEnd:
      return "front-end";
    case RegionRole::kBroker:
      return "broker";
    case RegionRole::kAllInOne:
      break;
  }
  return "all-in-one";
}

Status check_shard_id(const std::string& field, const std::string& id) {
  bool ok = !id.empty() && id.size() <= 32 && id[0] != '-';
  for (char ch : id) ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-');
  if (!ok) return field_error(field, "a shard id is 1 to 32 of a-z, 0-9 and '-', not first");
  return {};
}

}  // namespace weft::cp
