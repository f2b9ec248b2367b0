// A bundle on the MCP TypeScript SDK 1 server (`@modelcontextprotocol/sdk`
// 1.32.2's McpServer, pinned by package-lock.json), which speaks MCP
// 2025-11-25 and older only: `greet` elicits a name and `ponder` samples the
// client's model, each by a request sent to the client while the call runs.
// The SDK does not tell a tool which revision it was initialized with, so
// `greet` answers "hello NAME" only. Built into target/ts1-asker-bundle by
// `make asker-bundles`; tests/rounds_matrix.rs runs it as a bundle.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const server = new McpServer({ name: "ts1-asker", version: "0.1.0" });

server.registerTool(
  "greet",
  { description: "Ask the client for a name (elicitation), then greet it." },
  async (extra) => {
    const reply = await server.server.elicitInput(
      {
        message: "what is your name?",
        requestedSchema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
      },
      { relatedRequestId: extra.requestId },
    );
    const text = reply.action === "accept" ? `hello ${reply.content.name}` : `no name (${reply.action})`;
    return { content: [{ type: "text", text }] };
  },
);

server.registerTool(
  "ponder",
  {
    description: "Ask the client's model the question (sampling), then answer with its reply.",
    inputSchema: { question: z.string() },
  },
  async ({ question }, extra) => {
    const reply = await server.server.createMessage(
      { messages: [{ role: "user", content: { type: "text", text: question } }], maxTokens: 50 },
      { relatedRequestId: extra.requestId },
    );
    return { content: [{ type: "text", text: `the model said ${reply.content.text}` }] };
  },
);

await server.connect(new StdioServerTransport());
