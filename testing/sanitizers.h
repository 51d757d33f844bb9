// Whether this test program runs under AddressSanitizer (gcc defines
// __SANITIZE_ADDRESS__, clang has __has_feature). Under it, freed memory is held back
// in a quarantine (up to 256 MiB), so a process's resident size says nothing of what it
// holds: tests assert memory in the normal build only.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define WEFT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_UNDER_ASAN 1
#endif
#endif
#ifndef WEFT_UNDER_ASAN
#define WEFT_UNDER_ASAN 0
#endif

namespace weft::testing {
inline constexpr bool kUnderAsan = WEFT_UNDER_ASAN != 0;
}  // namespace weft::testing
