#!/usr/bin/env bash
# The project's test suite again, with the dormant client installed
# system-wide (issue 13: "with the client installed system-wide and dormant,
# the machine keeps working: the project's test suite ... run with correct
# output"). test.sh runs it after its "tests" step; it runs alone too:
#
#   scripts/test-installed.sh [CARGO_TEST_ARGS...]
#   scripts/test-installed.sh --recover   (only undo a killed run's leftover)
#
# 1. `heapprofd-rs install` (target/release/heapprofd-rs: the client goes to
#    /usr/lib/heapprofd-rs/preload/ and into /etc/ld.so.preload), so every
#    process started from then on, each test binary and every program the
#    tests start, loads the client, dormant;
# 2. the test binaries the "tests" step built run again (nothing is
#    rebuilt: same profile, same flags): every crate's tests with
#    `cargo test --workspace --exclude heapprofd-tests CARGO_TEST_ARGS`, and
#    the end-to-end test binaries of tests/tests/ listed in E2E (all but the
#    ptrace-injection ones and system_install), but for the tests whose
#    subject is a process without the client (NO_CLIENT_TESTS; below, with
#    why, and why the other end-to-end binaries are not here);
# 3. `heapprofd-rs uninstall`, then /etc/ld.so.preload must be what it was
#    (bytes, mode, owner; or absent again) and the install's directories
#    gone. A trap runs this step on every exit: a failed test, Ctrl-C,
#    SIGTERM.
#
# Root only (CI runs as root on a disposable machine): otherwise it says it
# was skipped and exits 0. While it runs, every process started on the
# machine loads the client (dormant: one branch per allocation call).
#
# A run killed outright (SIGKILL, a machine image saved mid-run) cannot run
# its trap and leaves the client installed: every later test run on that
# machine (or its image) would load it. So a run keeps what the machine was
# like before it, and who it is, in $STATE (below) until it has restored
# it; the next run, or `scripts/test-installed.sh --recover` (test.sh calls
# it before its "tests" step), finds a $STATE whose run is gone, uninstalls
# that leftover and checks the machine is as before. An install that no run
# of this script made is never touched: the run stops and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0

if [ "$(id -u)" != 0 ]; then
  echo "installed-suite: skipped (needs root: it changes /etc/ld.so.preload)"
  exit 0
fi

BIN=$PWD/target/release/heapprofd-rs
PRELOAD=/etc/ld.so.preload
INSTALL_STATE=/var/lib/heapprofd-rs/install.json
# Survives a reboot and /tmp cleaning: the before-state of a run not yet
# restored.
STATE=/var/tmp/heapprofd-rs-installed-suite
if [ ! -x "$BIN" ]; then
  echo "installed-suite: $BIN is missing; run cargo build --release --workspace first" >&2
  exit 1
fi

# Who a run is: pid, the pid's start time (another process may get the pid
# later) and the boot (pids restart at each one). Nothing for a pid that is
# gone or dead (a zombie, not yet reaped).
identity() {
  local pid=$1 stat
  stat=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || return 1
  case "${stat%% *}" in Z | X | x) return 1 ;; esac
  echo "$pid $(echo "$stat" | cut -d' ' -f20) $(cat /proc/sys/kernel/random/boot_id)"
}

# Whether /etc/ld.so.preload, the install's directories and the install
# state are what $1 (a before-state directory) says they were. Prints what
# differs.
as_before() {
  local dir=$1 rc=0
  if [ -e "$dir/preload" ]; then
    if ! cmp -s "$dir/preload" "$PRELOAD" \
      || [ "$(stat -c '%a %u %g' "$PRELOAD")" != "$(cat "$dir/meta")" ]; then
      echo "installed-suite: $PRELOAD is not what it was before the install" >&2
      rc=1
    fi
  elif [ -e "$PRELOAD" ]; then
    echo "installed-suite: $PRELOAD was absent before the install and is still there" >&2
    rc=1
  fi
  local dirs_after
  dirs_after=$(ls -d /usr/lib/heapprofd-rs /var/lib/heapprofd-rs 2>/dev/null || true)
  if [ "$dirs_after" != "$(cat "$dir/dirs")" ]; then
    echo "installed-suite: left behind: $dirs_after" >&2
    rc=1
  fi
  return "$rc"
}

# A $STATE whose run is gone: that run's install is still there (or half
# undone); uninstall it and check the machine is as before that run.
recover() {
  [ -d "$STATE" ] || return 0
  local owner
  owner=$(cat "$STATE/owner" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$(identity "${owner%% *}" || true)" = "$owner" ]; then
    echo "installed-suite: another run (pid ${owner%% *}) has the client installed now; wait for it to end" >&2
    return 1
  fi
  echo "installed-suite: a run that ended without restoring the machine (${owner:-unknown}) left $STATE; undoing its install"
  if [ -e "$INSTALL_STATE" ]; then
    "$BIN" uninstall || return 1
  fi
  if ! as_before "$STATE"; then
    echo "installed-suite: could not restore what $STATE records; see $STATE and fix the machine by hand" >&2
    return 1
  fi
  rm -rf "$STATE"
  echo "installed-suite: recovered; $PRELOAD is as before that run"
}

recover
if [ "${1:-}" = --recover ]; then
  exit 0
fi
if [ -e "$INSTALL_STATE" ]; then
  echo "installed-suite: heapprofd-rs is installed on this machine ($INSTALL_STATE), not by this script; run \`heapprofd-rs uninstall\` first" >&2
  exit 1
fi

# Tests whose subject is a process without the client (with it installed,
# every test binary and program has it loaded):
NO_CLIENT_TESTS=(
  without_the_client_everything_is_a_no_op  # api: no client to find
  without_the_client_contexts_are_none      # api: the same, for contexts
  without_the_client_every_call_is_a_no_op  # api: the same, for stack requests
  without_the_client_nothing_is_called      # api: the same, for the in-process walk
  glibc_is_the_original_in_the_test_binary  # client: the installed copy interposes first
  a_dynamically_linked_child_is_probed      # inject: asserts the child has no client
  works_when_dlopened_after_start           # client_e2e: a client dlopened into a process
                                            # without one (installed, it is a second copy)
  without_the_client_the_header_is_a_no_op  # stack_walk: asserts no client answers
  binary_without_its_client_names_where_it_looked
                                            # install_layout: a heapprofd-rs without its
                                            # client; installed, record uses the installed one
)
# The end-to-end test binaries of tests/tests/ run here: all but those whose
# subject is loading the client with ptrace into programs that have none:
# attach_e2e, attach_kill (record --pid's hijack), service_inject and
# service_users_pid (the service's; their targets sit in read(2) until told
# to allocate and the tests wait for the session first, while a dormant
# installed client, woken by the signal instead, connects at its next
# allocation); and system_install, which installs and uninstalls the real
# system itself. Measured in a private mount namespace with the client in
# /etc/ld.so.preload (2026-12-03, 2 cores shared with other builds, load
# about 6, debug test binaries): these binaries took 238 s in all, the
# longest stack_walk 63 s, client_e2e 19 s, corpus 18 s, record_analysis
# 16 s; the rest 2-14 s each.
E2E=(
  aarch64_e2e android_adb bionic_e2e client_e2e contexts corpus cpu_time
  custom_heaps heapprofd_layout hostile_peers install_layout preload_order
  record_analysis record_churn record_e2e record_truth report_views
  service_e2e service_multi service_record service_scale service_users
  stack_walk symbolize_debug_files symbolize_offline symbolize_perfetto
  unprofiled_e2e
)

# What the machine is like now, and who is about to change it: written
# before the install, removed once the machine is as before again.
mkdir "$STATE"
identity $$ > "$STATE/owner"
# /etc/ld.so.preload: bytes, and mode and owner.
if [ -e "$PRELOAD" ]; then
  cp -p "$PRELOAD" "$STATE/preload"
  stat -c '%a %u %g' "$PRELOAD" > "$STATE/meta"
fi
ls -d /usr/lib/heapprofd-rs /var/lib/heapprofd-rs 2>/dev/null > "$STATE/dirs" || true

# Runs on every exit: uninstall, then check that nothing is left.
restore() {
  local rc=$?
  trap - EXIT INT TERM
  echo "installed-suite: uninstalling"
  "$BIN" uninstall || rc=1
  if as_before "$STATE"; then
    rm -rf "$STATE"
  else
    rc=1
  fi
  [ "$rc" = 0 ] && echo "installed-suite: uninstalled; $PRELOAD is as before"
  exit "$rc"
}
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" install
skip=()
for t in "${NO_CLIENT_TESTS[@]}"; do skip+=(--skip "$t"); done
e2e=()
for t in "${E2E[@]}"; do e2e+=(--test "$t"); done
start=$(date +%s)
cargo test --workspace --exclude heapprofd-tests "$@" -- "${skip[@]}"
cargo test -p heapprofd-tests --lib --bins "${e2e[@]}" "$@" -- "${skip[@]}"
echo "installed-suite: the suite passed with the client installed ($(( $(date +%s) - start )) s)"
