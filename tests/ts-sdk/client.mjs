// The official MCP TypeScript SDK's client (pinned by package-lock.json)
// against the daemon's HTTP gateway: tests/ts_sdk.rs runs it as
//   node client.mjs URL TOKEN
// and reads one JSON object per line from its stdout. It lists, calls,
// reads a workspace file, says "ready", then waits (20 s at most) for
// notifications/tools/list_changed, which the test causes.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));

let toolsChanged;
const changed = new Promise((resolve) => {
  toolsChanged = resolve;
});
const client = new Client({ name: "bundlevisor-ts-sdk-test", version: "1.0.0" });
client.setNotificationHandler(ToolListChangedNotificationSchema, () => toolsChanged());

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
say({ protocol: transport.protocolVersion, session: Boolean(transport.sessionId) });

const { tools } = await client.listTools();
say({ tools: tools.map((t) => t.name) });

const called = await client.callTool({ name: "demo__echo", arguments: { text: "from the TypeScript SDK" } });
say({ call: called.content.map((c) => c.text).join("") });

// A call that asks for progress (the SDK sends a progressToken): the
// reports, then the result.
const reports = [];
const stepped = await client.callTool(
  { name: "demo__progress", arguments: { steps: 3, delay_ms: 1 } },
  undefined,
  { onprogress: (p) => reports.push(p) },
);
say({ progress: reports.map((p) => p.progress), done: stepped.content.map((c) => c.text).join("") });

const { resources } = await client.listResources();
const file = resources.find((r) => r.uri.startsWith("files://"));
say({ resources: resources.map((r) => r.uri) });
const read = await client.readResource({ uri: file.uri });
say({ read: read.contents[0].text, mime: read.contents[0].mimeType });

say({ ready: true });
const timeout = new Promise((_, reject) =>
  setTimeout(() => reject(new Error("no notifications/tools/list_changed within 20 s")), 20000),
);
await Promise.race([changed, timeout]);
say({ tools_changed: true });
const after = await client.listTools();
say({ tools_after: after.tools.map((t) => t.name) });
await client.close();
process.exit(0);
