#include "controlplane/etcd_client.h"

#include <curl/curl.h>

#include <mutex>

#include <nlohmann/json.hpp>

#include "common/base64.h"

namespace weft::etcd {

using json = nlohmann::json;

namespace {

std::once_flag curl_once;
constexpr size_t kMaxAnswer = 256u << 20;  // a page of keys is far smaller
constexpr size_t kPage = 1000;

size_t collect(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kMaxAnswer) return 0;  // curl fails the transfer
  out->append(data, size * n);
  return size * n;
}

// etcd's JSON renders 64-bit integers as strings.
int64_t num(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return 0;
}

}  // namespace

Result<std::vector<Kv>> parse_range(const std::string& answer) {
  json j = json::parse(answer, nullptr, false);
  if (!j.is_object()) return make_error("etcd answered a range with no JSON object");
  std::vector<Kv> out;
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array())
    for (const auto& e : *kvs) {
      if (!e.is_object()) return make_error("etcd answered a malformed key");
      auto k = e.find("key"), v = e.find("value");
      if (k == e.end() || !k->is_string()) return make_error("etcd answered a key without a key");
      Kv kv;
      TRY_ASSIGN(kv.key, base64_decode(k->get<std::string>()));
      if (v != e.end()) {
        if (!v->is_string()) return make_error("etcd answered a malformed value");
        TRY_ASSIGN(kv.value, base64_decode(v->get<std::string>()));
      }
      kv.create_revision = num(e, "create_revision");
      kv.mod_revision = num(e, "mod_revision");
      kv.lease = num(e, "lease");
      out.push_back(std::move(kv));
    }
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Client::Client(Config cfg) : cfg_(std::move(cfg)) {}

Client::~Client() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Result<std::unique_ptr<Client>> Client::create(Config cfg) {
  if (cfg.endpoints.empty()) return field_error("endpoints", "names no etcd member");
  for (const auto& e : cfg.endpoints)
    if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0)
      return field_error("endpoints", "\"" + e + "\" is not an http:// or https:// URL");
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::unique_ptr<Client> c(new Client(std::move(cfg)));
  c->curl_ = curl_easy_init();
  if (!c->curl_) return make_error("curl_easy_init failed");
  return c;
}

Result<std::string> Client::post(const std::string& path, const std::string& body) {
  CURL* h = static_cast<CURL*>(curl_);
  std::string last_error;
  for (size_t tried = 0; tried < cfg_.endpoints.size(); ++tried) {
    const std::string& ep = cfg_.endpoints[current_];
    std::string url = ep + path, answer;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(cfg_.timeout_ms));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(cfg_.timeout_ms));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (!cfg_.ca.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, cfg_.ca.c_str());
    if (!cfg_.cert.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, cfg_.cert.c_str());
    if (!cfg_.key.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, cfg_.key.c_str());
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) {
      last_error = ep + ": " + curl_easy_strerror(rc);
      current_ = (current_ + 1) % cfg_.endpoints.size();
      continue;
    }
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
      json e = json::parse(answer, nullptr, false);
      std::string msg = e.is_object() && e.contains("message") && e["message"].is_string()
                            ? e["message"].get<std::string>()
                            : answer.substr(0, 200);
      // A member without a leader or one being stopped: another may serve.
      if (status >= 500 && tried + 1 < cfg_.endpoints.size()) {
        last_error = ep + ": " + msg;
        current_ = (current_ + 1) % cfg_.endpoints.size();
        continue;
      }
      return make_error("etcd " + ep + path + ": HTTP " + std::to_string(status) + ": " + msg);
    }
    return answer;
  }
  return make_error("no etcd member answered: " + last_error);
}

Result<std::vector<Kv>> Client::range(const std::string& key, const std::string& end, size_t limit,
                                      bool descend) {
  json req{{"key", base64_encode(key)}, {"limit", limit}};
  if (!end.empty()) req["range_end"] = base64_encode(end);
  if (descend) {
    req["sort_order"] = "DESCEND";
    req["sort_target"] = "KEY";
  }
  TRY_ASSIGN(std::string answer, post("/v3/kv/range", req.dump()));
  return parse_range(answer);
}

Result<std::vector<Kv>> Client::range_prefix(const std::string& prefix) {
  std::vector<Kv> all;
  std::string from = prefix, end = prefix_end(prefix);
  for (;;) {
    TRY_ASSIGN(auto page, range(from, end, kPage, false));
    size_t n = page.size();
    for (auto& kv : page) all.push_back(std::move(kv));
    if (n < kPage) return all;
    from = all.back().key + std::string(1, '\0');
  }
}

Result<std::vector<Kv>> Client::last(const std::string& prefix, size_t limit) {
  return range(prefix, prefix_end(prefix), limit, true);
}

Result<std::optional<Kv>> Client::get(const std::string& key) {
  TRY_ASSIGN(auto kvs, range(key, "", 1, false));
  if (kvs.empty()) return std::optional<Kv>();
  return std::optional<Kv>(std::move(kvs.front()));
}

Result<TxnResult> Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& ops) {
  json cmp = json::array(), success = json::array();
  for (const auto& c : compares) {
    if (c.target == Compare::Target::kCreate)
      cmp.push_back({{"key", base64_encode(c.key)},
                     {"result", "EQUAL"},
                     {"target", "CREATE"},
                     {"create_revision", std::to_string(c.create_revision)}});
    else
      cmp.push_back({{"key", base64_encode(c.key)},
                     {"result", "EQUAL"},
                     {"target", "VALUE"},
                     {"value", base64_encode(c.value)}});
  }
  for (const auto& o : ops) {
    switch (o.kind) {
      case Op::Kind::kPut: {
        json p{{"key", base64_encode(o.key)}, {"value", base64_encode(o.value)}};
        if (o.lease) p["lease"] = std::to_string(o.lease);
        success.push_back({{"request_put", p}});
        break;
      }
      case Op::Kind::kDelete:
        success.push_back({{"request_delete_range", {{"key", base64_encode(o.key)}}}});
        break;
      case Op::Kind::kDeleteRange:
        success.push_back(
            {{"request_delete_range",
              {{"key", base64_encode(o.key)}, {"range_end", base64_encode(o.range_end)}}}});
        break;
    }
  }
  json req{{"compare", cmp}, {"success", success}};
  TRY_ASSIGN(std::string answer, post("/v3/kv/txn", req.dump()));
  json j = json::parse(answer, nullptr, false);
  if (!j.is_object()) return make_error("etcd answered a transaction with no JSON object");
  TxnResult r;
  auto ok = j.find("succeeded");
  r.succeeded = ok != j.end() && ok->is_boolean() && ok->get<bool>();
  if (auto h = j.find("header"); h != j.end() && h->is_object()) r.revision = num(*h, "revision");
  return r;
}

Result<int64_t> Client::lease_grant(int64_t ttl_s) {
  TRY_ASSIGN(std::string answer, post("/v3/lease/grant", json{{"TTL", ttl_s}}.dump()));
  json j = json::parse(answer, nullptr, false);
  if (!j.is_object() || num(j, "ID") == 0)
    return make_error("etcd granted no lease: " + answer.substr(0, 200));
  return num(j, "ID");
}

Result<int64_t> Client::lease_keepalive(int64_t id) {
  TRY_ASSIGN(std::string answer,
             post("/v3/lease/keepalive", json{{"ID", std::to_string(id)}}.dump()));
  json j = json::parse(answer, nullptr, false);
  if (!j.is_object() || !j.contains("result") || !j["result"].is_object())
    return make_error("etcd answered a keepalive with no result: " + answer.substr(0, 200));
  return num(j["result"], "TTL");
}

Status Client::lease_revoke(int64_t id) {
  TRY(post("/v3/lease/revoke", json{{"ID", std::to_string(id)}}.dump()));
  return {};
}

Status Client::ping() {
  TRY(get("weft-ping"));
  return {};
}

}  // namespace weft::etcd
