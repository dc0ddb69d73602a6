#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "dependencies"
scripts/install-deps.sh

step "format"
cargo fmt --all --check

step "lint"
cargo clippy --workspace --all-targets -- -D warnings

step "crate dependency rules"
scripts/check-deps.sh

step "layout rules (module docs, file length, no too_many_arguments, no import circles)"
python3 scripts/check-layout.py

step "release build (the end-to-end tests run these binaries)"
cargo build --release --workspace

step "tests"
cargo test --workspace

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
