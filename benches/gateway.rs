//! Gateway overhead: the same `echo` tool call made directly to a demo
//! bundle process (rmcp client over its stdio, no daemon) and through
//! `bundlevisor mcp` (agent → gateway → control socket → daemon → bundle).
//! Sequential calls, so the figures are latencies, not throughput.
//!
//! `cargo bench --bench gateway` (part of `make bench`); `CALLS=N` sets the
//! number of measured calls per path (default 2000, after 200 warm-up).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};

const BIN: &str = env!("CARGO_BIN_EXE_bundlevisor");
const DEMO: &str = env!("CARGO_BIN_EXE_bundlevisor-demo");

async fn connect(
    cmd: &mut tokio::process::Command,
) -> (tokio::process::Child, RunningService<RoleClient, ()>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.expect("initialize");
    (child, client)
}

async fn measure(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    calls: usize,
) -> Vec<Duration> {
    let args = serde_json::json!({"text": "ping"})
        .as_object()
        .unwrap()
        .clone();
    let mut out = Vec::with_capacity(calls);
    for i in 0..calls + 200 {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.clone());
        let start = Instant::now();
        client.peer().call_tool(params).await.expect("call");
        if i >= 200 {
            out.push(start.elapsed());
        }
    }
    out.sort();
    out
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn wait_ready(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let out = std::process::Command::new(BIN)
            .arg("--socket")
            .arg(socket)
            .args(["status", "--json"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("\"ready\"") {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the daemon did not become ready");
}

fn main() {
    let calls: usize = std::env::var("CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let bundle = root.join("bundles/demo");
    std::fs::create_dir_all(bundle.join("server")).unwrap();
    std::fs::copy("bundles/demo/manifest.json", bundle.join("manifest.json")).unwrap();
    std::os::unix::fs::symlink(DEMO, bundle.join("server/bundlevisor-demo")).unwrap();
    std::fs::write(
        root.join("bv.toml"),
        "state_dir = \"state\"\nsocket = \"bv.sock\"\n[[watch]]\ndir = \"bundles\"\n",
    )
    .unwrap();
    let mut daemon = std::process::Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(root.join("bv.toml"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = root.join("bv.sock");
    wait_ready(&socket);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (direct, gateway) = rt.block_on(async {
        let (_c1, client) = connect(&mut tokio::process::Command::new(DEMO)).await;
        let direct = measure(&client, "echo", calls).await;
        let _ = client.cancel().await;
        let (_c2, client) = connect(
            tokio::process::Command::new(BIN)
                .arg("--socket")
                .arg(&socket)
                .arg("mcp"),
        )
        .await;
        let gateway = measure(&client, "demo__echo", calls).await;
        let _ = client.cancel().await;
        (direct, gateway)
    });
    let _ = daemon.kill();
    let _ = daemon.wait();

    println!("tool call latency, {calls} sequential echo calls per path");
    println!("{:<28} {:>10} {:>10}", "path", "median µs", "p99 µs");
    for (name, d) in [
        ("direct to the bundle", &direct),
        ("through bundlevisor mcp", &gateway),
    ] {
        println!(
            "{:<28} {:>10.1} {:>10.1}",
            name,
            us(pct(d, 0.5)),
            us(pct(d, 0.99))
        );
    }
    println!(
        "{:<28} {:>10.1} {:>10.1}",
        "gateway overhead",
        us(pct(&gateway, 0.5)) - us(pct(&direct, 0.5)),
        us(pct(&gateway, 0.99)) - us(pct(&direct, 0.99))
    );
}
