// The official MCP TypeScript SDK's client (pinned by package-lock.json)
// on a profile with `discovery = "search"`, over HTTP or stdio:
//   node search.mjs http URL TOKEN
//   node search.mjs stdio BUNDLEVISOR SOCKET PROFILE
// It lists the tools (the meta-tools), finds "add two numbers" (or $QUERY), calls the
// first hit through call_tool, pins it, waits (10 s at most) for
// notifications/tools/list_changed, lists again and calls the pinned tool
// directly. Prints one JSON object: what it saw at each step.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [kind, first, second, third] = process.argv.slice(2);
const text = (result) => result.content.map((c) => c.text).join("");

let toolsChanged;
const changed = new Promise((resolve) => {
  toolsChanged = resolve;
});
const client = new Client({ name: "bundlevisor-ts-sdk-search", version: "1.0.0" });
client.setNotificationHandler(ToolListChangedNotificationSchema, () => toolsChanged());

const transport =
  kind === "http"
    ? new StreamableHTTPClientTransport(new URL(first), {
        requestInit: { headers: { Authorization: `Bearer ${second}` } },
      })
    : new StdioClientTransport({ command: first, args: ["--socket", second, "mcp", "--profile", third] });
await client.connect(transport);
const seen = { protocol: transport.protocolVersion ?? client.getServerVersion()?.name };

seen.listed = (await client.listTools()).tools.map((t) => t.name);
const found = await client.callTool({ name: "find_tools", arguments: { query: process.env.QUERY ?? "add two numbers" } });
const hits = found.structuredContent.tools;
seen.found = hits.map((h) => h.name);
seen.schema = hits[0].inputSchema;
const best = hits[0].name;
seen.called = text(await client.callTool({ name: "call_tool", arguments: { name: best, arguments: { a: 2, b: 3 } } }));
seen.pin = text(await client.callTool({ name: "pin_tools", arguments: { names: [best] } }));
await Promise.race([
  changed,
  new Promise((_, reject) => setTimeout(() => reject(new Error("no tools/list_changed after pin_tools")), 10000)),
]);
seen.pinned = (await client.listTools()).tools.map((t) => t.name);
seen.direct = text(await client.callTool({ name: best, arguments: { a: 20, b: 22 } }));
console.log(JSON.stringify(seen));
await client.close();
