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
mkdir -p "$work/watched" "$work/staging"
# stable_after and max_restarts: every measured crash is a *first* restart.
printf 'state_dir = "state"\nsocket = "bv.sock"\n[[watch]]\ndir = "watched"\n[supervision]\nstable_after = "1ms"\nmax_restarts = 100000\n[host_resources]\nrate_per_sec = 1000000\nburst = 1000000\n' > "$work/bundlevisor.toml"
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

# Crash -> ready and manifest landing -> ready, from the daemon's own event
# timestamps (events --json), so CLI start-up is not counted.
"$BIN" --socket "$work/bv.sock" events --json > "$work/events.jsonl" &
events_pid=$!
sleep 0.3
state_of() { cli status --json | python3 -c "import json,sys; b=[x for x in json.load(sys.stdin)['bundles'] if x['name']=='$1']; print(b[0]['state'] if b else 'absent')"; }
for _ in $(seq 1 "$ROUNDS"); do
  cli call d2 crash >/dev/null 2>&1 || true
  for _ in $(seq 1 200); do [ "$(state_of d2)" = ready ] && break; sleep 0.02; done
done
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$work/staging/w$r"; cp -r "$work/b/d1" "$work/staging/w$r"
  sed -i "s/\"name\": \"d1\"/\"name\": \"w$r\"/" "$work/staging/w$r/manifest.json"
  echo "landed w$r $(( $(date +%s%N) / 1000000 ))" >> "$work/landed.txt"
  mv "$work/staging/w$r" "$work/watched/w$r"
  for _ in $(seq 1 200); do [ "$(state_of "w$r")" = ready ] && break; sleep 0.02; done
  rm -rf "$work/watched/w$r"
  for _ in $(seq 1 200); do [ "$(state_of "w$r")" = absent ] && break; sleep 0.02; done
done
kill "$events_pid" 2>/dev/null || true
python3 - "$work" <<'PY' > "$work/times.txt"
import json, sys
work = sys.argv[1]
events = [json.loads(l) for l in open(f"{work}/events.jsonl") if l.strip()]
crash, pending = [], None
for e in events:
    if e["name"] != "d2":
        continue
    if e["kind"] == "exited":
        pending = e["time_ms"]
    elif e["kind"] == "ready" and pending is not None:
        crash.append(e["time_ms"] - pending)
        pending = None
landed = {l.split()[1]: int(l.split()[2]) for l in open(f"{work}/landed.txt")}
land = [e["time_ms"] - landed[e["name"]] for e in events if e["kind"] == "ready" and e["name"] in landed]
def stats(xs):
    xs = sorted(xs)
    return f"median {xs[len(xs)//2]} ms, min {xs[0]} ms, max {xs[-1]} ms (n={len(xs)})" if xs else "no samples"
print("crash " + stats(crash))
print("land " + stats(land))
PY
bundles_kib=$(ps -o rss= -p "$(pgrep -d, -f "$work/b/")" | awk '{s+=$1} END {print s}')

# Host-resources reads from one bundle, inside the bundle (no CLI in the loop).
head -c 4096 /dev/zero | tr '\0' a > "$work/4k.txt"
head -c 10485760 /dev/urandom > "$work/10m.bin"
id4=$(cli files put "$work/4k.txt")
id10=$(cli files put "$work/10m.bin")
hwm() { awk '/VmHWM/ {print $2}' "/proc/$daemon/status"; }
reads4=$(cli call d3 host_bench "{\"uri\":\"files://$id4\",\"count\":5000}")
hwm_before=$(hwm)
reads10=$(cli call d3 host_bench "{\"uri\":\"files://$id10\",\"count\":20}")
hwm_after=$(hwm)

echo "bundlevisor foundation figures ($(nproc) cores, $(date -u +%F))"
echo "install -> ready, demo bundle (CLI wall time incl. CLI start):  $(stats < "$work/install.txt")"
echo "status round trip (CLI wall time incl. CLI start):              $(stats < "$work/status.txt")"
echo "daemon RSS idle: ${idle} KiB; with 10 ready bundles: ${ten} KiB ($(( (ten - idle) / 10 )) KiB per bundle)"
echo "demo bundle processes: $((bundles_kib / 10)) KiB RSS each"
echo "host-resources reads, one bundle, 4 KiB text file:  $reads4"
echo "host-resources reads, one bundle, 10 MiB binary file: $reads10"
echo "daemon peak RSS (VmHWM) before the 10 MiB reads: ${hwm_before} KiB; after: ${hwm_after} KiB"
echo "bundle killed -> ready again (first restart, daemon event times): $(sed -n 's/^crash //p' "$work/times.txt")"
echo "manifest renamed into a watched folder -> ready (200 ms debounce):  $(sed -n 's/^land //p' "$work/times.txt")"
