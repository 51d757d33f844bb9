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

# weft_configure_san: the suite's sanitizer tree (scripts/test.sh): clang, -O0 with line
# tables, ASan+UBSan, and libFuzzer's coverage so that the harnesses are built in it too.
# One tree for the sanitizer pass and the suite's bounded fuzz run; clang compiles it in
# a fifth of the CPU gcc took (docs/decisions.md, "One sanitizer tree, clang's").
weft_configure_san() {
  CC=clang CXX=clang++ cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
    -DWEFT_SANITIZE=ON -DWEFT_FUZZ=ON -DWEFT_BENCH=OFF >/dev/null
}

# weft_configure_fuzz: the long fuzz run's tree (scripts/fuzz.sh): clang, -O2, ASan+UBSan,
# libFuzzer's coverage; only the harnesses are built in it.
weft_configure_fuzz() {
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWEFT_FUZZ=ON -DWEFT_BENCH=OFF >/dev/null
}

# weft_machine_configs DIR MACHINE CGROUP_ROOT CONTROL_PLANE: the configuration of this
# machine's daemons for a trial on one host (scripts/demo.sh, scripts/region.sh):
# DIR/agent.toml, sidekick.toml and hcs.toml, their sockets and state under DIR, the
# agent's tasks under CGROUP_ROOT, the host profile limited to the safe examples/dev.toml
# (it touches only that subtree), all reaching CONTROL_PLANE.
weft_machine_configs() {
  local dev=$1 machine=$2 cgroot=$3 cp=$4
  mkdir -p "$dev/profiles"
  cp examples/dev.toml "$dev/profiles/"
  cat > "$dev/agent.toml" <<TOML
socket = "$dev/agent.sock"
state_dir = "$dev/agent"
cgroup_root = "$cgroot"
machine_id = "$machine"
control_plane = "$cp"
[labels]
dc = "dev"
rack = "dev-rack"
TOML
  cat > "$dev/sidekick.toml" <<TOML
socket = "$dev/sidekick.sock"
state_dir = "$dev/sidekick"
profile_dirs = ["$dev/profiles"]
workload_cgroup = "$cgroot/tasks"
apply_on_start = false
machine_id = "$machine"
control_plane = "$cp"
TOML
  cat > "$dev/hcs.toml" <<TOML
socket = "$dev/hcs.sock"
state_dir = "$dev/hcs"
interval = "2s"
# A developer's machine is often busy compiling: its CPU pressure is not a reason to
# take it out of service here (a fleet machine's is; docs/health.md).
psi = ["memory", "io"]
machine_id = "$machine"
control_plane = "$cp"
[liveness]
agent_socket = "$dev/agent.sock"
sidekick_socket = "$dev/sidekick.sock"
TOML
}

# For the trials (demo.sh, region.sh), which keep their daemons' pids in `pids` and their
# files in $dev. weft_trial_start NAME BIN CONF: a daemon in its own session (Ctrl-C
# reaches the script, which stops them in order), its log in $dev/NAME.log.
weft_trial_start() {
  local name=$1 bin=$2 conf=$3
  setsid "$bin" -c "$conf" >"$dev/$name.log" 2>&1 &
  pids+=($!)
}
weft_trial_wait_socket() {
  for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "$(basename "$0"): $1 did not appear; see $dev/*.log" >&2
  return 1
}
# weft_trial_stop_job JOB: the follower ($follow_pid, weftctl itself rather than a
# subshell around it) stopped and reaped before the daemons go, so that it never writes
# to a socket they closed; then JOB stopped through the caller's `weftctl`, and its
# tasks waited for (10 s at most).
weft_trial_stop_job() {
  if [ -n "${follow_pid:-}" ]; then
    kill "$follow_pid" 2>/dev/null || true
    wait "$follow_pid" 2>/dev/null || true
  fi
  weftctl job stop "$1" >/dev/null 2>&1 || true
  for _ in $(seq 100); do
    weftctl --json task ls 2>/dev/null | grep -q '"state": "\(running\|stopping\)"' || break
    sleep 0.1
  done
}
# weft_trial_stop CGROUP_ROOT CGROUP2_MOUNT CONTROLLERS_BEFORE: the daemons stopped (last
# started first), the tasks' cgroups removed (tasks outlive the agent by design), and the
# mount's subtree_control put back (unless WEFT_DEMO_KEEP_CONTROLLERS=1: left to whoever
# shares the file, tests/fresh_clone.sh). WEFT_DEMO_KEEP=DIR keeps the logs and state.
weft_trial_stop() {
  local cgroot=$1 cg2=$2 before=$3
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null && wait "${pids[i]}" 2>/dev/null || true
  done
  if [ -d "$cgroot" ]; then
    find "$cgroot" -depth -type d | while read -r d; do
      echo 1 > "$d/cgroup.kill" 2>/dev/null || true
      for _ in $(seq 100); do rmdir "$d" 2>/dev/null && break; sleep 0.02; done
    done
  fi
  if [ -z "${WEFT_DEMO_KEEP_CONTROLLERS:-}" ]; then
    for c in $(cat "$cg2/cgroup.subtree_control"); do
      case " $before " in *" $c "*) ;; *) echo "-$c" > "$cg2/cgroup.subtree_control" 2>/dev/null || true ;; esac
    done
  fi
  if [ -n "${WEFT_DEMO_KEEP:-}" ]; then cp -r "$dev" "$WEFT_DEMO_KEEP"; fi
  rm -rf "$dev"
}
