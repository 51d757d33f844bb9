#include "common/dns.h"

#include <arpa/inet.h>
#include "common/ldns.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

namespace weft::dns {

namespace {

struct PktFree {
  void operator()(ldns_pkt* p) const { ldns_pkt_free(p); }
};
using Pkt = std::unique_ptr<ldns_pkt, PktFree>;

constexpr size_t kMaxUdp = 4096;

// The query's name as lowercase labels without the root ("web", "a", "weft"); false when
// it holds a character our names never have (ldns escapes those with '\').
bool labels_of(const ldns_rdf* name, std::vector<std::string>* out) {
  char* text = ldns_rdf2str(name);
  if (!text) return false;
  std::string s(text);
  std::free(text);
  if (s.find('\\') != std::string::npos) return false;
  if (!s.empty() && s.back() == '.') s.pop_back();
  out->clear();
  if (s.empty()) return true;
  size_t start = 0;
  for (;;) {
    size_t dot = s.find('.', start);
    std::string label = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out->push_back(std::move(label));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return true;
}

// A record of `type` for `owner` with the given rdata; null if ldns refuses a piece.
ldns_rr* make_rr(const ldns_rdf* owner, ldns_rr_type type, uint32_t ttl) {
  ldns_rr* rr = ldns_rr_new();
  if (!rr) return nullptr;
  ldns_rr_set_owner(rr, ldns_rdf_clone(owner));
  ldns_rr_set_type(rr, type);
  ldns_rr_set_class(rr, LDNS_RR_CLASS_IN);
  ldns_rr_set_ttl(rr, ttl);
  return rr;
}

// The address record of an endpoint for `owner`, if it is of `type` (A or AAAA).
ldns_rr* address_rr(const ldns_rdf* owner, const Endpoint& e, ldns_rr_type type, uint32_t ttl) {
  bool v6 = e.address.find(':') != std::string::npos;
  if ((type == LDNS_RR_TYPE_A) == v6) return nullptr;
  ldns_rdf* addr =
      ldns_rdf_new_frm_str(v6 ? LDNS_RDF_TYPE_AAAA : LDNS_RDF_TYPE_A, e.address.c_str());
  if (!addr) return nullptr;
  ldns_rr* rr = make_rr(owner, type, ttl);
  if (!rr) {
    ldns_rdf_deep_free(addr);
    return nullptr;
  }
  ldns_rr_push_rdf(rr, addr);
  return rr;
}

void push(ldns_pkt* p, ldns_pkt_section s, ldns_rr* rr) {
  if (rr && !ldns_pkt_push_rr(p, s, rr)) ldns_rr_free(rr);
}

std::vector<uint8_t> wire(const ldns_pkt* p) {
  uint8_t* buf = nullptr;
  size_t size = 0;
  std::vector<uint8_t> out;
  if (ldns_pkt2wire(&buf, p, &size) == LDNS_STATUS_OK && buf) out.assign(buf, buf + size);
  std::free(buf);
  return out;
}

// Endpoints in turn from `rotate`, so that clients that take the first record spread.
template <class F>
void each_rotated(const std::vector<Endpoint>& eps, uint32_t rotate, F&& f) {
  if (eps.empty()) return;
  size_t start = rotate % eps.size();
  for (size_t i = 0; i < eps.size(); ++i) f(eps[(start + i) % eps.size()]);
}

}  // namespace

std::optional<std::string> asked_job(const uint8_t* data, size_t n) {
  if (n < LDNS_HEADER_SIZE) return std::nullopt;
  ldns_pkt* raw = nullptr;
  if (ldns_wire2pkt(&raw, data, n) != LDNS_STATUS_OK || !raw) return std::nullopt;
  Pkt q(raw);
  if (ldns_pkt_qr(q.get()) || ldns_pkt_get_opcode(q.get()) != LDNS_PACKET_QUERY)
    return std::nullopt;
  ldns_rr_list* questions = ldns_pkt_question(q.get());
  if (!questions || ldns_rr_list_rr_count(questions) != 1) return std::nullopt;
  const ldns_rr* question = ldns_rr_list_rr(questions, 0);
  if (ldns_rr_get_class(question) != LDNS_RR_CLASS_IN &&
      ldns_rr_get_class(question) != LDNS_RR_CLASS_ANY)
    return std::nullopt;
  std::vector<std::string> labels;
  const ldns_rdf* qname = ldns_rr_owner(question);
  if (!qname || !labels_of(qname, &labels) || labels.size() < 3 || labels.back() != "weft")
    return std::nullopt;
  return labels[labels.size() - 3];
}

size_t udp_limit(const uint8_t* data, size_t n) {
  ldns_pkt* raw = nullptr;
  if (ldns_wire2pkt(&raw, data, n) != LDNS_STATUS_OK || !raw) return 512;
  Pkt q(raw);
  if (!ldns_pkt_edns(q.get())) return 512;
  return std::clamp<size_t>(ldns_pkt_edns_udp_size(q.get()), 512, kMaxUdp);
}

std::vector<uint8_t> respond(const uint8_t* data, size_t n, const ServiceCatalog& catalog,
                             const Options& o, size_t max_size, uint32_t rotate) {
  if (n < LDNS_HEADER_SIZE) return {};
  ldns_pkt* raw = nullptr;
  ldns_status parsed = ldns_wire2pkt(&raw, data, n);
  Pkt q(parsed == LDNS_STATUS_OK ? raw : nullptr);
  if (!q) {
    // Not a packet ldns reads: answer FORMERR when the header says it is a query.
    if (raw) ldns_pkt_free(raw);
    if (data[2] & 0x80) return {};  // QR: a response; never answered
    std::vector<uint8_t> out(data, data + LDNS_HEADER_SIZE);
    out[2] = static_cast<uint8_t>((out[2] & 0x79) | 0x80);  // QR, opcode and RD kept
    out[3] = LDNS_RCODE_FORMERR;
    for (size_t i = 4; i < LDNS_HEADER_SIZE; ++i) out[i] = 0;  // no sections
    return out;
  }
  if (ldns_pkt_qr(q.get())) return {};
  Pkt r(ldns_pkt_new());
  if (!r) return {};
  ldns_pkt_set_id(r.get(), ldns_pkt_id(q.get()));
  ldns_pkt_set_qr(r.get(), true);
  ldns_pkt_set_opcode(r.get(), ldns_pkt_get_opcode(q.get()));
  ldns_pkt_set_rd(r.get(), ldns_pkt_rd(q.get()));
  if (ldns_pkt_edns(q.get())) ldns_pkt_set_edns_udp_size(r.get(), static_cast<uint16_t>(kMaxUdp));
  ldns_rr_list* questions = ldns_pkt_question(q.get());
  if (ldns_pkt_get_opcode(q.get()) != LDNS_PACKET_QUERY) {
    ldns_pkt_set_rcode(r.get(), LDNS_RCODE_NOTIMPL);
    return wire(r.get());
  }
  if (!questions || ldns_rr_list_rr_count(questions) != 1) {
    ldns_pkt_set_rcode(r.get(), LDNS_RCODE_FORMERR);
    return wire(r.get());
  }
  const ldns_rr* question = ldns_rr_list_rr(questions, 0);
  push(r.get(), LDNS_SECTION_QUESTION, ldns_rr_clone(question));
  const ldns_rdf* qname = ldns_rr_owner(question);
  ldns_rr_type qtype = ldns_rr_get_type(question);
  std::vector<std::string> labels;
  if (!qname || !labels_of(qname, &labels) || labels.empty() || labels.back() != "weft" ||
      (ldns_rr_get_class(question) != LDNS_RR_CLASS_IN &&
       ldns_rr_get_class(question) != LDNS_RR_CLASS_ANY)) {
    ldns_pkt_set_rcode(r.get(), LDNS_RCODE_REFUSED);  // not our zone
    return wire(r.get());
  }
  ldns_pkt_set_aa(r.get(), true);
  labels.pop_back();
  auto nxdomain = [&] {
    ldns_pkt_set_rcode(r.get(), LDNS_RCODE_NXDOMAIN);
    return wire(r.get());
  };
  bool want_a = qtype == LDNS_RR_TYPE_A || qtype == LDNS_RR_TYPE_ANY;
  bool want_aaaa = qtype == LDNS_RR_TYPE_AAAA || qtype == LDNS_RR_TYPE_ANY;
  if (labels.empty()) return wire(r.get());  // the zone itself: no records of its own
  if (labels.size() == 1) return nxdomain();
  const size_t n_labels = labels.size();
  const Service* svc = catalog.find(labels[n_labels - 2], labels[n_labels - 1]);
  if (!svc) {
    // "<entitlement>.weft." exists when some job of it does (an empty non-terminal).
    return nxdomain();
  }
  const std::string base = labels[n_labels - 2] + "." + labels[n_labels - 1] + ".weft.";
  if (n_labels == 2) {  // <job>.<entitlement>
    each_rotated(svc->endpoints, rotate, [&](const Endpoint& e) {
      if (want_a) push(r.get(), LDNS_SECTION_ANSWER, address_rr(qname, e, LDNS_RR_TYPE_A, o.ttl));
      if (want_aaaa)
        push(r.get(), LDNS_SECTION_ANSWER, address_rr(qname, e, LDNS_RR_TYPE_AAAA, o.ttl));
    });
  } else if (n_labels == 3) {  // <index>.<job>.<entitlement>
    const std::string& idx = labels[0];
    if (idx.empty() || idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos)
      return nxdomain();
    int index = std::atoi(idx.c_str());
    auto it = std::find_if(svc->endpoints.begin(), svc->endpoints.end(),
                           [&](const Endpoint& e) { return e.index == index; });
    if (it == svc->endpoints.end()) return nxdomain();
    if (want_a) push(r.get(), LDNS_SECTION_ANSWER, address_rr(qname, *it, LDNS_RR_TYPE_A, o.ttl));
    if (want_aaaa)
      push(r.get(), LDNS_SECTION_ANSWER, address_rr(qname, *it, LDNS_RR_TYPE_AAAA, o.ttl));
  } else if (n_labels == 4 && labels[1] == "_tcp" && labels[0].size() > 1 && labels[0][0] == '_') {
    const std::string port = labels[0].substr(1);
    bool named = false;
    for (const auto& e : svc->endpoints) named = named || e.ports.count(port);
    if (!named && !svc->endpoints.empty()) return nxdomain();
    if (qtype == LDNS_RR_TYPE_SRV || qtype == LDNS_RR_TYPE_ANY) {
      each_rotated(svc->endpoints, rotate, [&](const Endpoint& e) {
        auto p = e.ports.find(port);
        if (p == e.ports.end()) return;
        std::string target_name = std::to_string(e.index) + "." + base;
        ldns_rdf* target = ldns_dname_new_frm_str(target_name.c_str());
        ldns_rr* rr = target ? make_rr(qname, LDNS_RR_TYPE_SRV, o.ttl) : nullptr;
        if (!rr) {
          if (target) ldns_rdf_deep_free(target);
          return;
        }
        ldns_rr_push_rdf(rr, ldns_native2rdf_int16(LDNS_RDF_TYPE_INT16, 0));  // priority
        ldns_rr_push_rdf(rr, ldns_native2rdf_int16(LDNS_RDF_TYPE_INT16, 1));  // weight
        ldns_rr_push_rdf(rr, ldns_native2rdf_int16(LDNS_RDF_TYPE_INT16, p->second));
        ldns_rr_push_rdf(rr, ldns_rdf_clone(target));
        push(r.get(), LDNS_SECTION_ANSWER, rr);
        push(r.get(), LDNS_SECTION_ADDITIONAL, address_rr(target, e, LDNS_RR_TYPE_A, o.ttl));
        push(r.get(), LDNS_SECTION_ADDITIONAL, address_rr(target, e, LDNS_RR_TYPE_AAAA, o.ttl));
        ldns_rdf_deep_free(target);
      });
    }
  } else {
    return nxdomain();
  }
  std::vector<uint8_t> out = wire(r.get());
  if (out.size() <= max_size) return out;
  // Too large for the asker: the header and question with TC, so it asks over TCP or
  // makes do.
  Pkt t(ldns_pkt_new());
  if (!t) return {};
  ldns_pkt_set_id(t.get(), ldns_pkt_id(q.get()));
  ldns_pkt_set_qr(t.get(), true);
  ldns_pkt_set_aa(t.get(), true);
  ldns_pkt_set_rd(t.get(), ldns_pkt_rd(q.get()));
  ldns_pkt_set_tc(t.get(), true);
  push(t.get(), LDNS_SECTION_QUESTION, ldns_rr_clone(question));
  return wire(t.get());
}

}  // namespace weft::dns
