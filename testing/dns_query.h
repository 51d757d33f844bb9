// A DNS query as a resolver sends it, for the tests of weft's DNS answers
// (common/services_test.cc, agent/dns_server_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/ldns.h"

namespace weft::testing {

// The wire form of a query for `name` of `type` with message id `id` (recursion desired),
// with an EDNS record advertising 4,096 bytes when `edns`.
inline std::vector<uint8_t> dns_query(const char* name, ldns_rr_type type, uint16_t id,
                                      bool edns = false) {
  ldns_pkt* q = nullptr;
  EXPECT_EQ(ldns_pkt_query_new_frm_str(&q, name, type, LDNS_RR_CLASS_IN, LDNS_RD), LDNS_STATUS_OK);
  ldns_pkt_set_id(q, id);
  if (edns) ldns_pkt_set_edns_udp_size(q, 4096);
  uint8_t* buf = nullptr;
  size_t size = 0;
  EXPECT_EQ(ldns_pkt2wire(&buf, q, &size), LDNS_STATUS_OK);
  std::vector<uint8_t> out(buf, buf + size);
  std::free(buf);
  ldns_pkt_free(q);
  return out;
}

}  // namespace weft::testing
