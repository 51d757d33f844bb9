#include "common/http_client.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cctype>
#include <mutex>

namespace weft {

namespace {

std::once_flag curl_once;

struct Request {
  uint64_t id = 0;
  CURL* easy = nullptr;
  HttpRequest req;
  HttpClient::Done done;
  HttpResponse resp;
  curl_slist* headers = nullptr;
  size_t header_bytes = 0;
  bool aborted_by_sink = false;
  char error[CURL_ERROR_SIZE] = {0};
  ~Request() { curl_slist_free_all(headers); }
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Request*>(user);
  size_t len = size * n;
  if (r->req.on_data) {
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) {
      if (r->req.on_data(status, std::string_view(data, len))) return len;
      r->aborted_by_sink = true;
      return 0;  // curl ends the transfer with a write error
    }
  }
  size_t room = r->req.max_body > r->resp.body.size() ? r->req.max_body - r->resp.body.size() : 0;
  r->resp.body.append(data, std::min(len, room));
  return len;
}

// Header lines of each response: a status line starts a new response (after a
// redirect), so only the last one's headers are kept. At most 64 KiB of them.
size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Request*>(user);
  size_t len = size * n;
  r->header_bytes += len;
  if (r->header_bytes > (64u << 10)) return 0;
  std::string_view line(data, len);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.rfind("HTTP/", 0) == 0) {
    r->resp.headers.clear();
    return len;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return len;
  std::string name(line.substr(0, colon));
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  r->resp.headers[name] = std::string(value);
  return len;
}

curl_socket_t on_open_socket(void* user, curlsocktype purpose, struct curl_sockaddr* a) {
  auto* r = static_cast<Request*>(user);
  if (purpose != CURLSOCKTYPE_IPCXN) return CURL_SOCKET_BAD;
  int fd = r->req.open_socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

}  // namespace

struct HttpClient::Impl {
  EventLoop& loop;
  CURLM* multi = nullptr;
  std::map<curl_socket_t, Source> sockets;
  Source timer;
  Source finish;  // delivers results outside curl's callbacks
  std::map<uint64_t, std::unique_ptr<Request>> requests;
  std::vector<std::pair<std::unique_ptr<Request>, Result<HttpResponse>>> ended;
  uint64_t next_id = 1;

  explicit Impl(EventLoop& l) : loop(l) {}
  ~Impl() {
    for (auto& [id, r] : requests) {
      curl_multi_remove_handle(multi, r->easy);
      curl_easy_cleanup(r->easy);
    }
    sockets.clear();
    if (multi) curl_multi_cleanup(multi);
  }

  void act(curl_socket_t s, int flags) {
    int running = 0;
    curl_multi_socket_action(multi, s, flags, &running);
    collect();
  }

  void collect() {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      Request* raw = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &raw);
      CURLcode code = m->data.result;
      auto it = requests.find(raw->id);
      if (it == requests.end()) continue;
      std::unique_ptr<Request> r = std::move(it->second);
      requests.erase(it);
      curl_multi_remove_handle(multi, r->easy);
      Result<HttpResponse> out = HttpResponse{};
      long status = 0;
      curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
      if (code == CURLE_OK || (code == CURLE_PARTIAL_FILE && status >= 400)) {
        // An error status whose body ended before its Content-Length (a registry's 416
        // that announces the blob's length) is still that status: its body only explains.
        r->resp.status = status;
        out = std::move(r->resp);
      } else if (r->aborted_by_sink) {
        out = make_error("the transfer was stopped by its receiver");
      } else {
        out = make_error(r->error[0] ? std::string(r->error) : curl_easy_strerror(code));
      }
      curl_easy_cleanup(r->easy);
      r->easy = nullptr;
      ended.emplace_back(std::move(r), std::move(out));
    }
    if (!ended.empty() && !finish.active()) {
      auto d = loop.add_defer([this] { deliver(); });
      if (d.ok()) finish = std::move(d).value();
    }
  }

  void deliver() {
    finish.reset();
    auto done = std::move(ended);
    ended.clear();
    for (auto& [r, out] : done)
      if (r->done) r->done(std::move(out));
  }

  static int on_socket(CURL*, curl_socket_t s, int what, void* user, void*) {
    auto* self = static_cast<Impl*>(user);
    if (what == CURL_POLL_REMOVE) {
      self->sockets.erase(s);
      return 0;
    }
    uint32_t events = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= EPOLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= EPOLLOUT;
    auto it = self->sockets.find(s);
    if (it != self->sockets.end()) {
      (void)it->second.set_io_events(events);
      return 0;
    }
    auto src = self->loop.add_io(s, events, [self, s](uint32_t rev) {
      int flags = 0;
      if (rev & EPOLLIN) flags |= CURL_CSELECT_IN;
      if (rev & EPOLLOUT) flags |= CURL_CSELECT_OUT;
      if (rev & (EPOLLERR | EPOLLHUP)) flags |= CURL_CSELECT_ERR;
      self->act(s, flags);
    });
    if (!src.ok()) return -1;
    self->sockets.emplace(s, std::move(src).value());
    return 0;
  }

  static int on_timer(CURLM*, long timeout_ms, void* user) {
    auto* self = static_cast<Impl*>(user);
    self->timer.reset();
    if (timeout_ms < 0) return 0;
    auto t = self->loop.add_timer_in(static_cast<uint64_t>(timeout_ms) * 1000,
                                     [self] { self->act(CURL_SOCKET_TIMEOUT, 0); });
    if (!t.ok()) return -1;
    self->timer = std::move(t).value();
    return 0;
  }
};

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpClient::~HttpClient() = default;

Result<std::unique_ptr<HttpClient>> HttpClient::create(EventLoop& loop) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  auto impl = std::make_unique<Impl>(loop);
  impl->multi = curl_multi_init();
  if (!impl->multi) return make_error("curl_multi_init failed");
  curl_multi_setopt(impl->multi, CURLMOPT_SOCKETFUNCTION, &Impl::on_socket);
  curl_multi_setopt(impl->multi, CURLMOPT_SOCKETDATA, impl.get());
  curl_multi_setopt(impl->multi, CURLMOPT_TIMERFUNCTION, &Impl::on_timer);
  curl_multi_setopt(impl->multi, CURLMOPT_TIMERDATA, impl.get());
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

Result<uint64_t> HttpClient::get(HttpRequest req, Done done) {
  auto r = std::make_unique<Request>();
  r->id = impl_->next_id++;
  r->req = std::move(req);
  r->done = std::move(done);
  CURL* e = curl_easy_init();
  if (!e) return make_error("curl_easy_init failed");
  r->easy = e;
  long timeout_ms = r->req.timeout_us == 0
                        ? 0
                        : static_cast<long>(std::max<uint64_t>(r->req.timeout_us / 1000, 1));
  curl_easy_setopt(e, CURLOPT_URL, r->req.url.c_str());
  curl_easy_setopt(e, CURLOPT_PRIVATE, r.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->error);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r.get());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, r.get());
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms ? timeout_ms : 10'000L);
  if (r->req.stall_timeout_us) {
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max<uint64_t>(r->req.stall_timeout_us / 1'000'000, 1)));
  }
  if (r->req.max_recv_bytes_per_s)
    curl_easy_setopt(e, CURLOPT_MAX_RECV_SPEED_LARGE,
                     static_cast<curl_off_t>(r->req.max_recv_bytes_per_s));
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, r->req.follow_redirects ? 1L : 0L);
  curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  if (!r->req.use_proxy) curl_easy_setopt(e, CURLOPT_NOPROXY, "*");  // probes: never a proxy
  if (r->req.head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  if (!r->req.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, r->req.ca_file.c_str());
  for (const auto& h : r->req.headers) {
    curl_slist* l = curl_slist_append(r->headers, h.c_str());
    if (!l) {
      curl_easy_cleanup(e);
      return make_error("out of memory for request headers");
    }
    r->headers = l;
  }
  if (r->headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
  if (!r->req.on_data)
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(1) << 30);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "weft");
  if (r->req.open_socket) {
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, &on_open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, r.get());
  }
  if (curl_multi_add_handle(impl_->multi, e) != CURLM_OK) {
    curl_easy_cleanup(e);
    return make_error("curl_multi_add_handle failed");
  }
  uint64_t id = r->id;
  impl_->requests.emplace(id, std::move(r));
  return id;
}

void HttpClient::cancel(uint64_t id) {
  auto it = impl_->requests.find(id);
  if (it != impl_->requests.end()) {
    curl_multi_remove_handle(impl_->multi, it->second->easy);
    curl_easy_cleanup(it->second->easy);
    impl_->requests.erase(it);
    return;
  }
  for (auto& [r, out] : impl_->ended)
    if (r->id == id) r->done = nullptr;
}

size_t HttpClient::in_flight() const {
  return impl_->requests.size();
}

}  // namespace weft
