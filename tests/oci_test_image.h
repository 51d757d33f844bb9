// Test images: tar layers assembled in memory (libarchive) and pushed, with their
// config and manifest, to a RegistryServer (testing/registry_server.h).
#pragma once

#include <archive.h>
#include <archive_entry.h>
#include <sys/sysmacros.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/oci.h"
#include "testing/registry_server.h"

namespace weft::testing {

struct Entry {
  std::string path;
  char type = 'f';   // f file, d dir, l symlink, h hard link, c char device, p fifo
  std::string data;  // contents, or the link target
  int mode = 0644;
  int uid = 0;
};

// A tar layer of `entries`, compressed as `c`.
inline std::string make_layer(const std::vector<Entry>& entries, oci::Compression c) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_set_bytes_in_last_block(a, 1);  // no zero padding after the stream
  if (c == oci::Compression::kGzip) archive_write_add_filter_gzip(a);
  if (c == oci::Compression::kZstd) archive_write_add_filter_zstd(a);
  std::string out;
  archive_write_open(
      a, &out, nullptr,
      [](archive*, void* ctx, const void* buf, size_t n) -> la_ssize_t {
        static_cast<std::string*>(ctx)->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (const auto& e : entries) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, e.path.c_str());
    archive_entry_set_perm(en, static_cast<mode_t>(e.mode));
    archive_entry_set_uid(en, e.uid);
    archive_entry_set_gid(en, e.uid);
    switch (e.type) {
      case 'f':
        archive_entry_set_filetype(en, AE_IFREG);
        archive_entry_set_size(en, static_cast<la_int64_t>(e.data.size()));
        break;
      case 'd':
        archive_entry_set_filetype(en, AE_IFDIR);
        break;
      case 'l':
        archive_entry_set_filetype(en, AE_IFLNK);
        archive_entry_set_symlink(en, e.data.c_str());
        break;
      case 'h':
        archive_entry_set_filetype(en, AE_IFREG);
        archive_entry_set_hardlink(en, e.data.c_str());
        break;
      case 'c':
        archive_entry_set_filetype(en, AE_IFCHR);
        archive_entry_set_rdev(en, makedev(1, 3));
        break;
      case 'p':
        archive_entry_set_filetype(en, AE_IFIFO);
        break;
    }
    archive_write_header(a, en);
    if (e.type == 'f') archive_write_data(a, e.data.data(), e.data.size());
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

// Pushes an image of `layers` (gzip blobs from make_layer) with `config` (the
// "config" object of an OCI image config) as repo:tag; the manifest's digest.
inline oci::Digest push_image(RegistryServer& reg, const std::string& repo, const std::string& tag,
                              const std::vector<std::string>& layers,
                              const nlohmann::json& config) {
  nlohmann::json diff_ids = nlohmann::json::array();
  nlohmann::json descs = nlohmann::json::array();
  for (const auto& l : layers) {
    oci::Digest d = reg.push_blob(repo, l);
    descs.push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                     {"digest", d.str()},
                     {"size", l.size()}});
    diff_ids.push_back(d.str());  // not checked by weft against the uncompressed bytes
  }
  nlohmann::json cfg{{"architecture", oci::host_platform().architecture},
                     {"os", "linux"},
                     {"config", config},
                     {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
  std::string cfg_bytes = cfg.dump();
  oci::Digest cd = reg.push_blob(repo, cfg_bytes);
  nlohmann::json m{
      {"schemaVersion", 2},
      {"mediaType", oci::kOciManifest},
      {"config",
       {{"mediaType", oci::kOciConfig}, {"digest", cd.str()}, {"size", cfg_bytes.size()}}},
      {"layers", descs}};
  return reg.push_manifest(repo, tag, m.dump(), oci::kOciManifest);
}

}  // namespace weft::testing
