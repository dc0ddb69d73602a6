#!/usr/bin/env bash
# Enforces the crate dependency rules (ARCHITECTURE.md, "Architecture invariants"):
#  - the client library links only shmem, proto and low-level crates (libc/nix);
#    no tokio, no unwinder, no daemon, nothing heavy, not even at build time;
#  - the daemon never links the client.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed_client='^(heapprofd-client|heapprofd-proto|heapprofd-shmem|libc|nix|bitflags|cfg-if|cfg_aliases)$'
deps=$(cargo tree -p heapprofd-client -e normal,build --prefix none --no-dedupe --offline 2>/dev/null \
       || cargo tree -p heapprofd-client -e normal,build --prefix none --no-dedupe)
bad=$(echo "$deps" | awk '{print $1}' | sort -u | grep -Ev "$allowed_client" || true)
if [ -n "$bad" ]; then
  echo "check-deps: heapprofd-client must depend only on shmem, proto and libc/nix, but pulls in:" >&2
  echo "$bad" | sed 's/^/  /' >&2
  exit 1
fi

for crate in heapprofd-daemon heapprofd-unwinder; do
  if cargo tree -p "$crate" -e normal,build --prefix none | awk '{print $1}' | grep -qx heapprofd-client; then
    echo "check-deps: $crate must never link heapprofd-client" >&2
    exit 1
  fi
done
echo "check-deps: dependency rules hold"
