//! The physical floors each figure is compared with, measured in the same
//! run: the demo bundle driven by a bare rmcp client (no daemon), a
//! minimal JSON-RPC peer echoing the same request/response sizes over a
//! pipe, and a minimal unix-socket server answering with the same bytes as
//! `status`. The peers run as this bench binary re-executed with
//! `BV_BENCH_ROLE` set, so they are separate processes like the real ones.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::harness::{pin_thread, Placement, DEMO};

pub const ROLE: &str = "BV_BENCH_ROLE";
const REPLY: &str = "BV_BENCH_REPLY";
const SOCKET: &str = "BV_BENCH_SOCKET";
/// The CPU a pipe-echo peer pins itself to.
const CPU: &str = "BV_BENCH_CPU";

/// Runs this process as a floor peer when `BV_BENCH_ROLE` says so.
pub fn run_role() -> bool {
    match std::env::var(ROLE).as_deref() {
        Ok("pipe-echo") => pipe_echo_peer(),
        Ok("socket-echo") => socket_echo_server(),
        Ok("relay") => relay(),
        Ok("http-relay") => http_relay(),
        _ => return false,
    }
    true
}

/// The demo bundle, its stdio piped, killed on drop.
fn spawn_demo() -> tokio::process::Child {
    tokio::process::Command::new(DEMO)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the demo bundle")
}

/// Spawns the demo bundle and completes `initialize` + `tools/list` with a
/// bare rmcp client.
pub async fn bare_start() -> (tokio::process::Child, RunningService<RoleClient, ()>) {
    let mut child = spawn_demo();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.expect("initialize");
    let tools = client.peer().list_all_tools().await.expect("tools/list");
    assert!(!tools.is_empty());
    (child, client)
}

/// A process in the middle that does nothing but forward lines: spawns the
/// command in `BV_BENCH_NEXT` (`--` separated, this binary again for a
/// second relay) and copies stdin → its stdin and its stdout → stdout.
fn relay() {
    let next = std::env::var("BV_BENCH_NEXT").unwrap();
    let mut parts = next.splitn(2, "--");
    let program = parts.next().unwrap();
    let mut cmd = Command::new(program);
    if let Some(rest) = parts.next() {
        cmd.env(ROLE, "relay").env("BV_BENCH_NEXT", rest);
    } else {
        cmd.env_remove(ROLE);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let from_child = BufReader::new(child.stdout.take().unwrap());
    let back = std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        for line in from_child.split(b'\n') {
            let Ok(mut line) = line else { return };
            line.push(b'\n');
            if out.write_all(&line).and_then(|()| out.flush()).is_err() {
                return;
            }
        }
    });
    for line in std::io::stdin().lock().split(b'\n') {
        let Ok(mut line) = line else { break };
        line.push(b'\n');
        if to_child.write_all(&line).is_err() {
            break;
        }
    }
    drop(to_child);
    let _ = child.wait();
    let _ = back.join();
}

/// The least any HTTP gateway in front of a stdio bundle can add on this
/// machine (issue 37): a process on one thread, as the daemon, with the
/// daemon's HTTP stack (axum on hyper, no Nagle delay), that writes each
/// POST's body to the demo bundle's stdin as a line and answers with the
/// line the bundle writes back. No token, no parsing, no MCP: only the
/// agent's connection, the bundle's pipe and the two wake-ups between.
/// Prints its port on stdout.
fn http_relay() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut child = spawn_demo();
        let write = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let pipe = std::sync::Arc::new(tokio::sync::Mutex::new((write, lines)));
        {
            let mut pipe = pipe.lock().await;
            let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "bench-relay", "version": "1"}}});
            let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            pipe.0
                .write_all(format!("{hello}\n{initialized}\n").as_bytes())
                .await
                .unwrap();
            pipe.1
                .next_line()
                .await
                .unwrap()
                .expect("initialize answered");
        }
        let relay = move |body: axum::body::Bytes| {
            let pipe = pipe.clone();
            async move {
                let mut pipe = pipe.lock().await;
                let mut line = body.to_vec();
                line.push(b'\n');
                pipe.0.write_all(&line).await.unwrap();
                let answer = pipe.1.next_line().await.unwrap().expect("an answer");
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    answer,
                )
            }
        };
        let router = axum::Router::new().route("/mcp", axum::routing::post(relay));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap().port());
        let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
            let _ = s.set_nodelay(true);
        });
        let _ = axum::serve(listener, router).await;
        drop(child);
    });
}

/// The bare HTTP→stdio relay ([`http_relay`]) as a process of its own,
/// killed on drop, and its port.
pub async fn http_relay_start() -> (tokio::process::Child, u16) {
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(ROLE, "http-relay")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let port = out.next_line().await.unwrap().expect("the relay's port");
    (child, port.parse().expect("a port"))
}

/// The demo bundle behind `relays` line-relay processes.
pub async fn relayed_start(
    relays: usize,
) -> (tokio::process::Child, RunningService<RoleClient, ()>) {
    let me = std::env::current_exe().unwrap();
    let mut next = DEMO.to_string();
    for _ in 1..relays {
        next = format!("{}--{next}", me.display());
    }
    let mut child = tokio::process::Command::new(&me)
        .env(ROLE, "relay")
        .env("BV_BENCH_NEXT", next)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.expect("initialize through relays");
    (child, client)
}

/// The peer: answers every JSON-RPC request line with the result in the
/// file `BV_BENCH_REPLY`, parsing and serializing like a real peer would.
fn pipe_echo_peer() {
    if let Ok(cpu) = std::env::var(CPU) {
        crate::harness::pin_thread(Some(cpu.parse().unwrap()));
    }
    let result: Value =
        serde_json::from_slice(&std::fs::read(std::env::var(REPLY).unwrap()).unwrap()).unwrap();
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lines() {
        let Ok(line) = line else { return };
        let request: Value = serde_json::from_str(&line).unwrap();
        let response = json!({"jsonrpc": "2.0", "id": request["id"], "result": result});
        serde_json::to_writer(&mut out, &response).unwrap();
        out.write_all(b"\n").unwrap();
        out.flush().unwrap();
    }
}

/// `count` sequential request/response round trips with a pipe-echo peer
/// that answers with `result`; returns each round trip's duration. With a
/// placement, this thread and the peer are pinned for the duration.
pub fn pipe_echo(
    reply_file: &Path,
    uri: &str,
    count: usize,
    placement: Option<Placement>,
) -> Vec<Duration> {
    let mut peer = Command::new(std::env::current_exe().unwrap());
    if let Some(p) = placement {
        pin_thread(Some(p.cpus().0));
        peer.env(CPU, p.cpus().1.to_string());
    }
    let mut peer = peer
        .env(ROLE, "pipe-echo")
        .env(REPLY, reply_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_peer = std::io::BufWriter::new(peer.stdin.take().unwrap());
    let mut from_peer = BufReader::new(peer.stdout.take().unwrap());
    let mut line = String::new();
    let mut sample = Vec::with_capacity(count);
    for id in 0..count {
        let start = Instant::now();
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "ai.nimblebrain/resources/read",
            "params": {"uri": uri},
        });
        serde_json::to_writer(&mut to_peer, &request).unwrap();
        to_peer.write_all(b"\n").unwrap();
        to_peer.flush().unwrap();
        line.clear();
        from_peer.read_line(&mut line).unwrap();
        let response: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(response["id"], json!(id));
        sample.push(start.elapsed());
    }
    drop(to_peer);
    let _ = peer.wait();
    if placement.is_some() {
        pin_thread(None);
    }
    sample
}

/// The socket floor: a tokio server (two workers, like the daemon's
/// machine) answering every request line with the result in
/// `BV_BENCH_REPLY`.
fn socket_echo_server() {
    let result: Value =
        serde_json::from_slice(&std::fs::read(std::env::var(REPLY).unwrap()).unwrap()).unwrap();
    let result = std::sync::Arc::new(result);
    let socket = std::env::var(SOCKET).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let listener = tokio::net::UnixListener::bind(&socket).unwrap();
            println!("listening");
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let result = result.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = tokio::io::BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let request: Value = serde_json::from_str(&line).unwrap();
                        let response =
                            json!({"jsonrpc": "2.0", "id": request["id"], "result": *result});
                        let mut bytes = serde_json::to_vec(&response).unwrap();
                        bytes.push(b'\n');
                        if write.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
}

/// Starts the socket floor server at `socket`; it lives as long as the
/// returned child.
pub fn socket_echo(reply_file: &Path, socket: &Path) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, "socket-echo")
        .env(REPLY, reply_file)
        .env(SOCKET, socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "listening");
    child
}

/// `clients` connections each sending `method` requests back to back for
/// `run`; returns every request's latency. With `hello`, each connection
/// first completes `daemon.hello` (the daemon requires it).
pub async fn hammer(
    socket: &Path,
    clients: usize,
    method: &'static str,
    hello: bool,
    run: Duration,
) -> Vec<Duration> {
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let socket = socket.to_path_buf();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(read).lines();
            let mut roundtrip = async |id: u64, method: &str, params: Value| {
                let request =
                    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
                let mut bytes = serde_json::to_vec(&request).unwrap();
                bytes.push(b'\n');
                write.write_all(&bytes).await.unwrap();
                let line = lines.next_line().await.unwrap().expect("server closed");
                let response: Value = serde_json::from_str(&line).unwrap();
                assert!(response.get("result").is_some(), "{line}");
            };
            if hello {
                roundtrip(0, "daemon.hello", json!({"protocol": 1})).await;
            }
            let mut sample = Vec::new();
            let mut id = 1;
            while Instant::now() < until {
                let start = Instant::now();
                roundtrip(id, method, json!({})).await;
                sample.push(start.elapsed());
                id += 1;
            }
            sample
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// rmcp's streamable HTTP server alone: an in-process `echo` tool behind
/// it, no bundle, no daemon — the least any gateway built on it can add.
pub async fn rmcp_http_echo() -> RunningService<RoleClient, ()> {
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    use rmcp::{ErrorData, RoleServer, ServerHandler};

    #[derive(Clone)]
    struct Echo;
    impl ServerHandler for Echo {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
        async fn list_tools(
            &self,
            _r: Option<PaginatedRequestParams>,
            _c: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let schema = serde_json::from_value(json!({"type": "object"})).unwrap();
            Ok(ListToolsResult::with_all_items(vec![Tool::new(
                "echo",
                "echo",
                std::sync::Arc::new(schema),
            )]))
        }
        async fn call_tool(
            &self,
            r: CallToolRequestParams,
            _c: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let text = r
                .arguments
                .and_then(|a| a.get("text").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_default();
            Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
        }
    }
    let service = StreamableHttpService::new(
        || Ok(Echo),
        std::sync::Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Without Nagle's delay, as the daemon's listener (40 ms a call with it).
    let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("http://{addr}/mcp"),
        );
    let transport =
        rmcp::transport::StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(transport).await.expect("initialize")
}

/// A lean agent of the demo bundle's stdio: JSON-RPC lines written and
/// read by hand, no MCP library — the floor a lean HTTP agent's figure
/// is compared with.
pub struct RawStdio {
    _child: tokio::process::Child,
    write: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: u64,
}

impl RawStdio {
    pub async fn start() -> RawStdio {
        let mut child = spawn_demo();
        let write = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut raw = RawStdio {
            _child: child,
            write,
            lines,
            id: 0,
        };
        let hello = json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}});
        raw.request("initialize", hello).await;
        raw.write_line(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        raw
    }

    async fn write_line(&mut self, message: &Value) {
        let mut bytes = serde_json::to_vec(message).unwrap();
        bytes.push(b'\n');
        self.write.write_all(&bytes).await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> String {
        self.id += 1;
        let message = json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params});
        self.write_line(&message).await;
        let line = self.lines.next_line().await.unwrap().expect("an answer");
        assert!(line.contains("\"result\""), "{line}");
        line
    }

    /// `n` echo calls after 50 unmeasured ones.
    pub async fn echo_calls(&mut self, n: usize) -> Vec<Duration> {
        let mut sample = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let start = Instant::now();
            let params = json!({"name": "echo", "arguments": {"text": "ping"}});
            let line = self.request("tools/call", params).await;
            if i >= 50 {
                sample.push(start.elapsed());
            }
            assert!(line.contains("ping"), "{line}");
        }
        sample
    }
}

/// A lean agent of an HTTP endpoint: HTTP/1.1 requests written by hand on
/// one keep-alive connection, each answer read by its length or its
/// chunks — no HTTP or MCP library on the agent's side, as wrk.
pub struct RawHttp {
    port: u16,
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    /// The request line and the headers every request carries.
    head: String,
    id: u64,
}

impl RawHttp {
    async fn open(port: u16) -> tokio::io::BufReader<tokio::net::TcpStream> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        stream.set_nodelay(true).unwrap();
        tokio::io::BufReader::new(stream)
    }

    pub async fn connect(port: u16, path: &str, headers: &[(String, String)]) -> RawHttp {
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        RawHttp {
            port,
            stream: Self::open(port).await,
            head,
            id: 0,
        }
    }

    /// Sends a request; once more on a new connection when the server
    /// had closed the idle one (uvicorn and Node close keep-alive
    /// connections idle for 5 s).
    async fn send(&mut self, request: &[u8]) -> String {
        for _ in 0..2 {
            let stream = self.stream.get_mut();
            if stream.write_all(request).await.is_ok() {
                let mut status = String::new();
                if self.stream.read_line(&mut status).await.unwrap_or(0) > 0 {
                    return status;
                }
            }
            self.stream = Self::open(self.port).await;
        }
        panic!("the server closed every connection");
    }

    /// One POST of `body` (with `extra` headers): the answer's headers
    /// (lower-cased names) and body.
    pub async fn post(&mut self, body: &[u8], extra: &str) -> (String, String) {
        let mut request =
            format!("{}{extra}Content-Length: {}\r\n\r\n", self.head, body.len()).into_bytes();
        request.extend_from_slice(body);
        let status = self.send(&request).await;
        assert!(status.starts_with("HTTP/1.1 2"), "{status}");
        let mut headers = String::new();
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            headers.push_str(&line.to_ascii_lowercase());
        }
        let length = headers
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse::<usize>().unwrap());
        let mut answer = Vec::new();
        if let Some(length) = length {
            answer.resize(length, 0);
            tokio::io::AsyncReadExt::read_exact(&mut self.stream, &mut answer)
                .await
                .unwrap();
        } else {
            // Chunked: size lines, data, until the empty chunk.
            loop {
                let mut size = String::new();
                self.stream.read_line(&mut size).await.unwrap();
                let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
                let mut chunk = vec![0; size + 2];
                tokio::io::AsyncReadExt::read_exact(&mut self.stream, &mut chunk)
                    .await
                    .unwrap();
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        }
        (headers, String::from_utf8(answer).unwrap())
    }

    /// `n` echo calls of `tool` after 50 unmeasured ones: `params` is the
    /// call's params (a 2026-07-28 request's `_meta` in it).
    pub async fn echo_calls(&mut self, params: &Value, n: usize) -> Vec<Duration> {
        let mut sample = Vec::with_capacity(n);
        for i in 0..n + 50 {
            self.id += 1;
            let body = json!({"jsonrpc": "2.0", "id": self.id, "method": "tools/call",
                "params": params});
            let body = serde_json::to_vec(&body).unwrap();
            let start = Instant::now();
            let (_, answer) = self.post(&body, "").await;
            if i >= 50 {
                sample.push(start.elapsed());
            }
            assert!(
                answer.contains("\"result\"") && answer.contains("ping"),
                "{answer}"
            );
        }
        sample
    }

    /// `n` POSTs of the same `body` (a REST call of `echo` with `ping`)
    /// after 50 unmeasured ones.
    pub async fn same_calls(&mut self, body: &[u8], n: usize) -> Vec<Duration> {
        let mut sample = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let start = Instant::now();
            let (_, answer) = self.post(body, "").await;
            if i >= 50 {
                sample.push(start.elapsed());
            }
            assert!(answer.contains("ping"), "{answer}");
        }
        sample
    }

    /// A 2025-11-25 session opened on this connection: every later request
    /// carries its id.
    pub async fn open_session(&mut self) {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}});
        let (headers, answer) = self.post(&serde_json::to_vec(&init).unwrap(), "").await;
        assert!(answer.contains("\"result\""), "{answer}");
        let id = headers
            .lines()
            .find_map(|l| l.strip_prefix("mcp-session-id:"))
            .expect("a session id")
            .trim()
            .to_string();
        self.head.push_str(&format!(
            "Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        ));
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&serde_json::to_vec(&initialized).unwrap(), "")
            .await;
    }
}
