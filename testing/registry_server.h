// For tests: a real OCI registry (Debian's docker-registry, /usr/bin/docker-registry) as a
// child process on a free loopback port, its storage in a temporary directory; stopped
// (SIGKILL) and removed with the object. Images are pushed with the distribution API
// (blocking libcurl: this is the test's side, not a daemon's). A missing registry fails
// the test (scripts/setup.sh installs it).
#pragma once

#include <curl/curl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "common/fs.h"
#include "common/oci.h"
#include "common/strings.h"
#include "testing/ports.h"
#include "testing/process.h"

namespace weft::testing {

class RegistryServer {
 public:
  RegistryServer() {
    dir_ = std::filesystem::temp_directory_path() / ("weft-registry-" + random_hex(5));
    (void)mkdir_p(dir_ + "/storage");
    port_ = free_tcp_port();
    (void)write_file(dir_ + "/config.yml",
                     "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                     "    rootdirectory: " +
                         dir_ + "/storage\n  delete:\n    enabled: true\nhttp:\n  addr: " + host() +
                         "\n");
    start();
  }
  ~RegistryServer() {
    stop();
    (void)remove_tree(dir_);
  }
  RegistryServer(const RegistryServer&) = delete;
  RegistryServer& operator=(const RegistryServer&) = delete;

  void start() {
    if (::access("/usr/bin/docker-registry", X_OK) != 0) {
      error_ = "/usr/bin/docker-registry is missing (scripts/setup.sh installs docker-registry)";
      return;
    }
    pid_ = spawn_process({"/usr/bin/docker-registry", "serve", dir_ + "/config.yml"});
    error_ = "did not answer /v2/ within 10 s";
    for (int i = 0; i < 200; ++i) {
      if (request("GET", "/v2/", "", "").first == 200) {
        error_.clear();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void stop() { stop_process(pid_, SIGKILL); }
  const std::string& error() const { return error_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& storage() const { return dir_; }
  // Where the registry keeps a blob's bytes (a test corrupts them there).
  std::string blob_file(const oci::Digest& d) const {
    return dir_ + "/storage/docker/registry/v2/blobs/" + d.algorithm + "/" + d.hex.substr(0, 2) +
           "/" + d.hex + "/data";
  }

  // Pushes `bytes` as a blob of `repo`; its digest.
  oci::Digest push_blob(const std::string& repo, const std::string& bytes) {
    oci::Digest d = oci::digest_of(bytes);
    auto [code, location] = request("POST", "/v2/" + repo + "/blobs/uploads/", "", "");
    if (code != 202 || location.empty()) return d;
    std::string url =
        location + (location.find('?') == std::string::npos ? "?" : "&") + "digest=" + d.str();
    if (url.rfind("http", 0) != 0) url = "http://" + host() + url;
    request("PUT", url, bytes, "application/octet-stream");
    return d;
  }
  // Pushes a manifest (or index) under `reference` (a tag or its digest); its digest.
  oci::Digest push_manifest(const std::string& repo, const std::string& reference,
                            const std::string& bytes, const std::string& media_type) {
    request("PUT", "/v2/" + repo + "/manifests/" + reference, bytes, media_type);
    return oci::digest_of(bytes);
  }
  // HTTP status and the Location header, if any.
  std::pair<long, std::string> request(const std::string& method, const std::string& path,
                                       const std::string& body, const std::string& type) {
    CURL* c = curl_easy_init();
    std::string url = path.rfind("http", 0) == 0 ? path : "http://" + host() + path;
    std::string location;
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_slist* hs = nullptr;
    if (!type.empty()) hs = curl_slist_append(hs, ("Content-Type: " + type).c_str());
    if (hs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
    if (method == "PUT" || method == "POST") {
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    curl_easy_setopt(
        c, CURLOPT_WRITEFUNCTION, +[](char*, size_t s, size_t n, void*) { return s * n; });
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &location);
    curl_easy_setopt(
        c, CURLOPT_HEADERFUNCTION, +[](char* d, size_t s, size_t n, void* u) {
          std::string line(d, s * n);
          if (line.size() > 10 &&
              (line.rfind("Location:", 0) == 0 || line.rfind("location:", 0) == 0))
            *static_cast<std::string*>(u) = trim(line.substr(9));
          return s * n;
        });
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    return {code, location};
  }

 private:
  std::string dir_, error_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace weft::testing
