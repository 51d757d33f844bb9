// For tests: a real etcd (Debian's etcd-server, /usr/bin/etcd) as a child process on
// loopback ports picked free, its data in a temporary directory; stopped (SIGKILL) and
// removed with the object. A missing etcd fails the test (scripts/setup.sh installs it):
// a store test that silently skips would prove nothing.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd.h"
#include "common/fs.h"

namespace weft::testing {

inline uint16_t free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdServer {
 public:
  EtcdServer() {
    dir_ = std::filesystem::temp_directory_path() / ("weft-etcd-" + random_hex(5));
    (void)mkdir_p(dir_);
    client_port_ = free_tcp_port();
    peer_port_ = free_tcp_port();
    start();
  }
  ~EtcdServer() {
    kill();
    (void)remove_tree(dir_);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  // Empty when it serves; else why not.
  const std::string& error() const { return error_; }

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Started again on its data (after kill()).
  void start() {
    std::string client = endpoint();
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::string log = dir_ + "/etcd.log";
      FILE* f = std::freopen(log.c_str(), "a", stderr);
      (void)f;
      std::vector<std::string> args = {"/usr/bin/etcd",
                                       "--name=weft-test",
                                       "--data-dir=" + dir_ + "/data",
                                       "--listen-client-urls=" + client,
                                       "--advertise-client-urls=" + client,
                                       "--listen-peer-urls=" + peer,
                                       "--initial-advertise-peer-urls=" + peer,
                                       "--initial-cluster=weft-test=" + peer,
                                       "--max-txn-ops=1024",
                                       "--log-level=error",
                                       "--logger=zap"};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    auto client_or = etcd::Client::create({{client}, {}, {}, {}, 500});
    if (!client_or.ok()) {
      error_ = client_or.error().str();
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "etcd exited at start (is etcd-server installed? scripts/setup.sh); see " + dir_ +
                 "/etcd.log";
        return;
      }
      auto ping = (*client_or)->ping();
      if (ping.ok()) {
        error_.clear();
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        error_ = "etcd did not serve within 20 s: " + ping.error().str();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

 private:
  std::string dir_;
  uint16_t client_port_ = 0, peer_port_ = 0;
  pid_t pid_ = -1;
  std::string error_;
};

}  // namespace weft::testing
