// Service discovery's hostile inputs: a DNS packet from anyone who can reach an agent's
// dns_listen, answered from a catalog (common/dns.h, ldns), and a service.update from the
// control plane's session read into that catalog (common/services.h), and the job a
// query names (dns::asked_job: what an agent asks the control plane about). The first
// byte picks which. Nothing may crash, leak or answer more than the asker's limit.
#include <cstdint>
#include <cstdlib>

#include "common/dns.h"
#include "common/json_bounded.h"
#include "common/services.h"

using namespace weft;

namespace {

const ServiceCatalog& catalog() {
  static ServiceCatalog c = [] {
    ServiceCatalog x;
    ServiceUpdate u;
    u.version = 1;
    u.reset = true;
    Service web{"e", {}};
    for (int i = 0; i < 40; ++i)
      web.endpoints.push_back(Endpoint{"web." + std::to_string(i) + ".1",
                                       i,
                                       1,
                                       "m",
                                       i % 3 ? "10.0.0." + std::to_string(i + 1) : "fd00::1",
                                       {{"http", static_cast<uint16_t>(20000 + i)}}});
    u.services["web"] = web;
    u.services["empty"] = Service{"e", {}};
    x.apply(u);
    return x;
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* body = data + 1;
  size_t n = size - 1;
  if (data[0] & 1) {
    auto j = parse_json_bounded(std::string_view(reinterpret_cast<const char*>(body), n));
    if (!j.ok()) return 0;
    auto u = parse_service_update(*j);
    if (!u.ok()) return 0;
    ServiceCatalog c;
    c.apply(*u);
    // What was read is what is written back.
    auto again = parse_service_update(to_json(*u));
    if (!again.ok() || again->services != u->services) std::abort();
    return 0;
  }
  size_t limit = dns::udp_limit(body, n);
  auto out = dns::respond(body, n, catalog(), dns::Options{}, limit, data[0]);
  if (out.size() > limit) std::abort();
  // The job a query asks about (what makes the agent ask the control plane): a DNS
  // label of our zone, lower case, or nothing.
  if (auto job = dns::asked_job(body, n)) {
    if (job->empty() || job->size() > 63) std::abort();
    for (char c : *job)
      if (c >= 'A' && c <= 'Z') std::abort();
  }
  return 0;
}
