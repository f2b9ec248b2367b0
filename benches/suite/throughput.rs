//! Throughput of the HTTP gateway (issue 37, point 2;
//! `BENCH_ONLY=throughput`): `wrk` (Debian's, installed by `make
//! bench-peers`) drives raw MCP 2026-07-28 `tools/call` POSTs — stateless
//! requests, each a whole call — at the daemon's endpoint over 1, 10, 100
//! and 1,000 keep-alive connections (one agent each), for a few seconds
//! each; then the same call on one MCP 2025-11-25 session that every
//! connection shares. At each point: calls per second, calls per second per daemon
//! core (the calls over the CPU time the daemon used meanwhile, from
//! `/proc`), wrk's median and p99 latency, the daemon's RSS; beside them
//! the bundle's own ceiling (the same demo bundle called directly over its
//! stdio with as many calls in flight). wrk, the daemon and the bundle
//! share this machine's cores: the per-core figure is the one that does
//! not depend on who else runs. Written to `target/bench/throughput.json`
//! and plotted to `target/bench/throughput.png`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::harness::{rss_kib, BenchDaemon};

/// The agents (connections) at each point.
const AGENTS: [usize; 4] = [1, 10, 100, 1000];

#[derive(Debug, Serialize)]
pub struct Point {
    pub agents: usize,
    pub calls_per_s: f64,
    /// Calls over the daemon's CPU seconds (user + system) in the run.
    pub calls_per_daemon_core_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub daemon_rss_kib: u64,
    /// Non-2xx answers and socket errors (timeouts included).
    pub errors: u64,
    /// The bundle called directly with `agents` calls in flight.
    pub bundle_calls_per_s: f64,
    /// The same call on one MCP 2025-11-25 session (all the agents share
    /// it): calls per second and median.
    pub session_calls_per_s: f64,
    pub session_p50_us: f64,
    /// Non-2xx answers and socket errors of the session's run.
    pub session_errors: u64,
}

/// The daemon's CPU time so far (user + system), from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime
    // are the 12th and 13th of them.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// What wrk repeats: a POST of `body` with `headers`. A JSON-RPC body
/// (`numbered`) gets an id of its own on every request (each wrk thread
/// its own range), since a peer that keeps a session may route answers by
/// id; a REST body is sent as it is.
pub struct Load {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
    pub numbered: bool,
}

impl Load {
    /// The daemon's MCP 2026-07-28 stateless `tools/call` of `tool`.
    pub fn stateless(url: &str, token: &str, tool: &str) -> Load {
        let header = |k: &str, v: &str| (k.to_string(), v.to_string());
        Load {
            url: url.to_string(),
            headers: vec![
                header("Authorization", &format!("Bearer {token}")),
                header("MCP-Protocol-Version", "2026-07-28"),
                header("Mcp-Method", "tools/call"),
                header("Mcp-Name", tool),
            ],
            body: json!({
                "jsonrpc": "2.0", "method": "tools/call",
                "params": {
                    "name": tool,
                    "arguments": {"text": "ping"},
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {},
                    },
                },
            }),
            numbered: true,
        }
    }

    /// The wrk script: this request on every call, and the figures
    /// printed as one line at the end.
    fn script(&self) -> String {
        let mut headers = String::new();
        for (k, v) in [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ]
        .into_iter()
        .chain(self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            headers.push_str(&format!("wrk.headers[\"{k}\"] = [[{v}]]\n"));
        }
        let body = self.body.to_string();
        let request = if self.numbered {
            // `{"id":N,` then the body without its opening brace.
            r#"request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, '{"id":' .. (tid * 1000000000 + counter) .. ',' .. string.sub(body, 2))
end"#
        } else {
            "wrk.body = body"
        };
        format!(
            r#"wrk.method = "POST"
{headers}body = [[{body}]]
counter = 0
tid = 0
threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
{request}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.status + e.connect + e.read + e.write + e.timeout))
end
"#
        )
    }

    /// One request by hand first: wrk counts any 200 as done, and a
    /// JSON-RPC error (or a REST error in a 200) is a 200 too.
    pub async fn check(&self) {
        let mut body = self.body.clone();
        if self.numbered {
            body["id"] = json!(1);
        }
        let mut request = reqwest::Client::new()
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let answer = request
            .send()
            .await
            .expect("the call")
            .text()
            .await
            .expect("its answer");
        assert!(
            answer.contains("\"result\"")
                && answer.contains("ping")
                && !answer.contains("isError\":true"),
            "the call wrk repeats must succeed at {}: {answer}",
            self.url
        );
    }
}

/// What one wrk run measured.
pub struct Wrk {
    pub requests: f64,
    pub calls_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// wrk with `agents` connections for `secs` against `load` (its script
/// written into `dir`).
pub fn wrk(load: &Load, dir: &Path, agents: usize, secs: u64) -> Wrk {
    let script_path = dir.join(format!("wrk-{}.lua", std::process::id()));
    std::fs::write(&script_path, load.script()).unwrap();
    let threads = agents.min(2);
    let out = tokio::task::block_in_place(|| {
        Command::new("wrk")
            .args(["-t", &threads.to_string(), "-c", &agents.to_string()])
            .args(["-d", &format!("{secs}s"), "--timeout", "10s", "-s"])
            .arg(&script_path)
            .arg(&load.url)
            .output()
            .expect("wrk (make bench-peers installs it)")
    });
    let _ = std::fs::remove_file(&script_path);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "wrk said no result: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let f: Vec<f64> = line
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    Wrk {
        requests: f[0],
        calls_per_s: f[0] / (f[1] / 1e6),
        p50_us: f[2],
        p99_us: f[3],
        errors: f[4] as u64,
    }
}

/// The demo bundle called directly over its stdio with `in_flight` calls
/// at once for `secs`: its calls per second.
async fn bundle_ceiling(in_flight: usize, secs: Duration) -> f64 {
    let (_child, client) = crate::floors::bare_start().await;
    let peer = client.peer().clone();
    let end = Instant::now() + secs;
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let peer = peer.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let args = json!({"text": "ping"}).as_object().cloned();
                let request =
                    rmcp::model::CallToolRequestParams::new("echo").with_arguments(args.unwrap());
                peer.call_tool(request).await.expect("echo");
                n += 1;
            }
            n
        }));
    }
    let started = Instant::now();
    let mut calls = 0;
    for t in tasks {
        calls += t.await.unwrap();
    }
    let took = started.elapsed().as_secs_f64();
    let _ = client.cancel().await;
    calls as f64 / took
}

pub async fn measure(d: &BenchDaemon, http_port: u16, token: &str, tool: &str) -> Vec<Point> {
    let url = format!("http://127.0.0.1:{http_port}/mcp/default");
    let load = Load::stateless(&url, token, tool);
    load.check().await;
    let (agent, session) = crate::peers::streamable(&url, Some(token), tool).await;
    agent.close().await;
    session.check().await;
    let secs = if crate::smoke() { 1 } else { 5 };
    let mut points = Vec::new();
    for agents in AGENTS {
        let agents = if crate::smoke() {
            agents.min(10)
        } else {
            agents
        };
        let before = cpu_seconds(d.pid());
        let run = wrk(&load, &d.root, agents, secs);
        let daemon_cpu = cpu_seconds(d.pid()) - before;
        let daemon_rss_kib = rss_kib(d.pid());
        let on_session = wrk(&session, &d.root, agents, secs);
        let bundle_calls_per_s = bundle_ceiling(agents, Duration::from_secs(secs)).await;
        points.push(Point {
            agents,
            calls_per_s: run.calls_per_s,
            calls_per_daemon_core_s: run.requests / daemon_cpu.max(1e-3),
            p50_us: run.p50_us,
            p99_us: run.p99_us,
            daemon_rss_kib,
            errors: run.errors,
            bundle_calls_per_s,
            session_calls_per_s: on_session.calls_per_s,
            session_p50_us: on_session.p50_us,
            session_errors: on_session.errors,
        });
        if crate::smoke() && agents == 10 {
            break;
        }
    }
    points
}

/// The points as lines of a table.
pub fn lines(points: &[Point]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>7} {:>10} {:>16} {:>10} {:>10} {:>10} {:>7} {:>14} {:>16} {:>12}",
        "agents",
        "calls/s",
        "calls/s/core",
        "p50",
        "p99",
        "RSS",
        "errors",
        "bundle alone",
        "session calls/s",
        "session p50"
    )];
    for p in points {
        lines.push(format!(
            "{:>7} {:>10.0} {:>16.0} {:>7.0} µs {:>7.0} µs {:>6.1} MiB {:>7} {:>12.0}/s {:>16.0} {:>9.0} µs",
            p.agents,
            p.calls_per_s,
            p.calls_per_daemon_core_s,
            p.p50_us,
            p.p99_us,
            p.daemon_rss_kib as f64 / 1024.0,
            p.errors + p.session_errors,
            p.bundle_calls_per_s,
            p.session_calls_per_s,
            p.session_p50_us
        ));
    }
    lines
}

/// `DIR/throughput.json` and the curve, `DIR/throughput.png`.
pub fn write(points: &[Point], dir: &Path) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("throughput.json"),
        serde_json::to_vec_pretty(points).map_err(std::io::Error::other)?,
    )?;
    let png = dir.join("throughput.png");
    plot(points, &png).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(png)
}

/// Calls per second (and the bundle's own, dashed grey), latency, RSS:
/// one chart each, the agents across on a log scale.
fn plot(points: &[Point], png: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    crate::scale::register_font()?;
    type Line = (&'static str, fn(&Point) -> f64, RGBColor, bool);
    let charts: [(&str, Vec<Line>); 3] = [
        (
            "calls per second",
            vec![
                (
                    "through the daemon",
                    |p| p.calls_per_s,
                    RGBColor(31, 119, 180),
                    false,
                ),
                (
                    "per daemon core",
                    |p| p.calls_per_daemon_core_s,
                    RGBColor(255, 127, 14),
                    false,
                ),
                (
                    "2025-11-25 session",
                    |p| p.session_calls_per_s,
                    RGBColor(148, 103, 189),
                    false,
                ),
                (
                    "the bundle alone",
                    |p| p.bundle_calls_per_s,
                    RGBColor(150, 150, 150),
                    true,
                ),
            ],
        ),
        (
            "latency (ms)",
            vec![
                ("p50", |p| p.p50_us / 1000.0, RGBColor(31, 119, 180), false),
                ("p99", |p| p.p99_us / 1000.0, RGBColor(214, 39, 40), false),
            ],
        ),
        (
            "daemon RSS (MiB)",
            vec![(
                "RSS",
                |p| p.daemon_rss_kib as f64 / 1024.0,
                RGBColor(44, 160, 44),
                false,
            )],
        ),
    ];
    let (root, body) = crate::scale::page(
        png,
        (1600, 550),
        "bundlevisor: tools/call over HTTP (MCP 2026-07-28 stateless; one 2025-11-25 session), wrk, one connection an agent",
    )?;
    let most = points.iter().map(|p| p.agents).max().unwrap_or(1) as f64;
    for (area, (name, lines)) in body.split_evenly((1, 3)).iter().zip(charts) {
        let top = (points.iter())
            .flat_map(|p| lines.iter().map(move |l| (l.1)(p)))
            .fold(0.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d((0.8..most * 1.25).log_scale(), 0.0..top.max(1e-9))?;
        chart
            .configure_mesh()
            .x_desc("agents")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| crate::scale::figure(top, *y))
            .label_style(("sans-serif", 14))
            .draw()?;
        for (label, value, color, dashed) in lines {
            let line: Vec<(f64, f64)> =
                points.iter().map(|p| (p.agents as f64, value(p))).collect();
            if dashed {
                chart
                    .draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(2)))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            } else {
                crate::scale::solid(&mut chart, line, color, label.to_string())?;
            }
        }
        crate::scale::legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}
