// An OCI distribution client on a daemon's event loop (libcurl's multi interface through
// HttpClient: nothing blocks). It reads manifests and indexes (every manifest type of
// common/oci.h asked for at once), checks them against the digest they are asked by, and
// streams blobs into a sink, resuming with a Range request where an earlier try stopped.
//
// Authentication as registries do it: a 401 with a Bearer challenge sends the client to
// the token service it names (with the registry's credentials, if any) and the request
// is made again with the token; a Basic challenge is answered with the credentials.
// Transient failures (connection errors, 429, 5xx) are retried with exponential backoff;
// everything else is an error that says what the registry answered.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/event.h"
#include "common/http_client.h"
#include "common/oci.h"
#include "common/result.h"

namespace weft::registry {

struct Credentials {
  std::string username, password;
};

struct Config {
  // Registries spoken to over plain HTTP (host[:port] as in image references): a
  // registry on loopback or a test network. Every other one is HTTPS, verified.
  std::set<std::string> insecure;
  std::string ca_file;                             // extra CAs (empty: the system's)
  std::map<std::string, Credentials> credentials;  // by registry host[:port]
  uint64_t manifest_timeout_us = 30'000'000;
  uint64_t stall_timeout_us = 30'000'000;  // a blob moving < 1 KiB/s this long fails
  int attempts = 5;                        // tries of a transient failure
  uint64_t max_download_rate = 0;          // bytes/s of each blob or package download (0: any)
  uint64_t first_backoff_us = 500'000;     // doubled each retry
};

// Reads the credentials file: one registry per line, "<registry> <username> <password>"
// separated by blanks; '#' starts a comment. Errors name the line.
Result<std::map<std::string, Credentials>> parse_credentials(std::string_view text,
                                                             const std::string& file);

struct FetchedManifest {
  oci::Digest digest;      // of the bytes (what a tag resolved to)
  std::string media_type;  // as the registry sent it
  std::string bytes;
};

// Where a blob's bytes go: `offset()` bytes are already there (a resumed download);
// `restart()` discards them (the registry ignored the Range request). `size()` is the
// blob's size when the caller knows it (a manifest's descriptor): a sink that already
// holds that many bytes asks the registry for nothing.
class BlobSink {
 public:
  virtual ~BlobSink() = default;
  virtual uint64_t offset() const = 0;
  virtual std::optional<uint64_t> size() const { return std::nullopt; }
  virtual Status restart() = 0;
  virtual Status append(const void* data, size_t n) = 0;
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> create(EventLoop& loop, Config cfg);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  using ManifestDone = std::function<void(Result<FetchedManifest>)>;
  using BlobDone = std::function<void(Status)>;
  // The manifest or index `ref` names (by its digest if it has one, else its tag). With
  // a digest the bytes must hash to it. `done` runs on the loop, never from inside.
  void manifest(const oci::ImageRef& ref, ManifestDone done);
  // The manifest `d` of `ref`'s repository (an index entry).
  void manifest(const oci::ImageRef& ref, const oci::Digest& d, ManifestDone done);
  // Blob `d` of `ref`'s repository into `sink` (which must outlive the call). The caller
  // verifies and commits: the sink holds exactly the bytes received.
  void blob(const oci::ImageRef& ref, const oci::Digest& d, BlobSink* sink, BlobDone done);
  // A plain http(s) URL (a package) into `sink`, resumed, retried and timed out as a
  // blob is; no registry authentication. The caller verifies the bytes.
  void fetch(const std::string& url, BlobSink* sink, BlobDone done);

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The registry settings of a daemon's [images] table (agent.toml, controlplane.toml):
//   insecure_registries = ["127.0.0.1:5000"]   # plain HTTP (loopback, test networks)
//   registry_ca = "/etc/weft/registry-ca.pem"  # extra CAs for HTTPS registries
//   registry_credentials = "/etc/weft/registry-credentials"  # read now; file:line errors
// `keys` lists them for the table's only_keys check.
inline const std::vector<std::string> kRegistryConfigKeys = {"insecure_registries", "registry_ca",
                                                             "registry_credentials"};
Status read_registry_config(const TomlDoc& doc, const toml::table& images, Config* out);

// Parses a WWW-Authenticate challenge: scheme ("bearer", "basic", lowercase) and its
// parameters (realm, service, scope, ...). Exposed for tests and the fuzzer.
struct Challenge {
  std::string scheme;
  std::map<std::string, std::string> params;
};
Result<Challenge> parse_challenge(std::string_view header);

}  // namespace weft::registry
