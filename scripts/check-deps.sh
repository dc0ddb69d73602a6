#!/usr/bin/env bash
# Enforces the crate dependency rules (ARCHITECTURE.md, "Architecture invariants"):
#  - the client library (its core, the glibc and the bionic front-end) links only shmem,
#    proto and low-level crates (libc/nix); no tokio, no unwinder, no daemon,
#    nothing heavy, not even at build time; the glibc front-end alone adds
#    framehop (with gimli, arrayvec, fallible-iterator) for the stack-request
#    API's in-process walk, the only unwinding the client does;
#  - the daemon (and its model, report and inject crates) never links the
#    client (nor its core);
#  - the profile model and the reports never link tokio, nix's ptrace, or the
#    unwinder (nor the daemon's other crates);
#  - the custom allocator API crate (heapprofd-api) links libc and nothing
#    else: programs using it link no part of heapprofd-rs.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed_client='^(heapprofd-client|heapprofd-client-core|heapprofd-android|heapprofd-proto|heapprofd-shmem|libc|nix|bitflags|cfg-if|cfg_aliases)$'
# The glibc front-end's in-process walk (walkstack.rs, walktables.rs).
allowed_walk='^(framehop|gimli|arrayvec|fallible-iterator)$'
for crate in heapprofd-client heapprofd-client-core heapprofd-android; do
  deps=$(cargo tree -p "$crate" -e normal,build --prefix none --no-dedupe --offline 2>/dev/null \
         || cargo tree -p "$crate" -e normal,build --prefix none --no-dedupe)
  bad=$(echo "$deps" | awk '{print $1}' | sort -u | grep -Ev "$allowed_client" || true)
  if [ "$crate" = heapprofd-client ]; then
    bad=$(echo "$bad" | grep -Ev "$allowed_walk" || true)
  fi
  if [ -n "$bad" ]; then
    echo "check-deps: $crate must depend only on shmem, proto and libc/nix, but pulls in:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    exit 1
  fi
done

tree() { cargo tree -p "$1" -e normal,build --prefix none | awk '{print $1}' | sort -u; }

for crate in heapprofd-daemon heapprofd-inject heapprofd-model heapprofd-report heapprofd-unwinder; do
  if tree "$crate" | grep -qxE 'heapprofd-client(-core)?'; then
    echo "check-deps: $crate must never link heapprofd-client or heapprofd-client-core" >&2
    exit 1
  fi
done

banned_model='^(tokio|heapprofd-unwinder|framehop|heapprofd-inject|heapprofd-daemon|heapprofd-client|heapprofd-client-core)$'
for crate in heapprofd-model heapprofd-report; do
  bad=$(tree "$crate" | grep -E "$banned_model" || true)
  if [ -n "$bad" ]; then
    echo "check-deps: $crate (no async runtime, no ptrace, no unwinder) pulls in:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    exit 1
  fi
  if tree "$crate" | grep -qx nix \
     && cargo tree -p "$crate" -e features -i nix --prefix none | grep -q 'nix feature "ptrace"'; then
    echo "check-deps: $crate links nix with its ptrace feature" >&2
    exit 1
  fi
done
api_deps=$(tree heapprofd-api | grep -Ev '^(heapprofd-api|libc)$' || true)
if [ -n "$api_deps" ]; then
  echo "check-deps: heapprofd-api must depend on libc only, but pulls in:" >&2
  echo "$api_deps" | sed 's/^/  /' >&2
  exit 1
fi
echo "check-deps: dependency rules hold"
