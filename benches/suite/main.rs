//! The benchmark suite (`make bench`, docs/performance.md): what
//! bundlevisor exists for, each figure next to its physical floor measured
//! in the same run, printed as one table with the ratios and the targets.
//!
//! - install: manifest renamed into a watched folder → `ready` event;
//!   floor: the same binary spawned and `initialize` + `tools/list`
//!   completed by a bare rmcp client.
//! - crash: bundle SIGKILLed → `ready` again (first restart); same floor.
//! - host-resources: `ai.nimblebrain/resources/read` round trips made by
//!   the demo bundle itself (its `host_bench` tool), 4 KiB text and 1 MiB
//!   binary, one bundle and 8 at once; floor: the same request and
//!   response bytes echoed over a pipe by a minimal JSON-RPC peer.
//! - boot: daemon start → 200 installed bundles ready, and memory; floor:
//!   200 bare starts at once.
//! - control: `status` with 64 concurrent clients; floor: a minimal
//!   unix-socket server answering the same bytes.
//! - gateway: a tool call through `bundlevisor mcp`; floor: the same call
//!   directly to the bundle. Two reference rows say what bounds it: the
//!   same call through two line-relay processes (the process hops alone)
//!   and as `bundle.call` on the control socket (the daemon's share).
//!
//! Where a figure and its floor are both short round trips they are
//! measured in alternating rounds, so that the VM's slow drifts hit both.
//!
//! - scale: the curve of boot, memory, descriptors, `status`, a gateway
//!   call, host-resources reads, crash recovery and stop at 50–2,000
//!   bundles over 1, 10 and 100 workspaces ([`scale`]).
//!
//! - tracing: the same HTTP call with `[telemetry]` off and on (spans
//!   exported over OTLP), in alternating rounds, and the dashboard's page
//!   loads ([`traces`]).
//!
//! - search: the tool search ranking's recall on real servers' tools and
//!   agents' queries, one search at 1,000 and 10,000 tools, and the bytes
//!   an agent's tool list saves ([`search`]).
//!
//! - peers: the same call through supergateway, mcp-proxy, IBM
//!   ContextForge and mcp-hub beside ours: latency, calls per second at
//!   100 agents, RSS ([`peers`]).
//!
//! - supervisord: the same demo binary under supervisord (PyPI, pinned):
//!   start → 200 programs running, SIGKILL → running again; bundlevisor's
//!   same two figures (process exec'd, no handshake) sit beside them.
//!
//! Environment: `BENCH_SCALE` (default 1.0) scales the sample sizes,
//! `BOOT_BUNDLES` (default 200), `SCALE_BUNDLES` (default 50,200,1000,2000)
//! and `SCALE_WORKSPACES` (default 1,10,100) the curve's points,
//! `BENCH_ONLY` (comma-separated of install,crash,host,control,gateway,throughput,
//! peers,boot,scale,search,supervisord,tracing) runs a subset. Results also go to
//! `target/bench/suite.json`, the curve to `target/bench/scale.{json,png}`,
//! the throughput points to `target/bench/throughput.json`.

mod floors;
mod harness;
mod peers;
mod report;
mod scale;
mod search;
mod supervisord;
mod throughput;
mod traces;

use std::path::Path;
use std::time::{Duration, Instant};

use bundlevisor::client::Client;
use bundlevisor::protocol::{method, EventKind};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::json;

use harness::{
    call, rss_kib, status, summarize, tool_text, BenchDaemon, EventTap, Placement, Summary,
};
use report::{Row, Target};

pub(crate) const CONFIG: &str = r#"state_dir = "state"
socket = "bv.sock"
[[watch]]
dir = "watched"
[supervision]
# Every measured crash is a first restart.
stable_after = "1ms"
max_restarts = 100000
[host_resources]
rate_per_sec = 1000000
burst = 1000000
"#;

/// `cargo test --all-targets` (so `make test`) runs this binary without
/// `--bench`: a smoke run with small samples that checks every scenario
/// still works end to end, in seconds.
pub(crate) fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

pub(crate) fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke() { 0.02 } else { 1.0 });
    ((n as f64 * scale).round() as usize).max(ROUNDS)
}

/// `BENCH_ONLY=host,gateway` runs only those scenarios (install, crash,
/// host, control, gateway, boot).
fn wanted(scenario: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| only.split(',').any(|s| s.trim() == scenario))
}

fn main() {
    if floors::run_role() {
        return;
    }
    harness::raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let mut search_lines = Vec::new();
    let (rows, curve, through) = rt.block_on(async {
        let mut rows = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Bundles run under uids of their own (root daemon): they must
        // reach their folders.
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        for sub in ["watched", "staging", "bundles", "files"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        // The HTTP gateway on a port of its own (the gateway scenario).
        let http_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let config = format!(
            "{CONFIG}[http]\nlisten = \"127.0.0.1:{http_port}\"\nrate_per_sec = 1000000.0\nburst = 1000000\nmax_connections = 2048\n"
        );
        let d = BenchDaemon::start(root, Some(&config)).await;
        let mut tap = EventTap::start(&d).await;
        let mut ctl = d.connect().await;

        // supervisord beside us (issue 22): the same binary, the same count.
        let peer = wanted("supervisord").then(|| {
            eprintln!("supervisord…");
            let dir = root.join("supervisord");
            tokio::task::block_in_place(|| {
                supervisord::measure(&dir, boot_count(), scaled(3), scaled(30))
            })
        });
        if let Some(p) = &peer {
            rows.push(Row::latency(
                &format!("supervisord: start → {} programs running", p.programs),
                p.start,
                None,
            ));
            rows.push(Row::latency(
                "supervisord: SIGKILL → running again",
                p.crash,
                None,
            ));
        }
        if wanted("install") || wanted("crash") {
            eprintln!("install latency…");
            let floor = bare_starts(scaled(30)).await;
            if wanted("install") {
                rows.push(install(root, &mut tap, scaled(30), floor));
            }
            if wanted("crash") {
                eprintln!("crash recovery…");
                rows.extend(crash(&d, &mut ctl, &mut tap, scaled(30), floor, peer.as_ref()).await);
            }
        }
        if wanted("host") {
            eprintln!("host-resources reads…");
            rows.extend(host_resources(&d, &mut ctl).await);
        }
        if wanted("control") {
            eprintln!("control socket…");
            rows.push(control(&d, &mut ctl).await);
        }
        if wanted("gateway") {
            eprintln!("gateway…");
            rows.extend(gateway(&d, &mut ctl, http_port).await);
        }
        let mut through = Vec::new();
        if wanted("throughput") {
            eprintln!("throughput…");
            let dir = harness::demo_bundle(&d.root.join("bundles"), "tp");
            call(&mut ctl, method::INSTALL, json!({"path": dir})).await;
            let made = call(&mut ctl, method::TOKEN_CREATE, json!({"workspace": "default"})).await;
            let token = made["token"].as_str().expect("a token").to_string();
            through = throughput::measure(&d, http_port, &token, "tp__echo").await;
        }
        if wanted("peers") {
            eprintln!("peers side by side…");
            let dir = harness::demo_bundle(&d.root.join("bundles"), "pe");
            call(&mut ctl, method::INSTALL, json!({"path": dir})).await;
            let made = call(&mut ctl, method::TOKEN_CREATE, json!({"workspace": "default"})).await;
            let token = made["token"].as_str().expect("a token");
            let url = format!("http://127.0.0.1:{http_port}/mcp/default");
            let (ours, load) = peers::streamable(&url, Some(token), "pe__echo").await;
            let stateless = throughput::Load::stateless(&url, token, "pe__echo");
            let n = scaled(2000);
            let loads = (load, stateless);
            rows.extend(peers::compare(ours, loads, d.pid(), &d.root, ROUNDS, n).await);
        }
        d.stop();
        if wanted("tracing") {
            eprintln!("tracing on and off…");
            rows.extend(traces::cost(root).await);
        }
        if wanted("boot") {
            eprintln!("boot reload…");
            rows.extend(boot(&root.join("boot"), peer.as_ref()).await);
        }
        if wanted("search") {
            eprintln!("tool search…");
            let (found, lines) = tokio::task::block_in_place(|| search::measure(smoke()));
            rows.extend(found);
            search_lines = lines;
        }
        let mut curve = Vec::new();
        if wanted("scale") {
            curve = scale::curve(root).await;
            // The plot is drawn in a smoke run too (so `make test` checks
            // it), into the run's temporary folder.
            let png = scale::write(&curve, &root.join("plots")).expect("plot the curve");
            assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
        }
        (rows, curve, through)
    });
    // A smoke run's figures are not results.
    report::print(&rows, started.elapsed(), !smoke());
    for line in &search_lines {
        println!("{line}");
    }
    if !through.is_empty() {
        println!("\nthroughput of the HTTP gateway (tools/call, wrk, one connection an agent: MCP 2026-07-28 stateless, and on one 2025-11-25 session):");
        for line in throughput::lines(&through) {
            println!("{line}");
        }
        // A smoke run draws the plot too (so `make test` checks it), into
        // a folder of its own.
        let dir = if smoke() {
            std::env::temp_dir().join(format!("bench-throughput-{}", std::process::id()))
        } else {
            std::path::PathBuf::from("target/bench")
        };
        let png = throughput::write(&through, &dir).expect("write and plot the throughput");
        assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
        if smoke() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            println!("the curve: {} and throughput.json", png.display());
        }
    }
    if !curve.is_empty() {
        scale::print(&curve);
        if !smoke() {
            let dir = std::path::Path::new("target/bench");
            match scale::write(&curve, dir) {
                Ok(png) => println!("the curve: {} and scale.json", png.display()),
                Err(e) => eprintln!("the curve could not be written: {e}"),
            }
        }
    }
}

/// `n` bare starts of the demo bundle, one after the other.
async fn bare_starts(n: usize) -> Summary {
    let mut sample = Vec::new();
    for i in 0..n + 3 {
        let start = Instant::now();
        let (_child, client) = floors::bare_start().await;
        if i >= 3 {
            sample.push(start.elapsed());
        }
        let _ = client.cancel().await;
    }
    summarize(sample)
}

/// Manifest landing → ready: a complete bundle folder is renamed into the
/// watched folder (the documented atomic way), then removed again.
fn install(root: &Path, tap: &mut EventTap, n: usize, floor: Summary) -> Row {
    let rt = tokio::runtime::Handle::current();
    let mut sample = Vec::new();
    for i in 0..n + 3 {
        let name = format!("land{i}");
        harness::demo_bundle(&root.join("staging"), &name);
        let start = Instant::now();
        std::fs::rename(
            root.join("staging").join(&name),
            root.join("watched").join(&name),
        )
        .unwrap();
        let ready = tokio::task::block_in_place(|| rt.block_on(tap.wait(&name, EventKind::Ready)));
        if i >= 3 {
            sample.push(ready - start);
        }
        std::fs::remove_dir_all(root.join("watched").join(&name)).unwrap();
        tokio::task::block_in_place(|| rt.block_on(tap.wait(&name, EventKind::Uninstalled)));
    }
    let got = summarize(sample);
    Row::latency("install: watched folder → ready", got, Some(floor))
        .target(Target::OverFloorAtMost(Duration::from_millis(10)))
}

/// SIGKILL → ready again, and → the process running again (what
/// supervisord's figure is: no handshake).
async fn crash(
    d: &BenchDaemon,
    ctl: &mut Client,
    tap: &mut EventTap,
    n: usize,
    floor: Summary,
    peer: Option<&supervisord::Figures>,
) -> Vec<Row> {
    let dir = harness::demo_bundle(&d.root.join("bundles"), "crashy");
    call(ctl, method::INSTALL, json!({"path": dir})).await;
    let (mut sample, mut running) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let pid = harness::ready_pid(ctl, None, "crashy").await;
        let (daemon, program) = (d.pid(), supervisord::program_of(d.pid(), pid));
        // A first restart: the bundle has been ready for `stable_after`
        // (1 ms in this config). Scenario set-up, not synchronisation.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let start = harness::sigkill(pid);
        let replaced =
            tokio::task::spawn_blocking(move || supervisord::wait_replaced(daemon, &program, pid));
        tap.wait("crashy", EventKind::Exited).await;
        sample.push(tap.wait("crashy", EventKind::Ready).await - start);
        running.push(replaced.await.unwrap() - start);
    }
    call(ctl, method::UNINSTALL, json!({"name": "crashy"})).await;
    let mut rows = vec![
        Row::latency("crash: SIGKILL → ready", summarize(sample), Some(floor))
            .target(Target::AtMost(Duration::from_millis(100))),
    ];
    if let Some(p) = peer {
        rows.push(Row::latency(
            "  SIGKILL → running again (floor: supervisord)",
            summarize(running),
            Some(p.crash),
        ));
    }
    rows
}

/// What `host_bench` reports.
#[derive(serde::Deserialize)]
pub(crate) struct HostBench {
    errors: u64,
    elapsed_ms: f64,
    p50_us: f64,
    p99_us: f64,
    #[serde(default)]
    samples_us: Vec<u64>,
}

async fn host_bench(
    ctl: &mut Client,
    name: &str,
    uri: &str,
    count: usize,
    samples: bool,
) -> HostBench {
    let args = json!({"uri": uri, "count": count, "samples": samples});
    let text = tool_text(ctl, name, "host_bench", args).await;
    let out: HostBench = serde_json::from_str(&text).unwrap();
    assert_eq!(out.errors, 0, "{name}: {text}");
    out
}

/// Rounds of the measured path and of its floor, alternated, so that both
/// see the same machine: on a VM a cross-CPU wake-up costs 15–25 µs and
/// where the scheduler places two processes changes between runs.
pub(crate) const ROUNDS: usize = 5;

async fn host_resources(d: &BenchDaemon, ctl: &mut Client) -> Vec<Row> {
    let files = d.root.join("files");
    let text: String = (0..4096).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    std::fs::write(files.join("small.txt"), text).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let binary: Vec<u8> = (0..1 << 20).map(|_| rng.u8(..)).collect();
    std::fs::write(files.join("large.bin"), binary).unwrap();
    let mut uris = Vec::new();
    for f in ["small.txt", "large.bin"] {
        let record = call(ctl, method::FILES_PUT, json!({"path": files.join(f)})).await;
        uris.push(format!("files://{}", record["id"].as_str().unwrap()));
    }
    let names: Vec<String> = (0..8).map(|i| format!("h{i}")).collect();
    for name in &names {
        let dir = harness::demo_bundle(&d.root.join("bundles"), name);
        call(ctl, method::INSTALL, json!({"path": dir})).await;
    }
    let mut rows = Vec::new();
    for (uri, label, count) in [
        (&uris[0], "4 KiB text", scaled(5000)),
        (&uris[1], "1 MiB binary", scaled(60)),
    ] {
        // The peer's answer is exactly what the daemon answers.
        let reply = tool_text(ctl, "h0", "host_read", json!({"uri": uri})).await;
        let reply_file = d.root.join("reply.json");
        std::fs::write(&reply_file, &reply).unwrap();

        host_bench(ctl, "h0", uri, count / 10, false).await; // warm-up
        let placements: &[Option<Placement>] = if label.starts_with('4') {
            &[Some(Placement::SameCore), Some(Placement::TwoCores), None]
        } else {
            &[None]
        };
        for placement in placements {
            let what = format!(
                "host read {label}, 1 bundle, {}",
                placement.map_or("unpinned", Placement::label)
            );
            let row = one_bundle_reads(d, ctl, uri, &reply_file, count, *placement).await;
            rows.push(
                Row::latency(&what, row.0, Some(row.1))
                    .rate(row.2, row.3)
                    .target(if label.starts_with('4') && placement.is_some() {
                        Target::RateOfFloorAtLeast(0.5)
                    } else {
                        Target::None
                    }),
            );
        }

        let per = (count / 4).max(3);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for name in &names {
            let (mut c, name, uri) = (d.connect().await, name.clone(), uri.clone());
            tasks.push(tokio::spawn(async move {
                host_bench(&mut c, &name, &uri, per, false).await
            }));
        }
        let mut each = Vec::new();
        for t in tasks {
            each.push(t.await.unwrap());
        }
        let rate = (per * names.len()) as f64 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        let floors: Vec<_> = (0..names.len())
            .map(|_| {
                let (file, uri) = (reply_file.clone(), uri.clone());
                std::thread::spawn(move || floors::pipe_echo(&file, &uri, per, None))
            })
            .collect();
        let floor: Vec<Duration> = floors.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let floor_rate = (per * names.len()) as f64 / start.elapsed().as_secs_f64();
        let mut p50: Vec<f64> = each.iter().map(|h| h.p50_us).collect();
        p50.sort_by(f64::total_cmp);
        let p99 = each.iter().map(|h| h.p99_us).fold(0.0, f64::max);
        rows.push(
            Row::latency(
                &format!("host read {label}, 8 bundles"),
                Summary {
                    median_us: p50[p50.len() / 2],
                    p99_us: p99,
                    n: per * names.len(),
                },
                Some(summarize(floor)),
            )
            .rate(rate, floor_rate),
        );
    }
    rows
}

/// Reads by one bundle (`h0`) and the pipe-echo floor of the same bytes in
/// alternating rounds; with a placement, the daemon and the bundle are
/// pinned like the floor's two ends. Returns (sample, floor sample, rate,
/// floor rate).
async fn one_bundle_reads(
    d: &BenchDaemon,
    ctl: &mut Client,
    uri: &str,
    reply_file: &Path,
    count: usize,
    placement: Option<Placement>,
) -> (Summary, Summary, f64, f64) {
    let bundle = status(ctl)
        .await
        .bundles
        .iter()
        .find(|b| b.name == "h0")
        .and_then(|b| b.pid)
        .expect("h0 runs");
    let pin = |cpus: Option<(usize, usize)>| {
        harness::pin_process(d.pid(), cpus.map(|c| c.0));
        harness::pin_process(bundle, cpus.map(|c| c.1));
    };
    let (mut got, mut got_secs, mut floor) = (Vec::new(), 0.0, Vec::new());
    for _ in 0..ROUNDS {
        pin(placement.map(Placement::cpus));
        let one = host_bench(ctl, "h0", uri, count / ROUNDS, true).await;
        pin(None);
        got_secs += one.elapsed_ms / 1000.0;
        got.extend(one.samples_us.iter().map(|us| Duration::from_micros(*us)));
        let (file, uri) = (reply_file.to_path_buf(), uri.to_string());
        floor.extend(
            tokio::task::spawn_blocking(move || {
                floors::pipe_echo(&file, &uri, count / ROUNDS, placement)
            })
            .await
            .unwrap(),
        );
    }
    let rate = got.len() as f64 / got_secs;
    let floor_rate = floor.len() as f64 / floor.iter().sum::<Duration>().as_secs_f64();
    (summarize(got), summarize(floor), rate, floor_rate)
}

/// `status` with 64 concurrent clients against the daemon and against a
/// server answering the same bytes.
async fn control(d: &BenchDaemon, ctl: &mut Client) -> Row {
    let run = Duration::from_secs_f64(2.0 * scaled(100) as f64 / 100.0);
    let reply = call(ctl, method::STATUS, json!({})).await;
    let reply_file = d.root.join("status.json");
    std::fs::write(&reply_file, serde_json::to_vec(&reply).unwrap()).unwrap();
    let got = floors::hammer(&d.socket, 64, method::STATUS, true, run).await;
    let floor_socket = d.root.join("floor.sock");
    let mut server = floors::socket_echo(&reply_file, &floor_socket);
    let floor = floors::hammer(&floor_socket, 64, method::STATUS, false, run).await;
    let _ = server.kill();
    let _ = server.wait();
    let (rate, floor_rate) = (
        got.len() as f64 / run.as_secs_f64(),
        floor.len() as f64 / run.as_secs_f64(),
    );
    let bundles = reply["bundles"].as_array().map_or(0, Vec::len);
    Row::latency(
        &format!("control: status, 64 clients, {bundles} bundles"),
        summarize(got),
        Some(summarize(floor)),
    )
    .rate(rate, floor_rate)
}

pub(crate) async fn echo_calls(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    n: usize,
) -> Vec<Duration> {
    let args = json!({"text": "ping"}).as_object().unwrap().clone();
    let mut sample = Vec::with_capacity(n);
    for i in 0..n + 50 {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.clone());
        let start = Instant::now();
        client.peer().call_tool(params).await.expect("call");
        if i >= 50 {
            sample.push(start.elapsed());
        }
    }
    sample
}

/// rmcp's streamable HTTP client of the daemon's `default` endpoint,
/// with `token`.
pub(crate) fn http_transport(
    port: u16,
    token: &str,
) -> rmcp::transport::StreamableHttpClientTransport<reqwest::Client> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config = StreamableHttpClientTransportConfig::with_uri(format!(
        "http://127.0.0.1:{port}/mcp/default"
    ))
    .auth_header(token.to_string());
    rmcp::transport::StreamableHttpClientTransport::with_client(reqwest::Client::new(), config)
}

/// An `echo` call directly to the bundle and through `bundlevisor mcp`.
async fn gateway(d: &BenchDaemon, ctl: &mut Client, http_port: u16) -> Vec<Row> {
    let n = scaled(2000);
    let dir = harness::demo_bundle(&d.root.join("bundles"), "gw");
    call(ctl, method::INSTALL, json!({"path": dir})).await;
    let (_child, direct) = floors::bare_start().await;
    let (_mcp, client) = harness::mcp_agent(d, "default").await;
    let (_relays, relayed) = floors::relayed_start(2).await;
    // An agent over streamable HTTP, with a token.
    let made = call(ctl, method::TOKEN_CREATE, json!({"workspace": "default"})).await;
    let token = made["token"].as_str().expect("a token").to_string();
    let http = rmcp::ServiceExt::serve((), http_transport(http_port, &token))
        .await
        .expect("initialize over HTTP");
    // An agent on MCP 2026-07-28: `server/discover`, then stateless
    // requests (no session), with the same token.
    let stateless = {
        use rmcp::{ClientLifecycleMode, ClientServiceExt};
        let discover = ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        };
        ().serve_with_lifecycle(http_transport(http_port, &token), discover)
            .await
            .expect("server/discover over HTTP")
    };
    let rmcp_http = floors::rmcp_http_echo().await;
    // Lean agents (requests written by hand, no MCP or HTTP library): what
    // the gateway itself adds, without the agent library's own cost.
    let mut lean_floor = floors::RawStdio::start().await;
    let bearer = [("Authorization".to_string(), format!("Bearer {token}"))];
    let mut lean_session = floors::RawHttp::connect(http_port, "/mcp/default", &bearer).await;
    lean_session.open_session().await;
    let lean_params = json!({"name": "gw__echo", "arguments": {"text": "ping"}});
    // A 2026-07-28 call of `tool`: its headers, and its params.
    let stateless_call = |tool: &str| {
        let mut headers = bearer.to_vec();
        for (k, v) in [
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", tool),
        ] {
            headers.push((k.to_string(), v.to_string()));
        }
        let params = json!({"name": tool, "arguments": {"text": "ping"}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}});
        (headers, params)
    };
    let (headers, lean_2026) = stateless_call("gw__echo");
    let mut lean = floors::RawHttp::connect(http_port, "/mcp/default", &headers).await;
    // The per-bundle endpoint: the bundle as itself, its tools by their
    // own names.
    let (own, own_2026) = stateless_call("echo");
    let mut lean_own = floors::RawHttp::connect(http_port, "/mcp/default/bundle/gw", &own).await;
    let mut lean_own_sample = Vec::new();
    // The same request to a bare HTTP→stdio relay: what any gateway adds.
    let (_http_relay, relay_port) = floors::http_relay_start().await;
    let mut lean_relay = floors::RawHttp::connect(relay_port, "/mcp", &headers).await;
    let relay_2026 = own_2026.clone();
    let mut lean_relay_sample = Vec::new();
    let (mut lean_floor_sample, mut lean_session_sample, mut lean_sample) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut got, mut floor, mut relay) = (Vec::new(), Vec::new(), Vec::new());
    let (mut control, mut over_http, mut over_stateless) = (Vec::new(), Vec::new(), Vec::new());
    let mut bare_http = Vec::new();
    let args = json!({"name": "gw", "tool": "echo", "arguments": {"text": "ping"}});
    for _ in 0..ROUNDS {
        floor.extend(echo_calls(&direct, "echo", n / ROUNDS).await);
        relay.extend(echo_calls(&relayed, "echo", n / ROUNDS).await);
        got.extend(echo_calls(&client, "gw__echo", n / ROUNDS).await);
        over_http.extend(echo_calls(&http, "gw__echo", n / ROUNDS).await);
        over_stateless.extend(echo_calls(&stateless, "gw__echo", n / ROUNDS).await);
        bare_http.extend(echo_calls(&rmcp_http, "echo", n / ROUNDS).await);
        lean_floor_sample.extend(lean_floor.echo_calls(n / ROUNDS).await);
        lean_session_sample.extend(lean_session.echo_calls(&lean_params, n / ROUNDS).await);
        lean_sample.extend(lean.echo_calls(&lean_2026, n / ROUNDS).await);
        lean_own_sample.extend(lean_own.echo_calls(&own_2026, n / ROUNDS).await);
        lean_relay_sample.extend(lean_relay.echo_calls(&relay_2026, n / ROUNDS).await);
        for _ in 0..n / ROUNDS {
            let start = Instant::now();
            call(ctl, method::CALL, args.clone()).await;
            control.push(start.elapsed());
        }
    }
    for c in [client, direct, relayed, http, stateless, rmcp_http] {
        let _ = c.cancel().await;
    }
    let floor = summarize(floor);
    let lean_floor_summary = summarize(lean_floor_sample);
    vec![
        Row::latency(
            "gateway: echo via bundlevisor mcp",
            summarize(got),
            Some(floor),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(100))),
        // The daemon's own HTTP endpoint (issue 20: the same Gateway,
        // still on the daemon's control socket inside).
        Row::latency(
            "gateway: echo via the daemon's HTTP endpoint",
            summarize(over_http),
            Some(floor),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(50))),
        // The same endpoint for an agent on MCP 2026-07-28 (issue 32): no
        // session, the version and capabilities in every request's `_meta`.
        Row::latency(
            "gateway: echo via HTTP, MCP 2026-07-28 (stateless)",
            summarize(over_stateless),
            Some(floor),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(50))),
        // What two more processes in the path cost on this machine when
        // they do nothing but copy lines: the bound of any out-of-process
        // relay (docs/performance.md).
        Row::latency(
            "  same call through 2 line-relay processes",
            summarize(relay),
            Some(floor),
        ),
        // The daemon's share: the call over the control socket, no gateway.
        Row::latency(
            "  same call as bundle.call on the socket",
            summarize(control),
            Some(floor),
        ),
        // The same calls by lean agents: the gateway's own cost.
        Row::latency(
            "gateway: echo via HTTP session, lean agent",
            summarize(lean_session_sample),
            Some(lean_floor_summary),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(50))),
        Row::latency(
            "gateway: echo via HTTP 2026-07-28, lean agent",
            summarize(lean_sample),
            Some(lean_floor_summary),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(50))),
        // The same through the bundle's own endpoint (issue 37: "the
        // per-bundle endpoint the same").
        Row::latency(
            "gateway: echo via the per-bundle endpoint, 2026-07-28, lean agent",
            summarize(lean_own_sample),
            Some(lean_floor_summary),
        )
        .target(Target::OverFloorAtMost(Duration::from_micros(50))),
        // A process that only relays the POST body to the bundle's pipe
        // and its line back, on the daemon's HTTP stack: the bound of the
        // two rows above on this machine (docs/performance.md).
        Row::latency(
            "  same request through a bare HTTP→stdio relay",
            summarize(lean_relay_sample),
            Some(lean_floor_summary),
        ),
        // rmcp's streamable HTTP server with an in-process echo: the least
        // a gateway on it adds (no bundle behind it, so its floor is 0).
        Row::latency(
            "  rmcp HTTP server alone, in-process echo",
            summarize(bare_http),
            None,
        ),
    ]
}

/// Daemon start → every installed bundle ready, several times, with the
/// daemon's memory at that point.
fn boot_count() -> usize {
    std::env::var("BOOT_BUNDLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke() { 5 } else { 200 })
}

async fn boot(root: &Path, peer: Option<&supervisord::Figures>) -> Vec<Row> {
    let count = boot_count();
    let rounds = scaled(3);
    std::fs::create_dir_all(root.join("bundles")).unwrap();
    let config = CONFIG.replace("[[watch]]\ndir = \"watched\"\n", "");
    let d = BenchDaemon::start(root, Some(&config)).await;
    let idle_kib = rss_kib(d.pid());
    let mut tap = EventTap::start(&d).await;
    let mut ctl = d.connect().await;
    for i in 0..count {
        let dir = harness::demo_bundle(&root.join("bundles"), &format!("b{i:03}"));
        call(
            &mut ctl,
            method::INSTALL,
            json!({"path": dir, "no_wait": true}),
        )
        .await;
    }
    tap.wait_count(EventKind::Ready, count).await;
    drop(ctl);
    d.stop();

    let (mut sample, mut running) = (Vec::new(), Vec::new());
    let (mut daemon_kib, mut bundle_kib) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        let d = BenchDaemon::start(root, None).await;
        let daemon = d.pid();
        let all_running =
            tokio::task::spawn_blocking(move || supervisord::wait_running(daemon, count));
        let mut tap = EventTap::start(&d).await;
        let mut ctl = d.connect().await;
        let at = harness::all_ready(&mut ctl, &mut tap, count).await;
        sample.push(at - start);
        running.push(all_running.await.unwrap() - start);
        daemon_kib.push(rss_kib(d.pid()));
        let st = status(&mut ctl).await;
        let pids: Vec<u32> = st.bundles.iter().filter_map(|b| b.pid).collect();
        assert_eq!(pids.len(), count);
        bundle_kib.push(pids.iter().map(|p| rss_kib(*p)).sum::<u64>() / count as u64);
        drop(ctl);
        d.stop();
    }

    let mut floor = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let all = futures::future::join_all((0..count).map(|_| floors::bare_start())).await;
        floor.push(start.elapsed());
        for (_child, client) in all {
            let _ = client.cancel().await;
        }
    }
    let daemon = *daemon_kib.iter().max().unwrap();
    let mut rows = vec![Row::latency(
        &format!("boot: start → {count} bundles ready"),
        summarize(sample),
        Some(summarize(floor)),
    )
    .target(Target::AtMost(Duration::from_secs(3)))];
    if let Some(p) = peer {
        rows.push(Row::latency(
            &format!("  start → {count} running (floor: supervisord)"),
            summarize(running),
            Some(p.start),
        ));
    }
    rows.extend([
        Row::memory(
            &format!("daemon RSS, {count} bundles ready"),
            daemon,
            Target::MemoryAtMost(64 << 10),
        ),
        Row::memory("daemon RSS, idle", idle_kib, Target::None),
        Row::memory(
            "daemon RSS per bundle",
            daemon.saturating_sub(idle_kib) / count as u64,
            Target::None,
        ),
        Row::memory(
            "demo bundle process RSS (mean)",
            bundle_kib.iter().sum::<u64>() / bundle_kib.len() as u64,
            Target::None,
        ),
    ]);
    rows
}
