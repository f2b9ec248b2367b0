// An agent on the MCP TypeScript SDK 2 client (`@modelcontextprotocol/client`,
// pinned by package-lock.json) against the daemon's HTTP gateway, with
// sampling and elicitation handlers. tests/agents_2026.rs runs it as
//   node agent.mjs URL TOKEN FILE_ID MODE
// where MODE is the client's `versionNegotiation` mode: "default" (none
// given: the SDK's own default, "legacy", the 2025 `initialize` handshake),
// "auto" (probe `server/discover`, take 2026-07-28 when offered) or a
// version to pin ("2026-07-28"). It lists the tools, calls one, reads a
// workspace file, gets the demo's prompt (which samples the client), calls
// the demo's confirm tool (which elicits twice), then listens for tool list
// changes (on 2026-07-28 a `subscriptions/listen` stream, `client.listen`;
// on 2025-11-25 the session's notifications), says "listening" and waits
// (20 s at most) to hear one, which the test causes. One JSON object per
// line on stdout.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, token, fileId, mode] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));

const options = { capabilities: { sampling: {}, elicitation: {} } };
if (mode === "auto") {
  options.versionNegotiation = { mode: "auto" };
} else if (mode !== "default") {
  options.versionNegotiation = { mode: { pin: mode } };
}
const client = new Client({ name: "bundlevisor-ts-sdk2-agent", version: "1.0.0" }, options);

const asked = [];
client.setRequestHandler("elicitation/create", async (request) => {
  asked.push(request.params.message);
  return { action: "accept", content: { ok: true } };
});
client.setRequestHandler("sampling/createMessage", async () => ({
  role: "assistant",
  model: "ts-model-2",
  content: { type: "text", text: "forty-two from typescript" },
}));
let toolsChanged;
const changed = new Promise((resolve) => {
  toolsChanged = resolve;
});
client.setNotificationHandler("notifications/tools/list_changed", () => toolsChanged());

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
say({ protocol: client.getNegotiatedProtocolVersion(), era: client.getProtocolEra() });

const { tools } = await client.listTools();
say({ tools: tools.map((t) => t.name) });

const called = await client.callTool({ name: "demo__echo", arguments: { text: "from the TypeScript SDK 2" } });
say({ call: called.content.map((c) => c.text).join("") });

const read = await client.readResource({ uri: `files://${fileId}` });
say({ read: read.contents[0].text, mime: read.contents[0].mimeType });

const prompt = await client.getPrompt({ name: "demo__ask", arguments: { question: "six times seven?" } });
say({ prompt: prompt.messages[0].content.text });

const confirmed = await client.callTool({ name: "demo__confirm", arguments: { times: 2 } });
say({ confirm: confirmed.content.map((c) => c.text).join(""), error: Boolean(confirmed.isError), asked });

let subscription;
if (client.getProtocolEra() === "modern") {
  subscription = await client.listen({ toolsListChanged: true });
  say({ listening: "subscriptions/listen", honored: subscription.honoredFilter });
} else {
  say({ listening: "session" });
}
const timeout = new Promise((_, reject) =>
  setTimeout(() => reject(new Error("no notifications/tools/list_changed within 20 s")), 20000),
);
await Promise.race([changed, timeout]);
say({ tools_changed: true });
const after = await client.listTools({}, { cacheMode: "refresh" });
say({ tools_after: after.tools.map((t) => t.name) });
await subscription?.close();
await client.close();
process.exit(0);
