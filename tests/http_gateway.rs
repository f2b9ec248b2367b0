//! Issue 20 (first part): the gateway served by the daemon over streamable
//! HTTP, with rmcp's streamable HTTP client as the agent: `/mcp/WS` and
//! `/mcp/WS/PROFILE`, admitted by access token (401 with the RFC 9728
//! metadata, 403 for another workspace or profile, revocation).

mod common;

use common::{free_port, Daemon};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

fn daemon() -> (Daemon, String) {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[[profile]]\nname = \"echo-only\"\nexclude_tools = [\"demo__add\"]\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    (d, format!("http://127.0.0.1:{port}"))
}

fn token(d: &Daemon, args: &[&str]) -> String {
    let mut all = vec!["token", "create"];
    all.extend_from_slice(args);
    d.ok(&all).trim().to_string()
}

/// An initialize over plain HTTP: the status and headers of the answer.
async fn raw_initialize(
    url: &str,
    token: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
            .to_string(),
        );
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap_or_default())
}

use common::http_agent as agent;

/// A 2026-07-28 client (`server/discover`, then stateless requests).
async fn stateless_agent(
    url: &str,
    token: &str,
) -> Result<rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>, String> {
    use rmcp::model::{ClientConfig, ProtocolVersion};
    use rmcp::{ClientLifecycleMode, ClientServiceExt};
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token);
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ClientConfig::default()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .map_err(|e| e.to_string())
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_token_lists_and_calls_over_http() {
    let (d, base) = daemon();
    let url = format!("{base}/mcp/default");
    let t = token(&d, &["--name", "agent"]);

    let agent = agent(&url, &t).await.unwrap();
    let tools = agent.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    assert!(names.contains(&"demo__echo".to_string()), "{names:?}");
    let mut args = serde_json::Map::new();
    args.insert("text".into(), Value::from("over http"));
    let result = agent
        .call_tool(CallToolRequestParams::new("demo__echo").with_arguments(args))
        .await
        .unwrap();
    assert!(text_of(&result).contains("over http"), "{result:?}");
    agent.cancel().await.unwrap();
    assert!(!d.log().contains(&t), "the token is in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_valid_token_the_answer_is_401_with_the_resource_metadata() {
    let (d, base) = daemon();
    let url = format!("{base}/mcp/default");

    let (status, headers, _) = raw_initialize(&url, None).await;
    assert_eq!(status, 401);
    let challenge = headers["www-authenticate"].to_str().unwrap().to_string();
    let metadata = format!("{base}/.well-known/oauth-protected-resource/mcp/default");
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&format!("resource_metadata=\"{metadata}\"")),
        "{challenge}"
    );
    let doc: Value = reqwest::get(&metadata).await.unwrap().json().await.unwrap();
    assert_eq!(doc["resource"], url);
    assert_eq!(doc["bearer_methods_supported"], json!(["header"]));

    let (status, headers, body) = raw_initialize(&url, Some("bvt_not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    assert!(headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_token"));

    // Revoked: refused from then on.
    let t = token(&d, &["--name", "short-lived"]);
    let (status, _, body) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 200, "{body}");
    d.ok(&["token", "revoke", "short-lived"]);
    let (status, _, _) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_reaches_only_its_workspace_and_profile() {
    let (d, base) = daemon();
    let elsewhere = token(&d, &["-w", "other"]);
    // Another workspace, existing or not: the same 403, nothing more.
    let (known, _, known_body) =
        raw_initialize(&format!("{base}/mcp/default"), Some(&elsewhere)).await;
    let (unknown, _, unknown_body) =
        raw_initialize(&format!("{base}/mcp/no-such-ws"), Some(&elsewhere)).await;
    assert_eq!((known, unknown), (403, 403));
    assert_eq!(known_body, unknown_body);
    assert!(known_body.contains("insufficient_scope"), "{known_body}");

    // A profile's token: that profile only, with its filter.
    let limited = token(&d, &["--profile", "echo-only"]);
    let (status, _, _) = raw_initialize(&format!("{base}/mcp/default"), Some(&limited)).await;
    assert_eq!(status, 403);
    let agent = agent(&format!("{base}/mcp/default/echo-only"), &limited)
        .await
        .unwrap();
    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"demo__echo".to_string()), "{names:?}");
    assert!(!names.contains(&"demo__add".to_string()), "{names:?}");
    agent.cancel().await.unwrap();
}

/// What the agent was told (the tools list changed).
#[derive(Clone, Default)]
struct Recorder(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ClientHandler for Recorder {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The same `list_changed` as on stdio: a bundle installed while agents
/// are connected is announced on each one's session stream. The
/// endpoint's agents share one look at its lists (a look lists the
/// workspace's every tool): a few looks for eight agents, where each agent
/// once looked for itself at its start and at every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agent_is_told_when_the_tools_change() {
    let (d, base) = daemon();
    let t = token(&d, &[]);
    let looks = |d: &Daemon| common::metric(d, "bundlevisor_gateway_list_looks_total");
    let looked_before = tokio::task::block_in_place(|| looks(&d));
    const AGENTS: usize = 8;
    let mut agents = Vec::new();
    for _ in 0..AGENTS {
        let config = StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp/default"))
            .auth_header(t.clone());
        let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
        let seen = Recorder::default();
        agents.push((seen.clone(), seen.serve(transport).await.unwrap()));
    }
    let before = agents[0].1.list_all_tools().await.unwrap().len();
    let second = d.demo_bundle("second");
    let installing = tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bundlevisor"))
            .arg("--socket")
            .arg(d.root().join("run/bv.sock"))
            .arg("install")
            .arg(&second)
            .output()
            .unwrap();
        assert!(out.status.success());
        d
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let told = || {
        agents
            .iter()
            .filter(|(seen, _)| seen.0.load(std::sync::atomic::Ordering::SeqCst) > 0)
            .count()
    };
    while told() < AGENTS {
        assert!(
            std::time::Instant::now() < deadline,
            "no tools/list_changed for {} of {AGENTS} agents",
            AGENTS - told()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let d = installing.await.unwrap();
    let after = agents[0].1.list_all_tools().await.unwrap().len();
    assert!(after > before, "{before} → {after}");
    let looked = tokio::task::block_in_place(|| looks(&d)) - looked_before;
    assert!(
        (1..AGENTS as u64).contains(&looked),
        "{looked} looks at the lists for {AGENTS} agents"
    );
    for (_, agent) in agents {
        agent.cancel().await.unwrap();
    }
}

/// Each token has its own request rate: beyond it, 429 with `Retry-After`,
/// and another token is not held up by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_beyond_its_rate_gets_429_with_retry_after() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nrate_per_sec = 0.5\nburst = 2\n"
    ));
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let busy = token(&d, &[]);
    for _ in 0..2 {
        let (status, _, body) = raw_initialize(&url, Some(&busy)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, headers, body) = raw_initialize(&url, Some(&busy)).await;
    assert_eq!(status, 429, "{body}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    assert!(body.contains("rate_per_sec"), "{body}");
    let other = token(&d, &[]);
    let (status, _, _) = raw_initialize(&url, Some(&other)).await;
    assert_eq!(status, 200);
}

/// The gateway keeps at most `[http] max_sessions` sessions. Issue 34,
/// point 10: abandoned sessions held every new one off (503) until they
/// idled out after 5 minutes; now the least recently used idle session
/// makes room, and only when every session has a request in progress is a
/// new one refused (503 with `Retry-After`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_and_the_least_recently_used_idle_one_makes_room() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmax_sessions = 2\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let t = token(&d, &[]);
    let mut opened = Vec::new();
    for _ in 0..3 {
        let (status, headers, body) = raw_initialize(&url, Some(&t)).await;
        assert_eq!(status, 200, "{body}");
        opened.push(headers["mcp-session-id"].to_str().unwrap().to_string());
    }
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _) = on_session(&url, &t, &opened[0], list.clone()).await;
    assert_eq!(
        status, 404,
        "the least recently used session was not the one ended"
    );
    let (status, body) = on_session(&url, &t, &opened[1], list).await;
    assert_eq!(status, 200, "{body}");
    // Both remaining sessions busy: nothing can be ended, so 503.
    let _first = in_progress(&url, &t, &opened[1], "demo__progress").await;
    let _second = in_progress(&url, &t, &opened[2], "demo__progress").await;
    let (status, headers, body) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        headers.contains_key("retry-after")
            && body.contains("max_sessions")
            && body.contains("each has a request in progress"),
        "{body}"
    );
}

/// A tool call in progress on `session` (the demo's `progress`, slow):
/// returned once its first progress notification arrived, so the gateway
/// has it; in progress until the response is dropped.
async fn in_progress(url: &str, token: &str, session: &str, tool: &str) -> reqwest::Response {
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _) = on_session(url, token, session, initialized).await;
    assert!(status < 300, "{status}");
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": tool, "arguments": {"steps": 600, "delay_ms": 100},
        "_meta": {"progressToken": "held"}}});
    let mut response = session_post(url, token, session, call).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut seen = String::new();
    while !seen.contains("notifications/progress") {
        let chunk = response
            .chunk()
            .await
            .unwrap()
            .expect("the call's stream ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    response
}

/// A daemon restart ends the 2025-11-25 sessions: the old session id gets
/// 404 (the spec's signal to initialize again), and a new session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_daemon_restart_an_old_session_gets_404() {
    let (mut d, base) = daemon();
    let url = format!("{base}/mcp/default");
    let t = token(&d, &[]);
    let (status, headers, body) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 200, "{body}");
    let session = headers["mcp-session-id"].to_str().unwrap().to_string();
    let list = |session: String| {
        let (url, t) = (url.clone(), t.clone());
        async move {
            reqwest::Client::new()
                .post(&url)
                .bearer_auth(&t)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json")
                .header("Mcp-Session-Id", session)
                .header("MCP-Protocol-Version", "2025-11-25")
                .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(list(session.clone()).await, 200, "the session works before");
    let d = tokio::task::spawn_blocking(move || {
        assert!(d.signal(nix::sys::signal::Signal::SIGTERM).success());
        d.launch();
        d
    })
    .await
    .unwrap();
    assert_eq!(list(session).await, 404);
    let (status, _, body) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 200, "{body}");
    drop(d);
}

/// Issue 33: ending a session with DELETE answers 200 (it was 202, which
/// the Python SDK's client logs as a failed termination: it takes 200, 204
/// or 405), and the ended session is gone (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_answers_200_and_ends_it() {
    let (d, base) = daemon();
    let url = format!("{base}/mcp/default");
    let t = token(&d, &[]);
    let (status, headers, body) = raw_initialize(&url, Some(&t)).await;
    assert_eq!(status, 200, "{body}");
    let session = headers["mcp-session-id"].to_str().unwrap().to_string();
    let deleted = reqwest::Client::new()
        .delete(&url)
        .bearer_auth(&t)
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 200);
    let after = reqwest::Client::new()
        .post(&url)
        .bearer_auth(&t)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(after.status().as_u16(), 404);
    drop(d);
}

/// `[http] tls_cert`/`tls_key`: HTTPS with the operator's certificate (made
/// here by the openssl CLI); plain HTTP on that port gets nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_https_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        // A server certificate, not a CA (rustls refuses a CA as the leaf).
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl CLI (make sysdeps installs it)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        cert.display(),
        key.display()
    ));
    let t = token(&d, &[]);
    let client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let answer = client
        .post(format!("https://127.0.0.1:{port}/mcp/default"))
        .bearer_auth(&t)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "tls", "version": "1"}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let plain = raw_initialize_result(&format!("http://127.0.0.1:{port}/mcp/default"), &t).await;
    assert!(plain.is_err() || plain.is_ok_and(|s| s != 200));

    // Half a TLS identity is refused at start, saying what is missing.
    let config = dir.path().join("half.toml");
    std::fs::write(
        &config,
        format!("state_dir = \"s\"\nsocket = \"s.sock\"\n[http]\nlisten = \"127.0.0.1:{}\"\ntls_cert = \"{}\"\n", free_port(), cert.display()),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bundlevisor"))
        .args(["daemon", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("tls_cert and http.tls_key go together"),
        "{said}"
    );
}

async fn raw_initialize_result(url: &str, token: &str) -> Result<u16, reqwest::Error> {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .map(|r| r.status().as_u16())
}

/// Issue 20, point 7: `/healthz` and `/readyz` on the gateway's listener;
/// `/metrics` there only when `[http] metrics = true` (it names every
/// workspace and bundle, and asks no token), from the same registry as
/// the socket's `metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_opt_in_metrics_share_the_gateway_listener() {
    let (d, base) = daemon();
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move {
            let r = reqwest::get(url).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/healthz").await, (200, "ok\n".to_string()));
    assert_eq!(get("/readyz").await, (200, "ready\n".to_string()));
    assert_eq!(get("/metrics").await.0, 404, "off unless configured");
    drop(d);

    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmetrics = true\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    d.ok(&["call", "demo", "echo", "{\"text\": \"x\"}"]);
    let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    assert!(
        text.contains("bundlevisor_tool_calls_total{workspace=\"default\",bundle=\"demo\"} 1"),
        "{text}"
    );
    let socket = d.ok(&["metrics"]);
    assert!(
        socket.contains("bundlevisor_tool_calls_total{workspace=\"default\",bundle=\"demo\"} 1"),
        "the socket's metrics come from the same registry: {socket}"
    );
}

/// Issue 20, point 2: a 2026-07-28 client — `server/discover`, then
/// stateless requests that carry their own version and capabilities —
/// lists, calls and reads a workspace file on the same endpoint that keeps
/// sessions for 2025-11-25 clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_2026_07_28_client_lists_calls_and_reads() {
    use rmcp::model::{ProtocolVersion, ReadResourceRequestParams};

    let (d, base) = daemon();
    let t = token(&d, &[]);
    let id = d.put_file("stateless.txt", b"read without a session");
    let client = stateless_agent(&format!("{base}/mcp/default"), &t)
        .await
        .expect("a 2026-07-28 client starts");
    assert_eq!(
        client
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.clone()),
        Some(ProtocolVersion::V_2026_07_28)
    );
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "demo__echo"), "{tools:?}");
    let result = client
        .call_tool(
            CallToolRequestParams::new("demo__echo")
                .with_arguments(json!({"text": "stateless"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(text_of(&result), "stateless");
    let read = client
        .read_resource(ReadResourceRequestParams::new(format!("files://{id}")))
        .await
        .unwrap();
    let contents = serde_json::to_value(&read.contents).unwrap();
    assert_eq!(contents[0]["text"], "read without a session", "{contents}");
    client.cancel().await.unwrap();
}

/// The answer to a stateless MCP 2026-07-28 request of an agent that
/// declared no capabilities.
async fn stateless(url: &str, token: &str, method: &str, name: &str, params: Value) -> Value {
    let (_, answers) = common::post_2026(url, token, method, name, params, json!({})).await;
    answers
        .into_iter()
        .find(|a| a["id"] == 7)
        .unwrap_or_else(|| panic!("no answer to {method}"))
}

/// Issue 32, point 1: what an agent on MCP 2026-07-28 gets carries
/// `resultType`, which the revision requires (the Python SDK 2.3 and the
/// TypeScript SDK 2 clients reject a result without it). A bundle on
/// 2025-11-25 and the workspace's files resolver send none; before, the
/// gateway passed their results on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_for_a_2026_07_28_agent_say_their_result_type() {
    let (d, base) = daemon();
    let t = token(&d, &[]);
    let id = d.put_file("typed.txt", b"typed");
    let url = format!("{base}/mcp/default");
    let call = stateless(
        &url,
        &t,
        "tools/call",
        "demo__echo",
        json!({"name": "demo__echo", "arguments": {"text": "typed"}}),
    )
    .await;
    assert_eq!(call["result"]["resultType"], "complete", "{call}");
    assert_eq!(call["result"]["content"][0]["text"], "typed", "{call}");
    let uri = format!("files://{id}");
    let read = stateless(&url, &t, "resources/read", &uri, json!({"uri": uri})).await;
    assert_eq!(read["result"]["resultType"], "complete", "{read}");
    let list = stateless(&url, &t, "tools/list", "", json!({})).await;
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    // A 2025-11-25 session keeps its wire shape: no `resultType`.
    let client = agent(&url, &t).await.unwrap();
    assert_eq!(
        client
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.to_string()),
        Some("2025-11-25".to_string())
    );
    let result = client
        .call_tool(
            CallToolRequestParams::new("demo__echo")
                .with_arguments(json!({"text": "old"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(result.result_type, None, "{result:?}");
    client.cancel().await.unwrap();
}

/// Issue 32, point 1, with a real agent: the Python SDK `mcp` 2.3.0 client
/// in its default mode picks MCP 2026-07-28 and lists, calls and reads a
/// workspace file (before, it refused every result: "CallToolResult.
/// resultType Field required").
#[test]
fn a_python_sdk_2_3_agent_on_2026_07_28_lists_calls_and_reads() {
    let (d, base) = daemon();
    let t = token(&d, &[]);
    let id = d.put_file("py2.txt", b"read by mcp 2.3.0");
    let url = format!("{base}/mcp/default");
    let said = common::mcp_py2("tests/mcp-py2/agent.py", &[&url, &t, &id]);
    assert_eq!(said[0], "protocol 2026-07-28", "{said:?}");
    assert!(said[1].contains("demo__echo"), "{said:?}");
    assert_eq!(said[2], "call from mcp 2.3.0", "{said:?}");
    assert_eq!(said[3], "read read by mcp 2.3.0", "{said:?}");
}

/// A request on session `session` with token `token`: its status and body.
async fn on_session(url: &str, token: &str, session: &str, body: Value) -> (u16, String) {
    let response = session_post(url, token, session, body).await;
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A POST of `body` on session `session` (2025-11-25), as sent.
async fn session_post(url: &str, token: &str, session: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// Issue 30, findings 13 and 14: a session id was served to any token of
/// the endpoint (another token used the first token's session), and one
/// token could take every session of an endpoint. Now a session is its
/// token's (404 to another, as for a session that does not exist), and one
/// token holds at most `max_sessions_per_token`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_13_and_14_a_session_is_its_tokens_and_one_token_cannot_take_every_session() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmax_sessions = 6\nmax_sessions_per_token = 2\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let (first, second) = (token(&d, &[]), token(&d, &[]));
    let (status, headers, body) = raw_initialize(&url, Some(&first)).await;
    assert_eq!(status, 200, "{body}");
    let session = headers["mcp-session-id"].to_str().unwrap().to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _) = on_session(&url, &first, &session, initialized.clone()).await;
    assert!(status < 300, "{status}");
    let (status, body) = on_session(&url, &first, &session, list.clone()).await;
    assert_eq!(status, 200, "the owner uses its session: {body}");
    assert!(body.contains("demo__echo"), "{body}");
    // Another token of the same endpoint: as if the session did not exist.
    let (status, body) = on_session(&url, &second, &session, list.clone()).await;
    assert_eq!(status, 404, "another token was served the session: {body}");
    assert!(!body.contains("demo__echo"), "{body}");

    // The first token may hold 2 sessions: a third ends its own least
    // recently used one (issue 34), never another token's.
    let (status, _, body) = raw_initialize(&url, Some(&second)).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = raw_initialize(&url, Some(&first)).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = raw_initialize(&url, Some(&first)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = on_session(&url, &first, &session, list.clone()).await;
    assert_eq!(status, 404, "the token's oldest session still open: {body}");
    let (status, _, body) = raw_initialize(&url, Some(&second)).await;
    assert_eq!(status, 200, "another token is not locked out: {body}");

    // A 2026-07-28 client opens no session: the first token, at its cap,
    // is still served on that revision.
    let client = stateless_agent(&url, &first)
        .await
        .expect("a 2026-07-28 client of a token at its session cap starts");
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "demo__echo"), "{tools:?}");
}

/// Issue 33: the session caps held per endpoint, so a token reaching a
/// workspace through its bundles' endpoints too held the cap once per
/// endpoint (and the listener `max_sessions` once per endpoint). Now both
/// are counted over the whole listener (at a cap the least recently used
/// idle session makes room, wherever it is), and the endpoint of a bundle
/// that is uninstalled is dropped with its sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_caps_count_over_every_endpoint_and_a_gone_bundles_sessions_end() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmax_sessions = 3\nmax_sessions_per_token = 2\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let workspace = format!("http://127.0.0.1:{port}/mcp/default");
    let bundle = format!("{workspace}/bundle/demo");
    let (first, second) = (token(&d, &[]), token(&d, &[]));
    let open = |url: &str, t: &str| {
        let (url, t) = (url.to_string(), t.to_string());
        async move {
            let (status, headers, body) = raw_initialize(&url, Some(&t)).await;
            assert_eq!(status, 200, "{body}");
            headers["mcp-session-id"].to_str().unwrap().to_string()
        }
    };
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let on_workspace = open(&workspace, &first).await;
    let on_bundle = open(&bundle, &first).await;
    // The token's third session, on the bundle's endpoint, ends its
    // session on the workspace's (per endpoint, it would have had room).
    let third = open(&bundle, &first).await;
    let (status, _) = on_session(&workspace, &first, &on_workspace, list.clone()).await;
    assert_eq!(status, 404, "a session on another endpoint was not counted");
    // The listener holds 3: another token's new one ends the least
    // recently used idle one of anyone's.
    let _theirs = open(&bundle, &second).await;
    let _busy = in_progress(&bundle, &first, &third, "progress").await;
    let more = open(&workspace, &second).await;
    let (status, _) = on_session(&bundle, &first, &on_bundle, list.clone()).await;
    assert_eq!(status, 404, "the listener's cap was not held");

    // The bundle goes: its endpoint's sessions end and free their places.
    drop(_busy);
    d.ok(&["uninstall", "demo"]);
    let (status, body) = on_session(&bundle, &first, &third, list.clone()).await;
    assert_eq!(status, 404, "a session of an uninstalled bundle: {body}");
    // Two places were freed: two new sessions, and no other one ended.
    open(&workspace, &first).await;
    open(&workspace, &first).await;
    let (status, body) = on_session(&workspace, &second, &more, list).await;
    assert_eq!(
        status, 200,
        "ended to make room that the gone bundle freed: {body}"
    );
}

/// A raw POST: the status and body of the answer.
async fn post_raw(url: &str, token: &str, headers: &[(&str, &str)], body: Value) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Issue 32, point 1, on the wire: headers that do not match the body get
/// 400 and the revision's HeaderMismatch error (-32020); a version the
/// gateway does not speak gets 400 and UnsupportedProtocolVersion (-32022)
/// naming the versions it does; lists and reads carry caching hints
/// (`ttlMs`, and `cacheScope: "private"`: what an agent sees depends on
/// its token); `ping` is gone from the revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2026_07_28_wire_rules_hold() {
    let (d, base) = daemon();
    let t = token(&d, &[]);
    let url = format!("{base}/mcp/default");
    let meta = |version: &str| {
        json!({
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {},
        })
    };
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "demo__echo", "arguments": {"text": "x"}, "_meta": meta("2026-07-28")}});
    let (status, body) = post_raw(
        &url,
        &t,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "demo__add"),
        ],
        call.clone(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("-32020") && body.contains("Mcp-Name"),
        "{body}"
    );
    let (status, body) = post_raw(
        &url,
        &t,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
            ("Mcp-Name", "demo__echo"),
        ],
        call,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("-32020") && body.contains("Mcp-Method"),
        "{body}"
    );

    for (headers, params) in [
        (
            vec![
                ("MCP-Protocol-Version", "2099-01-01"),
                ("Mcp-Method", "tools/list"),
            ],
            json!({"_meta": meta("2099-01-01")}),
        ),
        (
            vec![("MCP-Protocol-Version", "1900-01-01")],
            json!({"_meta": meta("1900-01-01")}),
        ),
        // Only the header (as a client of an older revision sends it).
        (vec![("MCP-Protocol-Version", "1900-01-01")], json!({})),
    ] {
        let version = headers[0].1;
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": params});
        let (status, body) = post_raw(&url, &t, &headers, list).await;
        assert_eq!(status, 400, "{version}: {body}");
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("{version}: not JSON-RPC: {body}"));
        assert_eq!(answer["error"]["code"], -32022, "{answer}");
        assert_eq!(answer["error"]["data"]["requested"], version, "{answer}");
        let supported = answer["error"]["data"]["supported"].to_string();
        assert!(
            supported.contains("2026-07-28") && supported.contains("2025-11-25"),
            "{answer}"
        );
    }

    let list = stateless(&url, &t, "tools/list", "", json!({})).await;
    assert!(list["result"]["ttlMs"].is_u64(), "{list}");
    assert_eq!(list["result"]["cacheScope"], "private", "{list}");
    let ping = stateless(&url, &t, "ping", "", json!({})).await;
    assert_eq!(ping["error"]["code"], -32601, "{ping}");
}

/// Issue 33, point 3: a profile with `names = "bare"` shows its bundles'
/// tools under their own names; installing a bundle whose manifest lists
/// a tool another bundle of the profile already shows is refused, naming
/// both; a name two bundles share anyway (a manifest that lists no tools)
/// is shown prefixed for both, never given to one of them silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_profile_shows_own_names_and_refuses_a_collision() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[[profile]]\nname = \"plain\"\nnames = \"bare\"\n"
    ));
    tokio::task::block_in_place(|| d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]));
    let t = tokio::task::block_in_place(|| token(&d, &[]));
    let url = format!("http://127.0.0.1:{port}/mcp/default/plain");
    let names = |client: &rmcp::service::RunningService<rmcp::RoleClient, ()>| {
        let peer = client.peer().clone();
        async move {
            let mut names: Vec<String> = peer
                .list_all_tools()
                .await
                .unwrap()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            names.sort();
            names
        }
    };
    let client = agent(&url, &t).await.unwrap();
    let shown = names(&client).await;
    assert!(
        shown.contains(&"echo".to_string()) && !shown.iter().any(|n| n.contains("__")),
        "{shown:?}"
    );
    let params = CallToolRequestParams::new("echo")
        .with_arguments(json!({"text": "bare"}).as_object().unwrap().clone());
    let answer = client.peer().call_tool(params).await.unwrap();
    assert_eq!(
        serde_json::to_value(&answer).unwrap()["content"][0]["text"],
        "bare"
    );

    let mut manifest: Value = serde_json::from_str(common::DEMO_MANIFEST).unwrap();
    manifest["name"] = json!("other");
    manifest["tools"] = json!([{"name": "echo", "description": "Echo a text"}]);
    let dir = common::write_bundle(&d.root().join("bundles"), "other", &manifest);
    let refused = tokio::task::block_in_place(|| d.cli(&["install", dir.to_str().unwrap()]));
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains(r#"profile "plain" shows tools under their own names"#)
            && said.contains(
                r#"bundle "other" would show tool "echo", which bundle "demo" already shows"#
            ),
        "{said}"
    );
    assert!(tokio::task::block_in_place(|| d.bundle("default", "other")).is_none());

    manifest.as_object_mut().unwrap().remove("tools");
    let dir = common::write_bundle(&d.root().join("bundles"), "other", &manifest);
    tokio::task::block_in_place(|| d.ok(&["install", dir.to_str().unwrap()]));
    let shown = names(&client).await;
    assert!(
        shown.contains(&"demo__echo".to_string())
            && shown.contains(&"other__echo".to_string())
            && !shown.contains(&"echo".to_string()),
        "{shown:?}"
    );
    client.cancel().await.unwrap();
}

/// Issue 33, point 1: who reaches `/mcp/WS/bundle/NAME`. A token of the
/// workspace reaches each bundle as itself; a token bound to a profile
/// reaches only the bundles its profile shows — 403 for another, whether
/// it exists or not (so it learns nothing of bundles it may not use); an
/// unknown bundle is 404 naming it; no token, 401 naming the endpoint's
/// metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_bundle_endpoint_admits_by_token_and_profile() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n[[profile]]\nname = \"only-demo\"\nbundles = [\"demo\"]\n"
    ));
    tokio::task::block_in_place(|| {
        d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
        d.ok(&["install", d.demo_bundle("second").to_str().unwrap()]);
    });
    let (any, bound) = tokio::task::block_in_place(|| {
        (
            token(&d, &[]),
            token(&d, &["--name", "bound", "--profile", "only-demo"]),
        )
    });
    let base = format!("http://127.0.0.1:{port}/mcp/default/bundle");
    // The status, `WWW-Authenticate` and body of an initialize there.
    let status = |path: String, token: Option<String>| async move {
        let (code, headers, body) = raw_initialize(&path, token.as_deref()).await;
        let www = headers
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        (code, www, body)
    };
    assert_eq!(
        status(format!("{base}/demo"), Some(any.clone())).await.0,
        200
    );
    assert_eq!(
        status(format!("{base}/second"), Some(any.clone())).await.0,
        200
    );
    let (code, _, body) = status(format!("{base}/nosuch"), Some(any.clone())).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains(r#"there is no bundle \"nosuch\""#), "{body}");
    assert_eq!(
        status(format!("{base}/demo"), Some(bound.clone())).await.0,
        200
    );
    assert_eq!(
        status(format!("{base}/second"), Some(bound.clone()))
            .await
            .0,
        403
    );
    assert_eq!(
        status(format!("{base}/nosuch"), Some(bound.clone()))
            .await
            .0,
        403
    );
    let (code, www, _) = status(format!("{base}/demo"), None).await;
    assert_eq!(code, 401);
    assert!(
        www.contains("/.well-known/oauth-protected-resource/mcp/default/bundle/demo"),
        "{www}"
    );
    let client = agent(&format!("{base}/demo"), &bound).await.unwrap();
    let names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"echo".to_string()), "{names:?}");
    client.cancel().await.unwrap();
}

/// Issue 34, point 8, as agents see it: a tool call whose bundle dies
/// under it says why (its exit and its telling stderr line), not
/// "Transport closed", to an agent of either MCP revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_told_why_the_bundle_died_under_its_call_on_both_revisions() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    tokio::task::block_in_place(|| {
        d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    });
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let t = token(&d, &[]);
    let crash = |code: i64| {
        let mut args = serde_json::Map::new();
        args.insert("code".into(), Value::from(code));
        CallToolRequestParams::new("demo__crash").with_arguments(args)
    };
    let said = agent(&url, &t)
        .await
        .unwrap()
        .call_tool(crash(5))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        said.contains("exit code 5") && said.contains("crashing on request"),
        "{said}"
    );
    tokio::task::block_in_place(|| d.wait_state("default", "demo", "ready"));
    let said = stateless_agent(&url, &t)
        .await
        .unwrap()
        .call_tool(crash(6))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        said.contains("exit code 6") && said.contains("crashing on request"),
        "{said}"
    );
}

/// Issue 37, point 1: a plain stateless 2026-07-28 tool call is answered
/// below rmcp's service, with the answer rmcp gives (the same request
/// asking for log messages goes through rmcp: compared), and on the same
/// path of policy: a tool the token's rules deny is refused there and
/// audited; a name that routes nowhere and a session's request are rmcp's.
/// A call asking for progress is answered here too: its reports on its
/// own stream, then its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_stateless_call_is_answered_below_rmcp_with_rmcps_answer_and_policy() {
    let (d, base) = daemon();
    let t =
        tokio::task::block_in_place(|| token(&d, &["--name", "direct", "--deny", "tool:demo/add"]));
    let url = format!("{base}/mcp/default");
    let before = common::answered_by(&d);
    let echo = json!({"name": "demo__echo", "arguments": {"text": "below"}});
    let direct = stateless(&url, &t, "tools/call", "demo__echo", echo.clone()).await;
    let after = common::answered_by(&d);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0), "{direct}");
    // The same call asking for log messages: rmcp's answer, the same.
    let mut logged = echo.clone();
    logged["_meta"] = json!({"io.modelcontextprotocol/logLevel": "debug"});
    let by_rmcp = stateless(&url, &t, "tools/call", "demo__echo", logged).await;
    assert_eq!(common::answered_by(&d), (after.0, after.1 + 1));
    assert_eq!(direct, by_rmcp);
    assert_eq!(direct["result"]["content"][0]["text"], "below", "{direct}");

    // Denied by the token's rules, below rmcp too, with the rule named.
    let add = json!({"name": "demo__add", "arguments": {"a": 1, "b": 2}});
    let refused = stateless(&url, &t, "tools/call", "demo__add", add).await;
    assert_eq!(common::answered_by(&d).0, after.0 + 1);
    let why = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("--deny tool:demo/add"), "{refused}");
    let audit = tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the audit lines",
            || {
                let out = d.ok(&["audit", "--json", "--token", "direct"]);
                let lines: Vec<Value> = out
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                (lines.len() >= 3).then_some(lines)
            },
        )
    });
    let outcomes: Vec<&str> = audit
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["ok", "ok", "refused"], "{audit:?}");

    // Not for this path: a name that routes nowhere.
    let nowhere = json!({"name": "demo__nosuch", "arguments": {}});
    let missing = stateless(&url, &t, "tools/call", "demo__nosuch", nowhere).await;
    assert!(missing["error"]["message"].as_str().is_some(), "{missing}");
    assert_eq!(
        common::answered_by(&d).0,
        after.0 + 1,
        "only the plain calls went below rmcp"
    );
    // A progress token keeps a call here: rmcp's answer when the tool
    // reports nothing; its reports, in order, then its answer when it does.
    let mut quiet = echo;
    quiet["_meta"] = json!({"progressToken": "p1"});
    let answer = stateless(&url, &t, "tools/call", "demo__echo", quiet).await;
    assert_eq!(answer, by_rmcp);
    let stepped = json!({"name": "demo__progress", "arguments": {"steps": 2, "delay_ms": 20},
        "_meta": {"progressToken": "p2"}});
    let (status, messages) =
        common::post_2026(&url, &t, "tools/call", "demo__progress", stepped, json!({})).await;
    assert_eq!(status, 200, "{messages:?}");
    let reports: Vec<_> = messages
        .iter()
        .filter(|m| m["params"]["progressToken"] == "p2")
        .map(|m| m["params"]["progress"].as_f64())
        .collect();
    assert_eq!(reports, [Some(1.0), Some(2.0)], "{messages:?}");
    let last = messages.last().expect("an answer");
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(last["result"]["content"][0]["text"], "done after 2 steps");
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    assert_eq!(common::answered_by(&d).0, after.0 + 3);

    // The trace context in `_meta` is read below rmcp too: the call's
    // audit line carries its trace id.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let traced = json!({"name": "demo__echo", "arguments": {"text": "traced"},
        "_meta": {"traceparent": format!("00-{trace_id}-b7ad6b7169203331-01")}});
    let answer = stateless(&url, &t, "tools/call", "demo__echo", traced).await;
    assert_eq!(answer["result"]["content"][0]["text"], "traced", "{answer}");
    assert_eq!(common::answered_by(&d).0, after.0 + 4, "below rmcp");
    let line = tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the traced call's audit",
            || {
                let out = d.ok(&["audit", "--json", "--token", "direct"]);
                out.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .find(|l| l["trace_id"] == trace_id)
            },
        )
    });
    assert_eq!(line["outcome"], "ok", "{line}");
}

/// Issue 37, point 1: a plain `tools/call` on a 2025-11-25 session whose
/// agent declared nothing a bundle could ask of it is answered below rmcp
/// too, as one JSON body, on the session's path of policy: the result rmcp
/// gives the same call, the token's rules; a call asking for progress
/// gets its reports on its own stream, then its answer (rmcp's own client
/// asks for progress with every call: its calls too). An agent
/// that declared sampling stays with rmcp (the bundle's request would go
/// on the call's stream). Such calls keep their session alive for rmcp
/// (`[http] session_idle`, whose timer is rmcp's), and an idle session
/// still ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_on_a_session_is_answered_below_rmcp_and_keeps_it_alive() {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nsession_idle = \"1s\"\n"
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let t = token(&d, &["--name", "sessions", "--deny", "tool:demo/add"]);
    let id = common::raw_session(&url, &t, json!({})).await;
    let echo = |n: u64, text: &str| {
        json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "demo__echo", "arguments": {"text": text}}})
    };
    // Known to the session's gateway once its `initialized` is answered:
    // the first call already goes below rmcp.
    let before = tokio::task::block_in_place(|| common::answered_by(&d));
    let mut n = 11;
    let (status, headers, direct) = common::posted(&url, &t, Some(&id), &echo(n, "below")).await;
    assert_eq!(status, 200, "{direct:?}");
    let after = tokio::task::block_in_place(|| common::answered_by(&d));
    assert_eq!((after.0, after.1), (before.0 + 1, before.1), "{direct:?}");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(direct[0]["result"]["content"][0]["text"], "below");
    // A progress token (rmcp's client sends one with every call) keeps a
    // call below rmcp: one JSON body when the tool reports nothing, the
    // reports on the call's own stream, in order, then its answer when it
    // does.
    let mut quiet = echo(1000, "below");
    quiet["params"]["_meta"] = json!({"progressToken": "p"});
    let (status, headers, answer) = common::posted(&url, &t, Some(&id), &quiet).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(answer[0]["result"], direct[0]["result"]);
    let stepped = json!({"jsonrpc": "2.0", "id": 1001, "method": "tools/call", "params": {
        "name": "demo__progress", "arguments": {"steps": 3, "delay_ms": 20},
        "_meta": {"progressToken": "p"}}});
    let (status, headers, answer) = common::posted(&url, &t, Some(&id), &stepped).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(headers["content-type"], "text/event-stream");
    let reports: Vec<_> = answer
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            (
                m["params"]["progressToken"].clone(),
                m["params"]["progress"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        reports,
        [
            (json!("p"), Some(1.0)),
            (json!("p"), Some(2.0)),
            (json!("p"), Some(3.0))
        ],
        "{answer:?}"
    );
    let last = answer.last().expect("an answer");
    assert_eq!((&last["id"], answer.len()), (&json!(1001), 4), "{answer:?}");
    assert_eq!(last["result"]["content"][0]["text"], "done after 3 steps");
    let now = tokio::task::block_in_place(|| common::answered_by(&d));
    assert_eq!((now.0, now.1), (before.0 + 3, before.1), "{answer:?}");
    // Its events carry ids, tagged with the request's id (its JSON in
    // hex), so an agent whose stream breaks resumes it: the daemon keeps
    // no copy, so the resume is answered with the request's error at once
    // (after a daemon restart, with the session's end), not left waiting.
    let mut again = stepped.clone();
    again["id"] = json!(1002);
    let text = session_post(&url, &t, &id, again)
        .await
        .text()
        .await
        .unwrap();
    let last_id = "direct-3#31303032";
    assert!(text.contains(&format!("id: {last_id}\n")), "{text}");
    let resumed = reqwest::Client::new()
        .get(&url)
        .bearer_auth(&t)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &id)
        .header("MCP-Protocol-Version", "2025-11-25")
        .header("Last-Event-ID", last_id)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status().as_u16(), 200);
    let text = resumed.text().await.unwrap();
    let data = text.lines().find_map(|l| l.strip_prefix("data: "));
    let error: Value = serde_json::from_str(data.unwrap_or_default()).expect(&text);
    assert_eq!(error["id"], 1002, "{text}");
    let why = error["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("send the request again"), "{text}");
    let add = json!({"jsonrpc": "2.0", "id": 2000, "method": "tools/call",
        "params": {"name": "demo__add", "arguments": {"a": 1, "b": 2}}});
    let direct_before = tokio::task::block_in_place(|| common::answered_by(&d)).0;
    let (_, _, refused) = common::posted(&url, &t, Some(&id), &add).await;
    let why = refused[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("--deny tool:demo/add"), "{refused:?}");
    let direct_so_far = tokio::task::block_in_place(|| common::answered_by(&d)).0;
    assert_eq!(direct_so_far, direct_before + 1, "refused below rmcp");

    // The agent cancels a call answered below rmcp by its id, as it would
    // one of rmcp's: the bundle hears it.
    let sleep = json!({"jsonrpc": "2.0", "id": 3000, "method": "tools/call",
        "params": {"name": "demo__sleep", "arguments": {"ms": 30000}}});
    let sleeping = tokio::spawn({
        let (url, t, id) = (url.clone(), t.clone(), id.clone());
        async move { common::posted(&url, &t, Some(&id), &sleep).await }
    });
    let logged = |what: &str| {
        tokio::task::block_in_place(|| {
            common::wait_for(std::time::Duration::from_secs(10), what, || {
                d.ok(&["logs", "demo", "-n", "50"])
                    .contains(what)
                    .then_some(())
            })
        })
    };
    logged("sleeping 30000 ms");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 3000, "reason": "test"}});
    common::posted(&url, &t, Some(&id), &cancel).await;
    logged("sleep of 30000 ms cancelled by the client");
    let (status, _, _) = sleeping.await.unwrap();
    assert_eq!(status, 200);
    let direct_so_far = tokio::task::block_in_place(|| common::answered_by(&d)).0;
    assert_eq!(
        direct_so_far,
        direct_before + 2,
        "the sleep went below rmcp"
    );

    // The trace context in a session call's `_meta` is read below rmcp
    // too, as a stateless call's: its audit line carries the trace id.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut traced = echo(3001, "traced");
    traced["params"]["_meta"] =
        json!({"traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")});
    let (status, _, answer) = common::posted(&url, &t, Some(&id), &traced).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(answer[0]["result"]["content"][0]["text"], "traced");
    let direct_so_far = tokio::task::block_in_place(|| common::answered_by(&d)).0;
    assert_eq!(
        direct_so_far,
        direct_before + 3,
        "the traced call went below rmcp"
    );
    let line = tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the traced call's audit",
            || {
                let out = d.ok(&["audit", "--json", "--token", "sessions"]);
                out.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .find(|l| l["trace_id"] == trace_id)
            },
        )
    });
    assert_eq!(line["outcome"], "ok", "{line}");

    // Calls below rmcp only, for longer than the idle time: one every
    // 200 ms for 2.5 s, and the session lives.
    let until = std::time::Instant::now() + std::time::Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        n += 1;
        let (status, _, messages) = common::posted(&url, &t, Some(&id), &echo(n, "alive")).await;
        assert_eq!(status, 200, "the session ended while in use: {messages:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (direct_now, _) = tokio::task::block_in_place(|| common::answered_by(&d));
    assert!(
        direct_now > direct_so_far + 5,
        "{direct_now} {direct_so_far}"
    );
    // One call below rmcp whose progress streams for 2.5 times the idle
    // time, and nothing else: the session lives on.
    let long = json!({"jsonrpc": "2.0", "id": 4000, "method": "tools/call", "params": {
        "name": "demo__progress", "arguments": {"steps": 13, "delay_ms": 200},
        "_meta": {"progressToken": "long"}}});
    let (status, _, streamed) = common::posted(&url, &t, Some(&id), &long).await;
    assert_eq!(status, 200, "{streamed:?}");
    assert_eq!(streamed.len(), 14, "{streamed:?}");
    n += 1;
    let (status, _, after) = common::posted(&url, &t, Some(&id), &echo(n, "after")).await;
    assert_eq!(
        status, 200,
        "the session ended under a call's stream: {after:?}"
    );
    // Idle for three times that (any request would be use): ended.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let (status, _, _) = common::posted(&url, &t, Some(&id), &echo(9000, "idle")).await;
    assert_eq!(status, 404, "an idle session lives on");

    // An agent that declared sampling (its session known, as above): rmcp's.
    let asking = common::raw_session(&url, &t, json!({"sampling": {}})).await;
    let (direct_before, rmcp_before) = tokio::task::block_in_place(|| common::answered_by(&d));
    let (status, _, answer) = common::posted(&url, &t, Some(&asking), &echo(11, "below")).await;
    assert_eq!(status, 200);
    let result = answer.iter().find(|m| m["id"] == 11).expect("an answer");
    // rmcp's answer to the same call is the one given below it.
    assert_eq!(result["result"], direct[0]["result"], "{answer:?}");
    let (direct_after, rmcp_after) = tokio::task::block_in_place(|| common::answered_by(&d));
    assert_eq!((direct_after, rmcp_after), (direct_before, rmcp_before + 1));

    // rmcp's own client puts a progress token in every call: its calls
    // are answered below rmcp too.
    let client = agent(&url, &t).await.unwrap();
    let mut args = serde_json::Map::new();
    args.insert("text".into(), json!("from rmcp"));
    let call = CallToolRequestParams::new("demo__echo").with_arguments(args);
    let (direct_before, _) = tokio::task::block_in_place(|| common::answered_by(&d));
    let result = client.call_tool(call).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "from rmcp"
    );
    let (direct_after, _) = tokio::task::block_in_place(|| common::answered_by(&d));
    assert_eq!(
        direct_after,
        direct_before + 1,
        "rmcp's client went through rmcp"
    );
    client.cancel().await.unwrap();
}

/// Issue 37, point 1: a call answered below rmcp's server is made below
/// rmcp's client too. The bundle is asked with an id of the daemon's own
/// (`"bv-N"`, where rmcp's client numbers its requests) and its answer is
/// written on as it came, in the revision's shape: the same answer rmcp
/// gives, a tool error audited as one, and a 2025-11-25 session's answer
/// without `resultType`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answered_below_rmcp_is_spliced_through_to_the_bundle() {
    let (d, base) = daemon();
    // The bundle's stdin, copied to its stderr (its log) on the way in.
    let copy = r#"while IFS= read -r l; do printf '%s\n' "$l" >&2; printf '%s\n' "$l"; done |"#;
    let teed = common::shell_wrapped_demo(&d.root().join("src"), "teed", copy);
    tokio::task::block_in_place(|| d.ok(&["install", teed.to_str().unwrap()]));
    let t = tokio::task::block_in_place(|| token(&d, &["--name", "spliced"]));
    let url = format!("{base}/mcp/default");
    let echo = json!({"name": "teed__echo", "arguments": {"text": "spliced"}});
    let before = tokio::task::block_in_place(|| common::answered_by(&d));
    let spliced = stateless(&url, &t, "tools/call", "teed__echo", echo.clone()).await;
    // The same call asking for log messages: rmcp's, by rmcp's client.
    let mut logged = echo;
    logged["_meta"] = json!({"io.modelcontextprotocol/logLevel": "debug"});
    let typed = stateless(&url, &t, "tools/call", "teed__echo", logged).await;
    let after = tokio::task::block_in_place(|| common::answered_by(&d));
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    assert_eq!(spliced, typed);
    assert_eq!(spliced["result"]["resultType"], "complete", "{spliced}");
    let asked = |what: &str| {
        let logs = d.ok(&["logs", "teed", "-n", "200"]);
        logs.lines()
            .filter(|l| l.contains(r#""method":"tools/call""#) && l.contains(what))
            .map(|l| {
                let at = l.find('{').unwrap_or_default();
                serde_json::from_str::<Value>(&l[at..]).unwrap_or(Value::Null)["id"].clone()
            })
            .collect::<Vec<_>>()
    };
    let ids = tokio::task::block_in_place(|| {
        common::wait_for(std::time::Duration::from_secs(10), "both calls", || {
            let ids = asked("spliced");
            (ids.len() == 2).then_some(ids)
        })
    });
    assert!(
        ids[0].as_str().is_some_and(|id| id.starts_with("bv-")),
        "{ids:?}"
    );
    assert!(ids[1].is_number(), "{ids:?}");

    // A tool error: as the bundle wrote it, audited as one.
    let fail = json!({"name": "teed__fail", "arguments": {"message": "no luck"}});
    let failed = stateless(&url, &t, "tools/call", "teed__fail", fail).await;
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert_eq!(failed["result"]["content"][0]["text"], "no luck");
    let audit = tokio::task::block_in_place(|| {
        common::wait_for(std::time::Duration::from_secs(10), "the audit", || {
            let out = d.ok(&["audit", "--json", "--token", "spliced"]);
            let lines: Vec<Value> = out
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            (lines.len() >= 3).then_some(lines)
        })
    });
    assert_eq!(audit[2]["outcome"], "tool_error", "{audit:?}");
    assert_eq!(tokio::task::block_in_place(|| asked("no luck")).len(), 1);

    // On a 2025-11-25 session: no `resultType`, as rmcp answers there.
    let id = common::session_below_rmcp(&d, &url, &t).await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "teed__echo", "arguments": {"text": "on a session"}}});
    let (status, _, answer) = common::posted(&url, &t, Some(&id), &call).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(answer[0]["result"]["content"][0]["text"], "on a session");
    assert!(
        answer[0]["result"].get("resultType").is_none(),
        "{answer:?}"
    );
    let on_session = tokio::task::block_in_place(|| asked("on a session"));
    assert!(
        on_session[0]
            .as_str()
            .is_some_and(|id| id.starts_with("bv-")),
        "{on_session:?}"
    );

    // An agent that goes away mid-call (its connection closed): the call,
    // the connection's own work, goes with it; the bundle hears that its
    // call (by the daemon's id) is cancelled, and the call is audited as
    // failed.
    let errors = |d: &Daemon| {
        let series = r#"bundlevisor_tool_call_errors_total{workspace="default",bundle="teed"}"#;
        common::metric(d, series)
    };
    let errors_before = tokio::task::block_in_place(|| errors(&d));
    let sleep = json!({"name": "teed__sleep", "arguments": {"ms": 30000}});
    let leaving = tokio::spawn({
        let (url, t) = (url.clone(), t.clone());
        async move { common::post_2026(&url, &t, "tools/call", "teed__sleep", sleep, json!({})).await }
    });
    let logged = |what: &str| {
        tokio::task::block_in_place(|| {
            common::wait_for(std::time::Duration::from_secs(10), what, || {
                let logs = d.ok(&["logs", "teed", "-n", "400"]);
                logs.lines().find(|l| l.contains(what)).map(str::to_string)
            })
        })
    };
    logged("sleeping 30000 ms");
    leaving.abort();
    let _ = leaving.await;
    logged("sleep of 30000 ms cancelled by the client");
    let cancelled = logged(r#""method":"notifications/cancelled""#);
    assert!(cancelled.contains(r#""requestId":"bv-"#), "{cancelled}");
    let audit = tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the sleep's audit",
            || {
                let out = d.ok(&["audit", "--json", "--token", "spliced"]);
                out.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .find(|l| l["name"] == "sleep")
            },
        )
    });
    assert_eq!(audit["outcome"], "error", "{audit}");
    // Counted as a call that failed, as the audit says.
    tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the sleep counted",
            || (errors(&d) == errors_before + 1).then_some(()),
        )
    });

    // The same on the 2025-11-25 session: its call dropped with the
    // agent's connection, cancelled at the bundle, audited and counted.
    let sleep = json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call",
        "params": {"name": "teed__sleep", "arguments": {"ms": 30001}}});
    let leaving = tokio::spawn({
        let (url, t, id) = (url.clone(), t.clone(), id.clone());
        async move { common::posted(&url, &t, Some(&id), &sleep).await }
    });
    logged("sleeping 30001 ms");
    leaving.abort();
    let _ = leaving.await;
    logged("sleep of 30001 ms cancelled by the client");
    tokio::task::block_in_place(|| {
        common::wait_for(
            std::time::Duration::from_secs(10),
            "the session's sleep audited and counted",
            || {
                let out = d.ok(&["audit", "--json", "--token", "spliced"]);
                let failed = out
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .filter(|l| l["name"] == "sleep" && l["outcome"] == "error")
                    .count();
                (failed == 2 && errors(&d) == errors_before + 2).then_some(())
            },
        )
    });
}
