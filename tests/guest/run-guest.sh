#!/usr/bin/env bash
# Boots the system-test guest once with the freshly built .deb and the checks, and
# prints the guest's console (WEFT-CHECK lines) on stdout.
#   run-guest.sh PATH/TO/weft_*.deb [console-log]
#   WEFT_GUEST_REGISTRY=DIR: a docker-registry storage directory (images pushed on the
#   host) the guest serves on its loopback for the image check
# Software emulation (KVM is not available here); one boot runs every check.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deb=$1
log=${2:-/dev/stdout}
cache=$("$here/build-image.sh" "$deb")
run=$(mktemp -d /var/tmp/weft-guest-run.XXXXXX)
trap 'rm -rf "$run"' EXIT

cp --sparse=always "$cache/root.img" "$run/root.img"
mkdir "$run/payload"
cp "$deb" "$here/checks.sh" "$run/payload/"
if [ -n "${WEFT_GUEST_REGISTRY:-}" ]; then cp -a "$WEFT_GUEST_REGISTRY" "$run/payload/registry"; fi
# Certificates for the cluster checks (mutual TLS between the packaged units): a CA, the
# control plane's for 127.0.0.1, the guest machine's (machine id "guest"), an admin's.
pki="$here/../../scripts/weft-pki"
{ "$pki" ca "$run/payload/pki" && "$pki" issue "$run/payload/pki" controlplane --ip 127.0.0.1 &&
  "$pki" issue "$run/payload/pki" guest --ou machine &&
  "$pki" issue "$run/payload/pki" admin --ou admin; } >/dev/null
rm -f "$run/payload/pki/ca.key"
mkfs.ext4 -q -F -L payload -d "$run/payload" "$run/payload.img" 64M >/dev/null

# KVM does not work on the development and CI machines; WEFT_GUEST_KVM=1 uses it elsewhere.
accel=tcg
if [ -n "${WEFT_GUEST_KVM:-}" ]; then accel=kvm; fi
timeout "${WEFT_GUEST_TIMEOUT:-900}" qemu-system-x86_64 \
  -machine q35 -accel "$accel" -cpu max -smp 2 -m 2048 \
  -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 quiet loglevel=3 systemd.show_status=0 panic=-1" \
  -drive file="$run/root.img",if=virtio,format=raw \
  -drive file="$run/payload.img",if=virtio,format=raw,readonly=on \
  -nic none -display none -serial file:"$run/console.log" -monitor none \
  >/dev/null 2>"$run/qemu.err" || {
    echo "WEFT-GUEST qemu exited with $?: $(cat "$run/qemu.err")" >>"$run/console.log"
  }
tr -d '\r' < "$run/console.log" > "$log"
