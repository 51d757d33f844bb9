// weftctl's side of tls_module.h: finding and opening weftctl-tls.so.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <vector>

#include "cli/tls_module.h"
#include "common/fs.h"

namespace weft::cli {

Result<const TlsModule*> load_tls_module() {
  static const TlsModule* loaded = nullptr;
  if (loaded) return loaded;
  std::vector<std::string> candidates;
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0)
    candidates.push_back(dirname_of(std::string(self, static_cast<size_t>(n))) + "/weftctl-tls.so");
  candidates.push_back(WEFT_TLS_MODULE_PATH);
  std::string tried;
  for (const auto& path : candidates) {
    if (!path_exists(path)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return make_error("cannot load weftctl's TLS module: " + std::string(::dlerror()));
    using Entry = const TlsModule* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(h, kTlsModuleEntry));
    const TlsModule* m = entry ? entry() : nullptr;
    if (!m) return make_error(path + " is not weftctl's TLS module");
    if (std::strcmp(m->build, WEFT_BUILD_ID) != 0)
      return make_error(path + " comes from another build of weft (" + m->build + ", weftctl " +
                        WEFT_BUILD_ID + "): reinstall the weft package");
    loaded = m;
    return m;
  }
  return make_error("weftctl's TLS module (weftctl-tls.so) is not installed; looked at " + tried);
}

}  // namespace weft::cli
