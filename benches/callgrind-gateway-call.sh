#!/usr/bin/env bash
# Instructions the daemon spends per gateway tool call (`make
# bench-callgrind`, issue 31): an agent on `bundlevisor mcp` (its stdio
# handed over to the daemon) calls `demo__echo`; the daemon runs under
# callgrind, instrumentation switched on after a warm-up, counters zeroed,
# N calls, dumped: instructions / N. The daemon's whole part of a call:
# the MCP session, the gateway's routing, the API, the bundle's session.
#
# As for host reads (callgrind-host-read.sh): `landlock = "off"` and no
# rlimits, which callgrind cannot follow and which are not on the path.
set -euo pipefail
cd "$(dirname "$0")/.."
BV=${BV:-target/release/bundlevisor}
DEMO=${DEMO:-target/release/bundlevisor-demo}
N=${CALLGRIND_CALLS:-1000}
OUT=${CALLGRIND_OUT:-target/bench/callgrind-gateway.json}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

work=$(mktemp -d /tmp/bv-callgrind-gw.XXXXXX)
chmod 1777 "$work"
cleanup() {
  [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export BUNDLEVISOR_SOCKET=$work/bv.sock
cat >"$work/bv.toml" <<TOML
state_dir = "state"
socket = "bv.sock"
[sandbox]
landlock = "off"
max_open_files = 0
TOML
mkdir -p "$work/demo/server"
cp "$DEMO" "$work/demo/server/"
cp bundles/demo/manifest.json "$work/demo/"
chmod -R a+rX "$work/demo"
(cd "$work" && exec valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/daemon.%p.out" "$OLDPWD/$BV" daemon --config bv.toml \
  >"$work/daemon.log" 2>&1) &
daemon=$!
for _ in $(seq 300); do "$BV" status >/dev/null 2>&1 && break; sleep 0.1; done
"$BV" install "$work/demo" >/dev/null

python3 - "$BV" "$daemon" "$N" <<'PY'
import json, subprocess, sys
bv, daemon, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
agent = subprocess.Popen([bv, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def ask(i, method, params):
    agent.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
    agent.stdin.flush()
    while True:
        line = json.loads(agent.stdout.readline())
        if line.get("id") == i:
            if "error" in line:
                sys.exit(f"{method}: {line['error']}")
            return line["result"]
ask(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                      "clientInfo": {"name": "callgrind", "version": "1"}})
agent.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
ask(1, "tools/list", {})
call = lambda i: ask(i, "tools/call", {"name": "demo__echo", "arguments": {"text": "hi"}})
for i in range(300):
    call(10 + i)
subprocess.run(["callgrind_control", "-i", "on", daemon], capture_output=True)
for i in range(100):
    call(1000 + i)
subprocess.run(["callgrind_control", "-z", daemon], capture_output=True)
for i in range(n):
    assert call(10000 + i)["content"][0]["text"].endswith("hi")
subprocess.run(["callgrind_control", "-d", daemon], capture_output=True)
agent.stdin.close()
agent.wait()
PY
total=$(grep -h '^totals:' "$work"/daemon.*.out.* | awk '{s += $2} END {print s}')
per=$(( total / N ))
printf '%-52s %12s\n' "instructions per gateway tool call (daemon)" "(callgrind)"
printf '%-52s %12d\n' "  MCP session, routing, API, the bundle's session" "$per"
mkdir -p "$(dirname "$OUT")"
printf '{"calls": %d, "daemon": %d}\n' "$N" "$per" >"$OUT"
