// A bundle on the MCP TypeScript SDK 2 server (`@modelcontextprotocol/server`
// 2.4.0, pinned by package-lock.json), served by `serveStdio`, which takes
// MCP 2026-07-28 (`server/discover`) or the 2025-11-25 `initialize`
// handshake, whichever the client opens with. `greet` elicits a name and
// `ponder` samples the client's model, written once for both revisions:
// the tool returns `inputRequired(...)` and reads the answer from
// `ctx.mcpReq.inputResponses` when it is called again (on 2026-07-28 the
// client retries; on 2025-11-25 the SDK's shim sends the request and
// re-enters the tool). `greet` says which revision it served. Built into
// target/ts2-asker-bundle by `make asker-bundles`; tests/rounds_matrix.rs
// runs it as a bundle.
import {
  McpServer,
  PROTOCOL_VERSION_META_KEY,
  acceptedContent,
  inputRequired,
  inputResponse,
} from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import { z } from "zod";

function asker() {
  const server = new McpServer({ name: "ts2-asker", version: "0.1.0" });
  const revision = (ctx) =>
    ctx.mcpReq.envelope?.[PROTOCOL_VERSION_META_KEY] ?? server.server.getNegotiatedProtocolVersion();

  const nameSchema = z.object({ name: z.string() });
  server.registerTool(
    "greet",
    { description: "Ask the client for a name (elicitation), then greet it." },
    async (ctx) => {
      const answer = acceptedContent(ctx.mcpReq.inputResponses, "name", nameSchema);
      if (answer === undefined) {
        return inputRequired({
          inputRequests: {
            name: inputRequired.elicit({ message: "what is your name?", requestedSchema: nameSchema }),
          },
        });
      }
      return { content: [{ type: "text", text: `hello ${answer.name} (on ${revision(ctx)})` }] };
    },
  );

  server.registerTool(
    "ponder",
    {
      description: "Ask the client's model the question (sampling), then answer with its reply.",
      inputSchema: z.object({ question: z.string() }),
    },
    async ({ question }, ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "model");
      if (answer.kind !== "sampling") {
        return inputRequired({
          inputRequests: {
            model: inputRequired.createMessage({
              messages: [{ role: "user", content: { type: "text", text: question } }],
              maxTokens: 50,
            }),
          },
        });
      }
      return { content: [{ type: "text", text: `the model said ${answer.result.content.text}` }] };
    },
  );
  return server;
}

serveStdio(asker);
