# Shared by scripts/demo.sh, test.sh and package.sh (sourced, not run): one way to
# configure the normal tree, so the demo's build, the packages and the normal test pass
# are one tree that each of them reuses.

# What the demo runs.
WEFT_PRODUCT_TARGETS="weft-agent weft-init weftctl weftctl-tls weft-sidekick weft-hcs weft-controlplane"
# What the packages ship: the programs and every file made at build time that they
# install (the completion scripts, the compressed man pages and changelog). One target
# in CMake (packaging/CMakeLists.txt), so that a new generated file cannot be left out.
WEFT_PACKAGE_TARGETS="weft-packaged"

# weft_configure DIR [cmake options...]: the normal (RelWithDebInfo, /usr) tree.
weft_configure() {
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
    "$@" >/dev/null
}

# weft_configure_fuzz: the fuzzers' tree (clang, ASan+UBSan, libFuzzer's coverage).
weft_configure_fuzz() {
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWEFT_FUZZ=ON -DWEFT_BENCH=OFF >/dev/null
}
