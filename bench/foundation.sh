#!/usr/bin/env bash
# Foundation figures (docs/performance.md): install -> ready latency of the
# demo bundle and daemon memory with 10 bundles, on the release build.
# The full benchmark suite with side-by-side floors replaces this (issue 8).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/bundlevisor
DEMO=target/release/bundlevisor-demo
ROUNDS=${ROUNDS:-20}
[ -x "$BIN" ] && [ -x "$DEMO" ] || { echo "build first: make build" >&2; exit 2; }

work=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in $(seq 1 10); do
  mkdir -p "$work/b/d$i/server"
  sed "s/\"name\": \"demo\"/\"name\": \"d$i\"/" bundles/demo/manifest.json > "$work/b/d$i/manifest.json"
  cp "$DEMO" "$work/b/d$i/server/bundlevisor-demo"
done
printf 'state_dir = "state"\nsocket = "bv.sock"\n' > "$work/bundlevisor.toml"
"$BIN" daemon --config "$work/bundlevisor.toml" 2>"$work/daemon.log" &
daemon=$!
cli() { "$BIN" --socket "$work/bv.sock" "$@"; }
for _ in $(seq 1 200); do cli status >/dev/null 2>&1 && break; sleep 0.05; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$daemon/status"; }

now_us() { echo $(( $(date +%s%N) / 1000 )); }
stats() { sort -n | awk '{a[NR]=$1} END {printf "median %d us, min %d us, p90 %d us, max %d us (n=%d)\n", a[int((NR+1)/2)], a[1], a[int(NR*0.9+0.5)], a[NR], NR}'; }

idle=$(rss)
for _ in $(seq 1 "$ROUNDS"); do
  s=$(now_us); cli install "$work/b/d1" >/dev/null; e=$(now_us)
  echo $((e - s)); cli uninstall d1 >/dev/null
done > "$work/install.txt"
for _ in $(seq 1 200); do s=$(now_us); cli status >/dev/null; e=$(now_us); echo $((e - s)); done > "$work/status.txt"
for i in $(seq 1 10); do cli install "$work/b/d$i" >/dev/null; done
ten=$(rss)
bundles_kib=$(ps -o rss= -p "$(pgrep -d, -f "$work/b/")" | awk '{s+=$1} END {print s}')

echo "bundlevisor foundation figures ($(nproc) cores, $(date -u +%F))"
echo "install -> ready, demo bundle (CLI wall time incl. CLI start):  $(stats < "$work/install.txt")"
echo "status round trip (CLI wall time incl. CLI start):              $(stats < "$work/status.txt")"
echo "daemon RSS idle: ${idle} KiB; with 10 ready bundles: ${ten} KiB ($(( (ten - idle) / 10 )) KiB per bundle)"
echo "demo bundle processes: $((bundles_kib / 10)) KiB RSS each"
