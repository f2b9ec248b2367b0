// An MCP Apps host on the MCP TypeScript SDK 2 client
// (`@modelcontextprotocol/client`) and ext-apps' own host helper
// (`getToolUiResourceUri` of `@modelcontextprotocol/ext-apps/app-bridge`),
// both pinned by package-lock.json, against the daemon's HTTP gateway.
// tests/mcp_apps.rs runs it as
//   node host.mjs URL TOKEN [MODE]
// where MODE is the client's `versionNegotiation` mode: "default" (none
// given: the 2025 `initialize` handshake, 2025-11-25) or "auto" (probe
// `server/discover`, take 2026-07-28 when offered). It declares the MCP Apps
// extension (`io.modelcontextprotocol/ui`) in its capabilities, lists the
// resources and the tools, takes the tool of server-basic-vanillajs
// (`BUNDLE__get-time`), asks ext-apps for the tool's UI resource URI, reads
// that resource as a host does before it renders the app, and calls the
// tool. One JSON object per line on stdout; any error ends it non-zero.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { getToolUiResourceUri, RESOURCE_MIME_TYPE } from "@modelcontextprotocol/ext-apps/app-bridge";

const [url, token, mode = "default"] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));

async function main() {
  if (!url || !token) {
    throw new Error("usage: node host.mjs URL TOKEN [default|auto]");
  }
  const options = {
    capabilities: {
      extensions: { "io.modelcontextprotocol/ui": { mimeTypes: [RESOURCE_MIME_TYPE] } },
    },
  };
  if (mode === "auto") {
    options.versionNegotiation = { mode: "auto" };
  } else if (mode !== "default") {
    throw new Error(`unknown mode ${mode}`);
  }
  const client = new Client({ name: "bundlevisor-ext-apps-host", version: "1.0.0" }, options);
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  say({ protocol: client.getNegotiatedProtocolVersion(), era: client.getProtocolEra() });

  const { resources } = await client.listResources();
  say({ resources: resources.map((r) => ({ uri: r.uri, mimeType: r.mimeType })) });

  const { tools } = await client.listTools();
  const tool = tools.find((t) => t.name.endsWith("__get-time"));
  if (!tool) {
    throw new Error(`no get-time tool among ${JSON.stringify(tools.map((t) => t.name))}`);
  }
  // Throws if the tool names a UI resource that is not `ui://`.
  const uiUri = getToolUiResourceUri(tool);
  if (uiUri === undefined) {
    throw new Error(`${tool.name} names no UI resource: ${JSON.stringify(tool._meta)}`);
  }
  const read = await client.readResource({ uri: uiUri });
  const content = read.contents[0];
  if (!content) {
    throw new Error(`${uiUri} read no contents`);
  }
  const html = content.text ?? Buffer.from(content.blob ?? "", "base64").toString("utf8");
  say({
    tool: tool.name,
    uiUri,
    legacyUri: tool._meta?.["ui/resourceUri"],
    contentUri: content.uri,
    mimeType: content.mimeType,
    htmlBytes: Buffer.byteLength(html),
    startsWithDoctype: /^\s*<!doctype html/i.test(html),
  });

  const called = await client.callTool({ name: tool.name, arguments: {} });
  if (called.isError) {
    throw new Error(`${tool.name} failed: ${JSON.stringify(called.content)}`);
  }
  say({
    call: called.content.map((c) => c.text).join(""),
    structured: called.structuredContent ?? null,
  });
  await client.close();
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`host.mjs: ${e?.stack ?? e}`);
    process.exit(1);
  },
);
