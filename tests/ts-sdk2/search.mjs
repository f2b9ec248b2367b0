// The MCP TypeScript SDK 2 client (`@modelcontextprotocol/client`, pinned
// by package-lock.json), pinned to MCP 2026-07-28, on a profile with
// `discovery = "search"`, over HTTP or stdio:
//   node search.mjs http URL TOKEN
//   node search.mjs stdio BUNDLEVISOR SOCKET PROFILE
// It lists the tools (the meta-tools: no pin_tools, as the revision has
// no sessions to keep pins in), finds "add two numbers" (or $QUERY) and calls the
// first hit through call_tool. Prints one JSON object.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [kind, first, second, third] = process.argv.slice(2);
const text = (result) => result.content.map((c) => c.text).join("");

const client = new Client(
  { name: "bundlevisor-ts-sdk2-search", version: "1.0.0" },
  { versionNegotiation: { mode: { pin: "2026-07-28" } } },
);
const transport =
  kind === "http"
    ? new StreamableHTTPClientTransport(new URL(first), {
        requestInit: { headers: { Authorization: `Bearer ${second}` } },
      })
    : new StdioClientTransport({ command: first, args: ["--socket", second, "mcp", "--profile", third] });
await client.connect(transport);
const seen = { protocol: client.getNegotiatedProtocolVersion() };

seen.listed = (await client.listTools()).tools.map((t) => t.name);
const found = await client.callTool({ name: "find_tools", arguments: { query: process.env.QUERY ?? "add two numbers" } });
const hits = found.structuredContent.tools;
seen.found = hits.map((h) => h.name);
seen.schema = hits[0].inputSchema;
seen.called = text(await client.callTool({ name: "call_tool", arguments: { name: hits[0].name, arguments: { a: 2, b: 3 } } }));
console.log(JSON.stringify(seen));
await client.close();
