// The official MCP TypeScript SDK's client (pinned by package-lock.json)
// with a call in progress when the daemon dies: tests/ts_sdk.rs runs it as
//   node crash.mjs URL TOKEN
// It says {"progress": 1} once the slow call (the demo's `progress`) is
// running, then how the call ended: {"error": …, "ms": …} or
// {"result": …}. The test kills the daemon and starts it again meanwhile.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));

const client = new Client({ name: "bundlevisor-ts-sdk-crash", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
let started;
let told = false;
try {
  const result = await client.callTool(
    { name: "demo__progress", arguments: { steps: 600, delay_ms: 100 } },
    undefined,
    {
      timeout: 120000,
      onprogress: () => {
        if (!told) {
          told = true;
          started = Date.now();
          say({ progress: 1 });
        }
      },
    },
  );
  say({ result });
} catch (e) {
  say({ error: String(e?.message ?? e), ms: Date.now() - (started ?? Date.now()) });
}
process.exit(0);
