#!/bin/bash
# The .rpm, installed for real where an RPM distribution cannot be had: no RPM
# distribution's packages are reachable from these machines (only Debian's registry), so
# there is no Fedora or openSUSE guest to boot. What can be checked is checked:
#  - its Requires name every shared library its programs load (soname()(64bit)), and
#    systemd;
#  - rpm itself installs it into a scratch root (a copy of the system-test guest's Debian
#    root, which has systemd and weft's libraries), running its scriptlets there: the
#    weft group made by systemd-sysusers, the state directories by systemd-tmpfiles, the
#    units enabled; its programs find every library; `rpm -e` runs the removal
#    scriptlets (units disabled, files gone, configuration kept).
#   rpm_root.sh PATH/TO/weft-*.rpm PATH/TO/weft_*.deb   (root; cleans up after itself)
set -u
rpm_file=$(readlink -f "$1")
deb=$2
here=$(cd "$(dirname "$0")" && pwd)
fail=0
bad() { echo "FAIL $*" >&2; fail=1; }
[ -f "$rpm_file" ] || { echo "FAIL: no $rpm_file (scripts/package.sh makes it)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/weft-rpm-root.XXXXXX)
R=$work/root
cleanup() {
  mountpoint -q "$R/proc" && umount "$R/proc"
  mountpoint -q "$R" && umount "$R"
  rm -rf "$work"
}
trap cleanup EXIT

# Requires: every NEEDED soname of every ELF file in the package.
requires=$(rpm -qp --requires "$rpm_file")
grep -q '^systemd' <<<"$requires" || bad "Requires has no systemd: $requires"
mkdir "$work/x"
(cd "$work/x" && rpm2cpio "$rpm_file" | cpio -idm --quiet) || bad "cannot unpack the rpm"
while IFS= read -r f; do
  for so in $(objdump -p "$f" 2>/dev/null | awk '/NEEDED/ { print $2 }'); do
    grep -qxF "$so()(64bit)" <<<"$requires" || bad "$f needs $so, which Requires does not name"
  done
done < <(find "$work/x" -type f -perm -u+x -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)

# A scratch root: the guest's Debian root (systemd, and the libraries the .deb needs).
cache=$("$here/guest/build-image.sh" "$deb") || { echo "FAIL: no guest image" >&2; exit 1; }
cp --sparse=always "$cache/root.img" "$work/root.img"
mkdir "$R"
mount -o loop "$work/root.img" "$R" || { echo "FAIL: cannot mount the scratch root" >&2; exit 1; }
# As an installer's target root has it (systemd-tmpfiles needs /proc).
mount -t proc proc "$R/proc" || { echo "FAIL: cannot mount /proc in the scratch root" >&2; exit 1; }
rpm --root "$R" --initdb
if ! rpm --root "$R" --nodeps -ivh "$rpm_file" >"$work/install.log" 2>&1; then
  bad "rpm -i: $(cat "$work/install.log")"
fi
[ -x "$R/usr/bin/weftctl" ] || bad "no /usr/bin/weftctl"
grep -q '^weft:' "$R/etc/group" || bad "%post: systemd-sysusers made no weft group"
[ -d "$R/var/lib/weft" ] || bad "%post: systemd-tmpfiles made no /var/lib/weft"
for u in weft-agent weft-sidekick weft-hcs weft-tasks; do
  [ -L "$R/etc/systemd/system/multi-user.target.wants/$u.service" ] ||
    bad "%post: $u.service is not enabled ($(ls "$R/etc/systemd/system/multi-user.target.wants" 2>&1 | tr '\n' ' '))"
done
# Every program the package installs finds its libraries. The list is the package's own
# (not names written here: a check of a path the package does not have would pass), and
# ldd's own failure is a failure too.
progs=$(rpm -qlp "$rpm_file" | grep -E '^/usr/(s?bin|libexec/weft)/')
[ "$(wc -w <<<"$progs")" -ge 7 ] || bad "the package lists too few programs: $progs"
for p in $progs; do
  [ -x "$R$p" ] || { bad "$p is not installed"; continue; }
  head -c4 "$R$p" | grep -q ELF || continue
  if ! out=$(chroot "$R" ldd "$p" 2>&1); then
    # A static program is fine (weftctl, weft-init); anything else ldd refuses is not.
    grep -q 'not a dynamic executable' <<<"$out" || bad "ldd $p: $out"
  fi
  ! grep -q 'not found' <<<"$out" || bad "$p: $(grep 'not found' <<<"$out" | tr '\n' ' ')"
done
# The key for secrets at rest, made by %post (mode 0600, root's, one 64-digit key).
key=$R/etc/weft/secrets.key
[ "$(stat -c %a:%U 2>/dev/null "$key")" = 600:root ] || bad "%post: $key is $(stat -c %a:%U "$key" 2>&1)"
grep -qE '^k[0-9]{6} [0-9a-f]{64}$' "$key" || bad "%post: $key holds no key line"
grep -q '^secrets_key = "/etc/weft/secrets.key"' "$R/etc/weft/controlplane.toml" ||
  bad "controlplane.toml does not name the key file"
chroot "$R" /usr/bin/weftctl --help >/dev/null || bad "weftctl does not run in the root"
[ -f "$R/usr/share/bash-completion/completions/weftctl" ] || bad "no bash completion"
echo 'log_level = "debug"' >>"$R/etc/weft/agent.toml"  # an operator's change

if ! rpm --root "$R" -e weft >"$work/erase.log" 2>&1; then bad "rpm -e: $(cat "$work/erase.log")"; fi
[ ! -e "$R/usr/bin/weftctl" ] || bad "rpm -e left /usr/bin/weftctl"
[ ! -L "$R/etc/systemd/system/multi-user.target.wants/weft-agent.service" ] ||
  bad "%preun: weft-agent.service still enabled"
[ -f "$R/etc/weft/agent.toml.rpmsave" ] || [ -f "$R/etc/weft/agent.toml" ] ||
  bad "rpm -e dropped the operator's changed agent.toml"
[ "$fail" = 0 ] && echo "rpm: requires, install, scriptlets and removal checked in a scratch root"
exit $fail
