// DNS answers for service discovery (docs/services.md), from an agent's copy of the
// endpoints (common/services.h). Packets are read and written by ldns, never by hand.
//
// Names, in the zone "weft." (case-insensitive):
//   <job>.<entitlement>.weft.              A / AAAA: the addresses of its ready tasks
//   <index>.<job>.<entitlement>.weft.      A / AAAA: one task's address
//   _<port>._tcp.<job>.<entitlement>.weft. SRV: each ready task's <port>, with target
//                                          <index>.<job>.<entitlement>.weft. (and its
//                                          address as additional data)
// A name in the zone that names no job is NXDOMAIN; a job with no ready task, or a type
// it has no record of, is an empty answer (NODATA); a name outside the zone is REFUSED.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/services.h"

namespace weft::dns {

struct Options {
  uint32_t ttl = 1;  // seconds: how long a client may cache an answer
};

// The response to one query packet of `n` bytes, at most `max_size` bytes (512 for UDP
// without EDNS; the query's EDNS size, at most 4096, with it): an answer that does not
// fit is sent without records and the TC bit. Empty: the packet is dropped (a response,
// or not a DNS packet at all). `rotate` turns the order of the records (load spreading).
std::vector<uint8_t> respond(const uint8_t* data, size_t n, const ServiceCatalog& catalog,
                             const Options& o, size_t max_size, uint32_t rotate = 0);

// The job a query packet asks about: the lower-case <job> of a name
// "...<job>.<entitlement>.weft." in class IN or ANY; nothing for a packet that is not
// such a query (a response, another zone, a name with no job, a malformed packet).
std::optional<std::string> asked_job(const uint8_t* data, size_t n);

// The largest response the asker of this query takes over UDP (512, or its EDNS size up
// to 4096); 512 when the packet is not a query.
size_t udp_limit(const uint8_t* data, size_t n);

}  // namespace weft::dns
