#!/bin/sh
# weftctl loads only libc, libm and OpenSSL (docs/decisions.md, issue 18): every library
# more is mapped and relocated at every command an operator or a script runs. Fails
# naming any other shared library weftctl asks for.
set -eu
bin=$1
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || { echo "no NEEDED entries read from $bin" >&2; exit 1; }
sanitized=no
case "$needed" in *libasan*|*libubsan*) sanitized=yes ;; esac
bad=
for lib in $needed; do
  case "$lib" in
    libc.so.*|libm.so.*|ld-linux*|libssl.so.*|libcrypto.so.*) ;;
    # Sanitizer builds: their runtimes and what they need.
    libasan.so.*|libubsan.so.*) ;;
    libstdc++.so.*|libgcc_s.so.*) [ "$sanitized" = yes ] || bad="$bad $lib" ;;
    *) bad="$bad $lib" ;;
  esac
done
if [ -n "$bad" ]; then
  echo "weftctl loads more than libc, libm and OpenSSL:$bad" >&2
  exit 1
fi
echo "weftctl needs: $(echo $needed)"
