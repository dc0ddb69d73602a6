#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
set -euo pipefail
cd "$(dirname "$0")/.."

# Incremental caches double the size of target/ and a clean CI clone never
# reuses them; CI machines have run out of disk with them on.
export CARGO_INCREMENTAL=0

# Each step names itself and the free disk space, so a CI log that ends in
# "No space left on device" shows which step used it up.
step() { printf '\n=== %s (disk free: %s)\n' "$*" "$(df -h --output=avail . | tail -1 | tr -d ' ')"; }

# A hung test must fail its step, not use up CI's 90 minutes with nothing
# landing: each test step runs under a limit well above its usual time, and
# on expiry the log says which step and how to rerun it.
bounded() {
  local minutes=$1
  shift
  local rc=0
  timeout --kill-after=30 "$((minutes * 60))" "$@" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "step timed out after $minutes minutes (a test hung; the last test named above as 'running for over 60 seconds' is the one): $*" >&2
  fi
  return "$rc"
}

step "dependencies"
scripts/install-deps.sh

step "format"
cargo fmt --all --check

step "lint"
cargo clippy --workspace --all-targets -- -D warnings

step "crate dependency rules"
scripts/check-deps.sh

step "layout rules (module docs, file length, no too_many_arguments, no import circles)"
python3 scripts/check-layout.py --self-test && python3 scripts/check-layout.py

step "benchmark scripts' self-checks (the interval they print, bench-sample-cost's classes)"
python3 scripts/bench_stats.py
python3 scripts/bench-sample-cost.py --self-test

step "release build (the end-to-end tests run these binaries)"
cargo build --release --workspace

step "aarch64: lint, and the client and daemon built for the end-to-end tests under qemu"
cargo clippy --target aarch64-unknown-linux-gnu --workspace --all-targets -- -D warnings
# The client for aarch64_e2e; with the daemon, the build `heapprofd-rs
# android` pushes to an arm64-v8a device (android_adb's device under qemu).
cargo build --release --target aarch64-unknown-linux-gnu -p heapprofd-client -p heapprofd-daemon

# What ships to an Android device, type-checked for both Android ABIs (no
# NDK linker here, so no link).
step "android: cargo check of everything that ships to a device, for both Android ABIs"
# The client (both front-ends), the heapprofd-rs binary (daemon, unwinder,
# record --pid injection: its ptrace requests are raw on Android, where nix
# and the libc crate lack them), shmem, proto and the API crate.
for t in aarch64-linux-android x86_64-linux-android; do
  cargo check --target "$t" -p heapprofd-shmem -p heapprofd-proto -p heapprofd-api \
    -p heapprofd-client-core -p heapprofd-client -p heapprofd-android -p heapprofd-unwinder \
    -p heapprofd-daemon -p heapprofd-inject
done

# A run of test-installed.sh killed before its trap (SIGKILL, a machine
# image saved mid-run) leaves the client in /etc/ld.so.preload, and every
# test binary would load it: undo such a leftover first (root only). Any
# other system-wide install stops the run here, named.
step "leftovers of an interrupted installed-suite run"
scripts/test-installed.sh --recover
if [ -e /var/lib/heapprofd-rs/install.json ]; then
  echo "heapprofd-rs is installed system-wide on this machine (/var/lib/heapprofd-rs/install.json): the tests need a machine without it; run \`heapprofd-rs uninstall\` first" >&2
  exit 1
fi

step "tests"
bounded 30 cargo test --workspace

# The same test binaries again (no rebuild) with the dormant client in
# every process through /etc/ld.so.preload; a trap uninstalls on every exit
# and checks the file is restored exactly. Root only, else skipped.
step "tests again with the client installed system-wide (scripts/test-installed.sh)"
bounded 25 scripts/test-installed.sh

# Unit and integration tests of what runs in a profiled process (and the
# unwinder), built for aarch64 and run by qemu-user (.cargo/config.toml).
# The two ring stress tests with 8 writer threads in a child process are
# left out: emulated, their writers outlast the ring's spinlock timeout.
step "aarch64 tests under qemu-user"
HEAPPROFD_TEST_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu" \
  bounded 20 cargo test --target aarch64-unknown-linux-gnu -p heapprofd-shmem -p heapprofd-proto \
  -p heapprofd-client-core -p heapprofd-client -p heapprofd-unwinder \
  -- --skip stress_many_writers_in_child_process

# The fuzz build needs ~1 GB more. On a small disk (a CI machine has run out),
# drop the test build first: nothing after this step uses it.
if [ "$(df --output=avail -k . | tail -1)" -lt $((8 * 1024 * 1024)) ]; then
  echo "less than 8 GiB free: removing the test builds before the fuzz build"
  rm -rf target/debug target/aarch64-unknown-linux-gnu/debug
fi

step "fuzz targets build and survive their seed corpus"
(
  cd fuzz
  cargo fuzz build -s none
  for t in $(cargo fuzz list); do
    cargo fuzz run -s none "$t" "corpus/$t" -- -runs=200000 >/dev/null 2>&1 \
      || { echo "fuzz target $t failed; rerun: (cd fuzz && cargo fuzz run -s none $t corpus/$t)" >&2; exit 1; }
    echo "fuzz $t: 200000 runs ok"
  done
)

step "all tests passed"
