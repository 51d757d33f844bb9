#!/usr/bin/env bash
# Builds the weft .deb and .rpm into dist/ from one build tree: the formats differ only
# in the unit directory (/lib/systemd/system on Debian 12, /usr/lib/systemd/system on
# RPM distributions) and the package metadata, which are compiled into nothing, so each
# configure changes install rules only and nothing is compiled twice.
#
#   WEFT_BUILD_DIR=DIR   package from this tree (default build-pkg). scripts/test.sh
#                        passes the normal pass's tree `build`, configured with the same
#                        options (scripts/lib.sh), so the suite compiles the product once.
set -euo pipefail
cd "$(dirname "$0")/.."
# What building, packaging and linting need (rpmbuild, lintian, rpmlint): this command
# installs them itself, as the demo and the test command do.
./scripts/setup.sh --package
. scripts/lib.sh
dir="${WEFT_BUILD_DIR:-build-pkg}"
mkdir -p dist
rm -f dist/weft_*.deb dist/weft-*.rpm
build_one() {
  local format=$1 unitdir=$2
  weft_configure "$dir" -DWEFT_UNITDIR="$unitdir" -DWEFT_PACKAGE_FORMAT="$format"
  cmake --build "$dir" --target $WEFT_PACKAGE_TARGETS >/dev/null
  rm -f "$dir"/*."${format,,}"
  (cd "$dir" && cpack -G "$format" >/dev/null)
  cp "$dir"/*."${format,,}" dist/
}
# RPM first: the tree is left configured for the Debian package, its default.
build_one RPM lib/systemd/system
build_one DEB /lib/systemd/system
ls -1 dist/
echo "== lintian"
lintian --fail-on error,warning dist/weft_*.deb
echo "== rpmlint"
rpmlint --strict -c packaging/rpmlint.toml dist/weft-*.rpm
