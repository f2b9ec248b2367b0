#!/usr/bin/env bash
# Instructions the daemon spends per gateway tool call (`make
# bench-callgrind`, issue 31): an agent on `bundlevisor mcp` (its stdio
# handed over to the daemon) calls `demo__echo`; the daemon runs under
# callgrind, instrumentation switched on after a warm-up, counters zeroed,
# N calls, dumped: instructions / N. The daemon's whole part of a call:
# the MCP session, the gateway's routing, the API, the bundle's session.
# With CALLGRIND_TRACED=1 (issue 36) the agent sends a `traceparent` in each
# call's `_meta` and the daemon exports its spans over OTLP to a sink here
# (answers 200): what tracing costs, the batch thread's encoding and posting
# included (callgrind counts every thread).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${CALLGRIND_CALLS:-1000}
OUT=${CALLGRIND_OUT:-target/bench/callgrind-gateway.json}
. benches/callgrind-common.sh
mkdir -p "$work/demo/server"
cp "$DEMO" "$work/demo/server/"
cp bundles/demo/manifest.json "$work/demo/"
chmod -R a+rX "$work/demo"
TRACED=${CALLGRIND_TRACED:-0}
if [ "$TRACED" = 1 ]; then
  python3 -u -c '
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(sys.argv[1], "a") as f:
            f.write("export\n")
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Sink)
print(server.server_port)
server.serve_forever()
' "$work/exports" >"$work/sink.port" &
  sink=$!
  trap 'kill $sink 2>/dev/null; cleanup' EXIT
  for _ in $(seq 100); do [ -s "$work/sink.port" ] && break; sleep 0.05; done
  start_daemon "$(printf '[telemetry]\notlp_endpoint = "http://127.0.0.1:%s"' "$(cat "$work/sink.port")")"
else
  start_daemon
fi
"$BV" install "$work/demo" >/dev/null

python3 - "$BV" "$daemon" "$N" "$TRACED" <<'PY'
import json, random, subprocess, sys
bv, daemon, n, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
def meta():
    if not traced:
        return {}
    return {"_meta": {"traceparent": "00-%032x-%016x-01" % (random.getrandbits(128) | 1, random.getrandbits(64) | 1)}}
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
call = lambda i: ask(i, "tools/call", {"name": "demo__echo", "arguments": {"text": "hi"}, **meta()})
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
if [ "$TRACED" = 1 ]; then
  exports=$(wc -l <"$work/exports" 2>/dev/null || echo 0)
  [ "$exports" -gt 0 ] || { echo "the traced daemon exported no spans" >&2; exit 1; }
  printf '%-52s %12s\n' "instructions per traced gateway tool call (daemon)" "(callgrind)"
  printf '%-52s %12d\n' "  the same, tracing on, spans exported over OTLP" "$per"
else
  printf '%-52s %12s\n' "instructions per gateway tool call (daemon)" "(callgrind)"
  printf '%-52s %12d\n' "  MCP session, routing, API, the bundle's session" "$per"
fi
mkdir -p "$(dirname "$OUT")"
printf '{"calls": %d, "daemon": %d, "traced": %s}\n' "$N" "$per" "$([ "$TRACED" = 1 ] && echo true || echo false)" >"$OUT"
