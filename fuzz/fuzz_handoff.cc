// The hand-off message a sandbox's weft-init reads on its socket (agent/init/handoff.h):
// the header and body as weft-init checks and splits them, and the agent's encoding of
// an argv made from the input, which must come back unchanged; then weft-init's parser
// (agent/init/args.h) over what was split.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agent/init/args.h"
#include "agent/init/handoff.h"
#include "agent/sandbox_pool.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::handoff;
  // As weft-init reads it: a header, then exactly body_len bytes.
  if (size >= sizeof(Header)) {
    Header h;
    std::memcpy(&h, data, sizeof h);
    if (header_ok(h) && size - sizeof h == h.body_len) {
      std::vector<char> body(data + sizeof h, data + size);
      std::vector<char*> argv(h.argc + 1, reinterpret_cast<char*>(1));
      if (split_args(body.data(), h.body_len, h.argc, argv.data())) {
        check(argv[h.argc] == nullptr);
        for (uint32_t i = 0; i < h.argc; ++i) {
          check(argv[i] >= body.data() && argv[i] < body.data() + body.size());
          check(std::memchr(argv[i], '\0', body.data() + body.size() - argv[i]) != nullptr);
        }
        weft_init::Args a;
        if (weft_init::parse_args(static_cast<int>(h.argc), argv.data(), &a)) {
          check(a.argv != nullptr && a.argv[0] != nullptr);
          check(a.nbinds <= 33 && a.ntmpfs <= 32 && a.nfiles <= 64 && a.nenv < 1024);
          check(a.env[a.nenv] == nullptr);
          check(a.ngroups <= 64);
        }
      }
    }
  }
  // The agent's encoding round-trips: the input's NUL-separated pieces as an argv.
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::string msg = weft::agent::handoff_message(args, 1);
  if (msg.empty()) return 0;
  Header h;
  std::memcpy(&h, msg.data(), sizeof h);
  check(header_ok(h) && h.argc == args.size() && msg.size() - sizeof h == h.body_len);
  std::vector<char*> argv(h.argc + 1);
  check(split_args(msg.data() + sizeof h, h.body_len, h.argc, argv.data()));
  for (size_t i = 0; i < args.size(); ++i) check(args[i] == argv[i]);
  return 0;
}
