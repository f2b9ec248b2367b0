// An agent on the MCP TypeScript SDK 1 client (`@modelcontextprotocol/sdk`
// 1.32.2, pinned by package-lock.json; MCP 2025-11-25) for the asker
// matrix (tests/rounds_matrix.rs), run from target/ts-sdk (`make
// asker-bundles` copies it there) as
//   node matrix.mjs URL TOKEN BUNDLE...
// It calls `greet` and `ponder` on each bundle through the daemon's HTTP
// gateway, answering elicitation with the name "Theo" and sampling with
// "forty-two from typescript 1". Prints `protocol VERSION`, then
// `BUNDLE TOOL TEXT` for each call, or `BUNDLE TOOL error: MESSAGE` when a
// call fails; one line each.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CreateMessageRequestSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token, ...bundles] = process.argv.slice(2);
const say = (...words) => console.log(words.join(" "));
const oneLine = (error) => `${error.name}: ${error.message}`.split(/\s+/).join(" ");

const client = new Client(
  { name: "bundlevisor-ts-sdk-matrix", version: "1.0.0" },
  { capabilities: { sampling: {}, elicitation: {} } },
);
client.setRequestHandler(ElicitRequestSchema, async () => ({ action: "accept", content: { name: "Theo" } }));
client.setRequestHandler(CreateMessageRequestSchema, async () => ({
  role: "assistant",
  model: "ts-model-1",
  content: { type: "text", text: "forty-two from typescript 1" },
}));

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
say("protocol", transport.protocolVersion);
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
