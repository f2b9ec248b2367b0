//! Issue 36, traces: the daemon's spans exported over OTLP to a real
//! receiver, Arize Phoenix 20.26.1 (`make phoenix`), and read back from
//! its REST API. One trace spans agent, daemon and bundle: a real agent
//! (the TypeScript SDK 2, on MCP 2026-07-28 over HTTP and on 2025-11-25
//! over stdio) sends its `traceparent` in `_meta`; the gateway's span
//! continues it, its request to the bundle is a child, the bundle is given
//! that child's context (the demo's `trace` tool shows what it got), and
//! the bundle's host-resources read, carrying it on, is the child's child.
//! Also: the HTTP `traceparent` header, a bundle's start (sandbox, spawn,
//! handshake), an OAuth token obtained for a remote bundle, the audit's
//! trace id, a tool error, and a collector's key never shown. With tracing
//! off the agent's context still reaches the bundle unchanged.

mod common;
#[path = "common/remote.rs"]
mod fixture;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{assert_no_canary, free_port, installed, wait_for, Daemon, BIN};
use serde_json::{json, Value};

/// A collector's key, sent with every export: never in a log or status.
const KEY: &str = "otlp-CANARY-5d1c07e2";

/// A Phoenix server of the test's own (ports, working folder), stopped
/// when dropped.
struct Phoenix {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on a loopback port: the status and the body, or None when
/// nothing listens yet.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some((status, body.to_string()))
}

impl Phoenix {
    fn start() -> Phoenix {
        let bin = installed("target/phoenix/venv/bin/phoenix", "phoenix");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("phoenix.log")).unwrap();
        let mut child = Command::new(bin)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("phoenix starts");
        let log = dir.path().join("phoenix.log");
        wait_for(Duration::from_secs(180), "Phoenix to answer", || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "phoenix exited ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            get(port, "/healthz").filter(|(s, _)| *s == 200)
        });
        Phoenix {
            child,
            port,
            _dir: dir,
        }
    }

    /// The OTLP/HTTP endpoint (the daemon appends `/v1/traces`).
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span of `trace_id` in `project`, once `done` holds for them.
    fn trace(&self, project: &str, trace_id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.spans_where(project, &format!("trace_id={trace_id}"), done)
    }

    /// The spans of `project` matching `query`, once `done` holds for them
    /// (spans go in batches, and Phoenix stores them in the background).
    fn spans_where(
        &self,
        project: &str,
        query: &str,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let path = format!("/v1/projects/{project}/spans?limit=1000&{query}");
        let mut last = String::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(Duration::from_secs(30), "the spans in Phoenix", || {
                let (status, body) = get(self.port, &path)?;
                last = format!("{status} {body}");
                if status != 200 {
                    return None;
                }
                let page: Value = serde_json::from_str(&body).ok()?;
                let spans = page["data"].as_array()?.clone();
                done(&spans).then_some(spans)
            })
        }));
        found.unwrap_or_else(|_| panic!("GET {path}: the spans never matched; last answer: {last}"))
    }
}

/// A span's attribute (Phoenix answers them flat or nested by dots).
fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    let flat = &span["attributes"][key];
    if !flat.is_null() {
        return flat;
    }
    key.split('.')
        .try_fold(&span["attributes"], |v, k| v.get(k))
        .unwrap_or(&Value::Null)
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn span_id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap()
}

/// A W3C `traceparent` of a new trace: (header, trace id, span id).
fn new_traceparent() -> (String, String, String) {
    let hex = |n| {
        (0..n)
            .map(|_| format!("{:x}", fastrand::u8(0..16)))
            .collect::<String>()
    };
    let (trace, span) = (hex(32), hex(16));
    (format!("00-{trace}-{span}-01"), trace, span)
}

/// Runs the TypeScript SDK 2 agent (tests/ts-sdk2/traced.mjs); what it saw.
fn traced_agent(args: &[&str]) -> Value {
    let script = installed("target/ts-sdk2/traced.mjs", "ts-sdk2");
    let out = Command::new("node")
        .arg(script)
        .args(args)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "traced.mjs {args:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

/// A daemon exporting to `phoenix` under `project`, with the HTTP gateway
/// on `port` and the demo bundle installed; the workspace file's URI.
fn traced_daemon(phoenix: &Phoenix, project: &str, port: u16) -> (Daemon, String) {
    let d = Daemon::start_with(&format!(
        "[telemetry]\notlp_endpoint = \"{}\"\nheaders = {{ \"x-project-name\" = \"{project}\", \"x-api-key\" = \"{KEY}\" }}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        phoenix.endpoint()
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let file = d.root().join("note.txt");
    std::fs::write(&file, "traced").unwrap();
    let put: Value =
        serde_json::from_str(&d.ok(&["files", "put", file.to_str().unwrap(), "--json"])).unwrap();
    let uri = format!("files://{}", put["id"].as_str().unwrap());
    (d, uri)
}

/// The agent's call, as Phoenix has it: the gateway's span continues the
/// agent's, its request to the bundle is the child the bundle was given,
/// and the bundle's host-resources read (carrying that context on) is the
/// child's child.
fn assert_one_trace(
    phoenix: &Phoenix,
    project: &str,
    seen: &Value,
    agent: (&str, &str),
    revision: &str,
) {
    let (trace_id, agent_span) = agent;
    let spans = phoenix.trace(project, trace_id, |s| {
        named(s, "tools/call trace").len() == 2
            && named(s, "tools/call host_read").len() == 2
            && !named(s, "host-resources ai.nimblebrain/resources/read").is_empty()
    });
    let by_kind = |name: &str| -> (Value, Value) {
        let both = named(&spans, name);
        let server = both
            .iter()
            .find(|s| s["parent_id"] == agent_span)
            .unwrap_or_else(|| panic!("no {name} span under the agent's: {spans:#?}"));
        let client = both
            .iter()
            .find(|s| s["parent_id"] == span_id(server))
            .unwrap_or_else(|| panic!("no {name} span under the gateway's: {spans:#?}"));
        ((*server).clone(), (*client).clone())
    };
    let (server, client) = by_kind("tools/call trace");
    assert_eq!(
        attribute(&server, "bundlevisor.workspace"),
        "default",
        "{server:#}"
    );
    assert_eq!(
        attribute(&server, "bundlevisor.bundle"),
        "demo",
        "{server:#}"
    );
    assert_eq!(
        attribute(&server, "gen_ai.tool.name"),
        "trace",
        "{server:#}"
    );
    assert_eq!(
        attribute(&server, "bundlevisor.outcome"),
        "ok",
        "{server:#}"
    );
    assert_eq!(
        attribute(&server, "mcp.protocol.version"),
        revision,
        "{server:#}"
    );
    assert_eq!(server["status_code"], "OK", "{server:#}");
    // What the bundle was given: the agent's trace, under the daemon's
    // request to it, and the agent's tracestate.
    let given = seen["bundle_saw"]["traceparent"].as_str().unwrap();
    assert_eq!(
        given,
        format!("00-{trace_id}-{}-01", span_id(&client)),
        "{seen}"
    );
    assert_eq!(seen["bundle_saw"]["tracestate"], "agent=1", "{seen}");
    let (_, client) = by_kind("tools/call host_read");
    let read = named(&spans, "host-resources ai.nimblebrain/resources/read")[0];
    assert_eq!(read["parent_id"], span_id(&client), "{spans:#?}");
    assert_eq!(attribute(read, "bundlevisor.bundle"), "demo", "{read:#}");
    assert_eq!(attribute(read, "bundlevisor.outcome"), "ok", "{read:#}");
    assert_eq!(seen["read_error"], false, "{seen}");
}

/// A stateless MCP 2026-07-28 `tools/call` with a `traceparent` header and
/// none in `_meta`: its answer.
async fn call_with_header(url: &str, token: &str, tool: &str, traceparent: &str) -> Value {
    let params = json!({"name": tool, "arguments": {"text": "hi"}});
    let headers = [("traceparent", traceparent)];
    let (status, messages) = common::post_2026_with(
        url,
        token,
        ("tools/call", tool),
        params,
        json!({}),
        &headers,
    )
    .await;
    assert_eq!(status, 200, "{messages:?}");
    let answer = messages.iter().find(|m| m.get("id").is_some());
    answer
        .cloned()
        .unwrap_or_else(|| panic!("no answer in {messages:?}"))
}

/// A bundle's start is a trace of its own: the sandbox, the spawn and the
/// handshake are its children, each ended ok.
fn assert_start_traced(phoenix: &Phoenix, project: &str) {
    let starts = phoenix.spans_where(project, "name=bundle.start", |s| {
        s.iter()
            .any(|s| attribute(s, "bundlevisor.bundle") == "demo")
    });
    let start = starts
        .iter()
        .find(|s| attribute(s, "bundlevisor.bundle") == "demo")
        .unwrap();
    assert_eq!(start["parent_id"], Value::Null, "{start:#}");
    assert_eq!(attribute(start, "bundlevisor.outcome"), "ok", "{start:#}");
    // The demo uses host-resources: it is spoken to on 2025-11-25.
    assert_eq!(
        attribute(start, "mcp.protocol.version"),
        "2025-11-25",
        "{start:#}"
    );
    let trace_id = start["context"]["trace_id"].as_str().unwrap();
    let spans = phoenix.trace(project, trace_id, |s| s.len() >= 4);
    for phase in ["bundle.sandbox", "bundle.spawn", "initialize"] {
        let span = named(&spans, phase);
        assert_eq!(span.len(), 1, "{phase}: {spans:#?}");
        assert_eq!(span[0]["parent_id"], span_id(start), "{phase}: {spans:#?}");
        assert_eq!(
            attribute(span[0], "bundlevisor.outcome"),
            "ok",
            "{phase}: {spans:#?}"
        );
    }
    assert!(
        attribute(named(&spans, "bundle.spawn")[0], "process.pid").is_number(),
        "{spans:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_agent_daemon_and_bundle_in_a_real_receiver() {
    let phoenix = tokio::task::spawn_blocking(Phoenix::start).await.unwrap();
    let project = "bundlevisor-test";
    let port = free_port();
    let (d, uri) = {
        let phoenix = &phoenix;
        tokio::task::block_in_place(|| traced_daemon(phoenix, project, port))
    };
    let token = d
        .ok(&["token", "create", "--name", "traced-agent"])
        .trim()
        .to_string();
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    tokio::task::block_in_place(|| {
        assert_start_traced(&phoenix, project);
        // A 2026-07-28 agent over HTTP, a 2025-11-25 one over stdio.
        let socket = d.socket.to_str().unwrap().to_string();
        for (revision, transport, first, second) in [
            ("2026-07-28", "http", url.as_str(), token.as_str()),
            ("default", "stdio", BIN, socket.as_str()),
        ] {
            let (traceparent, trace_id, agent_span) = new_traceparent();
            let seen = traced_agent(&[revision, transport, first, second, &traceparent, &uri]);
            let spoken = if revision == "default" {
                "2025-11-25"
            } else {
                revision
            };
            assert_eq!(seen["protocol"], spoken, "{seen}");
            assert_one_trace(&phoenix, project, &seen, (&trace_id, &agent_span), spoken);
        }
    });

    // The HTTP header, when `_meta` has none; a tool error ends its span
    // in error.
    let (traceparent, trace_id, agent_span) = new_traceparent();
    let answer = call_with_header(&url, &token, "demo__fail", &traceparent).await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    tokio::task::block_in_place(|| {
        let spans = phoenix.trace(project, &trace_id, |s| s.len() >= 2);
        let server = spans
            .iter()
            .find(|s| s["parent_id"] == agent_span.as_str())
            .unwrap_or_else(|| panic!("{spans:#?}"));
        assert_eq!(server["name"], "tools/call fail", "{server:#}");
        assert_eq!(
            attribute(server, "bundlevisor.outcome"),
            "tool_error",
            "{server:#}"
        );
        assert_eq!(
            attribute(server, "bundlevisor.principal"),
            "token:traced-agent",
            "{server:#}"
        );
        assert_eq!(server["status_code"], "ERROR", "{server:#}");
    });

    // A call that carries no context: the daemon's own trace, whose id
    // the audit line records.
    let agent = common::http_agent(&url, &token).await.unwrap();
    let echo = rmcp::model::CallToolRequestParams::new("demo__echo")
        .with_arguments(json!({"text": "untraced"}).as_object().unwrap().clone());
    agent.call_tool(echo).await.unwrap();
    agent.cancel().await.unwrap();
    tokio::task::block_in_place(|| {
        let line = wait_for(Duration::from_secs(10), "the echo's audit line", || {
            let out = d.ok(&["audit", "--json", "--token", "traced-agent"]);
            out.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|l| l["name"] == "echo")
        });
        let trace_id = line["trace_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{line}"));
        let spans = phoenix.trace(project, trace_id, |s| s.len() >= 2);
        let root = spans.iter().find(|s| s["parent_id"].is_null()).unwrap();
        assert_eq!(root["name"], "tools/call echo", "{spans:#?}");
    });

    // A remote bundle that needs a token: obtaining it is a span of its start.
    tokio::task::block_in_place(|| oauth_traced(&phoenix, project, &d));

    tokio::task::block_in_place(|| {
        let status = d.ok(&["status", "--json"]);
        let log = d.log();
        assert_no_canary(
            &format!("status and log\n{status}\n{log}"),
            (status + &log).as_bytes(),
        );
        assert!(!d.log().contains(KEY));
    });
}

/// A remote bundle (the OAuth fixture) with client credentials: its start
/// obtains a token, and that is a span of the start's trace.
fn oauth_traced(phoenix: &Phoenix, project: &str, d: &Daemon) {
    let fx = fixture::Fixture::start(Some(("bv-daemon", "cs-trace-secret")));
    let file = json!({
        "name": "notes",
        "url": fx.mcp_url,
        "description": "fixture",
        "auth": {"client_id": "bv-daemon", "client_secret": "cs-trace-secret"},
    });
    let path = d.root().join("bundles").join("notes.json");
    std::fs::write(&path, file.to_string()).unwrap();
    d.ok(&["install", path.to_str().unwrap()]);
    d.wait_state("default", "notes", "ready");
    let refreshes = phoenix.spans_where(project, "name=oauth.refresh", |s| !s.is_empty());
    let refresh = &refreshes[0];
    assert_eq!(
        attribute(refresh, "bundlevisor.outcome"),
        "ok",
        "{refresh:#}"
    );
    assert_eq!(
        attribute(refresh, "server.address"),
        "127.0.0.1",
        "{refresh:#}"
    );
    let trace_id = refresh["context"]["trace_id"].as_str().unwrap();
    let spans = phoenix.trace(project, trace_id, |s| {
        s.iter().any(|s| s["name"] == "bundle.start")
    });
    let start = named(&spans, "bundle.start")[0];
    assert_eq!(refresh["parent_id"], span_id(start), "{spans:#?}");
    assert_eq!(attribute(start, "bundlevisor.bundle"), "notes", "{start:#}");
    assert!(!serde_json::to_string(&spans)
        .unwrap()
        .contains("cs-trace-secret"));
}

/// Tracing off (the default): the agent's context reaches the bundle as
/// the agent sent it. A bad `[telemetry]` is refused at start, with the fix.
#[test]
fn with_tracing_off_the_agents_context_reaches_the_bundle_unchanged() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let token = d.ok(&["token", "create"]).trim().to_string();
    let (traceparent, _, _) = new_traceparent();
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let seen = traced_agent(&[
        "2026-07-28",
        "http",
        &url,
        &token,
        &traceparent,
        "files://none",
    ]);
    assert_eq!(seen["bundle_saw"]["traceparent"], traceparent, "{seen}");
    assert_eq!(seen["bundle_saw"]["tracestate"], "agent=1", "{seen}");

    // A collector that is not there: said once in the log, calls unharmed.
    let closed = free_port();
    let d = Daemon::start_with(&format!(
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{closed}\"\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    for _ in 0..3 {
        assert_eq!(
            d.ok(&["call", "demo", "echo", r#"{"text":"hi"}"#]).trim(),
            "hi"
        );
    }
    wait_for(
        Duration::from_secs(20),
        "the failed export in the log",
        || {
            d.log()
                .contains("an export to the collector failed")
                .then_some(())
        },
    );
    assert_eq!(
        d.log().matches("an export to the collector failed").count(),
        1
    );

    for (bad, says) in [
        (
            "otlp_endpoint = \"ftp://collector\"",
            "is not an http:// or https:// URL",
        ),
        (
            "otlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 2.0",
            "must be between 0 and 1",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bv.toml");
        std::fs::write(
            &config,
            format!("state_dir = \"state\"\nsocket = \"bv.sock\"\n[telemetry]\n{bad}\n"),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["daemon", "--config", config.to_str().unwrap()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {stderr}");
        assert!(stderr.contains(says), "{bad}: {stderr}");
    }
}
