#!/bin/bash
# Whole-program wall and CPU (user+sys) of sqlite3 :memory: (100k INSERTs,
# then an index), interleaved: bare, `record -i 1`, `record` (4 KiB),
# heaptrack. Usage: scripts/bench-sqlite-wall.sh ROUNDS (after cargo build
# --release); prints "name wall cpu" per run. /usr/bin/time: 10 ms resolution.
set -u
cd "$(dirname "$0")/.."
B="$PWD/target/release/heapprofd-rs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
SQL="$work/mem.sql"
cat > "$SQL" <<'SQL'
CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 100000)
INSERT INTO t(b, c) SELECT hex(randomblob(16)) || i, i * 1.5 FROM n;
CREATE INDEX tb ON t(b);
SELECT count(*) FROM t;
SQL
cd "$work"
t() { local name=$1; shift; /usr/bin/time -f "$name %e %U %S" -o t.out "$@" < $SQL > /dev/null 2>err.$name || { echo "$name FAILED"; cat err.$name; }; awk '{printf "%s %.3f %.3f\n", $1, $2, $3+$4}' t.out; }
for r in $(seq 1 "${1:-5}"); do
  t bare sqlite3 :memory:
  t i1 $B record -i 1 -o i1.pftrace -- sqlite3 :memory:
  t 4k $B record -o 4k.pftrace -- sqlite3 :memory:
  t heaptrack heaptrack -o ./ht sqlite3 :memory:
  rm -f ht*.zst ht*.gz
done
