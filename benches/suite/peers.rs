//! The gateways an operator would pick instead, side by side with ours in
//! the same run (issue 37, point 3; `BENCH_ONLY=peers`). The same demo
//! bundle behind each, every one pinned and installed by `make
//! bench-peers`:
//!
//! - supergateway 4.0.0 (npm), streamable HTTP, `--stateful`;
//! - mcp-proxy 0.13.0 (PyPI), streamable HTTP;
//! - IBM ContextForge 1.1.0 (PyPI): the bundle as a stdio server the way
//!   its documentation registers one — its own `mcpgateway.translate`
//!   bridge in front of the command, that bridge registered as a gateway,
//!   its `echo` tool put in a virtual server, and agents at the virtual
//!   server's `/servers/ID/mcp` with a JWT made by its own tool;
//! - mcp-hub 4.2.1 (npm): the bundle in its `mcpServers` file; agents at
//!   its `/mcp`, which is MCP's SSE transport (a GET stream, POSTs to
//!   `/messages`).
//!
//! For each: the median of one `tools/call` over HTTP, in rounds
//! alternating with the bundle called directly (the floor) and with ours,
//! by an MCP client library (rmcp's; for mcp-hub a hand-made SSE client)
//! and by a lean agent (requests written by hand on one connection, as
//! `wrk` sends them; for mcp-hub its REST call, its fastest way in);
//! calls per second at 100 agents (wrk, as the throughput scenario:
//! a session's JSON-RPC POSTs, or for mcp-hub its REST call
//! `POST /api/servers/tools`, since its SSE transport answers on another
//! stream than the request's); and the RSS of its own processes (not the
//! bundle's, as the daemon's RSS does not count its bundles). Target: ours
//! ≥ 3× lower in overhead over the floor and ≥ 3× in calls per second.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::harness::{rss_kib, summarize, Summary, DEMO};
use crate::report::{Row, Target};
use crate::throughput::{self, Load};

/// Agents for the throughput figure.
const AGENTS: usize = 100;
/// How much better ours must be.
const FACTOR: f64 = 3.0;

/// One peer, started, with what it takes to call it.
pub struct Peer {
    pub name: &'static str,
    children: Groups,
    agent: Agent,
    load: Load,
    _dir: tempfile::TempDir,
}

/// An MCP client of one endpoint.
pub enum Agent {
    Streamable(RunningService<RoleClient, ()>, String),
    Sse(SseAgent),
}

impl Agent {
    /// `n` echo calls after 50 unmeasured ones.
    pub async fn calls(&mut self, n: usize) -> Vec<Duration> {
        match self {
            Agent::Streamable(client, tool) => crate::echo_calls(client, tool, n).await,
            Agent::Sse(agent) => {
                let mut sample = Vec::with_capacity(n);
                for i in 0..n + 50 {
                    let start = Instant::now();
                    agent.echo().await;
                    if i >= 50 {
                        sample.push(start.elapsed());
                    }
                }
                sample
            }
        }
    }

    pub async fn close(self) {
        match self {
            Agent::Streamable(client, _) => {
                let _ = client.cancel().await;
            }
            Agent::Sse(agent) => agent.reader.abort(),
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target")
}

/// Spawns `command` quietly in a process group of its own (its workers
/// and bundle with it: [`Peer`]'s drop kills the group), with a clear word
/// when the peer is not installed.
fn spawn(mut command: Command, which: &str) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{which} is not installed ({e}); run `make bench-peers`"))
}

/// A peer's processes: dropped, the whole of each one's process group is
/// killed (ContextForge's workers and every peer's bundle would outlive a
/// killed leader).
struct Groups(Vec<Child>);

impl Drop for Groups {
    fn drop(&mut self) {
        for child in &self.0 {
            if let Some(pid) = child.id() {
                let group = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

/// Until something accepts connections on `port` (Node and Python start
/// slowly; ContextForge migrates its database first).
async fn listening(port: u16, which: &str, children: &mut [Child]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        for child in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{which} exited before it listened on {port}: {status}");
            }
        }
        assert!(
            Instant::now() < deadline,
            "{which} did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An MCP session opened by hand, for wrk: `initialize` and
/// `notifications/initialized` over `url`, giving the headers each later
/// request carries (the session's id where the peer keeps one, the
/// version it chose, `extra`).
async fn session_headers(url: &str, extra: &[(String, String)]) -> Vec<(String, String)> {
    let http = reqwest::Client::new();
    let post = |body: Value, headers: &[(String, String)]| {
        let mut r = http
            .post(url)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "bundlevisor-bench", "version": "1"}}});
    let answer = post(init, extra).await.expect("initialize");
    let session = answer
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = answer.text().await.expect("initialize's answer");
    let version = text
        .split("\"protocolVersion\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no protocol version in {text}"))
        .to_string();
    let mut headers = extra.to_vec();
    headers.push(("MCP-Protocol-Version".into(), version));
    if let Some(id) = session {
        headers.push(("Mcp-Session-Id".into(), id));
    }
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(initialized, &headers).await.expect("initialized");
    headers
}

/// A `tools/call` of `tool` echoing `ping`, without an id (wrk numbers it).
fn call_body(tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": "ping"}}})
}

/// An rmcp client of the streamable HTTP endpoint `url` (with `token` as
/// a bearer where given), and a session of the same for wrk.
pub async fn streamable(url: &str, token: Option<&str>, tool: &str) -> (Agent, Load) {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    let mut extra = Vec::new();
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
        extra.push(("Authorization".into(), format!("Bearer {token}")));
    }
    let transport =
        rmcp::transport::StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let client = ().serve(transport).await.expect("initialize through the peer");
    let load = Load {
        url: url.to_string(),
        headers: session_headers(url, &extra).await,
        body: call_body(tool),
        numbered: true,
    };
    (Agent::Streamable(client, tool.to_string()), load)
}

/// supergateway or mcp-proxy, one stdio server behind `/mcp`.
async fn bridge(which: &'static str) -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let target = target_dir();
    let command = if which == "supergateway" {
        let mut c = Command::new(target.join("supergateway/node_modules/.bin/supergateway"));
        c.args(["--stdio", DEMO, "--outputTransport", "streamableHttp"])
            .args(["--stateful", "--streamableHttpPath", "/mcp"])
            .args(["--logLevel", "none", "--port", &port.to_string()]);
        c
    } else {
        let mut c = Command::new(target.join("mcp-proxy/venv/bin/mcp-proxy"));
        c.args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--",
            DEMO,
        ]);
        c
    };
    let mut children = vec![spawn(command, which)];
    listening(port, which, &mut children).await;
    let (agent, load) = streamable(&format!("http://127.0.0.1:{port}/mcp"), None, "echo").await;
    Peer {
        name: which,
        children: Groups(children),
        agent,
        load,
        _dir: dir,
    }
}

/// A secret for ContextForge's settings: 32 random bytes, hex, with the
/// character classes its password rules ask for.
fn secret() -> String {
    let mut bytes = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("Aa1!{hex}")
}

/// IBM ContextForge: its bridge in front of the bundle, the gateway, the
/// bridge registered, a virtual server with the echo tool.
async fn contextforge() -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let venv = target_dir().join("contextforge/venv/bin");
    let (bridge_port, port) = (free_port(), free_port());
    let jwt = secret();
    let env: Vec<(&str, String)> = vec![
        ("HOME", dir.path().display().to_string()),
        ("JWT_SECRET_KEY", jwt.clone()),
        ("AUTH_ENCRYPTION_SECRET", secret()),
        ("PLATFORM_ADMIN_EMAIL", "admin@example.com".into()),
        ("PLATFORM_ADMIN_PASSWORD", secret()),
        ("DEFAULT_USER_PASSWORD", secret()),
        ("BASIC_AUTH_PASSWORD", secret()),
        (
            "DATABASE_URL",
            format!("sqlite:///{}", dir.path().join("cf.db").display()),
        ),
        // The bridge it calls is on loopback.
        ("SSRF_ALLOW_LOCALHOST", "true".into()),
        ("CACHE_TYPE", "database".into()),
        ("RATE_LIMITING_ENABLED", "false".into()),
        ("LOG_LEVEL", "ERROR".into()),
    ];
    let command = |program: PathBuf| {
        let mut c = Command::new(program);
        c.current_dir(dir.path())
            .envs(env.iter().map(|(k, v)| (*k, v)));
        c
    };
    let mut translate = command(venv.join("python"));
    translate
        .args(["-m", "mcpgateway.translate", "--stdio", DEMO])
        .args([
            "--expose-streamable-http",
            "--port",
            &bridge_port.to_string(),
        ]);
    let mut gateway = command(venv.join("mcpgateway"));
    gateway.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
    let mut children = vec![
        spawn(translate, "ContextForge"),
        spawn(gateway, "ContextForge"),
    ];
    listening(bridge_port, "ContextForge's bridge", &mut children).await;
    listening(port, "ContextForge", &mut children).await;
    let out = command(venv.join("python"))
        .args(["-m", "mcpgateway.utils.create_jwt_token"])
        .args([
            "--username",
            "admin@example.com",
            "--exp",
            "120",
            "--secret",
            &jwt,
        ])
        .stderr(Stdio::null())
        .output()
        .await
        .expect("ContextForge's create_jwt_token");
    let token = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("a token")
        .trim()
        .to_string();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let admin = async |path: &str, body: Option<Value>| -> Value {
        let request = match body {
            Some(b) => http.post(format!("{base}{path}")).json(&b),
            None => http.get(format!("{base}{path}")),
        };
        let answer = request.bearer_auth(&token).send().await.expect(path);
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert!(status.is_success(), "ContextForge {path}: {status} {text}");
        serde_json::from_str(&text).expect("JSON")
    };
    let registered = json!({"name": "echo", "url": format!("http://127.0.0.1:{bridge_port}/mcp"),
        "transport": "STREAMABLEHTTP"});
    admin("/gateways", Some(registered)).await;
    let tools = admin("/tools", None).await;
    let tools = tools.as_array().or(tools["tools"].as_array()).cloned();
    let echo = tools
        .unwrap_or_default()
        .into_iter()
        .find(|t| t["name"] == "echo-echo")
        .expect("ContextForge lists the bundle's echo as echo-echo");
    let server = json!({"server": {"name": "bench", "associated_tools": [echo["id"]]}});
    let server = admin("/servers", Some(server)).await;
    let url = format!("{base}/servers/{}/mcp", server["id"].as_str().unwrap());
    let (agent, load) = streamable(&url, Some(&token), "echo-echo").await;
    Peer {
        name: "ContextForge",
        children: Groups(children),
        agent,
        load,
        _dir: dir,
    }
}

/// mcp-hub: the bundle in its servers file; its REST call answers once
/// the bundle is connected.
async fn mcp_hub() -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("hub.json");
    let servers = json!({"mcpServers": {"echo": {"command": DEMO, "args": [], "env": {}}}});
    std::fs::write(&config, servers.to_string()).unwrap();
    let mut command = Command::new("node");
    command
        .arg(target_dir().join("mcp-hub/node_modules/mcp-hub/dist/cli.js"))
        .args(["--port", &port.to_string(), "--config"])
        .arg(&config)
        .current_dir(dir.path());
    for var in [
        "HOME",
        "XDG_STATE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
    ] {
        command.env(var, dir.path());
    }
    let mut children = vec![spawn(command, "mcp-hub")];
    listening(port, "mcp-hub", &mut children).await;
    let base = format!("http://127.0.0.1:{port}");
    let load = Load {
        url: format!("{base}/api/servers/tools"),
        headers: Vec::new(),
        body: json!({"server_name": "echo", "tool": "echo", "arguments": {"text": "ping"}}),
        numbered: false,
    };
    // The servers connect after the hub listens.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = reqwest::Client::new()
            .post(&load.url)
            .json(&load.body)
            .send()
            .await;
        if let Ok(a) = answer {
            if a.status().is_success() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "mcp-hub never connected the bundle"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let agent = Agent::Sse(SseAgent::connect(&format!("{base}/mcp")).await);
    Peer {
        name: "mcp-hub",
        children: Groups(children),
        agent,
        load,
        _dir: dir,
    }
}

/// An MCP client of the SSE transport (2024-11-05): a GET stream whose
/// first event names where to POST; answers come back on the stream.
pub struct SseAgent {
    http: reqwest::Client,
    post: String,
    answers: tokio::sync::mpsc::UnboundedReceiver<Value>,
    reader: tokio::task::JoinHandle<()>,
    next: u64,
}

impl SseAgent {
    async fn connect(url: &str) -> SseAgent {
        let http = reqwest::Client::new();
        let mut stream = http
            .get(url)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .expect("the SSE stream");
        let (endpoint_tx, endpoint_rx) = tokio::sync::oneshot::channel();
        let (tx, answers) = tokio::sync::mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut endpoint = Some(endpoint_tx);
            let mut buffer = String::new();
            while let Ok(Some(chunk)) = stream.chunk().await {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let event: String = buffer.drain(..end + 2).collect();
                    let data: String = (event.lines())
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim_start)
                        .collect();
                    if event.lines().any(|l| l == "event: endpoint") {
                        if let Some(tx) = endpoint.take() {
                            let _ = tx.send(data);
                        }
                    } else if let Ok(message) = serde_json::from_str(&data) {
                        let _ = tx.send(message);
                    }
                }
            }
        });
        let path = endpoint_rx.await.expect("the SSE endpoint event");
        let origin = url.split("/mcp").next().unwrap();
        let mut agent = SseAgent {
            http,
            post: format!("{origin}{path}"),
            answers,
            reader,
            next: 1,
        };
        agent
            .request(
                "initialize",
                json!({"protocolVersion": "2024-11-05", "capabilities": {},
                "clientInfo": {"name": "bundlevisor-bench", "version": "1"}}),
            )
            .await;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        agent.send(&initialized).await;
        agent
    }

    async fn send(&self, message: &Value) {
        let answer = self.http.post(&self.post).json(message).send().await;
        let status = answer.expect("POST to the SSE endpoint").status();
        assert!(status.is_success(), "the SSE endpoint answered {status}");
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&message).await;
        loop {
            let answer = self.answers.recv().await.expect("the SSE stream ended");
            if answer["id"] == id {
                assert!(answer.get("result").is_some(), "{method}: {answer}");
                return answer;
            }
        }
    }

    async fn echo(&mut self) {
        let answer = self
            .request(
                "tools/call",
                json!({"name": "echo__echo", "arguments": {"text": "ping"}}),
            )
            .await;
        assert_eq!(answer["result"]["content"][0]["text"], "ping", "{answer}");
    }
}

impl Peer {
    pub async fn start(name: &str) -> Peer {
        match name {
            "supergateway" => bridge("supergateway").await,
            "mcp-proxy" => bridge("mcp-proxy").await,
            "ContextForge" => contextforge().await,
            _ => mcp_hub().await,
        }
    }

    /// The RSS of the peer's own processes: those started and their
    /// descendants, the bundle's (the demo binary) not counted.
    fn rss_kib(&self) -> u64 {
        let mut pids: Vec<u32> = self.children.0.iter().filter_map(Child::id).collect();
        let mut i = 0;
        while i < pids.len() {
            pids.extend(children_of(pids[i]));
            i += 1;
        }
        let bundle = std::fs::canonicalize(DEMO).ok();
        pids.into_iter()
            .filter(|p| std::fs::read_link(format!("/proc/{p}/exe")).ok() != bundle)
            .map(rss_kib)
            .sum()
    }
}

/// The pids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// What was measured of one gateway.
struct Figures {
    latency: Summary,
    /// The same call by a lean agent (requests written by hand): over
    /// streamable HTTP, or mcp-hub's REST call (`rest`).
    lean: Option<Summary>,
    rest: bool,
    calls_per_s: f64,
    /// wrk's non-2xx answers and socket errors (timeouts included).
    errors: u64,
    rss_kib: u64,
}

/// Ours and every peer, in the same run. `ours` is the daemon's HTTP
/// agent (a 2025-11-25 session, as the peers' are) and `load` its wrk
/// request ([`streamable`]), `stateless` the same call as a 2026-07-28
/// stateless request (each gateway's throughput is its best way in: the
/// peers' are measured the way each serves fastest, mcp-hub's by its REST
/// call), `daemon` its pid; `n` calls each in `rounds`.
pub async fn compare(
    mut ours: Agent,
    (load, stateless): (Load, Load),
    daemon: u32,
    dir: &Path,
    rounds: usize,
    n: usize,
) -> Vec<Row> {
    let (_bare, direct) = crate::floors::bare_start().await;
    let mut floor = Agent::Streamable(direct, "echo".into());
    let mut peers = Vec::new();
    for name in ["supergateway", "mcp-proxy", "ContextForge", "mcp-hub"] {
        eprintln!("  {name}…");
        peers.push(Peer::start(name).await);
    }
    let (mut floor_sample, mut our_sample) = (Vec::new(), Vec::new());
    let mut samples: Vec<Vec<Duration>> = peers.iter().map(|_| Vec::new()).collect();
    // Lean agents beside: the agent library's own cost taken out.
    let mut lean_floor = crate::floors::RawStdio::start().await;
    let mut our_lean = lean_agent(&load).await;
    let mut our_stateless_lean = lean_agent(&stateless).await;
    let mut our_stateless_sample = Vec::new();
    let mut leans = Vec::new();
    for peer in &peers {
        leans.push(lean_agent(&peer.load).await);
    }
    let (mut lean_floor_sample, mut our_lean_sample) = (Vec::new(), Vec::new());
    let mut lean_samples: Vec<Vec<Duration>> = peers.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        floor_sample.extend(floor.calls(n / rounds).await);
        our_sample.extend(ours.calls(n / rounds).await);
        lean_floor_sample.extend(lean_floor.echo_calls(n / rounds).await);
        our_lean_sample.extend(our_lean.calls(n / rounds).await);
        our_stateless_sample.extend(our_stateless_lean.calls(n / rounds).await);
        for (peer, sample) in peers.iter_mut().zip(&mut samples) {
            sample.extend(peer.agent.calls(n / rounds).await);
        }
        for (lean, sample) in leans.iter_mut().zip(&mut lean_samples) {
            sample.extend(lean.calls(n / rounds).await);
        }
    }
    let secs = if crate::smoke() { 1 } else { 5 };
    let agents = if crate::smoke() { 10 } else { AGENTS };
    load.check().await;
    let run = throughput::wrk(&load, dir, agents, secs);
    stateless.check().await;
    let best = throughput::wrk(&stateless, dir, agents, secs);
    let ours_figures = Figures {
        latency: summarize(our_sample),
        lean: Some(summarize(our_lean_sample)),
        rest: false,
        calls_per_s: run.calls_per_s,
        errors: run.errors,
        rss_kib: rss_kib(daemon),
    };
    let stateless_row = {
        let what = format!(
            "peers: bundlevisor, calls/s at {agents} agents, 2026-07-28 stateless{}",
            match best.errors {
                0 => String::new(),
                n => format!(" ({n} errors)"),
            }
        );
        Row::throughput(&what, best.calls_per_s, best.calls_per_s)
    };
    // Each peer is held to ours by our best way in.
    let stateless_lean = summarize(our_stateless_sample);
    let ours_best = Figures {
        calls_per_s: best.calls_per_s.max(run.calls_per_s),
        lean: Some(stateless_lean),
        rest: false,
        latency: ours_figures.latency,
        errors: ours_figures.errors,
        rss_kib: ours_figures.rss_kib,
    };
    let mut figures = Vec::new();
    for ((peer, sample), lean) in peers.iter().zip(samples).zip(lean_samples) {
        peer.load.check().await;
        let run = throughput::wrk(&peer.load, dir, agents, secs);
        figures.push(Figures {
            latency: summarize(sample),
            lean: Some(summarize(lean)),
            rest: !peer.load.numbered,
            calls_per_s: run.calls_per_s,
            errors: run.errors,
            rss_kib: peer.rss_kib(),
        });
    }
    let floors = (summarize(floor_sample), summarize(lean_floor_sample));
    floor.close().await;
    ours.close().await;
    let mut rows = rows_for("bundlevisor", &ours_figures, floors, None, agents);
    let lean_row = Row::latency(
        "peers: echo via bundlevisor, lean agent, 2026-07-28 stateless",
        stateless_lean,
        Some(floors.1),
    );
    rows.insert(2, lean_row);
    rows.insert(rows.len() - 1, stateless_row);
    for (peer, f) in peers.into_iter().zip(figures) {
        rows.extend(rows_for(peer.name, &f, floors, Some(&ours_best), agents));
        peer.agent.close().await;
    }
    rows
}

/// A lean agent (requests written by hand on one connection) of a load's
/// endpoint: a JSON-RPC call numbered afresh each time, or (mcp-hub's
/// REST call) the load's body as it is.
enum Lean {
    Rpc(crate::floors::RawHttp, Value),
    Rest(crate::floors::RawHttp, Vec<u8>),
}

impl Lean {
    async fn calls(&mut self, n: usize) -> Vec<Duration> {
        match self {
            Lean::Rpc(agent, params) => agent.echo_calls(params, n).await,
            Lean::Rest(agent, body) => agent.same_calls(body, n).await,
        }
    }
}

/// A lean agent of `load`'s endpoint (and session).
async fn lean_agent(load: &Load) -> Lean {
    let rest = load
        .url
        .strip_prefix("http://127.0.0.1:")
        .expect("a loopback URL");
    let (port, path) = rest.split_once('/').expect("a path");
    let port = port.parse().expect("a port");
    let agent = crate::floors::RawHttp::connect(port, &format!("/{path}"), &load.headers).await;
    match load.numbered {
        true => Lean::Rpc(agent, load.body["params"].clone()),
        false => Lean::Rest(agent, serde_json::to_vec(&load.body).unwrap()),
    }
}

/// `floors`: the bundle called directly by the rmcp client and by a lean
/// agent.
fn rows_for(
    name: &str,
    f: &Figures,
    (floor, lean_floor): (Summary, Summary),
    ours: Option<&Figures>,
    agents: usize,
) -> Vec<Row> {
    let how = if f.rest { ", its REST call" } else { "" };
    let mut lean = f.lean.map(|l| {
        Row::latency(
            &format!("peers: echo via {name}, lean agent{how}"),
            l,
            Some(lean_floor),
        )
    });
    let mut latency = Row::latency(&format!("peers: echo via {name}"), f.latency, Some(floor));
    let what = match f.errors {
        0 => format!("peers: {name}, calls/s at {agents} agents"),
        n => format!("peers: {name}, calls/s at {agents} agents ({n} errors)"),
    };
    let mut rate = Row::throughput(&what, f.calls_per_s, f.calls_per_s);
    if let Some(ours) = ours {
        let our_overhead = ours.latency.median_us - floor.median_us;
        latency = latency.target(Target::OverheadOverOursAtLeast(FACTOR, our_overhead));
        if let (Some(row), Some(our_lean)) = (lean.take(), ours.lean) {
            let our_overhead = our_lean.median_us - lean_floor.median_us;
            lean = Some(row.target(Target::OverheadOverOursAtLeast(FACTOR, our_overhead)));
        }
        rate = Row::throughput(&what, f.calls_per_s, ours.calls_per_s)
            .target(Target::RateOfOursAtMost(1.0 / FACTOR));
    }
    let mut rows = vec![latency];
    rows.extend(lean);
    rows.extend([
        rate,
        Row::memory(&format!("peers: {name}, RSS"), f.rss_kib, Target::None),
    ]);
    rows
}
