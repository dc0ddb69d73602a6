#!/usr/bin/env bash
# Installs what the test suite needs, skipping what is already there.
# Debian packages: compilers and debuggers the end-to-end tests drive, glibc's
# debug symbols (libc frames must be named), heaptrack (reference totals),
# nodejs (a target of the attach tests); for the corpus (tests/tests/corpus.rs):
# python3, perl, sqlite3 and git as Debian ships them, and the allocators
# jemalloc, tcmalloc (gperftools) and mimalloc with their development files
# (the C++ test program is also linked with -ljemalloc, -ltcmalloc_minimal,
# -lmimalloc); chromium (the HTML report's test loads the page in headless
# Chromium); for aarch64 (tests/tests/aarch64_e2e.rs and the cross-built unit
# tests): the cross compilers and libc, qemu-user-static to run the programs,
# lld (GNU ld refuses the client's two version scripts) and Rust's
# aarch64-unknown-linux-gnu target; the Android targets (type-checked only).
# Python: the official Perfetto trace schema. Cargo: cargo-fuzz.
set -euo pipefail

need_apt=()
for pkg in gcc g++ gdb binutils xz-utils dwz libc6-dbg heaptrack python3-pip nodejs \
  python3 perl sqlite3 git libjemalloc2 libjemalloc-dev libtcmalloc-minimal4 \
  libgoogle-perftools-dev libmimalloc2.0 libmimalloc-dev chromium \
  gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static lld; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages: ${need_apt[*]} (run as root, or: sudo apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
  apt-get clean # the downloaded .deb files are not needed again (CI disks are small)
fi

if ! python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' >/dev/null 2>&1; then
  echo "install-deps: pip install perfetto"
  python3 -m pip install -q perfetto 2>&1 | grep -v "WARNING: Running pip as the 'root' user" || true
  python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2'
fi

for t in aarch64-unknown-linux-gnu aarch64-linux-android x86_64-linux-android; do
  if ! rustup target list --installed | grep -qx "$t"; then
    echo "install-deps: rustup target add $t"
    rustup target add "$t"
  fi
done

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: cargo install cargo-fuzz"
  cargo install -q cargo-fuzz --locked
fi
