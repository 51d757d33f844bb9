#include "common/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/log.h"

namespace weft::metrics {

namespace {

std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string label_text(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ',';
    out += labels[i].first + "=\"" + escape(labels[i].second) + '"';
  }
  return out + '}';
}

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string unix_path;  // "unix:/path"
};

Result<Endpoint> parse_listen(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0) {  // a socket whose permissions say who may scrape
    Endpoint ep;
    ep.unix_path = listen.substr(5);
    if (ep.unix_path.empty() || ep.unix_path[0] != '/' || ep.unix_path.size() > 107)
      return make_error("'" + listen + "' is not unix:/absolute/path (at most 107 bytes)");
    return ep;
  }
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return make_error("'" + listen + "' is not host:port (a numeric address)");
  std::string host = listen.substr(0, colon), port_s = listen.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_s.c_str(), &end, 10);
  if (port_s.empty() || *end != '\0' || port < 0 || port > 65535)
    return make_error("'" + port_s + "' is not a port");
  Endpoint ep;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ep.addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a->sin6_addr) != 1)
      return make_error("'" + host + "' is not an IPv6 address");
    ep.len = sizeof *a;
    return ep;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&ep.addr);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1)
    return make_error("'" + host + "' is not a numeric IPv4 address (or [IPv6])");
  ep.len = sizeof *a;
  return ep;
}

MHD_Result reply(MHD_Connection* c, unsigned status, const std::string& body, const char* type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  // Pages are server-rendered HTML and SVG: no script runs, nothing is fetched.
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'none'; style-src 'unsafe-inline'; img-src data:");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method,
                      const char*, const char*, size_t* upload_size, void** state) {
  const auto* server = static_cast<const HttpServer*>(cls);
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    *upload_size = 0;  // nothing of a body is kept
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n", "text/plain");
  }
  if (*state == nullptr) {  // the headers are in; answer on the next call
    static int seen;
    *state = &seen;
    return MHD_YES;
  }
  if (!server->host_allowed(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
    return reply(c, 421, "this server does not answer for that host name\n", "text/plain");
  if (std::strcmp(url, "/metrics") == 0 && server->registry())
    return reply(c, MHD_HTTP_OK, server->registry()->render(),
                 "text/plain; version=0.0.4; charset=utf-8");
  std::string type, body;
  if (server->page(url, &type, &body)) return reply(c, MHD_HTTP_OK, body, type.c_str());
  return reply(c, MHD_HTTP_NOT_FOUND,
               server->registry() ? "metrics are at /metrics\n" : "not found\n", "text/plain");
}

}  // namespace

void HttpServer::set_allowed_hosts(std::vector<std::string> hosts) {
  for (auto& h : hosts)
    std::transform(h.begin(), h.end(), h.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
  allowed_hosts_ = std::move(hosts);
}

bool HttpServer::host_allowed(const char* header) const {
  if (allowed_hosts_.empty()) return true;
  if (!header) return false;  // HTTP/1.0 without Host: a browser always sends one
  std::string host(header);
  // "name:port", "1.2.3.4:port", "[::1]:port": the port aside.
  size_t colon = host.rfind(':');
  if (colon != std::string::npos && host.find(']', colon) == std::string::npos &&
      (host[0] == '[' || host.find(':') == colon))
    host.resize(colon);
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return std::find(allowed_hosts_.begin(), allowed_hosts_.end(), host) != allowed_hosts_.end();
}

void Writer::family(const std::string& name, const char* type, const std::string& help) {
  out_ += "# HELP " + name + ' ' + help + "\n# TYPE " + name + ' ' + type + '\n';
}

void Writer::sample(const std::string& name, double value, const Labels& labels) {
  out_ += name + label_text(labels) + ' ' + number(value) + '\n';
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

std::vector<double> Histogram::default_bounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++buckets_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(Writer& w, const std::string& name, const Labels& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i];
    Labels l = labels;
    l.emplace_back("le", i < bounds_.size() ? number(bounds_[i]) : "+Inf");
    w.sample(name + "_bucket", static_cast<double>(cumulative), l);
  }
  w.sample(name + "_sum", sum_, labels);
  w.sample(name + "_count", static_cast<double>(count_), labels);
}

void HistogramVec::write(Writer& w, const std::string& name) const {
  for (const auto& [value, h] : by_) h.write(w, name, {{label_, value}});
}

std::string Registry::render() const {
  Writer w;
  for (const auto& c : collectors_) c(w);
  return w.text();
}

Status check_listen(const std::string& listen) {
  if (listen.empty()) return {};
  auto ep = parse_listen(listen);
  if (!ep.ok()) return ep.error();
  return {};
}

Status read_listen(const TomlDoc& doc, const toml::table& t, std::string* out) {
  TRY_ASSIGN(auto v, doc.get_string(t, "metrics_listen"));
  if (!v) return {};
  if (auto s = check_listen(*v); !s.ok())
    return field_error(doc.where(*t.get("metrics_listen")),
                       "'metrics_listen': " + s.error().message);
  *out = *v;
  return {};
}

std::unique_ptr<HttpServer> HttpServer::serve(EventLoop& loop, const std::string& listen,
                                              const Registry* registry) {
  if (listen.empty()) return nullptr;
  auto s = start(loop, listen, registry);
  if (!s.ok()) {
    log_error("no /metrics endpoint: " + s.error().str());
    return nullptr;
  }
  return std::move(s).value();
}

struct HttpServer::Daemon {
  MHD_Daemon* d = nullptr;
};

Result<std::unique_ptr<HttpServer>> HttpServer::start(EventLoop& loop, const std::string& listen,
                                                      const Registry* registry) {
  TRY_ASSIGN(Endpoint ep, parse_listen(listen));
  std::unique_ptr<HttpServer> s(new HttpServer(loop, registry));
  unsigned flags = MHD_USE_EPOLL;
  MHD_Daemon* d = nullptr;
  // Idle connections are closed after 5 s and one address holds at most 8 of the 32, so
  // a few idle sockets from one host do not starve the scraper.
  if (!ep.unix_path.empty()) {
    // A stale socket of an earlier run is replaced; anything else at the path is not.
    struct stat st {};
    if (::lstat(ep.unix_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode))
        return make_error("metrics: " + ep.unix_path + " exists and is not a socket");
      ::unlink(ep.unix_path.c_str());
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, ep.unix_path.c_str(), ep.unix_path.size() + 1);
    mode_t old = ::umask(0117);  // 0660 from the start: never a moment open to all
    bool bound = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                 ::listen(fd, 16) == 0;
    ::umask(old);
    if (!bound) {
      int e = errno;
      if (fd >= 0) ::close(fd);
      return errno_error(e, "metrics: cannot listen on " + listen);
    }
    d = MHD_start_daemon(flags, 0, nullptr, nullptr, &on_request, s.get(), MHD_OPTION_LISTEN_SOCKET,
                         fd, MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_CONNECTION_TIMEOUT, 5u,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(64 * 1024),
                         MHD_OPTION_END);
    if (!d) {
      ::close(fd);
      return make_error("metrics: cannot serve on " + listen);
    }
  } else {
    if (ep.addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, 0, nullptr, nullptr, &on_request, s.get(), MHD_OPTION_SOCK_ADDR,
                         reinterpret_cast<const sockaddr*>(&ep.addr), MHD_OPTION_CONNECTION_LIMIT,
                         32u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8u, MHD_OPTION_CONNECTION_TIMEOUT,
                         5u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(64 * 1024),
                         MHD_OPTION_END);
  }
  if (!d)
    return make_error("metrics: cannot listen on " + listen + " (in use, or no such address)");
  s->daemon_ = new Daemon{d};
  const MHD_DaemonInfo* port = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  s->port_ = port ? port->port : 0;
  s->address_ = ep.unix_path.empty()
                    ? listen.substr(0, listen.rfind(':')) + ":" + std::to_string(s->port_)
                    : listen;
  const MHD_DaemonInfo* epfd = MHD_get_daemon_info(d, MHD_DAEMON_INFO_EPOLL_FD);
  if (!epfd) return make_error("metrics: libmicrohttpd has no epoll descriptor");
  HttpServer* raw = s.get();
  TRY_ASSIGN(s->io_, loop.add_io(epfd->epoll_fd, EPOLLIN, [raw](uint32_t) { raw->run(); }));
  raw->run();
  return s;
}

void HttpServer::run() {
  MHD_run(daemon_->d);
  timer_.reset();
  MHD_UNSIGNED_LONG_LONG ms = 0;
  if (MHD_get_timeout(daemon_->d, &ms) == MHD_YES) {
    auto t = loop_.add_timer_in(ms * 1000 + 1000, [this] { run(); });
    if (t.ok()) timer_ = std::move(t).value();
  }
}

HttpServer::~HttpServer() {
  io_.reset();
  timer_.reset();
  if (daemon_) {
    MHD_stop_daemon(daemon_->d);
    delete daemon_;
  }
}

}  // namespace weft::metrics
