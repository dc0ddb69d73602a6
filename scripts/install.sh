#!/usr/bin/env bash
# Builds heapprofd-rs and installs it under a prefix (default /usr/local):
#   PREFIX/bin/heapprofd-rs
#   PREFIX/lib/heapprofd-rs/libheapprofd_client.so   (found by heapprofd-rs)
# Usage: scripts/install.sh [PREFIX]      (uninstall: scripts/install.sh --uninstall [PREFIX])
# Set NO_BUILD=1 to install what target/release (or $CARGO_TARGET_DIR/release) already holds.
set -euo pipefail
cd "$(dirname "$0")/.."

uninstall=0
if [ "${1:-}" = "--uninstall" ]; then uninstall=1; shift; fi
if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
prefix="${1:-/usr/local}"
bin="$prefix/bin/heapprofd-rs"
lib="$prefix/lib/heapprofd-rs/libheapprofd_client.so"

if [ "$uninstall" = 1 ]; then
  rm -f "$bin" "$lib"
  rmdir "$prefix/lib/heapprofd-rs" 2>/dev/null || true
  echo "install: removed $bin and $lib"
  exit 0
fi

if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -p heapprofd-daemon -p heapprofd-client
fi
rel="${CARGO_TARGET_DIR:-target}/release"
for f in "$rel/heapprofd-rs" "$rel/libheapprofd_client.so"; do
  [ -f "$f" ] || { echo "install: $f is missing; run cargo build --release first" >&2; exit 1; }
done
install -D -m 0755 "$rel/heapprofd-rs" "$bin"
install -D -m 0644 "$rel/libheapprofd_client.so" "$lib"
echo "install: $bin"
echo "install: $lib"
