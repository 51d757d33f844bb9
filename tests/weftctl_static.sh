#!/bin/sh
# weftctl is a static PIE (docs/decisions.md, issue 18): no dynamic loader and no shared
# library is mapped and relocated at every command an operator or a script runs, and
# its addresses are still randomised. In sanitizer builds (BUILD "sanitized") it is
# linked dynamically, with the sanitizers' runtimes (gcc's shared, clang's inside the
# program): then only those, libstdc++, libgcc, libc and libm. OpenSSL is weftctl-tls's,
# executed for a control plane over TCP: without it a tls:// command says where it
# looked; with it next to weftctl it gets as far as reading the certificate files; a
# weftctl-tls of another build refuses to run. Fails naming what it found.
set -eu
#   weftctl_static.sh WEFTCTL WEFTCTL_TLS static|sanitized
bin=$1 helper=$2 build=$3
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if [ "$build" = sanitized ]; then
  readelf -Ws "$bin" | grep -q '__asan_init' || { echo "weftctl of a sanitizer tree has no ASan" >&2; exit 1; }
  needed="sanitized: $needed"
fi
case "$needed" in
  sanitized:*)
    for lib in ${needed#sanitized:}; do
      case "$lib" in
        libc.so.*|libm.so.*|ld-linux*|libasan.so.*|libubsan.so.*|libstdc++.so.*|libgcc_s.so.*) ;;
        *) echo "the sanitizer build of weftctl loads $lib" >&2; exit 1 ;;
      esac
    done ;;
  "")
    readelf -h "$bin" | grep -q 'Type:.*DYN' || { echo "weftctl is static but not a PIE" >&2; exit 1; }
    if readelf -l "$bin" | grep -q INTERP; then echo "weftctl asks for a dynamic loader" >&2; exit 1; fi ;;
  *) echo "weftctl loads shared libraries:" $needed >&2; exit 1 ;;
esac
case "$(readelf -d "$helper" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')" in
  *libssl.so*) ;;
  *) echo "weftctl-tls does not link OpenSSL" >&2; exit 1 ;;
esac

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$bin" "$dir/weftctl"
tls="--controlplane tls://127.0.0.1:1 --tls-ca $dir/none --tls-cert $dir/none --tls-key $dir/none"
installed=$(strings "$bin" | grep -m1 '/libexec/weft/weftctl-tls$' || true)
if [ -n "$installed" ] && [ -x "$installed" ]; then
  echo "skipped the case without weftctl-tls: one is installed at $installed"
else
  out=$("$dir/weftctl" $tls job ls 2>&1) && { echo "weftctl without weftctl-tls succeeded" >&2; exit 1; }
  case "$out" in *"TLS helper (weftctl-tls) is not installed; looked at $dir/weftctl-tls"*) ;;
    *) echo "weftctl without weftctl-tls said: $out" >&2; exit 1 ;; esac
fi
cp "$helper" "$dir/weftctl-tls"
out=$("$dir/weftctl" $tls job ls 2>&1) && { echo "weftctl with no certificate succeeded" >&2; exit 1; }
case "$out" in *"tls_ca: cannot read '$dir/none'"*) ;;
  *) echo "weftctl with weftctl-tls said: $out" >&2; exit 1 ;; esac
# The helper runs the command line weftctl was given, global options after the command
# included.
out=$("$dir/weftctl" job ls $tls 2>&1) && { echo "weftctl with no certificate succeeded" >&2; exit 1; }
case "$out" in *"tls_ca: cannot read '$dir/none'"*) ;;
  *) echo "weftctl with options after the command said: $out" >&2; exit 1 ;; esac
out=$(WEFTCTL_BUILD_ID=0.0.0-other "$dir/weftctl-tls" $tls job ls 2>&1) &&
  { echo "weftctl-tls ran for another build" >&2; exit 1; }
case "$out" in *"weftctl-tls comes from another build of weft"*"0.0.0-other"*) ;;
  *) echo "weftctl-tls for another build said: $out" >&2; exit 1 ;; esac
echo "weftctl: $(file -b "$bin" | cut -d, -f1-4); weftctl-tls takes tls://"
