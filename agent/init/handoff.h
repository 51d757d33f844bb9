// The hand-off of a task to a sandbox made ahead (agent/sandbox_pool.h).
//
// A sandbox is weft-init started as `weft-init --await-task` in a task's cgroup and
// namespaces before any task asked for them, holding one end of a socketpair on fd 3.
// Taking it, the agent sends one message on the socket: a Header, then `body_len`
// bytes holding `argc` NUL-terminated strings back to back (the argv weft-init would
// have been started with, built by agent/init/argv.h), with the task directory and,
// when the spec has files, their memfd as SCM_RIGHTS on the header's first byte.
// weft-init then goes on exactly as if started with that argv, fd 3 and fd 4.
//
// Header-only and free of libstdc++: weft-init (static, no C++ runtime) and the agent
// both include it. The socket's other end is the agent's, but the message is parsed as
// if it were hostile all the same (fuzz/fuzz_handoff.cc).
#pragma once

#include <stdint.h>
#include <string.h>

namespace weft::handoff {

constexpr uint32_t kMagic = 0x31544657;  // "WFT1", little-endian
constexpr uint32_t kMaxBody = 1u << 20;  // an argv larger than this is not handed off
constexpr uint32_t kMaxArgs = 8192;
constexpr int kMaxFds = 2;  // the task directory; the files' memfd when there are files

struct Header {
  uint32_t magic;
  uint32_t body_len;
  uint32_t argc;
  uint32_t nfds;
};

// Whether `h` is a header this version accepts.
inline bool header_ok(const Header& h) {
  return h.magic == kMagic && h.body_len > 0 && h.body_len <= kMaxBody && h.argc > 0 &&
         h.argc <= kMaxArgs && h.nfds >= 1 && h.nfds <= static_cast<uint32_t>(kMaxFds);
}

// Points argv[0..argc) at the `argc` strings of `body` (which must be exactly
// `body_len` bytes of them, each NUL-terminated; an argument may be empty) and sets
// argv[argc] to null. `argv` has room for argc + 1. False when the body does not hold
// exactly argc strings.
inline bool split_args(char* body, uint32_t body_len, uint32_t argc, char** argv) {
  if (body_len == 0 || body[body_len - 1] != '\0') return false;
  uint32_t n = 0;
  uint32_t start = 0;
  for (uint32_t i = 0; i < body_len; ++i) {
    if (body[i] != '\0') continue;
    if (n == argc) return false;
    argv[n++] = body + start;
    start = i + 1;
  }
  if (n != argc) return false;
  argv[argc] = nullptr;
  return true;
}

}  // namespace weft::handoff
