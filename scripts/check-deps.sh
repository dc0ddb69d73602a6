#!/usr/bin/env bash
# Enforces the crate dependency rules (ARCHITECTURE.md, "Architecture invariants"):
#  - the client library (its core and the glibc front-end) links only shmem,
#    proto and low-level crates (libc/nix); no tokio, no unwinder, no daemon,
#    nothing heavy, not even at build time;
#  - the daemon never links the client (nor its core).
set -euo pipefail
cd "$(dirname "$0")/.."

allowed_client='^(heapprofd-client|heapprofd-client-core|heapprofd-proto|heapprofd-shmem|libc|nix|bitflags|cfg-if|cfg_aliases)$'
for crate in heapprofd-client heapprofd-client-core; do
  deps=$(cargo tree -p "$crate" -e normal,build --prefix none --no-dedupe --offline 2>/dev/null \
         || cargo tree -p "$crate" -e normal,build --prefix none --no-dedupe)
  bad=$(echo "$deps" | awk '{print $1}' | sort -u | grep -Ev "$allowed_client" || true)
  if [ -n "$bad" ]; then
    echo "check-deps: $crate must depend only on shmem, proto and libc/nix, but pulls in:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    exit 1
  fi
done

for crate in heapprofd-daemon heapprofd-unwinder; do
  if cargo tree -p "$crate" -e normal,build --prefix none | awk '{print $1}' | grep -qxE 'heapprofd-client(-core)?'; then
    echo "check-deps: $crate must never link heapprofd-client or heapprofd-client-core" >&2
    exit 1
  fi
done
echo "check-deps: dependency rules hold"
