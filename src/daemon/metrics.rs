//! The daemon's metrics: one `prometheus-client` registry, encoded in the
//! Prometheus text format (version 0.0.4) for `bundlevisor metrics` over
//! the socket and `GET /metrics` on the HTTP listeners (`[http] listen`
//! with `[http] metrics = true`, and `metrics_addr`).
//!
//! Counters the daemon counts as things happen (tool calls and their
//! latency, host-resources requests, control requests, OOM kills) are
//! metric families of the registry; what the status board and the cgroups
//! know (bundles by state, restarts, crashes, memory, CPU) is read at each
//! scrape by a collector registered with it. Series of an uninstalled
//! bundle disappear with it ([`Metrics::forget`]). docs/operations.md
//! lists every series.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::board::StatusBoard;
use crate::bundle::cgroup::Cgroups;
use crate::host_resources::{codes as code, HostError};
use crate::protocol::BundleState;

/// Upper bounds (seconds) of the tool-call latency histogram.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a host-resources request came to.
pub const HOST_OUTCOMES: [&str; 5] = ["ok", "not_found", "rate_limited", "too_large", "invalid"];

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BundleLabels {
    workspace: String,
    bundle: String,
}

impl BundleLabels {
    fn new(workspace: &str, bundle: &str) -> Self {
        BundleLabels {
            workspace: workspace.to_string(),
            bundle: bundle.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    workspace: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

fn latency() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The counted families (shared with the registry: a family is a handle).
struct Counted {
    calls: Family<BundleLabels, Counter>,
    errors: Family<BundleLabels, Counter>,
    durations: Family<BundleLabels, Histogram, fn() -> Histogram>,
    host: Family<HostLabels, Counter>,
    control: Family<MethodLabels, Counter>,
    oom: Family<BundleLabels, Counter>,
    /// The HTTP gateway's requests answered below rmcp, and by rmcp.
    direct: Counter,
    by_rmcp: Counter,
    /// Looks at an endpoint's lists for its agents' change notifications.
    list_looks: Counter,
    /// Each called bundle's tool-call series (workspace, then bundle),
    /// handed out by the families once: counting a call is two adds and an
    /// observation, not three lookups by freshly made labels.
    series: std::sync::RwLock<HashMap<String, HashMap<String, CallSeries>>>,
}

/// One bundle's tool-call series.
struct CallSeries {
    calls: Counter,
    errors: Counter,
    durations: Histogram,
}

pub struct Metrics {
    registry: Registry,
    counted: Counted,
}

/// The outcome label of a host-resources answer: its index in
/// [`HOST_OUTCOMES`].
fn host_outcome<T>(result: &Result<T, HostError>) -> usize {
    match result {
        Ok(_) => 0,
        Err(e) if e.code == code::NOT_FOUND => 1,
        Err(e) if e.code == code::RATE_LIMITED => 2,
        Err(e) if e.code == code::TOO_LARGE => 3,
        Err(_) => 4,
    }
}

/// A workspace's host-resources counters, one per outcome, held by its
/// actor: counting an answer is one atomic add, not a lookup by labels.
#[derive(Clone)]
pub struct HostCounters(Arc<[Counter; HOST_OUTCOMES.len()]>);

impl HostCounters {
    pub fn count<T>(&self, result: &Result<T, HostError>) {
        self.0[host_outcome(result)].inc();
    }
}

impl Metrics {
    /// The registry, with the collector of what `board` and `cgroups` know.
    pub fn new(board: StatusBoard, cgroups: Arc<Cgroups>, started_at: Instant) -> Metrics {
        let paths = Family::<PathLabels, Counter>::default();
        // One at a time: a series is handed out under the family's lock.
        let direct = paths.get_or_create(&PathLabels { path: "direct" }).clone();
        let by_rmcp = paths.get_or_create(&PathLabels { path: "rmcp" }).clone();
        let counted = Counted {
            calls: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(latency),
            host: Family::default(),
            control: Family::default(),
            oom: Family::default(),
            direct,
            by_rmcp,
            list_looks: Counter::default(),
            series: Default::default(),
        };
        let mut registry = Registry::default();
        registry.register(
            "bundlevisor_http_gateway_requests",
            "Requests to the HTTP gateway, by how they were answered: a stateless tool call below rmcp (direct), or by rmcp's service",
            paths,
        );
        registry.register(
            "bundlevisor_gateway_list_looks",
            "Looks at an endpoint's lists (the workspace's every tool) to tell its connected agents what changed: one for all of them after each burst of lifecycle events",
            counted.list_looks.clone(),
        );
        registry.register_collector(Box::new(Observed {
            board,
            cgroups,
            started_at,
        }));
        registry.register(
            "bundlevisor_bundle_oom_kills",
            "Exits of a bundle caused by the kernel's OOM killer at its memory_max",
            counted.oom.clone(),
        );
        registry.register(
            "bundlevisor_tool_calls",
            "Tool calls answered by a bundle",
            counted.calls.clone(),
        );
        registry.register(
            "bundlevisor_tool_call_errors",
            "Tool calls that failed, timed out, were refused or returned isError",
            counted.errors.clone(),
        );
        registry.register(
            "bundlevisor_tool_call_duration_seconds",
            "Time from a tool call reaching the daemon to its answer",
            counted.durations.clone(),
        );
        registry.register(
            "bundlevisor_host_resources_requests",
            "ai.nimblebrain/resources requests from bundles, by workspace and outcome",
            counted.host.clone(),
        );
        registry.register(
            "bundlevisor_control_requests",
            "Requests on the control socket, by method",
            counted.control.clone(),
        );
        Metrics { registry, counted }
    }

    /// A tool call answered (`ok`: a result without `isError`).
    pub fn tool_call(&self, workspace: &str, bundle: &str, took: Duration, ok: bool) {
        let count = |series: &CallSeries| {
            series.calls.inc();
            if !ok {
                series.errors.inc();
            }
            series.durations.observe(took.as_secs_f64());
        };
        let c = &self.counted;
        {
            let known = c.series.read().unwrap_or_else(|p| p.into_inner());
            if let Some(series) = known.get(workspace).and_then(|w| w.get(bundle)) {
                return count(series);
            }
        }
        let mut known = c.series.write().unwrap_or_else(|p| p.into_inner());
        let labels = BundleLabels::new(workspace, bundle);
        // Every bundle that was called has both series (0 errors shows).
        let series = known
            .entry(labels.workspace.clone())
            .or_default()
            .entry(labels.bundle.clone())
            .or_insert_with(|| CallSeries {
                calls: c.calls.get_or_create(&labels).clone(),
                errors: c.errors.get_or_create(&labels).clone(),
                durations: c.durations.get_or_create(&labels).clone(),
            });
        count(series);
    }

    /// A request on the control socket; `method` is one the daemon knows
    /// (anything else is counted as `other`, so that clients cannot grow
    /// the label set).
    pub fn control_request(&self, method: &str) {
        let method = crate::protocol::typed::TYPED
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other");
        self.counted
            .control
            .get_or_create(&MethodLabels { method })
            .inc();
    }

    /// A request to the HTTP gateway, answered below rmcp (`direct`) or not.
    pub fn gateway_request(&self, direct: bool) {
        match direct {
            true => self.counted.direct.inc(),
            false => self.counted.by_rmcp.inc(),
        };
    }

    /// A look at an endpoint's lists for its agents (`gateway::watch_changes`).
    pub fn list_look(&self) {
        self.counted.list_looks.inc();
    }

    /// A bundle's process tree was killed by the OOM killer (its memory_max).
    pub fn oom_killed(&self, workspace: &str, bundle: &str) {
        self.counted
            .oom
            .get_or_create(&BundleLabels::new(workspace, bundle))
            .inc();
    }

    /// An uninstalled bundle: its series go.
    pub fn forget(&self, workspace: &str, bundle: &str) {
        let labels = BundleLabels::new(workspace, bundle);
        let c = &self.counted;
        // Held while the families forget too: a call counted meanwhile
        // hands out its series again only after they are gone.
        let mut known = c.series.write().unwrap_or_else(|p| p.into_inner());
        if let Some(bundles) = known.get_mut(workspace) {
            bundles.remove(bundle);
            if bundles.is_empty() {
                known.remove(workspace);
            }
        }
        c.calls.remove(&labels);
        c.errors.remove(&labels);
        c.durations.remove(&labels);
        c.oom.remove(&labels);
    }

    /// A workspace the daemon serves: every outcome of its host-resources
    /// requests is a series (at 0 until one happens), counted through the
    /// handles returned.
    pub fn workspace(&self, workspace: &str) -> HostCounters {
        HostCounters(Arc::new(HOST_OUTCOMES.map(|outcome| {
            let labels = HostLabels {
                workspace: workspace.to_string(),
                outcome,
            };
            self.counted.host.get_or_create(&labels).clone()
        })))
    }

    /// Tool calls and errors of a bundle so far (for `status --usage`).
    pub fn calls_of(&self, workspace: &str, bundle: &str) -> (u64, u64) {
        let labels = BundleLabels::new(workspace, bundle);
        let get = |f: &Family<BundleLabels, Counter>| f.get(&labels).map_or(0, |c| c.get());
        (get(&self.counted.calls), get(&self.counted.errors))
    }

    /// Everything, as Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// What the status board and the cgroups know, read at each scrape.
struct Observed {
    board: StatusBoard,
    cgroups: Arc<Cgroups>,
    started_at: Instant,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observed")
    }
}

/// One family with a sample per label set.
fn family<'a, L: EncodeLabelSet + 'a, M: EncodeMetric + 'a>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn per_bundle<V>(ws: &str, bundle: &str, value: V) -> ([(&'static str, String); 2], V) {
    (
        [
            ("workspace", ws.to_string()),
            ("bundle", bundle.to_string()),
        ],
        value,
    )
}

impl Collector for Observed {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (mut workspaces, mut bundles) = self.board.snapshot(false);
        // Archives being unpacked for an install count as `unpacking`.
        self.board.with_unpacking(&mut workspaces, &mut bundles);
        let counts = self.board.counts();
        let none: [(&str, &str); 0] = [];
        family(
            &mut encoder,
            (
                "bundlevisor_uptime_seconds",
                "Seconds since the daemon started.",
            ),
            MetricType::Gauge,
            [(
                none,
                ConstGauge::new(self.started_at.elapsed().as_secs() as i64),
            )],
        )?;
        family(
            &mut encoder,
            (
                "bundlevisor_resident_memory_bytes",
                "Resident memory of the daemon process.",
            ),
            MetricType::Gauge,
            [(
                none,
                ConstGauge::new(rss_bytes(std::process::id()).unwrap_or(0) as i64),
            )],
        )?;
        family(
            &mut encoder,
            ("bundlevisor_bundles", "Installed bundles by state."),
            MetricType::Gauge,
            BundleState::ALL.into_iter().map(|state| {
                let n = bundles.iter().filter(|b| b.state == state).count();
                ([("state", state.as_str())], ConstGauge::new(n as i64))
            }),
        )?;
        family(
            &mut encoder,
            (
                "bundlevisor_bundle_restarts",
                "Starts of a bundle after its first one since the daemon started (any reason but a 401 session rebuild; status shows the same number).",
            ),
            MetricType::Counter,
            counts
                .iter()
                .map(|((ws, b), c)| per_bundle(ws, b, ConstCounter::new(c.restarts))),
        )?;
        family(
            &mut encoder,
            (
                "bundlevisor_bundle_crashes",
                "Stops of a bundle nobody asked for: exits other than code 0, liveness kills, and failed starts that are retried.",
            ),
            MetricType::Counter,
            counts
                .iter()
                .map(|((ws, b), c)| per_bundle(ws, b, ConstCounter::new(c.crashes))),
        )?;
        family(
            &mut encoder,
            (
                "bundlevisor_bundle_resident_memory_bytes",
                "Resident memory of a running bundle's process.",
            ),
            MetricType::Gauge,
            bundles.iter().filter_map(|b| {
                let rss = b.pid.and_then(rss_bytes)?;
                Some(per_bundle(
                    &b.workspace,
                    &b.name,
                    ConstGauge::new(rss as i64),
                ))
            }),
        )?;
        // The whole tree of each running bundle, from its cgroup.
        let usage: Vec<_> = bundles
            .iter()
            .filter(|b| b.pid.is_some())
            .map(|b| (b, self.cgroups.usage(&b.workspace, &b.name)))
            .collect();
        family(
            &mut encoder,
            (
                "bundlevisor_bundle_memory_bytes",
                "Memory of a running bundle's whole process tree (its cgroup).",
            ),
            MetricType::Gauge,
            usage.iter().filter_map(|(b, (memory, _))| {
                Some(per_bundle(
                    &b.workspace,
                    &b.name,
                    ConstGauge::new((*memory)? as i64),
                ))
            }),
        )?;
        family(
            &mut encoder,
            (
                "bundlevisor_bundle_cpu_seconds",
                "CPU time of a running bundle's whole process tree (its cgroup), since it started.",
            ),
            MetricType::Counter,
            usage.iter().filter_map(|(b, (_, cpu))| {
                Some(per_bundle(
                    &b.workspace,
                    &b.name,
                    ConstCounter::new((*cpu)? as f64 / 1e6),
                ))
            }),
        )
    }
}

pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    Some(pages * page)
}

/// Resident memory (bytes) and CPU time (µs) of every process group, from
/// one pass over `/proc`: a bundle's tree where it has no cgroup (its
/// process group is its leader's pid).
pub fn group_usage() -> std::collections::HashMap<u32, (u64, u64)> {
    let sysconf = |v| nix::unistd::sysconf(v).ok().flatten().filter(|n| *n > 0);
    let page = sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap_or(4096) as u64;
    let tick = sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap_or(100) as u64;
    let mut groups = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return groups;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After "pid (comm) ": state ppid pgrp … utime(11) stime(12) … rss(21).
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let Some(group) = f.get(2).and_then(|v| v.parse::<u32>().ok()) else {
            continue;
        };
        let sum = groups.entry(group).or_insert((0, 0));
        sum.0 += num(21) * page;
        sum.1 += (num(11) + num(12)) * 1_000_000 / tick;
    }
    groups
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
        let m = Metrics::new(
            StatusBoard::default(),
            Arc::new(Cgroups::none("test")),
            Instant::now(),
        );
        m.tool_call("w", "b\"x", Duration::from_micros(700), true);
        m.tool_call("w", "b\"x", Duration::from_secs(60), false);
        let text = m.render();
        let le = |bound: &str| {
            format!("bundlevisor_tool_call_duration_seconds_bucket{{workspace=\"w\",bundle=\"b\\\"x\",le=\"{bound}\"}}")
        };
        assert!(text.contains(&format!("{} 0\n", le("0.0005"))), "{text}");
        assert!(
            text.contains(&format!("{} 1\n", le("0.001"))),
            "0.7 ms is in le=0.001: {text}"
        );
        assert!(
            text.contains(&format!("{} 1\n", le("10"))),
            "60 s is only in +Inf: {text}"
        );
        assert!(text.contains(&format!("{} 2\n", le("+Inf"))), "{text}");
        assert_eq!(m.calls_of("w", "b\"x"), (2, 1));
        m.forget("w", "b\"x");
        assert!(!m.render().contains("bundle=\"b"), "forgotten");
        // Installed again: its calls are counted from 0, and shown (the
        // series handed out before are not the ones counted).
        m.tool_call("w", "b\"x", Duration::from_micros(700), false);
        assert_eq!(m.calls_of("w", "b\"x"), (1, 1));
        assert!(m.render().contains(&format!("{} 1\n", le("+Inf"))));
    }
}
