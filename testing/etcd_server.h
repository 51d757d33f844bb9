// For tests: a real etcd (Debian's etcd-server, /usr/bin/etcd) as a child process on
// loopback ports picked free, its data in a temporary directory; stopped (SIGKILL) and
// removed with the object. A missing etcd fails the test (scripts/setup.sh installs it):
// a store test that silently skips would prove nothing.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "controlplane/store/etcd_client.h"
#include "testing/ports.h"
#include "testing/process.h"

namespace weft::testing {

// One member, or a cluster of `members` on loopback; with `tls_dir` (a weft-pki CA with
// a certificate "etcd" for 127.0.0.1) clients must present a certificate of that CA.
class EtcdServer {
 public:
  // `host`: the address members listen on (e.g. a veth's, in a test's network namespace).
  // `netns` (root), one per member: member i runs in /run/netns/<netns[i]> and listens
  // on hosts[i] (a cluster whose members a test partitions from one another).
  explicit EtcdServer(int members = 1, std::string tls_dir = "", std::string host = "127.0.0.1",
                      std::vector<std::string> hosts = {}, std::vector<std::string> netns = {})
      : tls_dir_(std::move(tls_dir)),
        host_(std::move(host)),
        hosts_(std::move(hosts)),
        netns_(std::move(netns)) {
    // Its data in memory (/dev/shm) where there is one: the suite runs many members side
    // by side on one disk, and an fsync held seconds behind another test's writes made a
    // leader lose its lease in a test about something else. A slow or silent etcd has
    // tests of its own (SIGSTOP, partitions); what etcd keeps across a member's SIGKILL
    // stays in /dev/shm as on a disk.
    std::error_code ec;
    std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
            ? std::filesystem::path("/dev/shm")
            : std::filesystem::temp_directory_path();
    dir_ = base / ("weft-etcd-" + random_hex(5));
    (void)mkdir_p(dir_);
    for (int i = 0; i < members; ++i) members_.push_back({free_tcp_port(), free_tcp_port(), -1});
    for (size_t i = 0; i < members_.size(); ++i) spawn(i);
    error_ = wait_serving();
  }
  ~EtcdServer() {
    for (size_t i = 0; i < members_.size(); ++i) kill(i);
    (void)remove_tree(dir_);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint(size_t i = 0) const {
    return std::string(tls_dir_.empty() ? "http" : "https") + "://" + host_of(i) + ":" +
           std::to_string(members_[i].client);
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  // Empty when it serves; else why not.
  const std::string& error() const { return error_; }
  // The client configuration for this server (TLS files when it has them).
  etcd::Config client_config(uint64_t timeout_ms = 500) const {
    etcd::Config c{endpoints(), {}, {}, {}, timeout_ms};
    if (!tls_dir_.empty()) {
      c.ca = tls_dir_ + "/ca.pem";
      c.cert = tls_dir_ + "/client.pem";
      c.key = tls_dir_ + "/client.key";
    }
    return c;
  }

  void kill(size_t i = SIZE_MAX) {
    for (size_t k = 0; k < members_.size(); ++k) {
      if (i != SIZE_MAX && k != i) continue;
      if (members_[k].pid <= 0) continue;
      stop_process(members_[k].pid, SIGKILL);
      members_[k].pid = -1;
    }
  }
  pid_t pid(size_t i = 0) const { return members_.at(i).pid; }
  // Started again on its data (after kill()); waits until the cluster serves.
  void start(size_t i = SIZE_MAX) {
    for (size_t k = 0; k < members_.size(); ++k)
      if ((i == SIZE_MAX || k == i) && members_[k].pid <= 0) spawn(k);
    error_ = wait_serving();
  }

 private:
  struct Member {
    uint16_t client, peer;
    pid_t pid;
  };
  std::string peer_url(size_t i) const {
    return "http://" + host_of(i) + ":" + std::to_string(members_[i].peer);
  }
  void spawn(size_t i) {
    std::string cluster;
    for (size_t k = 0; k < members_.size(); ++k)
      cluster += (k ? "," : "") + std::string("m") + std::to_string(k) + "=" + peer_url(k);
    std::string client = endpoint(i);
    std::vector<std::string> args = {"/usr/bin/etcd",
                                     "--name=m" + std::to_string(i),
                                     "--data-dir=" + dir_ + "/data" + std::to_string(i),
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer_url(i),
                                     "--initial-advertise-peer-urls=" + peer_url(i),
                                     "--initial-cluster=" + cluster,
                                     "--max-txn-ops=1024",
                                     "--log-level=error",
                                     "--logger=zap"};
    if (!tls_dir_.empty()) {
      args.push_back("--cert-file=" + tls_dir_ + "/etcd.pem");
      args.push_back("--key-file=" + tls_dir_ + "/etcd.key");
      args.push_back("--client-cert-auth");
      args.push_back("--trusted-ca-file=" + tls_dir_ + "/ca.pem");
    }
    SpawnOptions o{dir_ + "/etcd" + std::to_string(i) + ".log"};
    if (i < netns_.size()) o.netns = netns_[i];
    pid_t pid = spawn_process(args, o);
    members_[i].pid = pid;
  }
  std::string wait_serving() {
    auto client_or = etcd::Client::create(client_config());
    if (!client_or.ok()) return client_or.error().str();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      for (auto& m : members_) {
        int status = 0;
        if (m.pid > 0 && ::waitpid(m.pid, &status, WNOHANG) == m.pid) {
          m.pid = -1;
          return "etcd exited at start (is etcd-server installed? scripts/setup.sh); see " + dir_ +
                 "/etcd*.log";
        }
      }
      auto ping = (*client_or)->ping();
      if (ping.ok()) return {};
      if (std::chrono::steady_clock::now() > deadline)
        return "etcd did not serve within 20 s: " + ping.error().str();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  const std::string& host_of(size_t i) const { return i < hosts_.size() ? hosts_[i] : host_; }
  std::string dir_, tls_dir_, host_;
  std::vector<std::string> hosts_, netns_;
  std::vector<Member> members_;
  std::string error_;
};

}  // namespace weft::testing
