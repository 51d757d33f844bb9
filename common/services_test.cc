#include "common/services.h"

#include <gtest/gtest.h>
#include "common/ldns.h"

#include <cstdlib>

#include "common/dns.h"
#include "testing/dns_query.h"

namespace weft {
namespace {

using json = nlohmann::json;

Endpoint ep(const std::string& task, int index, const std::string& addr, uint16_t http) {
  return Endpoint{task, index, 1, "m" + std::to_string(index), addr, {{"http", http}}};
}

ServiceCatalog catalog_with_web() {
  ServiceCatalog c;
  ServiceUpdate u;
  u.version = 7;
  u.reset = true;
  u.services["web"] =
      Service{"frontend",
              {ep("web.0.1", 0, "10.0.0.1", 20001), ep("web.1.2", 1, "10.0.0.2", 20002),
               ep("web.2.3", 2, "fd00::3", 20003)}};
  u.services["empty"] = Service{"frontend", {}};
  c.apply(u);
  return c;
}

// A query packet for `name` of `type`, as a resolver sends it.
std::vector<uint8_t> query(const char* name, ldns_rr_type type, bool edns = false) {
  return weft::testing::dns_query(name, type, 4242, edns);
}

struct Answer {
  ldns_pkt_rcode rcode = LDNS_RCODE_SERVFAIL;
  bool tc = false;
  uint16_t id = 0;
  std::vector<std::string> answers, additional;  // records as text, without TTL and class
};

Answer ask(const ServiceCatalog& c, const std::vector<uint8_t>& q, size_t max = 512) {
  Answer a;
  auto r = dns::respond(q.data(), q.size(), c, dns::Options{}, max);
  if (r.empty()) return a;
  ldns_pkt* p = nullptr;
  EXPECT_EQ(ldns_wire2pkt(&p, r.data(), r.size()), LDNS_STATUS_OK);
  if (!p) return a;
  a.rcode = ldns_pkt_get_rcode(p);
  a.tc = ldns_pkt_tc(p);
  a.id = ldns_pkt_id(p);
  auto text = [](ldns_rr_list* l, std::vector<std::string>* out) {
    for (size_t i = 0; l && i < ldns_rr_list_rr_count(l); ++i) {
      ldns_rr* rr = ldns_rr_list_rr(l, i);
      std::string s;
      char* owner = ldns_rdf2str(ldns_rr_owner(rr));
      s += owner;
      std::free(owner);
      char* type = ldns_rr_type2str(ldns_rr_get_type(rr));
      s += std::string(" ") + type;
      std::free(type);
      for (size_t k = 0; k < ldns_rr_rd_count(rr); ++k) {
        char* d = ldns_rdf2str(ldns_rr_rdf(rr, k));
        s += std::string(" ") + d;
        std::free(d);
      }
      out->push_back(s);
    }
  };
  text(ldns_pkt_answer(p), &a.answers);
  text(ldns_pkt_additional(p), &a.additional);
  ldns_pkt_free(p);
  std::sort(a.answers.begin(), a.answers.end());
  std::sort(a.additional.begin(), a.additional.end());
  return a;
}

TEST(Services, AnUpdateRoundTripsAndItsErrorsNameTheField) {
  ServiceUpdate u;
  u.version = 3;
  u.services["web"] = Service{"frontend", {ep("web.0.1", 0, "10.0.0.1", 20001)}};
  u.services["gone"] = std::nullopt;
  auto back = parse_service_update(to_json(u));
  ASSERT_TRUE(back.ok()) << back.error().str();
  EXPECT_EQ(back->version, 3u);
  EXPECT_EQ(back->services, u.services);

  json bad = to_json(u);
  bad["services"]["web"]["endpoints"][0]["address"] = "10.0.0.300";
  auto e = parse_service_update(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().field, "services.web.endpoints[0].address");
  bad = to_json(u);
  bad["services"]["web"]["endpoints"][0]["ports"]["HTTP"] = 80;
  EXPECT_FALSE(parse_service_update(bad).ok());
  bad = to_json(u);
  bad["services"]["../x"] = nullptr;
  EXPECT_FALSE(parse_service_update(bad).ok());
  EXPECT_FALSE(parse_service_update(json{{"version", -1}, {"services", json::object()}}).ok());
}

TEST(Services, TheCatalogAppliesChangesAndResets) {
  ServiceCatalog c = catalog_with_web();
  ASSERT_NE(c.find("WEB", "Frontend"), nullptr);  // DNS names are case-insensitive
  ServiceUpdate gone;
  gone.version = 8;
  gone.services["web"] = std::nullopt;
  c.apply(gone);
  EXPECT_EQ(c.find("web", "frontend"), nullptr);
  EXPECT_NE(c.find("empty", "frontend"), nullptr);
  EXPECT_EQ(c.version(), 8u);
  ServiceUpdate reset;
  reset.version = 9;
  reset.reset = true;
  c.apply(reset);
  EXPECT_EQ(c.size(), 0u);
}

TEST(Dns, AnswersAddressesSrvAndOneTask) {
  ServiceCatalog c = catalog_with_web();
  Answer a = ask(c, query("web.frontend.weft.", LDNS_RR_TYPE_A));
  EXPECT_EQ(a.rcode, LDNS_RCODE_NOERROR);
  EXPECT_EQ(a.id, 4242);
  EXPECT_EQ(a.answers, (std::vector<std::string>{"web.frontend.weft. A 10.0.0.1",
                                                 "web.frontend.weft. A 10.0.0.2"}));
  a = ask(c, query("web.frontend.weft.", LDNS_RR_TYPE_AAAA));
  EXPECT_EQ(a.answers, (std::vector<std::string>{"web.frontend.weft. AAAA fd00::3"}));
  a = ask(c, query("_http._tcp.web.frontend.weft.", LDNS_RR_TYPE_SRV));
  EXPECT_EQ(a.rcode, LDNS_RCODE_NOERROR);
  EXPECT_EQ(a.answers, (std::vector<std::string>{
                           "_http._tcp.web.frontend.weft. SRV 0 1 20001 0.web.frontend.weft.",
                           "_http._tcp.web.frontend.weft. SRV 0 1 20002 1.web.frontend.weft.",
                           "_http._tcp.web.frontend.weft. SRV 0 1 20003 2.web.frontend.weft."}));
  EXPECT_EQ(a.additional, (std::vector<std::string>{"0.web.frontend.weft. A 10.0.0.1",
                                                    "1.web.frontend.weft. A 10.0.0.2",
                                                    "2.web.frontend.weft. AAAA fd00::3"}));
  a = ask(c, query("1.WEB.frontend.weft.", LDNS_RR_TYPE_A));
  // The answer's owner is the question's name as asked.
  EXPECT_EQ(a.answers, (std::vector<std::string>{"1.WEB.frontend.weft. A 10.0.0.2"}));
}

TEST(Dns, UnknownNamesEmptyJobsAndOtherZones) {
  ServiceCatalog c = catalog_with_web();
  EXPECT_EQ(ask(c, query("nope.frontend.weft.", LDNS_RR_TYPE_A)).rcode, LDNS_RCODE_NXDOMAIN);
  EXPECT_EQ(ask(c, query("9.web.frontend.weft.", LDNS_RR_TYPE_A)).rcode, LDNS_RCODE_NXDOMAIN);
  EXPECT_EQ(ask(c, query("_grpc._tcp.web.frontend.weft.", LDNS_RR_TYPE_SRV)).rcode,
            LDNS_RCODE_NXDOMAIN);
  Answer empty = ask(c, query("empty.frontend.weft.", LDNS_RR_TYPE_A));
  EXPECT_EQ(empty.rcode, LDNS_RCODE_NOERROR);  // the job exists; no task is ready
  EXPECT_TRUE(empty.answers.empty());
  Answer nodata = ask(c, query("web.frontend.weft.", LDNS_RR_TYPE_MX));
  EXPECT_EQ(nodata.rcode, LDNS_RCODE_NOERROR);
  EXPECT_TRUE(nodata.answers.empty());
  EXPECT_EQ(ask(c, query("example.com.", LDNS_RR_TYPE_A)).rcode, LDNS_RCODE_REFUSED);
}

TEST(Dns, AnAnswerTooLargeForUdpIsTruncatedAndEdnsMakesRoom) {
  ServiceCatalog c;
  ServiceUpdate u;
  u.version = 1;
  Service big{"frontend", {}};
  for (int i = 0; i < 60; ++i)
    big.endpoints.push_back(ep("big." + std::to_string(i) + ".1", i,
                               "10.1.0." + std::to_string(i + 1),
                               static_cast<uint16_t>(20000 + i)));
  u.services["big"] = big;
  c.apply(u);
  auto q = query("_http._tcp.big.frontend.weft.", LDNS_RR_TYPE_SRV);
  Answer small = ask(c, q, dns::udp_limit(q.data(), q.size()));
  EXPECT_TRUE(small.tc);
  EXPECT_TRUE(small.answers.empty());
  auto qe = query("_http._tcp.big.frontend.weft.", LDNS_RR_TYPE_SRV, /*edns=*/true);
  EXPECT_EQ(dns::udp_limit(qe.data(), qe.size()), 4096u);
  Answer large = ask(c, qe, dns::udp_limit(qe.data(), qe.size()));
  EXPECT_FALSE(large.tc);
  EXPECT_EQ(large.answers.size(), 60u);
}

TEST(Dns, GarbageIsDroppedOrRefusedNeverCrashes) {
  ServiceCatalog c = catalog_with_web();
  std::vector<uint8_t> junk = {0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  auto r = dns::respond(junk.data(), junk.size(), c, {}, 512);
  ASSERT_GE(r.size(), 12u);  // a query ldns cannot read: FORMERR, same id
  EXPECT_EQ(r[0], 0x12);
  EXPECT_EQ(r[3] & 0x0f, LDNS_RCODE_FORMERR);
  auto resp = query("web.frontend.weft.", LDNS_RR_TYPE_A);
  resp[2] |= 0x80;  // a response: never answered (no reflection loops)
  EXPECT_TRUE(dns::respond(resp.data(), resp.size(), c, {}, 512).empty());
  EXPECT_TRUE(dns::respond(junk.data(), 5, c, {}, 512).empty());
}

}  // namespace
}  // namespace weft
