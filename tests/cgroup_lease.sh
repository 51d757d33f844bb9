# Sourced by the root tests in shell (fresh_clone.sh, region_script.sh): the cgroup2
# root's subtree_control is shared with the other root tests through their lease
# (tests/agent_harness.h): a test holds one while its agent runs, and the last holder
# puts the file back. Needs $cg2 (the cgroup2 mount) and $lease (/run/weft-test-cgroup2).
lease_take() {
  flock "$cg2" sh -c 'mkdir -p "$2" && { [ -e "$2/before" ] || cat "$1/cgroup.subtree_control" >"$2/before"; } &&
    : >"$2/holder-$3-sh"' _ "$cg2" "$lease" "$$"
}
lease_release() {
  flock "$cg2" sh -c '
    rm -f "$2/holder-$3-sh"
    for h in "$2"/holder-*; do
      [ -e "$h" ] || continue
      pid=${h#"$2"/holder-}; pid=${pid%%-*}
      if kill -0 "$pid" 2>/dev/null; then exit 0; fi
      rm -f "$h"
    done
    if [ -e "$2/before" ]; then
      for c in $(cat "$1/cgroup.subtree_control"); do
        grep -qw -- "$c" "$2/before" || echo "-$c" >"$1/cgroup.subtree_control" 2>/dev/null
      done
      rm -f "$2/before"
    fi
    rmdir "$2" 2>/dev/null || true' _ "$cg2" "$lease" "$$"
}
