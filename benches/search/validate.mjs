#!/usr/bin/env node
// Check queries.json against tools.json and print per-server statistics.
//
// Usage: node benches/search/validate.mjs
// Exits non-zero if an expected "server/tool" is missing, a query is
// duplicated, a server has fewer than 3 queries, or one server has more
// than 15% of all queries.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const tools = JSON.parse(readFileSync(join(HERE, "tools.json"), "utf8"));
const { queries } = JSON.parse(readFileSync(join(HERE, "queries.json"), "utf8"));

const known = new Map(); // "server/tool" -> tool
let toolCount = 0;
let listBytes = 0;
for (const s of tools.servers) {
  for (const t of s.tools) {
    known.set(`${s.server}/${t.name}`, t);
    toolCount++;
    listBytes += Buffer.byteLength(JSON.stringify({ name: t.name, description: t.description, inputSchema: t.inputSchema }));
  }
}

const errors = [];
const perServer = new Map(tools.servers.map((s) => [s.server, 0]));
const seen = new Set();
const covered = new Set();

// "Shares a key word": a query word (lower-case, length >= 3, simple plural
// stripping) equal to a word of the expected tool's name.
const STOP = new Set(["the", "and", "for", "get", "api", "with", "from", "into", "a", "an"]);
const words = (s) =>
  s.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length >= 3 && !STOP.has(w)).map((w) => w.replace(/(?<=[a-z]{3})s$/, ""));
let sharesNameWord = 0;

for (const [i, q] of queries.entries()) {
  if (typeof q.query !== "string" || typeof q.expected !== "string") {
    errors.push(`#${i}: malformed entry`);
    continue;
  }
  const tool = known.get(q.expected);
  if (!tool) errors.push(`#${i}: unknown tool ${q.expected}`);
  const key = q.query.trim().toLowerCase();
  if (seen.has(key)) errors.push(`#${i}: duplicate query "${q.query}"`);
  seen.add(key);
  const server = q.expected.split("/")[0];
  perServer.set(server, (perServer.get(server) ?? 0) + 1);
  covered.add(q.expected);
  if (tool) {
    const nameWords = new Set(words(tool.name));
    if (words(q.query).some((w) => nameWords.has(w))) sharesNameWord++;
    const desc = tool.description.trim().toLowerCase();
    if (desc.length > 0 && key.includes(desc.slice(0, 40))) errors.push(`#${i}: copies the description of ${q.expected}`);
  }
}

console.log(`tools.json: ${tools.servers.length} servers, ${toolCount} tools, ${listBytes} bytes of compact tool JSON`);
console.log(`queries.json: ${queries.length} queries, ${covered.size} distinct expected tools`);
console.log(`queries sharing a word with the expected tool's name: ${sharesNameWord} (${((100 * sharesNameWord) / queries.length).toFixed(0)}%)\n`);
console.log("server                 tools  queries  share");
for (const s of tools.servers) {
  const n = perServer.get(s.server) ?? 0;
  const share = (100 * n) / queries.length;
  console.log(`${s.server.padEnd(22)} ${String(s.tools.length).padStart(5)}  ${String(n).padStart(7)}  ${share.toFixed(1).padStart(4)}%`);
  if (n < 3) errors.push(`${s.server}: only ${n} queries (< 3)`);
  if (share > 15) errors.push(`${s.server}: ${share.toFixed(1)}% of queries (> 15%)`);
}

if (errors.length) {
  console.error(`\n${errors.length} problem(s):\n- ` + errors.join("\n- "));
  process.exit(1);
}
console.log("\nOK");
