// toml++'s implementation, compiled once into weft-common (TOML_HEADER_ONLY=0 everywhere,
// TOML_IMPLEMENTATION here) instead of loaded from libtomlplusplus.so: every weft program
// that reads TOML starts without one more shared library to map and relocate (issue 18:
// weftctl's own start). Same Debian package, same source; only how it is linked differs.
#define TOML_IMPLEMENTATION
#include "common/toml.h"
