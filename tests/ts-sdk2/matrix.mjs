// An agent on the MCP TypeScript SDK 2 client (`@modelcontextprotocol/client`
// 2.4.0, pinned by package-lock.json) for the asker matrix
// (tests/rounds_matrix.rs), run from target/ts-sdk2 (`make asker-bundles`
// copies it there) as
//   node matrix.mjs URL TOKEN MODE BUNDLE...
// where MODE is "default" (no `versionNegotiation`: the SDK's 2025-11-25
// handshake) or "auto" (`versionNegotiation: {mode: "auto"}`: 2026-07-28
// when the gateway offers it). It calls `greet` and `ponder` on each
// bundle through the daemon's HTTP gateway, answering elicitation with the
// name "Tess" and sampling with "forty-two from typescript 2". Prints
// `protocol VERSION`, then `BUNDLE TOOL TEXT` for each call, or
// `BUNDLE TOOL error: MESSAGE` when a call fails; one line each.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, token, mode, ...bundles] = process.argv.slice(2);
const say = (...words) => console.log(words.join(" "));
const oneLine = (error) => `${error.name}: ${error.message}`.split(/\s+/).join(" ");

const options = { capabilities: { sampling: {}, elicitation: {} } };
if (mode === "auto") {
  options.versionNegotiation = { mode: "auto" };
} else if (mode !== "default") {
  throw new Error(`unknown mode ${mode}: default or auto`);
}
const client = new Client({ name: "bundlevisor-ts-sdk2-matrix", version: "1.0.0" }, options);
client.setRequestHandler("elicitation/create", async () => ({ action: "accept", content: { name: "Tess" } }));
client.setRequestHandler("sampling/createMessage", async () => ({
  role: "assistant",
  model: "ts-model-2",
  content: { type: "text", text: "forty-two from typescript 2" },
}));

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
say("protocol", client.getNegotiatedProtocolVersion());
for (const bundle of bundles) {
  for (const [tool, args] of [["greet", {}], ["ponder", { question: "six times seven?" }]]) {
    try {
      const result = await client.callTool({ name: `${bundle}__${tool}`, arguments: args });
      const text = result.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
      say(bundle, tool, result.isError ? `error: ${text}` : text);
    } catch (error) {
      say(bundle, tool, "error:", oneLine(error));
    }
  }
}
await client.close();
process.exit(0);
