#!/usr/bin/env bash
# Builds (or reuses) the system-test guest: a Debian 12 root with systemd as PID 1 and
# Debian's kernel, as an ext4 image plus the kernel and initramfs to boot it with.
# The packages come from this machine's own apt sources. The result is cached under
# $WEFT_GUEST_CACHE (default ~/.cache/weft/guest), keyed by the package list and this
# script, so a later run reuses it.
#   build-image.sh [weft.deb]   -> prints the cache directory holding root.img, vmlinuz,
#                                  initrd.img
# Given the .deb, its Depends are added to the image, so dpkg -i works offline in the guest
# whatever the build links against (a library added to the build cannot be forgotten here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

PACKAGES=(
  systemd systemd-sysv udev kmod linux-image-amd64 initramfs-tools
  procps iproute2 util-linux coreutils e2fsprogs man-db
  # weft's runtime dependencies (the .deb's Depends are added below as well)
  init-system-helpers libsqlite3-0 libtomlplusplus3 libsystemd0 libstdc++6
  libnl-3-200 libnl-route-3-200 libnl-genl-3-200 libbpf1 libmicrohttpd12 libcurl4
  libarchive13 libldns3 libnftables1
  # the image check's registry on the guest's loopback (its storage is made on the host)
  docker-registry
)
if [ -n "${1:-}" ]; then
  # "a (>= 1), b | c, d:any" -> a b d (the first of alternatives, no versions or arch)
  mapfile -t deps < <(dpkg-deb -f "$1" Depends | tr ',' '\n' |
    sed -E 's/\|.*//; s/\(.*\)//; s/:[a-z0-9]+//; s/[[:space:]]//g' | grep -v '^$')
  mapfile -t PACKAGES < <(printf '%s\n' "${PACKAGES[@]}" "${deps[@]}" | awk '!seen[$0]++')
fi
key=$( (printf '%s\n' "${PACKAGES[@]}"; cat "$0" "$here/guest-run") | sha256sum | cut -c1-16)
cache=${WEFT_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weft/guest}/$key
mkdir -p "$(dirname "$cache")"
# One build at a time (the guest test and the rpm check may ask at once); the second waits
# and finds it ready.
exec 9>"$cache.lock"
flock 9
if [ -f "$cache/ready" ]; then
  echo "$cache"
  exit 0
fi
rm -rf "$cache"
mkdir -p "$cache"
work=$(mktemp -d /var/tmp/weft-guest-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$f" ] && sources+=("$f")
done
include=$(IFS=,; echo "${PACKAGES[*]}")
echo "guest: building the root image ($include)" >&2
mmdebstrap --quiet --variant=minbase --include="$include" \
  --customize-hook='echo weft-guest > "$1/etc/hostname"' \
  bookworm "$root" "${sources[@]}" >&2

# Boot and console: root on the first virtio disk, no login prompts (a minbase root
# without udev rules for ttyS0 would wait 90 s for it), checks run by a oneshot unit.
cat > "$root/etc/fstab" <<FSTAB
/dev/vda / ext4 rw,errors=remount-ro 0 1
FSTAB
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
ln -sf /dev/null "$root/etc/systemd/system/getty@tty1.service"
# docker-registry is there for the image check, which serves its own storage when it
# needs it: the packaged service would run (and take CPU under emulation) from boot.
ln -sf /dev/null "$root/etc/systemd/system/docker-registry.service"
for t in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$t"
done
install -m 0755 "$here/guest-run" "$root/usr/local/sbin/weft-guest-run"
cat > "$root/etc/systemd/system/weft-guest-checks.service" <<UNIT
[Unit]
Description=weft system-test checks
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/weft-guest-run
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/weft-guest-checks.service \
  "$root/etc/systemd/system/multi-user.target.wants/weft-guest-checks.service"

cp "$root"/boot/vmlinuz-* "$cache/vmlinuz"
cp "$root"/boot/initrd.img-* "$cache/initrd.img"
chmod 0644 "$cache/vmlinuz" "$cache/initrd.img"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/boot/*
mkfs.ext4 -q -F -L weftroot -d "$root" "$cache/root.img" 3G >/dev/null
touch "$cache/ready"
echo "$cache"
