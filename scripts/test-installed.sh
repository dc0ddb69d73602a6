#!/usr/bin/env bash
# The project's test suite again, with the dormant client installed
# system-wide (issue 13: "with the client installed system-wide and dormant,
# the machine keeps working: the project's test suite ... run with correct
# output"). test.sh runs it after its "tests" step; it runs alone too:
#
#   scripts/test-installed.sh [CARGO_TEST_ARGS...]
#
# 1. `heapprofd-rs install` (target/release/heapprofd-rs: the client goes to
#    /usr/lib/heapprofd-rs/preload/ and into /etc/ld.so.preload), so every
#    process started from then on, each test binary and every program the
#    tests start, loads the client, dormant;
# 2. `cargo test --workspace CARGO_TEST_ARGS` reruns the test binaries the
#    "tests" step built (nothing is rebuilt: same profile, same flags),
#    skipping the few tests whose subject is a process without the client
#    (SKIPPED below, each with why);
# 3. `heapprofd-rs uninstall`, then /etc/ld.so.preload must be what it was
#    (bytes, mode, owner; or absent again) and the install's directories
#    gone. A trap runs this step on every exit: a failed test, Ctrl-C,
#    SIGTERM.
#
# Root only (CI runs as root on a disposable machine): otherwise it says it
# was skipped and exits 0. While it runs, every process started on the
# machine loads the client (dormant: one branch per allocation call).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0

if [ "$(id -u)" != 0 ]; then
  echo "installed-suite: skipped (needs root: it changes /etc/ld.so.preload)"
  exit 0
fi

BIN=$PWD/target/release/heapprofd-rs
PRELOAD=/etc/ld.so.preload
if [ ! -x "$BIN" ]; then
  echo "installed-suite: $BIN is missing; run cargo build --release --workspace first" >&2
  exit 1
fi
if [ -e /var/lib/heapprofd-rs/install.json ]; then
  echo "installed-suite: heapprofd-rs is already installed on this machine; uninstall it first" >&2
  exit 1
fi

# Tests whose subject is a process without the client, or the install
# itself (a test that matches one of these substrings is not run):
SKIPPED=(
  # installs and uninstalls the real system itself (and would take ours for
  # the stale install of a crashed run)
  system_wide_install_keeps_the_machine_working
)

before=$(mktemp -d /tmp/heapprofd-installed-suite.XXXXXX)
# What /etc/ld.so.preload is now: bytes, and mode and owner.
if [ -e "$PRELOAD" ]; then
  cp -p "$PRELOAD" "$before/preload"
  stat -c '%a %u %g' "$PRELOAD" > "$before/meta"
fi
dirs_before=$(ls -d /usr/lib/heapprofd-rs /var/lib/heapprofd-rs 2>/dev/null || true)

# Runs on every exit: uninstall, then check that nothing is left.
restore() {
  local rc=$?
  trap - EXIT INT TERM
  echo "installed-suite: uninstalling"
  "$BIN" uninstall || rc=1
  if [ -e "$before/preload" ]; then
    if ! cmp -s "$before/preload" "$PRELOAD" \
      || [ "$(stat -c '%a %u %g' "$PRELOAD")" != "$(cat "$before/meta")" ]; then
      echo "installed-suite: $PRELOAD is not what it was before the install" >&2
      rc=1
    fi
  elif [ -e "$PRELOAD" ]; then
    echo "installed-suite: $PRELOAD was absent before the install and is still there" >&2
    rc=1
  fi
  local dirs_after
  dirs_after=$(ls -d /usr/lib/heapprofd-rs /var/lib/heapprofd-rs 2>/dev/null || true)
  if [ "$dirs_after" != "$dirs_before" ]; then
    echo "installed-suite: left behind: $dirs_after" >&2
    rc=1
  fi
  rm -rf "$before"
  [ "$rc" = 0 ] && echo "installed-suite: uninstalled; $PRELOAD is as before"
  exit "$rc"
}
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" install
skip=()
for t in "${SKIPPED[@]}"; do skip+=(--skip "$t"); done
start=$(date +%s)
cargo test --workspace "$@" -- "${skip[@]}"
echo "installed-suite: the suite passed with the client installed ($(( $(date +%s) - start )) s)"
