#!/usr/bin/env bash
# Builds the weft .deb and .rpm into dist/, from one build tree: the formats differ only
# in the unit directory (/lib/systemd/system on Debian 12, /usr/lib/systemd/system on
# RPM distributions) and the package metadata, which are compiled into nothing, so the
# second configure changes install rules only and nothing is compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist
build_one() {
  local format=$1 unitdir=$2 dir=build-pkg
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
    -DWEFT_UNITDIR="$unitdir" -DWEFT_PACKAGE_FORMAT="$format" >/dev/null
  cmake --build "$dir" --target weft-agent weft-init weftctl weft-sidekick weft-hcs weft-controlplane \
    weft-package-docs >/dev/null
  (cd "$dir" && cpack -G "$format" >/dev/null)
  cp "$dir"/*.${1,,} dist/
}
build_one DEB /lib/systemd/system
build_one RPM lib/systemd/system
ls -1 dist/
echo "== lintian"
lintian --fail-on error,warning dist/weft_*.deb
echo "== rpmlint"
rpmlint --strict -c packaging/rpmlint.toml dist/weft-*.rpm
