#!/usr/bin/env bash
# Instructions the daemon spends per tool call through its HTTP gateway
# (`make bench-callgrind`, issue 37): an agent on one keep-alive HTTP/1.1
# connection calls `demo__echo` at `/mcp/default`, on a 2025-11-25 session
# (`Mcp-Session-Id`) and as 2026-07-28 stateless requests (the version,
# capabilities and client info in each request's `_meta`, `Mcp-Method` and
# `Mcp-Name` headers). The daemon runs under callgrind, instrumentation on
# after a warm-up, counters zeroed, N calls of one revision, dumped:
# instructions / N, for each revision. The daemon's whole part of a call:
# HTTP, the token's admission, rmcp's streamable HTTP server, the gateway,
# the API, the bundle's session.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${CALLGRIND_CALLS:-1000}
OUT=${CALLGRIND_OUT:-target/bench/callgrind-http.json}
mkdir -p target/bench
. benches/callgrind-common.sh
mkdir -p "$work/demo/server"
cp "$DEMO" "$work/demo/server/"
cp bundles/demo/manifest.json "$work/demo/"
chmod -R a+rX "$work/demo"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_daemon "$(printf '[http]\nlisten = "127.0.0.1:%s"\nrate_per_sec = 1000000.0\nburst = 1000000' "$port")"
"$BV" install "$work/demo" >/dev/null
token=$("$BV" token create --name callgrind 2>/dev/null)

python3 - "$daemon" "$N" "$port" "$token" "$work" <<'PY'
import glob, http.client, json, subprocess, sys
daemon, n, port, token, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
conn = http.client.HTTPConnection("127.0.0.1", port)
base = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"}

def post(body, headers):
    conn.request("POST", "/mcp/default", json.dumps(body), {**base, **headers})
    r = conn.getresponse()
    text = r.read().decode()
    if r.status >= 300:
        sys.exit(f"{body.get('method')}: HTTP {r.status}: {text}")
    messages = []
    if r.getheader("content-type", "").startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                messages.append(json.loads(line[5:]))
    elif text:
        messages.append(json.loads(text))
    return r, messages

def result(messages, i):
    for m in messages:
        if m.get("id") == i:
            if "error" in m:
                sys.exit(f"call {i}: {m['error']}")
            return m["result"]
    sys.exit(f"call {i}: no answer in {messages}")

# 2025-11-25: one session.
r, m = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "callgrind", "version": "1"}}}, {})
session = {"Mcp-Session-Id": r.getheader("mcp-session-id"), "MCP-Protocol-Version": "2025-11-25"}
post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
def call_2025(i):
    _, m = post({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                 "params": {"name": "demo__echo", "arguments": {"text": "hi"}}}, session)
    return result(m, i)

# 2026-07-28: no session; every request says who it is.
meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "callgrind", "version": "1"}}
stateless = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "demo__echo"}
def call_2026(i):
    _, m = post({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                 "params": {"name": "demo__echo", "arguments": {"text": "hi"}, "_meta": meta}}, stateless)
    return result(m, i)

def control(*args):
    subprocess.run(["callgrind_control", *args, daemon], capture_output=True, check=False)

def dumped():
    return set(glob.glob(f"{work}/daemon.*.out.*"))

figures = {}
for label, call in (("2025-11-25", call_2025), ("2026-07-28", call_2026)):
    for i in range(300):
        call(10 + i)
    control("-i", "on")
    for i in range(100):
        call(1000 + i)
    control("-z")
    before = dumped()
    for i in range(n):
        assert call(10000 + i)["content"][0]["text"].endswith("hi")
    control("-d")
    control("-i", "off")
    new = sorted(dumped() - before)
    # Kept for `callgrind_annotate` (target/bench/callgrind-http-REVISION.out).
    subprocess.run(["cp", new[-1], f"target/bench/callgrind-http-{label}.out"], check=False)
    total = 0
    for path in new:
        with open(path) as f:
            for line in f:
                if line.startswith("totals:"):
                    total += int(line.split()[1])
    figures[label] = total // n
with open(f"{work}/figures.json", "w") as f:
    json.dump(figures, f)
PY
printf '%-52s %12s\n' "instructions per HTTP gateway tool call (daemon)" "(callgrind)"
python3 - "$work/figures.json" "$N" "$OUT" <<'PY'
import json, sys
figures, n, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
for label, per in figures.items():
    print("%-52s %12d" % (f"  {label} (HTTP, token, rmcp, gateway, bundle)", per))
import os
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump({"calls": n, **figures}, open(out, "w"))
PY
