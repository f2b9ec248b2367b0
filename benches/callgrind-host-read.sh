#!/usr/bin/env bash
# Instructions per host-resources read (`make bench-callgrind`, issue 22): a
# figure that does not move with the machine's noise, for each of the three
# programs on the path, and for the pipe-echo floor's answering peer.
#
# - daemon: `bundlevisor daemon` under callgrind, instrumentation switched on
#   after a warm-up, counters zeroed, N reads, dumped: instructions / N.
# - bundle: the demo bundle under callgrind (its manifest's command wrapped);
#   two runs of N1 and N2 reads, the difference / (N2 - N1) (start-up and
#   the MCP handshake cancel out).
# - floor: the bench's pipe-echo peer, the same two-run difference.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${SUITE:-$(ls -t target/release/deps/suite-* | grep -v '\.d$' | head -1)}
N=${CALLGRIND_READS:-2000}
. benches/callgrind-common.sh
for b in demo vg; do
  mkdir -p "$work/$b/server"
  cp "$DEMO" "$work/$b/server/"
  chmod -R a+rX "$work/$b"
done
cp bundles/demo/manifest.json "$work/demo/"
python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
m = json.load(open(f"{work}/demo/manifest.json"))
m["name"] = "vg"
cfg = m["server"]["mcp_config"]
cfg["args"] = ["--tool=callgrind", f"--callgrind-out-file={work}/bundle.%p.out",
               cfg["command"]] + cfg["args"]
cfg["command"] = "/usr/bin/valgrind"
json.dump(m, open(f"{work}/vg/manifest.json", "w"))
EOF
start_daemon "$(printf '[host_resources]\nrate_per_sec = 1000000\nburst = 1000000')"
"$BV" install "$work/demo" >/dev/null
head -c 4096 /dev/zero | tr '\0' a >"$work/small.txt"
uri="files://$("$BV" files put "$work/small.txt")"
reads() { "$BV" call --timeout 600s "$1" host_bench "{\"uri\":\"$uri\",\"count\":$2}" >/dev/null; }

# The daemon.
vgpid=$daemon
callgrind_control -i on "$vgpid" >/dev/null 2>&1
reads demo 300
callgrind_control -z "$vgpid" >/dev/null 2>&1
reads demo "$N"
callgrind_control -d "$vgpid" >/dev/null 2>&1
daemon_per=$(( $(totals "$work"/daemon.*.out.*) / N ))

# The bundle: two runs.
bundle_run() {
  rm -f "$work"/bundle.*.out
  "$BV" install "$work/vg" >/dev/null
  reads vg "$1"
  "$BV" uninstall vg >/dev/null
  for _ in $(seq 100); do [ -s "$(ls "$work"/bundle.*.out 2>/dev/null | head -1)" ] && break; sleep 0.1; done
  totals "$work"/bundle.*.out
}
small=$(bundle_run 500)
large=$(bundle_run $((500 + N)))
bundle_per=$(( (large - small) / N ))

# The floor's peer: the same answer, two runs.
"$BV" call demo host_read "{\"uri\":\"$uri\"}" >"$work/reply.json"
floor_run() {
  python3 -c "
import json
for i in range($1): print(json.dumps({'jsonrpc': '2.0', 'id': i, 'method': 'ai.nimblebrain/resources/read', 'params': {'uri': '$uri'}}))" \
    | BV_BENCH_ROLE=pipe-echo BV_BENCH_REPLY="$work/reply.json" \
      valgrind --tool=callgrind --callgrind-out-file="$work/floor.out" "$SUITE" >/dev/null 2>&1
  totals "$work/floor.out"
}
small=$(floor_run 500)
large=$(floor_run $((500 + N)))
floor_per=$(( (large - small) / N ))

printf '%-52s %12s\n' "instructions per 4 KiB host-resources read" "(callgrind)"
printf '%-52s %12d\n' "  daemon (transport, WorkspaceActor, FileStore)" "$daemon_per"
printf '%-52s %12d\n' "  demo bundle (rmcp server's request and answer)" "$bundle_per"
printf '%-52s %12d\n' "  floor: pipe-echo peer (parse, serialize, write)" "$floor_per"
mkdir -p target/bench
printf '{"reads": %d, "daemon": %d, "bundle": %d, "floor_peer": %d}\n' \
  "$N" "$daemon_per" "$bundle_per" "$floor_per" >target/bench/callgrind.json
