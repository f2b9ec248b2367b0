// The conformance target bundle: an McpServer on the MCP TypeScript SDK 2
// server (`@modelcontextprotocol/server` 2.4.0, pinned by package-lock.json)
// exposing what the official MCP conformance suite's server scenarios call:
// for the pinned suite (`@modelcontextprotocol/conformance` 0.1.16,
// tests/conformance/suite, all 2025-era) the `test_*` tools, prompts,
// resources and resource template, prompt and template completion, logging,
// progress, resource subscriptions, elicitation (SEP-1034 defaults, SEP-1330
// enums), sampling, a JSON Schema 2020-12 tool and test_reconnection (an SSE
// stream closed mid-call); and for the 2026-07-28 scenarios of the newer
// suites (0.2.0 alphas) the multi-round-trip `test_input_required_result_*`
// tools and prompt (signed requestState), the stateless scenario's diagnostic
// tools (test_missing_capability, test_streaming_elicitation,
// test_logging_tool, test_trigger_tool_change, test_trigger_prompt_change)
// and an `x-mcp-header` parameter (test_custom_header). Written from the
// scenarios' stated requirements.
//
// One source, two ways to run it:
//   node server/index.mjs               stdio (as an MCPB bundle; `serveStdio`
//                                       takes the 2026-07-28 `server/discover`
//                                       or the 2025-11-25 `initialize` opening)
//   node server/index.mjs --http PORT   streamable HTTP on 127.0.0.1:PORT/mcp
//   (or CONFORMANCE_HTTP_PORT=PORT)     (PORT 0 picks a free one; the line
//                                       `listening http://127.0.0.1:N/mcp` is
//                                       printed on stderr)
// Over HTTP, 2026-07-28 requests (carrying the per-request `_meta` envelope)
// go to the SDK's `createMcpHandler`; 2025-era traffic gets a sessionful
// streamable HTTP transport per `initialize`, with an in-memory event store so
// a stream closed mid-call can be resumed with Last-Event-ID. Host and Origin
// must name localhost (DNS rebinding protection), else 403.
//
// Elicitation, sampling and roots are written once for both revisions: a
// tool returns `inputRequired(...)` and reads the answer from
// `ctx.mcpReq.inputResponses` when it is entered again (on 2026-07-28 the
// client retries; on 2025-11-25 the SDK sends the request to the client and
// re-enters the tool). Nothing is written to disk and nothing is fetched
// from the network. Built into target/conformance-bundle by `make conformance`;
// tests/conformance/run.sh runs the suite against a URL.
import http from "node:http";
import { randomBytes, randomUUID } from "node:crypto";
import {
  CLIENT_CAPABILITIES_META_KEY,
  McpServer,
  ResourceTemplate,
  WebStandardStreamableHTTPServerTransport,
  completable,
  createMcpHandler,
  createRequestStateCodec,
  fromJsonSchema,
  hostHeaderValidationResponse,
  inputRequired,
  inputResponse,
  isInitializeRequest,
  isLegacyRequest,
  localhostAllowedHostnames,
  localhostAllowedOrigins,
  originValidationResponse,
} from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import { z } from "zod";

// ---------------------------------------------------------------------------
// Small media made here: a 1x1 red PNG and a short silent 8 kHz mono WAV.

function crc32(bytes) {
  let crc = ~0;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return ~crc >>> 0;
}

function adler32(bytes) {
  let a = 1;
  let b = 0;
  for (const x of bytes) {
    a = (a + x) % 65521;
    b = (b + a) % 65521;
  }
  return ((b << 16) | a) >>> 0;
}

function pngChunk(type, data) {
  const out = Buffer.alloc(12 + data.length);
  out.writeUInt32BE(data.length, 0);
  out.write(type, 4, "ascii");
  data.copy(out, 8);
  out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length);
  return out;
}

function redPixelPng() {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(1, 0); // width
  ihdr.writeUInt32BE(1, 4); // height
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // truecolour
  const raw = Buffer.from([0, 0xff, 0, 0]); // filter byte, then R G B
  // zlib stream with one stored (uncompressed) deflate block
  const stored = Buffer.concat([
    Buffer.from([0x78, 0x01, 0x01, raw.length, 0, ~raw.length & 0xff, 0xff]),
    raw,
    Buffer.alloc(4),
  ]);
  stored.writeUInt32BE(adler32(raw), stored.length - 4);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk("IHDR", ihdr),
    pngChunk("IDAT", stored),
    pngChunk("IEND", Buffer.alloc(0)),
  ]);
}

function silentWav(samples = 800) {
  const data = samples * 2;
  const wav = Buffer.alloc(44 + data);
  wav.write("RIFF", 0, "ascii");
  wav.writeUInt32LE(36 + data, 4);
  wav.write("WAVEfmt ", 8, "ascii");
  wav.writeUInt32LE(16, 16); // fmt chunk size
  wav.writeUInt16LE(1, 20); // PCM
  wav.writeUInt16LE(1, 22); // mono
  wav.writeUInt32LE(8000, 24); // sample rate
  wav.writeUInt32LE(16000, 28); // byte rate
  wav.writeUInt16LE(2, 32); // block align
  wav.writeUInt16LE(16, 34); // bits per sample
  wav.write("data", 36, "ascii");
  wav.writeUInt32LE(data, 40);
  return wav;
}

const PNG = redPixelPng().toString("base64");
const WAV = silentWav().toString("base64");

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (t) => ({ content: [{ type: "text", text: t }] });

// ---------------------------------------------------------------------------
// Elicitation schemas (wire-ready JSON Schema, as the scenarios expect them).

const contactSchema = {
  type: "object",
  properties: {
    username: { type: "string", description: "User's response" },
    email: { type: "string", description: "User's email address" },
  },
  required: ["username", "email"],
};

const defaultsSchema = {
  type: "object",
  properties: {
    name: { type: "string", description: "Your name", default: "John Doe" },
    age: { type: "integer", description: "Your age", default: 30 },
    score: { type: "number", description: "Your score", default: 95.5 },
    status: {
      type: "string",
      description: "Account status",
      enum: ["active", "inactive", "pending"],
      default: "active",
    },
    verified: { type: "boolean", description: "Verified", default: true },
  },
};

const enumsSchema = {
  type: "object",
  properties: {
    untitledSingle: {
      type: "string",
      description: "Pick one (untitled)",
      enum: ["option1", "option2", "option3"],
    },
    titledSingle: {
      type: "string",
      description: "Pick one (titled)",
      oneOf: [
        { const: "value1", title: "First Option" },
        { const: "value2", title: "Second Option" },
        { const: "value3", title: "Third Option" },
      ],
    },
    legacyEnum: {
      type: "string",
      description: "Pick one (legacy titles)",
      enum: ["opt1", "opt2", "opt3"],
      enumNames: ["Option One", "Option Two", "Option Three"],
    },
    untitledMulti: {
      type: "array",
      description: "Pick several (untitled)",
      items: { type: "string", enum: ["option1", "option2", "option3"] },
    },
    titledMulti: {
      type: "array",
      description: "Pick several (titled)",
      items: {
        anyOf: [
          { const: "value1", title: "First Choice" },
          { const: "value2", title: "Second Choice" },
          { const: "value3", title: "Third Choice" },
        ],
      },
    },
  },
};

const jsonSchema2020 = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  type: "object",
  $defs: {
    address: {
      $anchor: "addressDef",
      type: "object",
      properties: { street: { type: "string" }, city: { type: "string" } },
    },
  },
  properties: {
    name: { type: "string" },
    address: { $ref: "#/$defs/address" },
    contactMethod: { type: "string", enum: ["phone", "email"] },
    phone: { type: "string" },
    email: { type: "string" },
  },
  allOf: [{ anyOf: [{ required: ["phone"] }, { required: ["email"] }] }],
  if: { properties: { contactMethod: { const: "phone" } }, required: ["contactMethod"] },
  then: { required: ["phone"] },
  else: { required: ["email"] },
  additionalProperties: false,
};

const stringField = (name) => ({ type: "object", properties: { [name]: { type: "string" } }, required: [name] });

// requestState (2026-07-28 multi-round-trip state) is HMAC-signed with a key
// made at start: a tampered or foreign state is refused with -32602.
const stateCodec = createRequestStateCodec({ key: randomBytes(32) });

// The client's capabilities: from the request's envelope on 2026-07-28,
// from the `initialize` handshake on 2025-era connections.
function clientCapabilities(server, ctx) {
  return ctx.mcpReq.envelope?.[CLIENT_CAPABILITIES_META_KEY] ?? server.server.getClientCapabilities() ?? {};
}

// Asks the client (elicitation/create) with `schema` under input key `key`;
// once answered, reports the answer with `report(action, content)`.
function elicit(ctx, key, message, schema, report) {
  const answer = inputResponse(ctx.mcpReq.inputResponses, key);
  if (answer.kind !== "elicit") {
    return inputRequired({
      inputRequests: { [key]: inputRequired.elicit({ message, requestedSchema: schema }) },
    });
  }
  return text(report(answer.action, answer.content));
}

const completed = (action, content) =>
  `Elicitation completed: action=${action}, content=${JSON.stringify(content ?? {})}`;

// ---------------------------------------------------------------------------
// The server: one factory for every instance (per stdio connection, per
// 2025 HTTP session, per 2026-07-28 HTTP request).

const COMPLETIONS = ["paris", "park", "party", "test", "testing", "tested", "value1", "value2"];

// Whether the extra tool and prompt that test_trigger_tool_change and
// test_trigger_prompt_change toggle are listed (process-wide, so every
// instance made afterwards agrees), and how a change reaches the
// 2026-07-28 `subscriptions/listen` streams of the HTTP server (stdio and
// 2025-era connections hear it from the instance itself).
const dynamic = { tool: false, prompt: false };
let publishChange;

function conformanceTarget() {
  const server = new McpServer(
    { name: "conformance-target", version: "0.1.0" },
    {
      capabilities: { logging: {}, completions: {}, resources: { subscribe: true, listChanged: true } },
      requestState: { verify: stateCodec.verify },
    },
  );

  // --- tools -------------------------------------------------------------

  server.registerTool(
    "test_simple_text",
    { description: "Returns a fixed text content block." },
    async () => text("This is a simple text response for testing."),
  );

  server.registerTool(
    "test_image_content",
    { description: "Returns a 1x1 red PNG image content block." },
    async () => ({ content: [{ type: "image", data: PNG, mimeType: "image/png" }] }),
  );

  server.registerTool(
    "test_audio_content",
    { description: "Returns a short silent WAV audio content block." },
    async () => ({ content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }] }),
  );

  server.registerTool(
    "test_embedded_resource",
    { description: "Returns an embedded text resource." },
    async () => ({
      content: [
        {
          type: "resource",
          resource: {
            uri: "test://embedded-resource",
            mimeType: "text/plain",
            text: "This is an embedded resource content.",
          },
        },
      ],
    }),
  );

  server.registerTool(
    "test_multiple_content_types",
    { description: "Returns text, image and embedded resource content blocks together." },
    async () => ({
      content: [
        { type: "text", text: "Multiple content types test:" },
        { type: "image", data: PNG, mimeType: "image/png" },
        {
          type: "resource",
          resource: {
            uri: "test://mixed-content-resource",
            mimeType: "application/json",
            text: JSON.stringify({ test: "data", value: 123 }),
          },
        },
      ],
    }),
  );

  server.registerTool(
    "test_tool_with_logging",
    { description: "Sends three info log messages while it runs, about 50 ms apart." },
    async (ctx) => {
      await ctx.mcpReq.log("info", "Tool execution started");
      await sleep(50);
      await ctx.mcpReq.log("info", "Tool processing data");
      await sleep(50);
      await ctx.mcpReq.log("info", "Tool execution completed");
      return text("Tool with logging executed successfully");
    },
  );

  server.registerTool(
    "test_error_handling",
    { description: "Always fails: returns a tool error (isError: true)." },
    async () => ({
      isError: true,
      content: [{ type: "text", text: "This tool intentionally returns an error for testing" }],
    }),
  );

  server.registerTool(
    "test_tool_with_progress",
    { description: "Reports progress 0, 50 and 100 of 100 (when given a progress token), about 50 ms apart." },
    async (ctx) => {
      const token = ctx.mcpReq._meta?.progressToken;
      for (const progress of [0, 50, 100]) {
        if (token !== undefined) {
          await ctx.mcpReq.notify({
            method: "notifications/progress",
            params: { progressToken: token, progress, total: 100, message: `step ${progress}/100` },
          });
        }
        if (progress < 100) await sleep(50);
      }
      return text(`Tool with progress executed${token === undefined ? " (no progress token)" : ""}`);
    },
  );

  server.registerTool(
    "test_sampling",
    {
      description: "Asks the client's model (sampling/createMessage) for a reply to the prompt.",
      inputSchema: z.object({ prompt: z.string().describe("The prompt to send to the LLM") }),
    },
    async ({ prompt }, ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "llm");
      if (answer.kind !== "sampling") {
        return inputRequired({
          inputRequests: {
            llm: inputRequired.createMessage({
              messages: [{ role: "user", content: { type: "text", text: prompt } }],
              maxTokens: 100,
            }),
          },
        });
      }
      const reply = answer.result.content;
      const said = Array.isArray(reply)
        ? reply.map((c) => c.text ?? `[${c.type}]`).join(" ")
        : (reply?.text ?? `[${reply?.type}]`);
      return text(`LLM response: ${said}`);
    },
  );

  server.registerTool(
    "test_elicitation",
    {
      description: "Asks the user (elicitation/create) for a username and an email.",
      inputSchema: z.object({ message: z.string().describe("The message to show the user") }),
    },
    async ({ message }, ctx) =>
      elicit(ctx, "user", message, contactSchema, (action, content) =>
        `User response: action=${action}, content=${JSON.stringify(content ?? {})}`,
      ),
  );

  server.registerTool(
    "test_elicitation_sep1034_defaults",
    { description: "Elicits a form whose string, integer, number, enum and boolean fields have defaults (SEP-1034)." },
    async (ctx) => elicit(ctx, "form", "Please review your details (defaults are filled in)", defaultsSchema, completed),
  );

  server.registerTool(
    "test_elicitation_sep1330_enums",
    { description: "Elicits a form with the five enum shapes of SEP-1330 (untitled/titled/legacy single, untitled/titled multi)." },
    async (ctx) => elicit(ctx, "choices", "Please make your choices", enumsSchema, completed),
  );

  server.registerTool(
    "json_schema_2020_12_tool",
    {
      description: "Tool with JSON Schema 2020-12 features ($schema, $defs, additionalProperties: false).",
      inputSchema: fromJsonSchema(jsonSchema2020),
    },
    async (args) => text(`Received ${JSON.stringify(args)}`),
  );

  server.registerTool(
    "test_reconnection",
    {
      description:
        "Closes its SSE response stream mid-call (2025-era HTTP with resumability), then answers; the client gets the result by resuming with Last-Event-ID.",
    },
    async (ctx) => {
      const closeSSE = ctx.http?.closeSSE;
      if (closeSSE) {
        // An event with an id before the close, so the client has a
        // Last-Event-ID to resume from whatever revision header it sent.
        await ctx.mcpReq.notify({
          method: "notifications/message",
          params: { level: "info", logger: "test_reconnection", data: "closing the stream; reconnect to get the result" },
        });
        await sleep(50);
        closeSSE();
        await sleep(300);
      }
      return text(`Reconnection test completed${closeSSE ? " (stream was closed mid-call)" : ""}`);
    },
  );

  // --- multi-round-trip input (2026-07-28 `input_required` results; on
  // 2025-era connections the SDK asks the client itself and re-enters) ---

  server.registerTool(
    "test_input_required_result_elicitation",
    { description: "Asks the user's name (input request user_name), then greets them." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "user_name");
      if (answer.kind !== "elicit" || typeof answer.content?.name !== "string") {
        return inputRequired({
          inputRequests: {
            user_name: inputRequired.elicit({ message: "What is your name?", requestedSchema: stringField("name") }),
          },
        });
      }
      return text(`Hello, ${answer.content.name}!`);
    },
  );

  server.registerTool(
    "test_input_required_result_sampling",
    { description: "Asks the client's model for the capital of France (input request capital_question)." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "capital_question");
      if (answer.kind !== "sampling") {
        return inputRequired({
          inputRequests: {
            capital_question: inputRequired.createMessage({
              messages: [{ role: "user", content: { type: "text", text: "What is the capital of France?" } }],
              maxTokens: 100,
            }),
          },
        });
      }
      return text(`The model answered: ${answer.result.content?.text ?? JSON.stringify(answer.result.content)}`);
    },
  );

  server.registerTool(
    "test_input_required_result_list_roots",
    { description: "Asks the client for its roots (input request client_roots), then lists them." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "client_roots");
      if (answer.kind !== "roots") {
        return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } });
      }
      return text(`Client roots: ${answer.roots.map((r) => r.uri).join(", ") || "(none)"}`);
    },
  );

  server.registerTool(
    "test_input_required_result_request_state",
    { description: "Asks for confirmation with a signed requestState; answers state-ok once both come back." },
    async (ctx) => {
      const state = ctx.mcpReq.requestState();
      const answer = inputResponse(ctx.mcpReq.inputResponses, "confirm");
      if (state?.step !== "confirm" || answer.kind !== "elicit") {
        return inputRequired({
          inputRequests: {
            confirm: inputRequired.elicit({
              message: "Please confirm",
              requestedSchema: { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"] },
            }),
          },
          requestState: await stateCodec.mint({ step: "confirm" }),
        });
      }
      return text(`state-ok: confirmed=${answer.content?.ok === true}`);
    },
  );

  server.registerTool(
    "test_input_required_result_multiple_inputs",
    { description: "Asks for a name (elicitation), a greeting (sampling) and the roots at once, with a requestState." },
    async (ctx) => {
      const responses = ctx.mcpReq.inputResponses;
      const name = inputResponse(responses, "user_name");
      const greeting = inputResponse(responses, "greeting");
      const roots = inputResponse(responses, "client_roots");
      if (ctx.mcpReq.requestState()?.step !== "all" || name.kind !== "elicit" || greeting.kind !== "sampling" || roots.kind !== "roots") {
        return inputRequired({
          inputRequests: {
            user_name: inputRequired.elicit({ message: "What is your name?", requestedSchema: stringField("name") }),
            greeting: inputRequired.createMessage({
              messages: [{ role: "user", content: { type: "text", text: "Generate a greeting" } }],
              maxTokens: 50,
            }),
            client_roots: inputRequired.listRoots(),
          },
          requestState: await stateCodec.mint({ step: "all" }),
        });
      }
      return text(
        `name=${name.content?.name}, greeting=${greeting.result.content?.text}, roots=${roots.roots.length}`,
      );
    },
  );

  server.registerTool(
    "test_input_required_result_multi_round",
    { description: "Two rounds of elicitation (step1: name, step2: colour), the requestState changing between them." },
    async (ctx) => {
      const state = ctx.mcpReq.requestState();
      const responses = ctx.mcpReq.inputResponses;
      const step1 = inputResponse(responses, "step1");
      if (state?.round === 1 && step1.kind === "elicit") {
        return inputRequired({
          inputRequests: {
            step2: inputRequired.elicit({ message: "Step 2: What is your favorite color?", requestedSchema: stringField("color") }),
          },
          requestState: await stateCodec.mint({ round: 2, name: step1.content?.name }),
        });
      }
      const step2 = inputResponse(responses, "step2");
      if (state?.round === 2 && step2.kind === "elicit") {
        return text(`${state.name ?? "someone"} likes ${step2.content?.color}`);
      }
      return inputRequired({
        inputRequests: {
          step1: inputRequired.elicit({ message: "Step 1: What is your name?", requestedSchema: stringField("name") }),
        },
        requestState: await stateCodec.mint({ round: 1 }),
      });
    },
  );

  server.registerTool(
    "test_input_required_result_tampered_state",
    { description: "Asks for confirmation with a signed requestState; a tampered state is refused (-32602)." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "confirm");
      if (ctx.mcpReq.requestState()?.step !== "tamper" || answer.kind !== "elicit") {
        return inputRequired({
          inputRequests: {
            confirm: inputRequired.elicit({
              message: "Please confirm",
              requestedSchema: { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"] },
            }),
          },
          requestState: await stateCodec.mint({ step: "tamper" }),
        });
      }
      return text("state verified");
    },
  );

  server.registerTool(
    "test_input_required_result_capabilities",
    { description: "Asks only through what the client declared: elicitation and/or sampling." },
    async (ctx) => {
      const caps = clientCapabilities(server, ctx);
      const responses = ctx.mcpReq.inputResponses;
      const requests = {};
      if (caps.elicitation && inputResponse(responses, "user_name").kind !== "elicit") {
        requests.user_name = inputRequired.elicit({ message: "What is your name?", requestedSchema: stringField("name") });
      }
      if (caps.sampling && inputResponse(responses, "greeting").kind !== "sampling") {
        requests.greeting = inputRequired.createMessage({
          messages: [{ role: "user", content: { type: "text", text: "Generate a greeting" } }],
          maxTokens: 50,
        });
      }
      if (Object.keys(requests).length > 0) return inputRequired({ inputRequests: requests });
      return text(`done (client declared: ${Object.keys(caps).join(", ") || "nothing"})`);
    },
  );

  // A parameter mirrored into an HTTP header (SEP-2243: on 2026-07-28 the
  // client sends it as Mcp-Param-Region, which the SDK checks against the body).
  server.registerTool(
    "test_custom_header",
    {
      description: "Echoes its region parameter, which clients also send as the Mcp-Param-Region header.",
      inputSchema: fromJsonSchema({
        type: "object",
        properties: { region: { type: "string", description: "A region name", "x-mcp-header": "Region" } },
        required: ["region"],
      }),
    },
    async ({ region }) => text(`region=${region}`),
  );

  // Diagnostic tools of the 2026-07-28 stateless scenario.
  server.registerTool(
    "test_missing_capability",
    { description: "Needs the client's sampling capability: asks its model a question." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "model");
      if (answer.kind !== "sampling") {
        return inputRequired({
          inputRequests: {
            model: inputRequired.createMessage({
              messages: [{ role: "user", content: { type: "text", text: "Say something." } }],
              maxTokens: 20,
            }),
          },
        });
      }
      return text(`The model said: ${answer.result.content?.text}`);
    },
  );

  server.registerTool(
    "test_streaming_elicitation",
    { description: "Reports progress, then asks the user (elicitation) for a value." },
    async (ctx) => {
      const token = ctx.mcpReq._meta?.progressToken;
      if (token !== undefined) {
        await ctx.mcpReq.notify({ method: "notifications/progress", params: { progressToken: token, progress: 1, total: 2 } });
      }
      return elicit(ctx, "value", "Please enter a value", stringField("value"), completed);
    },
  );

  server.registerTool(
    "test_logging_tool",
    { description: "Logs at info level (only sent when the request asks for logs)." },
    async (ctx) => {
      await ctx.mcpReq.log("info", "test_logging_tool ran");
      return text("logged");
    },
  );

  // --- list changes ------------------------------------------------------

  const addDynamicTool = () =>
    server.registerTool(
      "test_dynamic_tool",
      { description: "Listed while test_trigger_tool_change has toggled it on." },
      async () => text("dynamic tool"),
    );
  const addDynamicPrompt = () =>
    server.registerPrompt("test_dynamic_prompt", { description: "Listed while test_trigger_prompt_change has toggled it on." }, async () => ({
      messages: [{ role: "user", content: { type: "text", text: "dynamic prompt" } }],
    }));
  let dynamicTool = dynamic.tool ? addDynamicTool() : undefined;
  let dynamicPrompt = dynamic.prompt ? addDynamicPrompt() : undefined;

  // Adding or removing on a connected instance sends the list_changed
  // notification (stdio, 2025-era sessions); HTTP 2026-07-28 listeners hear
  // it through the handler's bus.
  server.registerTool(
    "test_trigger_tool_change",
    { description: "Adds or removes test_dynamic_tool, so the tool list changes." },
    async () => {
      dynamic.tool = !dynamic.tool;
      if (dynamicTool) {
        dynamicTool.remove();
        dynamicTool = undefined;
      } else {
        dynamicTool = addDynamicTool();
      }
      publishChange?.("tools");
      return text(`test_dynamic_tool is now ${dynamic.tool ? "listed" : "gone"}`);
    },
  );

  server.registerTool(
    "test_trigger_prompt_change",
    { description: "Adds or removes test_dynamic_prompt, so the prompt list changes." },
    async () => {
      dynamic.prompt = !dynamic.prompt;
      if (dynamicPrompt) {
        dynamicPrompt.remove();
        dynamicPrompt = undefined;
      } else {
        dynamicPrompt = addDynamicPrompt();
      }
      publishChange?.("prompts");
      return text(`test_dynamic_prompt is now ${dynamic.prompt ? "listed" : "gone"}`);
    },
  );

  // --- resources ---------------------------------------------------------

  server.registerResource(
    "static-text",
    "test://static-text",
    { description: "A static text resource.", mimeType: "text/plain" },
    async (uri) => ({
      contents: [{ uri: uri.href, mimeType: "text/plain", text: "This is the content of the static text resource." }],
    }),
  );

  server.registerResource(
    "static-binary",
    "test://static-binary",
    { description: "A static binary resource (a 1x1 red PNG).", mimeType: "image/png" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "image/png", blob: PNG }] }),
  );

  server.registerResource(
    "watched-resource",
    "test://watched-resource",
    { description: "A resource clients may subscribe to.", mimeType: "text/plain" },
    async (uri) => ({
      contents: [{ uri: uri.href, mimeType: "text/plain", text: `Watched resource content at ${new Date().toISOString()}` }],
    }),
  );

  server.registerResource(
    "template-data",
    new ResourceTemplate("test://template/{id}/data", {
      list: undefined,
      complete: { id: (value) => ["1", "2", "3", "123"].filter((id) => id.startsWith(value)) },
    }),
    { description: "Data for an id, substituted into the URI template.", mimeType: "application/json" },
    async (uri, { id }) => ({
      contents: [
        {
          uri: uri.href,
          mimeType: "application/json",
          text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }),
        },
      ],
    }),
  );

  // resources/subscribe and resources/unsubscribe (2025 revisions; on
  // 2026-07-28 the serving entry answers subscriptions/listen itself).
  const subscriptions = new Set();
  server.server.setRequestHandler("resources/subscribe", async (request) => {
    subscriptions.add(request.params.uri);
    return {};
  });
  server.server.setRequestHandler("resources/unsubscribe", async (request) => {
    subscriptions.delete(request.params.uri);
    return {};
  });

  // --- prompts -----------------------------------------------------------

  server.registerPrompt(
    "test_simple_prompt",
    { description: "A prompt without arguments." },
    async () => ({
      messages: [{ role: "user", content: { type: "text", text: "This is a simple prompt for testing." } }],
    }),
  );

  server.registerPrompt(
    "test_prompt_with_arguments",
    {
      description: "A prompt with two required arguments (arg1 completes).",
      argsSchema: z.object({
        arg1: completable(z.string().describe("First test argument"), (value) =>
          COMPLETIONS.filter((c) => c.startsWith(value ?? "")),
        ),
        arg2: z.string().describe("Second test argument"),
      }),
    },
    async ({ arg1, arg2 }) => ({
      messages: [
        { role: "user", content: { type: "text", text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } },
      ],
    }),
  );

  server.registerPrompt(
    "test_prompt_with_embedded_resource",
    {
      description: "A prompt embedding the resource named by resourceUri.",
      argsSchema: z.object({ resourceUri: z.string().describe("URI of the resource to embed") }),
    },
    async ({ resourceUri }) => ({
      messages: [
        {
          role: "user",
          content: {
            type: "resource",
            resource: { uri: resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." },
          },
        },
        { role: "user", content: { type: "text", text: "Please process the embedded resource above." } },
      ],
    }),
  );

  server.registerPrompt(
    "test_input_required_result_prompt",
    { description: "A prompt that first asks the user (elicitation) what context to use." },
    async (ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "user_context");
      if (answer.kind !== "elicit") {
        return inputRequired({
          inputRequests: {
            user_context: inputRequired.elicit({
              message: "What context should the prompt use?",
              requestedSchema: stringField("context"),
            }),
          },
        });
      }
      return {
        messages: [{ role: "user", content: { type: "text", text: `Use this context: ${answer.content?.context ?? "(none)"}` } }],
      };
    },
  );

  server.registerPrompt(
    "test_prompt_with_image",
    { description: "A prompt carrying an image." },
    async () => ({
      messages: [
        { role: "user", content: { type: "image", data: PNG, mimeType: "image/png" } },
        { role: "user", content: { type: "text", text: "Please analyze the image above." } },
      ],
    }),
  );

  return server;
}

// ---------------------------------------------------------------------------
// Streamable HTTP (--http PORT).

// In-memory event store of one 2025-era session, for resumable SSE streams.
class MemoryEventStore {
  #events = new Map(); // eventId -> { streamId, message }
  #next = 0;

  async storeEvent(streamId, message) {
    const eventId = `${streamId}_${String(++this.#next).padStart(8, "0")}`;
    this.#events.set(eventId, { streamId, message });
    if (this.#events.size > 10000) this.#events.delete(this.#events.keys().next().value);
    return eventId;
  }

  async getStreamIdForEventId(eventId) {
    return this.#events.get(eventId)?.streamId;
  }

  async replayEventsAfter(lastEventId, { send }) {
    const last = this.#events.get(lastEventId);
    if (!last) return "";
    let after = false;
    for (const [eventId, { streamId, message }] of this.#events) {
      if (eventId === lastEventId) {
        after = true;
        continue;
      }
      if (after && streamId === last.streamId) await send(eventId, message);
    }
    return last.streamId;
  }
}

function jsonRpcError(status, code, message) {
  return Response.json({ jsonrpc: "2.0", error: { code, message }, id: null }, { status });
}

function serveHttp(port) {
  const modern = createMcpHandler(() => conformanceTarget(), {
    legacy: "reject",
    onerror: (error) => console.error(`conformance-target: ${error.message}`),
  });
  const sessions = new Map(); // session id -> 2025-era transport
  publishChange = (kind) => (kind === "tools" ? modern.notify.toolsChanged() : modern.notify.promptsChanged());

  async function legacy(request, body) {
    const sessionId = request.headers.get("mcp-session-id");
    if (sessionId) {
      const transport = sessions.get(sessionId);
      if (!transport) return jsonRpcError(404, -32001, "Session not found");
      return transport.handleRequest(request, { parsedBody: body });
    }
    const opening = request.method === "POST" && (Array.isArray(body) ? body.some(isInitializeRequest) : isInitializeRequest(body));
    if (!opening) return jsonRpcError(400, -32000, "Bad Request: no valid session id");
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: new MemoryEventStore(),
      retryInterval: 500,
      onsessioninitialized: (id) => sessions.set(id, transport),
      onsessionclosed: (id) => sessions.delete(id),
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await conformanceTarget().connect(transport);
    return transport.handleRequest(request, { parsedBody: body });
  }

  async function route(request, raw) {
    if (new URL(request.url).pathname !== "/mcp") return new Response("Not Found", { status: 404 });
    const rejected =
      hostHeaderValidationResponse(request, localhostAllowedHostnames()) ??
      originValidationResponse(request, localhostAllowedOrigins());
    if (rejected) return rejected;
    let body;
    if (raw.length > 0) {
      try {
        body = JSON.parse(raw.toString("utf8"));
      } catch {
        body = undefined;
      }
    }
    if (await isLegacyRequest(request, body)) return legacy(request, body);
    return modern.fetch(request, body === undefined ? undefined : { parsedBody: body });
  }

  const httpServer = http.createServer(async (req, res) => {
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    try {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      const raw = Buffer.concat(chunks);
      const headers = new Headers();
      for (const [name, value] of Object.entries(req.headers)) {
        if (Array.isArray(value)) for (const v of value) headers.append(name, v);
        else if (value !== undefined) headers.set(name, value);
      }
      const hasBody = raw.length > 0 && req.method !== "GET" && req.method !== "HEAD";
      const request = new Request(`http://${req.headers.host ?? "127.0.0.1"}${req.url}`, {
        method: req.method,
        headers,
        body: hasBody ? raw : undefined,
        signal: abort.signal,
      });
      const response = await route(request, hasBody ? raw : Buffer.alloc(0));
      const outHeaders = {};
      response.headers.forEach((value, name) => {
        outHeaders[name] = value;
      });
      res.writeHead(response.status, outHeaders);
      if (!response.body) return res.end();
      res.flushHeaders();
      const reader = response.body.getReader();
      res.on("close", () => reader.cancel().catch(() => {}));
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!res.write(value)) await new Promise((resolve) => res.once("drain", resolve));
      }
      res.end();
    } catch (error) {
      if (!res.headersSent) {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32603, message: String(error?.message ?? error) }, id: null }));
      } else {
        res.destroy();
      }
    }
  });
  httpServer.listen(port, "127.0.0.1", () => {
    console.error(`listening http://127.0.0.1:${httpServer.address().port}/mcp`);
  });
  const stop = () => {
    httpServer.close();
    for (const transport of sessions.values()) transport.close().catch(() => {});
    modern.close().finally(() => process.exit(0));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

const flag = process.argv.indexOf("--http");
const httpPort = flag >= 0 ? process.argv[flag + 1] : process.env.CONFORMANCE_HTTP_PORT;
if (httpPort !== undefined && httpPort !== "") {
  const port = Number(httpPort);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`conformance-target: bad port ${JSON.stringify(httpPort)}`);
    process.exit(2);
  }
  serveHttp(port);
} else {
  serveStdio(conformanceTarget);
}
