// Runs the official MCP conformance suite's server scenarios (the pinned
// @modelcontextprotocol/conformance in target/conformance, see `make
// conformance`) against an MCP server URL and prints one JSON object per
// scenario on stdout, then a summary object, for tests to parse:
//
//   {"scenario":"tools-list","status":"pass","passed":1,"failed":0,"warnings":0,"seconds":0.4,"failures":[],"warningIds":[]}
//   ...
//   {"summary":true,"total":32,"pass":32,"fail":0,"error":0,"skipped":0,"seconds":9.1,"specVersion":null,"suiteVersion":"0.1.16"}
//
// status: "pass" (no check FAILED: the suite's own verdict; warnings are
// counted apart), "fail" (a check FAILED), "error" (the scenario crashed or
// timed out: `failures` says why), "skipped" (the suite ran nothing for it,
// as newer suites do for a scenario outside --spec-version).
// Progress and a closing `N passed, N failed` line go to stderr. Exit code:
// 0 all passed (or skipped), 1 some failed, 2 bad usage or setup.
//
// Usage (run.sh picks the pinned Node 22):
//   tests/conformance/run.sh --url http://127.0.0.1:PORT/mcp
//       [--spec-version 2025-11-25]        filter the scenarios (0.1.16 knows
//                                          2025-03-26, 2025-06-18, 2025-11-25,
//                                          draft, extension; it has no
//                                          2026-07-28 scenario)
//       [--header 'Authorization: Bearer T']...
//       [--scenario NAME]...               default: every server scenario
//       [--timeout 60]                     seconds a scenario may take
//       [--separate] [--jobs 2]            one suite process per scenario, N
//                                          at once (slower: ~1 s of Node start
//                                          each); the default runs them all in
//                                          one process (`server --suite all`)
//                                          and falls back to separate runs for
//                                          what is left if it hangs or dies
//       [--suite-dir target/conformance]   the installed suite: 0.1.16, or
//                                          target/conformance-2026 for
//                                          0.2.0-alpha.12, which has the
//                                          2026-07-28 scenarios (run.sh
//                                          runs this on that folder's Node)
//       [--keep DIR]
// The suite cannot send extra headers itself (its clients are built from
// the URL alone), so with --header the scenarios go through a header-adding
// reverse proxy on 127.0.0.1 that this script starts: it forwards every
// request to the URL's origin, streaming both ways, sets the given headers,
// and maps a Host/Origin naming the proxy to the target's (other values, such
// as the DNS rebinding scenario's evil Host, pass unchanged).
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function fatal(message) {
  console.error(`run.mjs: ${message}`);
  process.exit(2);
}

function usage(message) {
  console.error(`run.mjs: ${message}`);
  console.error("usage: run.mjs --url URL [--spec-version V] [--header 'Name: value']... [--scenario NAME]... [--timeout SECONDS] [--separate] [--jobs N] [--suite-dir DIR] [--keep DIR]");
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {
    url: undefined,
    specVersion: undefined,
    headers: [],
    scenarios: [],
    jobs: 2,
    timeout: 60,
    separate: false,
    suiteDir: process.env.CONFORMANCE_SUITE_DIR ?? path.resolve(here, "../../target/conformance"),
    keep: undefined,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case "--url": opts.url = value(); break;
      case "--spec-version": opts.specVersion = value(); break;
      case "--header": {
        const h = value();
        const colon = h.indexOf(":");
        if (colon <= 0) usage(`bad header ${JSON.stringify(h)} (want 'Name: value')`);
        opts.headers.push([h.slice(0, colon).trim().toLowerCase(), h.slice(colon + 1).trim()]);
        break;
      }
      case "--scenario": opts.scenarios.push(value()); break;
      case "--jobs": opts.jobs = Number(value()); break;
      case "--separate": opts.separate = true; break;
      case "--timeout": opts.timeout = Number(value()); break;
      case "--suite-dir": opts.suiteDir = path.resolve(value()); break;
      case "--keep": opts.keep = path.resolve(value()); break;
      case "-h":
      case "--help": usage("help");
      default: usage(`unknown argument ${JSON.stringify(arg)}`);
    }
  }
  if (!opts.url) usage("--url is required");
  try {
    new URL(opts.url);
  } catch {
    usage(`bad URL ${JSON.stringify(opts.url)}`);
  }
  if (!(opts.jobs >= 1)) usage("--jobs must be >= 1");
  if (!(opts.timeout > 0)) usage("--timeout must be > 0");
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
const nodeBin = path.join(opts.suiteDir, "node_modules/node/bin/node");
const suitePkg = path.join(opts.suiteDir, "node_modules/@modelcontextprotocol/conformance");
const suiteBin = path.join(suitePkg, "dist/index.js");
for (const f of [nodeBin, suiteBin]) if (!fs.existsSync(f)) fatal(`${f} is missing: run \`make conformance\``);
const suiteVersion = JSON.parse(fs.readFileSync(path.join(suitePkg, "package.json"), "utf8")).version;

function runSuite(args, { timeoutMs } = {}) {
  return new Promise((resolve) => {
    const child = spawn(nodeBin, [suiteBin, ...args], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, NO_COLOR: "1", FORCE_COLOR: "0" },
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    let timedOut = false;
    const timer = timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          child.kill("SIGKILL");
        }, timeoutMs)
      : undefined;
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, timedOut });
    });
  });
}

// A reverse proxy on 127.0.0.1 that adds `headers` to every request.
async function headerProxy(target, headers) {
  const upstream = target.protocol === "https:" ? https : http;
  let proxyHost;
  const server = http.createServer((req, res) => {
    const out = { ...req.headers };
    if (out.host === proxyHost) out.host = target.host;
    if (out.origin === `http://${proxyHost}`) out.origin = target.origin;
    for (const [name, value] of headers) out[name] = value;
    const up = upstream.request(
      { protocol: target.protocol, hostname: target.hostname, port: target.port, method: req.method, path: req.url, headers: out },
      (ur) => {
        res.writeHead(ur.statusCode, ur.headers);
        res.flushHeaders();
        ur.pipe(res);
      },
    );
    up.on("error", (error) => {
      if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
      res.end(`proxy: ${error.message}`);
    });
    res.on("close", () => up.destroy());
    req.pipe(up);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxyHost = `127.0.0.1:${server.address().port}`;
  return { server, host: proxyHost };
}

function summarize(checks) {
  const failed = checks.filter((c) => c.status === "FAILURE");
  const warned = checks.filter((c) => c.status === "WARNING");
  return {
    passed: checks.filter((c) => c.status === "SUCCESS").length,
    failed: failed.length,
    warnings: warned.length,
    failures: failed.map((c) => ({ id: c.id, message: c.errorMessage ?? c.description })),
    warningIds: warned.map((c) => c.id),
  };
}

// The checks.json the suite wrote for `scenario` under `dir` (its result
// folders are named `server-SCENARIO-TIMESTAMP`).
function findChecks(dir, scenario) {
  if (!fs.existsSync(dir)) return undefined;
  const prefix = `server-${scenario}-`;
  for (const entry of fs.readdirSync(dir)) {
    if (!entry.startsWith(prefix) || !/^\d{4}-\d\d-\d\dT[\d-]+Z$/.test(entry.slice(prefix.length))) continue;
    const file = path.join(dir, entry, "checks.json");
    if (fs.existsSync(file)) return JSON.parse(fs.readFileSync(file, "utf8"));
  }
  return undefined;
}

const errorLine = (id, message) => ({ status: "error", passed: 0, failed: 0, warnings: 0, failures: [{ id, message }], warningIds: [] });

async function main() {
  const started = Date.now();
  const specArgs = opts.specVersion ? ["--spec-version", opts.specVersion] : [];

  let scenarios = opts.scenarios;
  if (scenarios.length === 0) {
    const listed = await runSuite(["list", "--server", ...specArgs], { timeoutMs: 60000 });
    if (listed.code !== 0) fatal(`\`conformance list --server\` failed: ${(listed.stderr || listed.stdout).trim()}`);
    scenarios = [...listed.stdout.matchAll(/^\s+- (\S+)/gm)].map((m) => m[1]);
    if (scenarios.length === 0) fatal(`the suite lists no server scenario${opts.specVersion ? ` for ${opts.specVersion}` : ""}`);
  }

  let url = opts.url;
  let proxy;
  if (opts.headers.length > 0) {
    const target = new URL(opts.url);
    proxy = await headerProxy(target, opts.headers);
    url = `http://${proxy.host}${target.pathname}${target.search}`;
    console.error(`run.mjs: scenarios go through the header proxy ${url}`);
  }

  const work = opts.keep ?? fs.mkdtempSync(path.join(os.tmpdir(), "conformance-"));
  fs.mkdirSync(work, { recursive: true });
  const counts = { pass: 0, fail: 0, error: 0, skipped: 0 };
  const reported = new Set();

  function report(scenario, line, seconds) {
    reported.add(scenario);
    counts[line.status]++;
    process.stdout.write(`${JSON.stringify({ scenario, ...line, seconds })}\n`);
    console.error(`${line.status.padEnd(7)} ${scenario} (${seconds}s)${line.failures.length ? `: ${line.failures.map((f) => f.message).join("; ")}` : ""}`);
  }

  const since = (t0) => Math.round((Date.now() - t0) / 10) / 100;

  // One suite process per scenario.
  async function one(scenario) {
    const t0 = Date.now();
    const outDir = path.join(work, "separate");
    const run = await runSuite(["server", "--url", url, "--scenario", scenario, "-o", outDir, ...specArgs], {
      timeoutMs: opts.timeout * 1000,
    });
    const checks = findChecks(outDir, scenario);
    let line;
    if (run.timedOut) {
      line = errorLine("timeout", `no result after ${opts.timeout}s`);
    } else if (checks) {
      const s = summarize(checks);
      line = { status: s.failed > 0 ? "fail" : "pass", ...s };
    } else if (run.code === 0) {
      line = { status: "skipped", passed: 0, failed: 0, warnings: 0, failures: [], warningIds: [] };
    } else {
      const tail = (run.stderr || run.stdout).trim().split("\n").slice(-5).join("\n");
      line = errorLine("crash", `exit ${run.code ?? run.signal}: ${tail}`);
    }
    report(scenario, line, since(t0));
  }

  // Every scenario in one suite process (`server --suite all`), read as it
  // goes: a scenario's checks.json is written before the next one starts.
  function batch() {
    const outDir = path.join(work, "batch");
    return new Promise((resolve) => {
      const child = spawn(nodeBin, [suiteBin, "server", "--url", url, "--suite", "all", "-o", outDir, ...specArgs], {
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, NO_COLOR: "1", FORCE_COLOR: "0" },
      });
      let current;
      let t0;
      let pending = "";
      let stderr = "";
      let killed = false;
      const finish = () => {
        if (current === undefined || reported.has(current)) return;
        const checks = findChecks(outDir, current);
        if (checks) {
          const s = summarize(checks);
          report(current, { status: s.failed > 0 ? "fail" : "pass", ...s }, since(t0));
        } else {
          report(current, errorLine("crash", `the suite wrote no result${stderr ? `: ${stderr.trim().split("\n").slice(-3).join(" | ")}` : ""}`), since(t0));
        }
      };
      child.stdout.on("data", (data) => {
        pending += data;
        let nl;
        while ((nl = pending.indexOf("\n")) >= 0) {
          const lineText = pending.slice(0, nl);
          pending = pending.slice(nl + 1);
          const m = /^=== Running scenario: (\S+) ===$/.exec(lineText.trim());
          if (m) {
            finish();
            current = m[1];
            t0 = Date.now();
          }
        }
      });
      child.stderr.on("data", (d) => (stderr += d));
      const watchdog = setInterval(() => {
        if (current !== undefined && !reported.has(current) && Date.now() - t0 > opts.timeout * 1000) {
          killed = true;
          report(current, errorLine("timeout", `no result after ${opts.timeout}s`), since(t0));
          child.kill("SIGKILL");
        }
      }, 250);
      child.on("close", () => {
        clearInterval(watchdog);
        if (!killed) finish();
        resolve();
      });
    });
  }

  if (!opts.separate && opts.scenarios.length === 0) await batch();
  const queue = scenarios.filter((s) => !reported.has(s));
  if (!opts.separate && opts.scenarios.length === 0 && queue.length > 0) {
    console.error(`run.mjs: ${queue.length} scenario(s) left after the batch run; running them one by one`);
  }
  await Promise.all(
    Array.from({ length: Math.min(opts.jobs, queue.length) }, async () => {
      while (queue.length > 0) await one(queue.shift());
    }),
  );

  proxy?.server.close();
  proxy?.server.closeAllConnections?.();
  if (!opts.keep) fs.rmSync(work, { recursive: true, force: true });
  const seconds = since(started);
  process.stdout.write(
    `${JSON.stringify({ summary: true, total: reported.size, ...counts, seconds, specVersion: opts.specVersion ?? null, suiteVersion })}\n`,
  );
  console.error(`${counts.pass + counts.skipped} passed, ${counts.fail + counts.error} failed`);
  process.exit(counts.fail + counts.error > 0 ? 1 : 0);
}

main().catch((error) => {
  console.error(`run.mjs: ${error?.stack ?? error}`);
  process.exit(2);
});
