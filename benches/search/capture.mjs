#!/usr/bin/env node
// Capture the real tool definitions of pinned third-party MCP servers.
//
// Spawns each server over stdio, speaks a minimal hand-written JSON-RPC 2.0
// client (newline-delimited JSON), does initialize -> notifications/initialized
// -> tools/list (following nextCursor), and writes tools.json next to this file.
//
// The servers must already be installed (see README.md) under
//   $SEARCH_SERVERS_DIR (default: <repo>/target/search-servers)
//
// Usage: node benches/search/capture.mjs [--only name,name] [--out path]

import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "..", "..");
const BASE = resolve(process.env.SEARCH_SERVERS_DIR ?? join(REPO, "target", "search-servers"));
const SCRATCH = join(BASE, "scratch");
const CAPTURED = "2026-11-26";
const TIMEOUT_MS = 60_000;

const args = process.argv.slice(2);
const argVal = (flag) => {
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
};
const only = argVal("--only")?.split(",");
const outPath = resolve(argVal("--out") ?? join(HERE, "tools.json"));

const npmBin = (short, bin) => join(BASE, "npm", short, "node_modules", ".bin", bin);
const npmPkgJson = (short, pkg) => join(BASE, "npm", short, "node_modules", ...pkg.split("/"), "package.json");
const pyBin = (short, bin) => join(BASE, "py", short, ".venv", "bin", bin);

// short name, registry package, exact version, how to start it.
const SERVERS = [
  { server: "filesystem", npm: "@modelcontextprotocol/server-filesystem", version: "2026.8.31",
    bin: "mcp-server-filesystem", args: () => [join(SCRATCH, "fs-root")] },
  { server: "memory", npm: "@modelcontextprotocol/server-memory", version: "2026.8.31",
    bin: "mcp-server-memory", env: () => ({ MEMORY_FILE_PATH: join(SCRATCH, "memory.jsonl") }) },
  { server: "everything", npm: "@modelcontextprotocol/server-everything", version: "2026.8.31",
    bin: "mcp-server-everything", args: () => ["stdio"] },
  { server: "sequential-thinking", npm: "@modelcontextprotocol/server-sequential-thinking", version: "2026.8.31",
    bin: "mcp-server-sequential-thinking" },
  { server: "github", npm: "@modelcontextprotocol/server-github", version: "2025.4.8",
    bin: "mcp-server-github", env: () => ({ GITHUB_PERSONAL_ACCESS_TOKEN: "dummy" }) },
  { server: "gitlab", npm: "@modelcontextprotocol/server-gitlab", version: "2025.4.25",
    bin: "mcp-server-gitlab", env: () => ({ GITLAB_PERSONAL_ACCESS_TOKEN: "dummy" }) },
  { server: "slack", npm: "@modelcontextprotocol/server-slack", version: "2025.4.25",
    bin: "mcp-server-slack", env: () => ({ SLACK_BOT_TOKEN: "dummy", SLACK_TEAM_ID: "T0" }) },
  { server: "brave-search", npm: "@modelcontextprotocol/server-brave-search", version: "0.6.2",
    bin: "mcp-server-brave-search", env: () => ({ BRAVE_API_KEY: "dummy" }) },
  { server: "google-maps", npm: "@modelcontextprotocol/server-google-maps", version: "0.6.2",
    bin: "mcp-server-google-maps", env: () => ({ GOOGLE_MAPS_API_KEY: "dummy" }) },
  { server: "puppeteer", npm: "@modelcontextprotocol/server-puppeteer", version: "2025.5.12",
    bin: "mcp-server-puppeteer" },
  { server: "postgres", npm: "@modelcontextprotocol/server-postgres", version: "0.6.2",
    bin: "mcp-server-postgres", args: () => ["postgresql://127.0.0.1:1/none"] },
  { server: "redis", npm: "@modelcontextprotocol/server-redis", version: "2025.4.25",
    // Connects to Redis before serving MCP: pointed at the stub RESP server below.
    bin: "mcp-server-redis", args: () => [`redis://127.0.0.1:${fakeRedisPort}`] },
  { server: "everart", npm: "@modelcontextprotocol/server-everart", version: "0.6.2",
    bin: "mcp-server-everart", env: () => ({ EVERART_API_KEY: "dummy" }) },
  { server: "desktop-commander", npm: "@wonderwhy-er/desktop-commander", version: "0.2.52",
    // Hide container indicators so descriptions don't embed this machine's mounts.
    // Telemetry off and its remote feature-flag URL pointed at a closed loopback port,
    // so capture makes no outbound calls and uses the built-in flag defaults.
    bin: "desktop-commander", env: () => ({
      NODE_OPTIONS: `--import=${pathToFileURL(join(HERE, "no-container.mjs")).href}`,
      DESKTOP_COMMANDER_DISABLE_TELEMETRY: "1",
      DC_FLAG_URL: "http://127.0.0.1:9/flags.json",
    }) },
  { server: "playwright", npm: "@playwright/mcp", version: "0.0.83",
    bin: "playwright-mcp", args: () => ["--headless", "--isolated"] },
  { server: "kubernetes", npm: "mcp-server-kubernetes", version: "4.1.7",
    bin: "mcp-server-kubernetes", env: () => ({ KUBECONFIG: join(SCRATCH, "kubeconfig") }) },
  { server: "notion", npm: "@notionhq/notion-mcp-server", version: "2.5.2",
    bin: "notion-mcp-server", env: () => ({ NOTION_TOKEN: "dummy" }) },
  { server: "time", pypi: "mcp-server-time", version: "2026.10.19",
    bin: "mcp-server-time", args: () => ["--local-timezone", "UTC"] },
  { server: "fetch", pypi: "mcp-server-fetch", version: "2026.10.24",
    bin: "mcp-server-fetch" },
  { server: "git", pypi: "mcp-server-git", version: "2026.10.19",
    bin: "mcp-server-git" },
  { server: "sqlite", pypi: "mcp-server-sqlite", version: "2025.4.25",
    bin: "mcp-server-sqlite", args: () => ["--db-path", join(SCRATCH, "sqlite.db")] },
];

function installedVersion(s) {
  if (s.npm) {
    const p = npmPkgJson(s.server, s.npm);
    return existsSync(p) ? JSON.parse(readFileSync(p, "utf8")).version : undefined;
  }
  // pip: find <site-packages>/<dist>-<version>.dist-info
  const lib = join(BASE, "py", s.server, ".venv", "lib");
  if (!existsSync(lib)) return undefined;
  const dist = s.pypi.replace(/-/g, "_").toLowerCase();
  for (const pyd of readdirSync(lib)) {
    const sp = join(lib, pyd, "site-packages");
    if (!existsSync(sp)) continue;
    for (const e of readdirSync(sp)) {
      const m = e.match(/^(.+)-([^-]+)\.dist-info$/);
      if (m && m[1].toLowerCase() === dist) return m[2];
    }
  }
  return undefined;
}

// Minimal JSON-RPC client over newline-delimited stdio.
class StdioClient {
  constructor(cmd, argv, env) {
    this.proc = spawn(cmd, argv, { env, stdio: ["pipe", "pipe", "pipe"], cwd: SCRATCH });
    this.nextId = 1;
    this.pending = new Map();
    this.buf = "";
    this.stderr = "";
    this.exited = null;
    this.proc.stdout.setEncoding("utf8");
    this.proc.stdout.on("data", (chunk) => this.onData(chunk));
    this.proc.stderr.setEncoding("utf8");
    this.proc.stderr.on("data", (c) => { if (this.stderr.length < 20000) this.stderr += c; });
    this.proc.on("error", (e) => this.failAll(e));
    this.proc.on("exit", (code, sig) => {
      this.exited = { code, sig };
      this.failAll(new Error(`server exited (code=${code} signal=${sig})`));
    });
    this.proc.stdin.on("error", () => {});
  }
  onData(chunk) {
    this.buf += chunk;
    let nl;
    while ((nl = this.buf.indexOf("\n")) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (!line) continue;
      let msg;
      try { msg = JSON.parse(line); } catch { continue; } // stray log output on stdout
      if (msg && msg.id !== undefined && (msg.result !== undefined || msg.error !== undefined)) {
        const p = this.pending.get(msg.id);
        if (!p) continue;
        this.pending.delete(msg.id);
        clearTimeout(p.timer);
        if (msg.error) p.reject(new Error(`JSON-RPC error ${msg.error.code}: ${msg.error.message}`));
        else p.resolve(msg.result);
      } else if (msg && msg.method && msg.id !== undefined) {
        // Server->client request (e.g. roots/list, ping): answer minimally.
        const result = msg.method === "roots/list" ? { roots: [] } : {};
        this.send({ jsonrpc: "2.0", id: msg.id, result });
      }
    }
  }
  failAll(err) {
    for (const [, p] of this.pending) { clearTimeout(p.timer); p.reject(err); }
    this.pending.clear();
  }
  send(obj) { this.proc.stdin.write(JSON.stringify(obj) + "\n"); }
  request(method, params) {
    const id = this.nextId++;
    return new Promise((res, rej) => {
      const timer = setTimeout(() => { this.pending.delete(id); rej(new Error(`timeout waiting for ${method}`)); }, TIMEOUT_MS);
      this.pending.set(id, { resolve: res, reject: rej, timer });
      this.send({ jsonrpc: "2.0", id, method, params });
    });
  }
  notify(method, params) { this.send({ jsonrpc: "2.0", method, ...(params ? { params } : {}) }); }
  close() {
    try { this.proc.stdin.end(); } catch {}
    const t = setTimeout(() => { try { this.proc.kill("SIGKILL"); } catch {} }, 3000);
    try { this.proc.kill("SIGTERM"); } catch {}
    return new Promise((r) => {
      if (this.exited) { clearTimeout(t); return r(); }
      this.proc.on("exit", () => { clearTimeout(t); r(); });
    });
  }
}

async function capture(s) {
  const bin = s.npm ? npmBin(s.server, s.bin) : pyBin(s.server, s.bin);
  if (!existsSync(bin)) throw new Error(`not installed: ${bin}`);
  const env = {
    PATH: `${dirname(process.execPath)}:/usr/local/bin:/usr/bin:/bin`,
    HOME: join(SCRATCH, "home"),
    TMPDIR: join(SCRATCH, "tmp"),
    NODE_ENV: "production",
    LANG: "C.UTF-8",
    ...(s.env ? s.env() : {}),
  };
  const client = new StdioClient(bin, s.args ? s.args() : [], env);
  try {
    const init = await client.request("initialize", {
      protocolVersion: "2025-06-18",
      capabilities: {},
      clientInfo: { name: "bundlevisor-search-capture", version: "0.1.0" },
    });
    client.notify("notifications/initialized");
    const tools = [];
    let cursor;
    do {
      const r = await client.request("tools/list", cursor ? { cursor } : {});
      for (const t of r.tools ?? []) {
        tools.push({ name: t.name, description: t.description ?? "", inputSchema: t.inputSchema ?? {} });
      }
      cursor = r.nextCursor;
    } while (cursor);
    return { init, tools };
  } catch (e) {
    e.message += `\n  stderr: ${client.stderr.slice(0, 2000)}`;
    throw e;
  } finally {
    await client.close();
  }
}

for (const d of ["fs-root", "home", "tmp"]) mkdirSync(join(SCRATCH, d), { recursive: true });

// mcp-server-kubernetes reads a kubeconfig at start (never contacted for tools/list).
writeFileSync(join(SCRATCH, "kubeconfig"), `apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: none
  user: {token: dummy}
contexts:
- name: none
  context: {cluster: none, user: none}
current-context: none
`);

// Stub Redis on loopback: answers +OK to every RESP command so that
// mcp-server-redis finishes its startup connect. No data is stored.
let fakeRedisPort = 0;
const fakeRedis = createServer((sock) => {
  let buf = Buffer.alloc(0);
  sock.on("error", () => {});
  sock.on("data", (d) => {
    buf = Buffer.concat([buf, d]);
    // Count complete RESP arrays (*N\r\n then N bulk strings $len\r\n...\r\n).
    for (;;) {
      let pos = 0;
      const line = () => {
        const e = buf.indexOf("\r\n", pos);
        if (e < 0) return null;
        const l = buf.subarray(pos, e).toString();
        pos = e + 2;
        return l;
      };
      const head = line();
      if (head === null) return;
      let ok = true;
      if (head.startsWith("*")) {
        const n = parseInt(head.slice(1), 10);
        for (let i = 0; i < n && ok; i++) {
          const h = line();
          if (h === null) { ok = false; break; }
          const len = parseInt(h.slice(1), 10);
          if (buf.length < pos + len + 2) { ok = false; break; }
          pos += len + 2;
        }
      }
      if (!ok) return;
      buf = buf.subarray(pos);
      sock.write("+OK\r\n");
    }
  });
});
await new Promise((r) => fakeRedis.listen(0, "127.0.0.1", r));
fakeRedisPort = fakeRedis.address().port;

const out = { captured: CAPTURED, servers: [] };
const failures = [];
for (const s of SERVERS) {
  if (only && !only.includes(s.server)) continue;
  const pkg = s.npm ? `npm:${s.npm}` : `pypi:${s.pypi}`;
  const iv = installedVersion(s);
  if (iv !== s.version) {
    failures.push(`${s.server}: installed version ${iv} != pinned ${s.version}`);
    console.error(`SKIP ${s.server}: installed ${iv}, pinned ${s.version}`);
    continue;
  }
  try {
    const { init, tools } = await capture(s);
    out.servers.push({ server: s.server, package: pkg, version: s.version, tools });
    console.error(`OK   ${s.server.padEnd(20)} ${String(tools.length).padStart(3)} tools  (${init?.serverInfo?.name ?? "?"} ${init?.serverInfo?.version ?? "?"}, protocol ${init?.protocolVersion})`);
  } catch (e) {
    failures.push(`${s.server}: ${e.message}`);
    console.error(`FAIL ${s.server}: ${e.message}`);
  }
}

// Keep the previous entries of servers not captured this run (--only, or a
// failure), so a partial run never drops data from an existing tools.json.
if (existsSync(outPath)) {
  const prev = JSON.parse(readFileSync(outPath, "utf8"));
  const have = new Set(out.servers.map((s) => s.server));
  const order = SERVERS.map((s) => s.server);
  out.servers = [...out.servers, ...prev.servers.filter((s) => !have.has(s.server) && order.includes(s.server))]
    .sort((a, b) => order.indexOf(a.server) - order.indexOf(b.server));
}

fakeRedis.close();
writeFileSync(outPath, JSON.stringify(out, null, 2) + "\n");
const total = out.servers.reduce((n, s) => n + s.tools.length, 0);
const bytes = out.servers.reduce((n, s) => n + s.tools.reduce((m, t) => m + Buffer.byteLength(JSON.stringify(t)), 0), 0);
console.error(`\n${out.servers.length} servers, ${total} tools, ${bytes} bytes of compact tool JSON -> ${outPath}`);
if (failures.length) {
  console.error(`\n${failures.length} failure(s):\n- ` + failures.join("\n- "));
  process.exitCode = 1;
}
