#include "bench/sim_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "common/rpc/client.h"
#include "testing/process.h"

namespace weft::bench {

void Dialer::dial(EventLoop& loop, in_addr source, uint16_t port, std::function<void(Fd)> done) {
  cancel();
  done_ = std::move(done);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr = source;
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The port is chosen at connect() (by the 4-tuple), not at bind(): binding thousands of
  // sockets to one address first makes every bind scan the ports in use.
  int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      (::connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0 &&
       errno != EINPROGRESS)) {
    finish(loop, Fd());
    return;
  }
  fd_ = std::move(fd);
  auto io = loop.add_io(fd_.get(), EPOLLOUT, [this, &loop](uint32_t) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    // Ready once: no more wake-ups for this socket until its session takes it (a
    // writable socket left in the epoll set would be returned by every wait).
    (void)io_.set_io_events(0);
    finish(loop, err == 0 ? std::move(fd_) : Fd());
  });
  if (!io.ok()) {
    finish(loop, Fd());
    return;
  }
  io_ = std::move(io).value();
}

void Dialer::finish(EventLoop& loop, Fd fd) {
  auto later = loop.add_defer([this, fd = std::make_shared<Fd>(std::move(fd))] {
    io_.reset();
    fd_ = Fd();
    auto done = std::exchange(done_, nullptr);
    if (done) done(std::move(*fd));
  });
  if (later.ok()) {
    later_ = std::move(later).value();
  } else {
    io_.reset();
    fd_ = Fd();
    done_ = nullptr;
  }
}

void Dialer::cancel() {
  io_.reset();
  later_.reset();
  fd_ = Fd();
  done_ = nullptr;
}

std::string machine_name(int index) {
  char id[16];
  std::snprintf(id, sizeof id, "m%05d", index);
  return id;
}

namespace {

template <class T, void (*Free)(T*)>
struct Owned {
  T* p = nullptr;
  ~Owned() {
    if (p) Free(p);
  }
};

template <class T>
T* read_pem(const std::string& path, T* (*reader)(FILE*, T**, pem_password_cb*, void*)) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return nullptr;
  T* v = reader(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  return v;
}

bool write_pair(const std::string& base, X509* x, EVP_PKEY* key) {
  FILE* c = std::fopen((base + ".pem").c_str(), "w");
  // The key readable by its owner only: the daemons refuse a key every user can read.
  int kfd = ::open((base + ".key").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FILE* k = kfd >= 0 ? ::fdopen(kfd, "w") : nullptr;
  if (kfd >= 0 && !k) ::close(kfd);
  bool ok = c && k && PEM_write_X509(c, x) == 1 &&
            PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (c) std::fclose(c);
  if (k) std::fclose(k);
  return ok;
}

bool issue_one(X509* ca, EVP_PKEY* ca_key, const std::string& pki, int i) {
  std::string id = machine_name(i);
  Owned<EVP_PKEY, EVP_PKEY_free> key{EVP_EC_gen("P-256")};
  Owned<X509, X509_free> x{X509_new()};
  if (!key.p || !x.p) return false;
  X509_set_version(x.p, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.p), 500000 + i);
  X509_gmtime_adj(X509_getm_notBefore(x.p), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.p), 7 * 86400);
  X509_set_pubkey(x.p, key.p);
  X509_NAME* name = X509_get_subject_name(x.p);
  auto add = [name](const char* field, const std::string& v) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(v.c_str()), -1, -1, 0);
  };
  add("CN", id);
  add("OU", "machine");
  X509_set_issuer_name(x.p, X509_get_subject_name(ca));
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, ca, x.p, nullptr, nullptr, 0);
  std::string san = "DNS:" + id;
  bool ok = true;
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, san.c_str()},
                            {NID_ext_key_usage, "serverAuth,clientAuth"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    ok = ok && ext && X509_add_ext(x.p, ext, -1) == 1;
    X509_EXTENSION_free(ext);
  }
  return ok && X509_sign(x.p, ca_key, EVP_sha256()) > 0 && write_pair(pki + "/" + id, x.p, key.p);
}

}  // namespace

bool issue_machine_certs(const std::string& pki, int n) {
  Owned<EVP_PKEY, EVP_PKEY_free> ca_key{read_pem<EVP_PKEY>(pki + "/ca.key", PEM_read_PrivateKey)};
  Owned<X509, X509_free> ca{read_pem<X509>(pki + "/ca.pem", PEM_read_X509)};
  if (!ca_key.p || !ca.p) return false;
  for (int i = 0; i < n; ++i)
    if (!issue_one(ca.p, ca_key.p, pki, i)) return false;
  return true;
}

double cpu_seconds(pid_t pid) {
  auto stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return 0;
  auto close = stat->rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(stat->substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long rss_kib(pid_t pid) {
  auto status = read_file("/proc/" + std::to_string(pid) + "/status");
  if (!status.ok()) return 0;
  auto at = status->find("VmRSS:");
  return at == std::string::npos ? 0 : std::strtol(status->c_str() + at + 6, nullptr, 10);
}

pid_t start_controlplane(const std::string& conf, const std::string& log) {
  testing::SpawnOptions o{log};
  // An allocator measured against the one linked in, in the control plane alone (the
  // simulator keeps its own): WEFT_BENCH_CP_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
  if (const char* preload = getenv("WEFT_BENCH_CP_PRELOAD"); preload && *preload)
    o.env["LD_PRELOAD"] = preload;
  return testing::spawn_process({WEFT_CONTROLPLANE_BIN, "-c", conf}, o);
}

bool wait_controlplane(const std::string& socket) {
  for (int i = 0; i < 1000; ++i) {
    auto c = rpc::Client::connect(socket);
    if (c.ok() && (*c)->call("machine.ls", nlohmann::json::object(), 2000).ok()) return true;
    usleep(10'000);
  }
  return false;
}

bool raise_nofile(uint64_t want) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max < want) {
    rlimit more{want, want};
    if (setrlimit(RLIMIT_NOFILE, &more) == 0) return true;
  }
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur >= want;
}

}  // namespace weft::bench
