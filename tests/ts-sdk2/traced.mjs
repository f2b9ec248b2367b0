// The MCP TypeScript SDK 2 client (`@modelcontextprotocol/client`, pinned by
// package-lock.json) as an agent that traces its calls (tests/telemetry.rs):
//   node traced.mjs REVISION http URL TOKEN TRACEPARENT FILE_URI
//   node traced.mjs REVISION stdio BUNDLEVISOR SOCKET TRACEPARENT FILE_URI
// REVISION is "2026-07-28" (pinned) or "default" (the SDK's own choice,
// 2025-11-25). It calls the demo bundle's `trace` and `host_read` tools with
// TRACEPARENT in the request's `_meta` (SEP-414). Prints one JSON object.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [revision, kind, first, second, traceparent, uri] = process.argv.slice(2);
const text = (result) => result.content.map((c) => c.text).join("");

const options = revision === "default" ? {} : { versionNegotiation: { mode: { pin: revision } } };
const client = new Client({ name: "bundlevisor-traced-agent", version: "1.0.0" }, options);
const transport =
  kind === "http"
    ? new StreamableHTTPClientTransport(new URL(first), {
        requestInit: { headers: { Authorization: `Bearer ${second}` } },
      })
    : new StdioClientTransport({ command: first, args: ["--socket", second, "mcp"] });
await client.connect(transport);
const seen = { protocol: client.getNegotiatedProtocolVersion() };
const tools = (await client.listTools()).tools.map((t) => t.name);
const named = (own) => tools.find((t) => t === own || t.endsWith(`__${own}`));
const _meta = { traceparent, tracestate: "agent=1" };
seen.bundle_saw = JSON.parse(text(await client.callTool({ name: named("trace"), arguments: {}, _meta })));
const read = await client.callTool({ name: named("host_read"), arguments: { uri }, _meta });
seen.read_error = read.isError ?? false;
console.log(JSON.stringify(seen));
await client.close();
