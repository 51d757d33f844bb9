#!/bin/sh
# weftctl loads only libc and libm (docs/decisions.md, issue 18): every library more is
# mapped and relocated at every command an operator or a script runs; OpenSSL comes
# with weftctl-tls.so, opened for tls:// endpoints only. Fails naming any other shared
# library weftctl asks for, or a TLS module that exports more than its entry point.
set -eu
bin=$1
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || { echo "no NEEDED entries read from $bin" >&2; exit 1; }
sanitized=no
case "$needed" in *libasan*|*libubsan*) sanitized=yes ;; esac
bad=
for lib in $needed; do
  case "$lib" in
    libc.so.*|libm.so.*|ld-linux*) ;;
    # Sanitizer builds: their runtimes and what they need.
    libasan.so.*|libubsan.so.*) ;;
    libstdc++.so.*|libgcc_s.so.*) [ "$sanitized" = yes ] || bad="$bad $lib" ;;
    *) bad="$bad $lib" ;;
  esac
done
if [ -n "$bad" ]; then
  echo "weftctl loads more than libc and libm:$bad" >&2
  exit 1
fi
module=${2:-}
if [ -n "$module" ]; then
  exported=$(nm -D --defined-only "$module" | awk '{print $3}' | grep -v '^_\(init\|fini\)$' || true)
  if [ "$exported" != weft_tls_module_v1 ]; then
    echo "$module exports more than weft_tls_module_v1:" $exported >&2
    exit 1
  fi
  # Without the module, a tls:// command says what is missing; with it next to weftctl,
  # it gets as far as reading the certificate files.
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  cp "$bin" "$dir/weftctl"
  tls="--controlplane tls://127.0.0.1:1 --tls-ca $dir/none --tls-cert $dir/none --tls-key $dir/none"
  out=$("$dir/weftctl" $tls job ls 2>&1) && { echo "weftctl without its module succeeded" >&2; exit 1; }
  case "$out" in *"TLS module (weftctl-tls.so) is not installed; looked at $dir/weftctl-tls.so"*) ;;
    *) echo "weftctl without its module said: $out" >&2; exit 1 ;; esac
  cp "$module" "$dir/weftctl-tls.so"
  out=$("$dir/weftctl" $tls job ls 2>&1) && { echo "weftctl with no certificate succeeded" >&2; exit 1; }
  case "$out" in *"tls_ca: cannot read '$dir/none'"*) ;;
    *) echo "weftctl with its module said: $out" >&2; exit 1 ;; esac
fi
echo "weftctl needs: $(echo $needed)"
