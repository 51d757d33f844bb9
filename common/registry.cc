#include "common/registry.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/clock.h"
#include "common/fs.h"
#include "common/json_bounded.h"
#include "common/log.h"
#include "common/strings.h"

namespace weft::registry {

using json = nlohmann::json;

namespace {

std::string url_escape(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// What a registry's error body says, briefly: {"errors":[{"code":..,"message":..}]}.
std::string registry_says(const HttpResponse& r) {
  std::string what = "HTTP " + std::to_string(r.status);
  auto j = parse_json_bounded(r.body.substr(0, 4096), 8);
  if (j.ok() && j->is_object() && j->contains("errors") && (*j)["errors"].is_array() &&
      !(*j)["errors"].empty() && (*j)["errors"][0].is_object()) {
    const json& e = (*j)["errors"][0];
    if (e.contains("code") && e["code"].is_string()) what += " " + e["code"].get<std::string>();
    if (e.contains("message") && e["message"].is_string())
      what += ": " + e["message"].get<std::string>().substr(0, 200);
  }
  return what;
}

}  // namespace

Result<std::map<std::string, Credentials>> parse_credentials(std::string_view text,
                                                             const std::string& file) {
  std::map<std::string, Credentials> out;
  int line_no = 0;
  for (const auto& raw : split(text, '\n')) {
    ++line_no;
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::vector<std::string> f;
    for (const auto& w : split(line, ' '))
      if (!trim(w).empty()) f.push_back(trim(w));
    std::string where = file + ":" + std::to_string(line_no);
    if (f.size() != 3)
      return field_error(where, "a credentials line is: <registry> <username> <password>");
    if (!oci::parse_image_ref(f[0] + "/x").ok())
      return field_error(where, "'" + f[0].substr(0, 100) + "' is not a registry host[:port]");
    if (out.count(f[0])) return field_error(where, "registry " + f[0] + " is listed twice");
    out[f[0]] = {f[1], f[2]};
  }
  return out;
}

Result<Challenge> parse_challenge(std::string_view h) {
  if (h.size() > 4096) return make_error("challenge longer than 4096 bytes");
  Challenge c;
  size_t sp = h.find(' ');
  std::string scheme(h.substr(0, sp));
  for (auto& ch : scheme) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (scheme.empty()) return make_error("empty challenge");
  c.scheme = scheme;
  if (sp == std::string_view::npos) return c;
  std::string_view rest = h.substr(sp + 1);
  size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && (rest[i] == ' ' || rest[i] == ',')) ++i;
    size_t eq = rest.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string key(trim(rest.substr(i, eq - i)));
    for (auto& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    i = eq + 1;
    std::string value;
    if (i < rest.size() && rest[i] == '"') {
      ++i;
      while (i < rest.size() && rest[i] != '"') {
        if (rest[i] == '\\' && i + 1 < rest.size()) ++i;
        value += rest[i++];
      }
      if (i >= rest.size()) return make_error("unterminated quoted value in challenge");
      ++i;
    } else {
      size_t end = rest.find(',', i);
      value =
          trim(rest.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i));
      i = end == std::string_view::npos ? rest.size() : end;
    }
    if (!key.empty()) c.params[key] = value;
  }
  return c;
}

struct Client::Impl {
  EventLoop& loop;
  Config cfg;
  std::unique_ptr<HttpClient> http;
  // Bearer tokens by "<registry> <scope>", each until shortly before it expires (the
  // token service's expires_in; 60 s when it gives none, as the token spec says).
  struct Token {
    std::string auth;  // "Bearer ..."
    uint64_t expires_us = 0;
  };
  std::map<std::string, Token> tokens;

  struct Op {
    uint64_t id = 0;
    oci::ImageRef ref;
    std::string url;
    bool is_manifest = true;
    bool plain_url = false;           // fetch(): no registry behind it
    std::optional<oci::Digest> want;  // the digest the bytes must hash to
    BlobSink* sink = nullptr;
    ManifestDone manifest_done;
    BlobDone blob_done;
    std::string auth;  // the Authorization header value, once known
    bool tried_auth = false;
    std::string cached_token;  // the tokens key of a cached token this op sent
    int attempt = 0;
    uint64_t backoff_us = 0;
    Status sink_error;
    uint64_t request = 0;  // HttpClient's id of what is in flight
    Source timer;
  };
  std::map<uint64_t, std::unique_ptr<Op>> ops;
  uint64_t next_id = 1;

  Impl(EventLoop& l, Config c) : loop(l), cfg(std::move(c)) {}
  ~Impl() {
    for (auto& [id, op] : ops)
      if (op->request) http->cancel(op->request);
  }

  std::string base(const oci::ImageRef& r) const {
    return (cfg.insecure.count(r.registry) ? "http://" : "https://") + r.registry + "/v2/" +
           r.repository;
  }

  void finish(Op* op, Result<FetchedManifest> m, Status s) {
    auto node = ops.extract(op->id);
    if (node.empty()) return;
    std::unique_ptr<Op> own = std::move(node.mapped());
    // Never from inside a caller's own call: the HttpClient delivers on the loop, and a
    // failure found before any request is deferred.
    if (own->is_manifest) {
      if (own->manifest_done) own->manifest_done(std::move(m));
    } else if (own->blob_done) {
      own->blob_done(std::move(s));
    }
  }
  void fail(Op* op, Error e) {
    if (op->plain_url)
      e = std::move(e).wrap("GET " + op->url.substr(0, 200));
    else
      e = std::move(e).wrap((op->is_manifest ? "manifest of " : "blob of ") + op->ref.registry +
                            "/" + op->ref.repository);
    if (op->is_manifest)
      finish(op, std::move(e), {});
    else
      finish(op, make_error("unused"), std::move(e));
  }

  // A transient failure: again after the backoff, or the error once attempts are spent.
  void retry(Op* op, const std::string& why) {
    if (++op->attempt >= cfg.attempts) {
      fail(op, make_error(why + " (after " + std::to_string(op->attempt) + " tries)"));
      return;
    }
    op->backoff_us = op->backoff_us ? op->backoff_us * 2 : cfg.first_backoff_us;
    uint64_t id = op->id;
    auto t = loop.add_timer_in(op->backoff_us, [this, id] {
      auto it = ops.find(id);
      if (it != ops.end()) send(it->second.get());
    });
    if (!t.ok()) {
      fail(op, std::move(t).error());
      return;
    }
    op->timer = std::move(t).value();
  }

  void send(Op* op) {
    HttpRequest req;
    req.url = op->url;
    req.follow_redirects = true;
    req.ca_file = cfg.ca_file;
    req.use_proxy = true;
    if (!op->auth.empty()) req.headers.push_back("Authorization: " + op->auth);
    if (op->is_manifest) {
      req.headers.push_back("Accept: " + oci::manifest_accept_header());
      req.timeout_us = cfg.manifest_timeout_us;
      req.max_body = oci::kMaxManifestBytes + 1;
    } else {
      req.timeout_us = 0;
      req.stall_timeout_us = cfg.stall_timeout_us;
      req.max_recv_bytes_per_s = cfg.max_download_rate;
      req.max_body = 4096;  // an error's body
      uint64_t from = op->sink->offset();
      if (auto size = op->sink->size(); size && from >= *size) {
        // All of it arrived before (an agent killed between the last byte and the
        // commit): a Range past the end would only be refused. The caller verifies.
        finish(op, make_error("unused"), {});
        return;
      }
      if (from > 0) req.headers.push_back("Range: bytes=" + std::to_string(from) + "-");
      bool first = true;
      req.on_data = [op, from, first](long status, std::string_view data) mutable {
        if (first) {
          first = false;
          if (from > 0 && status == 200) {  // the Range was ignored: all of it again
            if (auto s = op->sink->restart(); !s.ok()) {
              op->sink_error = s;
              return false;
            }
          }
        }
        if (auto s = op->sink->append(data.data(), data.size()); !s.ok()) {
          op->sink_error = s;
          return false;
        }
        return true;
      };
    }
    uint64_t id = op->id;
    auto r = http->get(std::move(req), [this, id](Result<HttpResponse> resp) {
      auto it = ops.find(id);
      if (it == ops.end()) return;
      it->second->request = 0;
      answered(it->second.get(), std::move(resp));
    });
    if (!r.ok()) {
      retry(op, r.error().str());
      return;
    }
    op->request = *r;
  }

  void answered(Op* op, Result<HttpResponse> resp) {
    if (!op->sink_error.ok()) {
      fail(op, std::move(op->sink_error).error());
      return;
    }
    if (!resp.ok()) {
      retry(op, resp.error().str());
      return;
    }
    const HttpResponse& r = *resp;
    if (r.status == 401 && !op->plain_url) {
      authenticate(op, r);
      return;
    }
    if (r.status == 429 || r.status >= 500) {
      retry(op, registry_says(r));
      return;
    }
    if (!op->is_manifest && r.status == 416 && op->sink->offset() > 0) {
      // Everything was there already: the caller's verification decides.
      finish(op, make_error("unused"), {});
      return;
    }
    if (r.status == 404) {
      fail(op, make_error("not found (" + registry_says(r) + ")"));
      return;
    }
    if (r.status != 200 && r.status != 206) {
      fail(op, make_error(registry_says(r)));
      return;
    }
    if (!op->is_manifest) {
      finish(op, make_error("unused"), {});
      return;
    }
    if (r.body.size() > oci::kMaxManifestBytes) {
      fail(op, make_error("manifest larger than " + std::to_string(oci::kMaxManifestBytes)));
      return;
    }
    FetchedManifest m;
    m.bytes = r.body;
    auto ct = r.headers.find("content-type");
    m.media_type = ct == r.headers.end() ? "" : ct->second.substr(0, ct->second.find(';'));
    m.digest = oci::digest_of(m.bytes, op->want ? op->want->algorithm : "sha256");
    if (op->want && m.digest != *op->want) {
      fail(op, make_error("the registry sent bytes that hash to " + m.digest.str() + ", not " +
                          op->want->str()));
      return;
    }
    finish(op, std::move(m), {});
  }

  void authenticate(Op* op, const HttpResponse& r) {
    if (!op->cached_token.empty()) {
      // A cached token refused (revoked, or expired early): a new one, once.
      tokens.erase(op->cached_token);
      op->cached_token.clear();
      op->tried_auth = false;
    }
    if (op->tried_auth) {
      fail(op, make_error("unauthorized even with credentials (" + registry_says(r) + ")"));
      return;
    }
    op->tried_auth = true;
    auto h = r.headers.find("www-authenticate");
    if (h == r.headers.end()) {
      fail(op, make_error("unauthorized, and the registry says no way to authenticate"));
      return;
    }
    auto ch = parse_challenge(h->second);
    if (!ch.ok()) {
      fail(op, std::move(ch).error().wrap("the registry's challenge"));
      return;
    }
    auto cred = cfg.credentials.find(op->ref.registry);
    if (ch->scheme == "basic") {
      if (cred == cfg.credentials.end()) {
        fail(op, make_error("the registry wants a password and none is configured for " +
                            op->ref.registry));
        return;
      }
      op->auth = "Basic " + base64_encode(cred->second.username + ":" + cred->second.password);
      send(op);
      return;
    }
    if (ch->scheme != "bearer" || !ch->params.count("realm")) {
      fail(op, make_error("unsupported authentication '" + ch->scheme.substr(0, 32) + "'"));
      return;
    }
    std::string realm = ch->params["realm"];
    if (realm.rfind("https://", 0) != 0 && realm.rfind("http://", 0) != 0) {
      fail(op, make_error("token service '" + realm.substr(0, 100) + "' is not an http(s) URL"));
      return;
    }
    // A token service over plain HTTP only for a registry that is itself plain HTTP.
    if (realm.rfind("http://", 0) == 0 && !cfg.insecure.count(op->ref.registry)) {
      fail(op, make_error("token service " + realm.substr(0, 100) + " is not HTTPS"));
      return;
    }
    std::string scope = ch->params.count("scope") ? ch->params["scope"]
                                                  : "repository:" + op->ref.repository + ":pull";
    std::string key = op->ref.registry + " " + scope;
    if (auto t = tokens.find(key); t != tokens.end()) {
      if (now_monotonic_us() < t->second.expires_us) {
        op->auth = t->second.auth;
        op->cached_token = key;
        send(op);
        return;
      }
      tokens.erase(t);
    }
    HttpRequest req;
    req.url =
        realm + (realm.find('?') == std::string::npos ? "?" : "&") + "scope=" + url_escape(scope);
    if (ch->params.count("service")) req.url += "&service=" + url_escape(ch->params["service"]);
    req.timeout_us = cfg.manifest_timeout_us;
    req.max_body = 64 << 10;
    req.ca_file = cfg.ca_file;
    req.use_proxy = true;
    if (cred != cfg.credentials.end())
      req.headers.push_back("Authorization: Basic " +
                            base64_encode(cred->second.username + ":" + cred->second.password));
    uint64_t id = op->id;
    auto sent = http->get(std::move(req), [this, id, key](Result<HttpResponse> resp) {
      auto it = ops.find(id);
      if (it == ops.end()) return;
      Op* o = it->second.get();
      o->request = 0;
      if (!resp.ok()) {
        retry(o, "token service: " + resp.error().str());
        return;
      }
      if (resp->status != 200) {
        fail(o, make_error("token service refused: " + registry_says(*resp)));
        return;
      }
      auto j = parse_json_bounded(resp->body, 8);
      std::string token;
      if (j.ok() && j->is_object()) {
        for (const char* k : {"token", "access_token"})
          if (j->contains(k) && (*j)[k].is_string() && !(*j)[k].get<std::string>().empty()) {
            token = (*j)[k].get<std::string>();
            break;
          }
      }
      if (token.empty() || token.size() > 16384 ||
          token.find_first_of("\r\n") != std::string::npos) {
        fail(o, make_error("the token service sent no usable token"));
        return;
      }
      // Kept until 90% of its life (at most a day), so that no request carries a token
      // about to expire.
      uint64_t life_s = 60;
      if (j->contains("expires_in") && (*j)["expires_in"].is_number_unsigned())
        life_s = std::min<uint64_t>((*j)["expires_in"].get<uint64_t>(), 86400);
      o->auth = "Bearer " + token;
      if (life_s > 1) tokens[key] = {o->auth, now_monotonic_us() + life_s * 900'000};
      send(o);
    });
    if (!sent.ok()) {
      fail(op, std::move(sent).error());
      return;
    }
    op->request = *sent;
  }

  void start(std::unique_ptr<Op> op) {
    Op* raw = op.get();
    op->id = next_id++;
    ops.emplace(op->id, std::move(op));
    // The first request goes from the loop, not from inside the caller.
    uint64_t id = raw->id;
    auto d = loop.add_timer_in(1, [this, id] {
      auto it = ops.find(id);
      if (it != ops.end()) send(it->second.get());
    });
    if (d.ok()) raw->timer = std::move(d).value();
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::create(EventLoop& loop, Config cfg) {
  auto impl = std::make_unique<Impl>(loop, std::move(cfg));
  TRY_ASSIGN(impl->http, HttpClient::create(loop));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

void Client::manifest(const oci::ImageRef& ref, ManifestDone done) {
  auto op = std::make_unique<Impl::Op>();
  op->ref = ref;
  op->want = ref.digest;
  op->url = impl_->base(ref) + "/manifests/" + (ref.digest ? ref.digest->str() : ref.tag);
  op->manifest_done = std::move(done);
  impl_->start(std::move(op));
}

void Client::manifest(const oci::ImageRef& ref, const oci::Digest& d, ManifestDone done) {
  manifest(ref.pinned(d), std::move(done));
}

void Client::blob(const oci::ImageRef& ref, const oci::Digest& d, BlobSink* sink, BlobDone done) {
  auto op = std::make_unique<Impl::Op>();
  op->ref = ref;
  op->is_manifest = false;
  op->sink = sink;
  op->url = impl_->base(ref) + "/blobs/" + d.str();
  op->blob_done = std::move(done);
  impl_->start(std::move(op));
}

void Client::fetch(const std::string& url, BlobSink* sink, BlobDone done) {
  auto op = std::make_unique<Impl::Op>();
  op->is_manifest = false;
  op->plain_url = true;
  op->sink = sink;
  op->url = url;
  op->blob_done = std::move(done);
  impl_->start(std::move(op));
}

Status read_registry_config(const TomlDoc& doc, const toml::table& t, Config* out) {
  auto at = [&](const char* key) { return t.get(key) ? doc.where(*t.get(key)) : doc.name(); };
  TRY_ASSIGN(auto insecure, doc.get_string_list(t, "insecure_registries"));
  if (insecure) {
    for (const auto& r : *insecure) {
      // A registry as image references name it: host[:port], nothing else.
      auto ref = oci::parse_image_ref(r + "/x:y");
      if (r.empty() || !ref.ok() || ref->registry != r)
        return field_error(at("insecure_registries"), "'" + r + "' is not a registry host[:port]");
      out->insecure.insert(r);
    }
  }
  TRY_ASSIGN(auto ca, doc.get_string(t, "registry_ca"));
  if (ca) {
    if (ca->empty() || (*ca)[0] != '/' || !path_exists(*ca))
      return field_error(at("registry_ca"), "'registry_ca' must name an existing file");
    out->ca_file = *ca;
  }
  TRY_ASSIGN(auto creds, doc.get_string(t, "registry_credentials"));
  if (creds) {
    if (creds->empty() || (*creds)[0] != '/')
      return field_error(at("registry_credentials"),
                         "'registry_credentials' must be an absolute path");
    TRY_ASSIGN(std::string text, read_file_bounded(*creds, 1u << 20));
    TRY_ASSIGN(out->credentials, parse_credentials(text, *creds));
    struct stat st {};
    if (::stat(creds->c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0)
      log_warn("the registry credentials file is readable by others than its owner: chmod 0600",
               {{"FILE", *creds}});
  }
  return {};
}

}  // namespace weft::registry
