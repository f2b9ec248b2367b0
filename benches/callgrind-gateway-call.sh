#!/usr/bin/env bash
# Instructions the daemon spends per gateway tool call (`make
# bench-callgrind`, issue 31): an agent on `bundlevisor mcp` (its stdio
# handed over to the daemon) calls `demo__echo`; the daemon runs under
# callgrind, instrumentation switched on after a warm-up, counters zeroed,
# N calls, dumped: instructions / N. The daemon's whole part of a call:
# the MCP session, the gateway's routing, the API, the bundle's session.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${CALLGRIND_CALLS:-1000}
OUT=${CALLGRIND_OUT:-target/bench/callgrind-gateway.json}
. benches/callgrind-common.sh
mkdir -p "$work/demo/server"
cp "$DEMO" "$work/demo/server/"
cp bundles/demo/manifest.json "$work/demo/"
chmod -R a+rX "$work/demo"
start_daemon
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
total=$(totals "$work"/daemon.*.out.*)
per=$(( total / N ))
printf '%-52s %12s\n' "instructions per gateway tool call (daemon)" "(callgrind)"
printf '%-52s %12d\n' "  MCP session, routing, API, the bundle's session" "$per"
mkdir -p "$(dirname "$OUT")"
printf '{"calls": %d, "daemon": %d}\n' "$N" "$per" >"$OUT"
