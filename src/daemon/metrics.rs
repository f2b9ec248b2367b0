//! The daemon's metrics in the Prometheus text format (version 0.0.4):
//! `bundlevisor metrics` over the socket, and `GET /metrics` on the
//! optional `metrics_addr` listener. Counters are kept here (tool calls,
//! host-resources requests, control requests) or on the status board
//! (restarts, crashes); gauges (bundles by state, memory) are read when
//! the text is rendered. Series of an uninstalled bundle disappear with it.
//! docs/operations.md lists every series.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;

use super::board::StatusBoard;
use crate::host_resources::{codes as code, HostError};
use crate::protocol::BundleState;

/// A bundle's tree from its cgroup: memory (bytes), CPU time (µs).
type TreeUsage = (Option<u64>, Option<u64>);

/// Upper bounds (seconds) of the tool-call latency histogram.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a host-resources request came to.
pub const HOST_OUTCOMES: [&str; 5] = ["ok", "not_found", "rate_limited", "too_large", "invalid"];

#[derive(Default)]
struct Calls {
    total: u64,
    errors: u64,
    /// Per bucket of `BUCKETS` (not cumulative), then the +Inf overflow.
    buckets: [u64; BUCKETS.len() + 1],
    sum_secs: f64,
}

/// Keyed so that a hit is looked up with borrowed names (no allocation on
/// the request path).
#[derive(Default)]
struct Inner {
    /// workspace → bundle → calls.
    calls: BTreeMap<String, BTreeMap<String, Calls>>,
    host: BTreeMap<String, [u64; HOST_OUTCOMES.len()]>,
    control: BTreeMap<&'static str, u64>,
    /// workspace → bundle → exits the OOM killer caused.
    oom: BTreeMap<String, BTreeMap<String, u64>>,
}

/// The entry of `key` in `map`, inserted with a default on first use.
fn slot<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// The outcome label of a host-resources answer.
pub fn host_outcome(result: &Result<serde_json::Value, HostError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) if e.code == code::NOT_FOUND => "not_found",
        Err(e) if e.code == code::RATE_LIMITED => "rate_limited",
        Err(e) if e.code == code::TOO_LARGE => "too_large",
        Err(_) => "invalid",
    }
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A tool call answered (`ok`: a result without `isError`).
    pub fn tool_call(&self, workspace: &str, bundle: &str, took: Duration, ok: bool) {
        let mut inner = self.lock();
        let calls = slot(slot(&mut inner.calls, workspace), bundle);
        calls.total += 1;
        calls.errors += u64::from(!ok);
        let secs = took.as_secs_f64();
        calls.sum_secs += secs;
        let bucket = BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(BUCKETS.len());
        calls.buckets[bucket] += 1;
    }

    pub fn host_request(&self, workspace: &str, outcome: &str) {
        let i = HOST_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(HOST_OUTCOMES.len() - 1);
        slot(&mut self.lock().host, workspace)[i] += 1;
    }

    /// A request on the control socket; `method` is one the daemon knows
    /// (anything else is counted as `other`, so that clients cannot grow
    /// the label set).
    pub fn control_request(&self, method: &str) {
        let label = crate::protocol::method::REQUESTS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other");
        *self.lock().control.entry(label).or_default() += 1;
    }

    /// A bundle's process tree was killed by the OOM killer (its memory_max).
    pub fn oom_killed(&self, workspace: &str, bundle: &str) {
        *slot(slot(&mut self.lock().oom, workspace), bundle) += 1;
    }

    /// Tool calls and errors of a bundle so far (for `status --usage`).
    pub fn calls_of(&self, workspace: &str, bundle: &str) -> (u64, u64) {
        self.lock()
            .calls
            .get(workspace)
            .and_then(|bundles| bundles.get(bundle))
            .map_or((0, 0), |c| (c.total, c.errors))
    }

    /// Everything, as Prometheus text.
    pub fn render(
        &self,
        board: &StatusBoard,
        uptime: Duration,
        cgroups: &crate::bundle::cgroup::Cgroups,
    ) -> String {
        let (workspaces, bundles) = board.snapshot();
        let counts = board.counts();
        let mut out = String::with_capacity(4096);
        let daemon_rss = rss_bytes(std::process::id()).unwrap_or(0);
        for (name, help, value) in [
            (
                "bundlevisor_uptime_seconds",
                "Seconds since the daemon started.",
                uptime.as_secs(),
            ),
            (
                "bundlevisor_resident_memory_bytes",
                "Resident memory of the daemon process.",
                daemon_rss,
            ),
        ] {
            let name = family(&mut out, name, "gauge", help);
            sample(&mut out, &name, &[], value.to_string());
        }
        let name = family(
            &mut out,
            "bundlevisor_bundles",
            "gauge",
            "Installed bundles by state.",
        );
        for state in BundleState::ALL {
            let n = bundles.iter().filter(|b| b.state == state).count();
            sample(&mut out, &name, &[("state", state.as_str())], n.to_string());
        }
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_restarts_total", "counter"),
            "Starts of a bundle after its first one since the daemon started (any reason but a 401 session rebuild; status shows the same number).",
            counts
                .iter()
                .map(|((ws, b), c)| (ws.as_str(), b.as_str(), c.restarts)),
        );
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_crashes_total", "counter"),
            "Stops of a bundle nobody asked for: exits other than code 0, liveness kills, and failed starts that are retried.",
            counts
                .iter()
                .map(|((ws, b), c)| (ws.as_str(), b.as_str(), c.crashes)),
        );
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_resident_memory_bytes", "gauge"),
            "Resident memory of a running bundle's process.",
            bundles.iter().filter_map(|b| {
                let rss = b.pid.and_then(rss_bytes)?;
                Some((b.workspace.as_str(), b.name.as_str(), rss))
            }),
        );

        // The whole tree of each running bundle, from its cgroup.
        let usage: Vec<(&str, &str, TreeUsage)> = bundles
            .iter()
            .filter(|b| b.pid.is_some())
            .map(|b| {
                let usage = cgroups.usage(&b.workspace, &b.name);
                (b.workspace.as_str(), b.name.as_str(), usage)
            })
            .collect();
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_memory_bytes", "gauge"),
            "Memory of a running bundle's whole process tree (its cgroup).",
            usage
                .iter()
                .filter_map(|(ws, b, (memory, _))| Some((*ws, *b, (*memory)?))),
        );
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_cpu_seconds_total", "counter"),
            "CPU time of a running bundle's whole process tree (its cgroup), since it started.",
            usage
                .iter()
                .filter_map(|(ws, b, (_, cpu))| Some((*ws, *b, (*cpu)? as f64 / 1e6))),
        );

        let installed: std::collections::HashSet<(&str, &str)> = bundles
            .iter()
            .map(|b| (b.workspace.as_str(), b.name.as_str()))
            .collect();
        let inner = self.lock();
        let calls: Vec<(&str, &str, &Calls)> = inner
            .calls
            .iter()
            .flat_map(|(ws, bundles)| {
                bundles
                    .iter()
                    .map(move |(b, c)| (ws.as_str(), b.as_str(), c))
            })
            .filter(|(ws, b, _)| installed.contains(&(*ws, *b)))
            .collect();
        per_bundle(
            &mut out,
            ("bundlevisor_bundle_oom_kills_total", "counter"),
            "Exits of a bundle caused by the kernel's OOM killer at its memory_max.",
            inner
                .oom
                .iter()
                .flat_map(|(ws, bundles)| {
                    bundles
                        .iter()
                        .map(move |(b, n)| (ws.as_str(), b.as_str(), *n))
                })
                .filter(|(ws, b, _)| installed.contains(&(*ws, *b))),
        );
        per_bundle(
            &mut out,
            ("bundlevisor_tool_calls_total", "counter"),
            "Tool calls answered by a bundle.",
            calls.iter().map(|(ws, b, c)| (*ws, *b, c.total)),
        );
        per_bundle(
            &mut out,
            ("bundlevisor_tool_call_errors_total", "counter"),
            "Tool calls that failed, timed out, were refused or returned isError.",
            calls.iter().map(|(ws, b, c)| (*ws, *b, c.errors)),
        );
        let name = family(
            &mut out,
            "bundlevisor_tool_call_duration_seconds",
            "histogram",
            "Time from a tool call reaching the daemon to its answer.",
        );
        for (ws, b, c) in &calls {
            let labels = [("workspace", *ws), ("bundle", *b)];
            let mut cumulative = 0;
            for (i, le) in BUCKETS
                .iter()
                .map(f64::to_string)
                .chain(["+Inf".into()])
                .enumerate()
            {
                cumulative += c.buckets[i];
                let labels = [labels[0], labels[1], ("le", le.as_str())];
                sample(
                    &mut out,
                    &format!("{name}_bucket"),
                    &labels,
                    cumulative.to_string(),
                );
            }
            sample(
                &mut out,
                &format!("{name}_sum"),
                &labels,
                c.sum_secs.to_string(),
            );
            sample(
                &mut out,
                &format!("{name}_count"),
                &labels,
                c.total.to_string(),
            );
        }

        let name = family(
            &mut out,
            "bundlevisor_host_resources_requests_total",
            "counter",
            "ai.nimblebrain/resources requests from bundles, by workspace and outcome.",
        );
        for ws in &workspaces {
            let counts = inner.host.get(ws).copied().unwrap_or_default();
            for (outcome, n) in HOST_OUTCOMES.iter().zip(counts) {
                let labels = [("workspace", ws.as_str()), ("outcome", *outcome)];
                sample(&mut out, &name, &labels, n.to_string());
            }
        }
        let name = family(
            &mut out,
            "bundlevisor_control_requests_total",
            "counter",
            "Requests on the control socket, by method.",
        );
        for (method, n) in &inner.control {
            sample(&mut out, &name, &[("method", method)], n.to_string());
        }
        out
    }
}

/// A family with one sample per (workspace, bundle).
fn per_bundle<'a, V: std::fmt::Display>(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    samples: impl Iterator<Item = (&'a str, &'a str, V)>,
) {
    let name = family(out, name, kind, help);
    for (ws, bundle, value) in samples {
        sample(
            out,
            &name,
            &[("workspace", ws), ("bundle", bundle)],
            value.to_string(),
        );
    }
}

/// Writes a family's HELP and TYPE lines; its name back.
fn family(out: &mut String, name: &str, kind: &str, help: &str) -> String {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    name.to_string()
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: String) {
    let _ = writeln!(out, "{name}{} {value}", labels_text(labels));
}

fn labels_text(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Label values escape `\`, `"` and newlines.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Resident memory of a process, from `/proc/PID/statm`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    Some(pages * page)
}

/// Serves `GET /metrics` on `listener` until the task is dropped. One
/// request per connection; anything else is 404 or 405. Connections are
/// served concurrently with a 5 s deadline for the request head, at most
/// 64 at once (the oldest is closed for a newcomer): idle or trickling
/// connections cannot keep a scrape out.
pub async fn serve_http(
    listener: TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
    admit: impl Fn(std::net::SocketAddr, std::net::SocketAddr) -> Result<(), String>
        + Send
        + Sync
        + 'static,
) {
    use crate::http_listener::{serve_admitting, Limits, Response};
    let answer = move |r: &crate::http_listener::Request| {
        let response = match (r.method.as_str(), r.path()) {
            ("GET", "/metrics") => Response {
                status: "200 OK",
                content_type: "text/plain; version=0.0.4",
                body: render(),
            },
            ("GET", _) => Response {
                status: "404 Not Found",
                content_type: "text/plain",
                body: "try /metrics\n".to_string(),
            },
            _ => Response {
                status: "405 Method Not Allowed",
                content_type: "text/plain",
                body: "GET only\n".to_string(),
            },
        };
        (response, None)
    };
    let never: std::convert::Infallible =
        serve_admitting(&listener, Limits::default(), admit, answer).await;
    match never {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_addr;

    #[test]
    fn a_bare_port_is_loopback_and_junk_is_refused() {
        assert_eq!(parse_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr(":9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert!(parse_addr("localhost").unwrap_err().contains("HOST:PORT"));
    }

    #[test]
    fn latencies_land_in_their_bucket_and_label_values_are_escaped() {
        let m = Metrics::default();
        m.tool_call("w", "b", Duration::from_micros(700), true);
        m.tool_call("w", "b", Duration::from_secs(60), false);
        let inner = m.lock();
        let c = &inner.calls["w"]["b"];
        assert_eq!(c.buckets[1], 1, "0.7 ms is in le=0.001");
        assert_eq!(c.buckets[BUCKETS.len()], 1, "60 s is only in +Inf");
        assert_eq!((c.total, c.errors), (2, 1));
        assert_eq!(labels_text(&[("a", "x\"y\\z\n")]), "{a=\"x\\\"y\\\\z\\n\"}");
    }
}
