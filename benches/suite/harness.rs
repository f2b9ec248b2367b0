//! What every scenario needs: a daemon on a private state dir driven over
//! its real control socket, a lifecycle-event tap, demo bundle folders,
//! process memory and the statistics of a sample.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bundlevisor::client::Client;
use bundlevisor::protocol::{method, EventKind, LifecycleEvent, StatusResult};
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub const BIN: &str = env!("CARGO_BIN_EXE_bundlevisor");
pub const DEMO: &str = env!("CARGO_BIN_EXE_bundlevisor-demo");

/// The demo manifest, renamed.
pub fn demo_manifest(name: &str) -> String {
    let template = include_str!("../../bundles/demo/manifest.json");
    template.replacen("\"name\": \"demo\"", &format!("\"name\": \"{name}\""), 1)
}

/// Writes a demo bundle folder `parent/name` (the server is a hard link to
/// the built demo binary: a bundle reads only its own folder).
pub fn demo_bundle(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("server")).unwrap();
    std::fs::write(dir.join("manifest.json"), demo_manifest(name)).unwrap();
    let server = dir.join("server/bundlevisor-demo");
    std::fs::hard_link(DEMO, &server)
        .or_else(|_| std::fs::copy(DEMO, &server).map(|_| ()))
        .unwrap();
    dir
}

/// A running `bundlevisor daemon` on `root/bv.toml`.
pub struct BenchDaemon {
    pub root: PathBuf,
    pub socket: PathBuf,
    child: Child,
}

impl BenchDaemon {
    /// Writes the config (when `config` is given) and starts the daemon;
    /// returns once the socket answers `daemon.hello`.
    pub async fn start(root: &Path, config: Option<&str>) -> BenchDaemon {
        if let Some(config) = config {
            std::fs::write(root.join("bv.toml"), config).unwrap();
        }
        let child = Command::new(BIN)
            .args(["daemon", "--config"])
            .arg(root.join("bv.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("daemon.log")).unwrap())
            .spawn()
            .expect("spawn the daemon");
        let d = BenchDaemon {
            root: root.to_path_buf(),
            socket: root.join("bv.sock"),
            child,
        };
        d.connect().await;
        d
    }

    /// A new control connection, retried until the daemon listens.
    pub async fn connect(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match Client::connect(&self.socket).await {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("daemon never answered: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the daemon (which stops its bundles) to exit.
    pub fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn call(client: &mut Client, method: &str, params: Value) -> Value {
    match client.request::<_, Value>(method, params, |_| {}).await {
        Ok(v) => v,
        Err(e) => panic!("{method}: {e}"),
    }
}

pub async fn status(client: &mut Client) -> StatusResult {
    serde_json::from_value(call(client, method::STATUS, json!({})).await).unwrap()
}

/// The pid of bundle `name` (of `workspace`, when given) once it is ready.
pub async fn ready_pid(client: &mut Client, workspace: Option<&str>, name: &str) -> u32 {
    status(client)
        .await
        .bundles
        .iter()
        .find(|b| {
            b.name == name
                && workspace.is_none_or(|w| b.workspace == w)
                && b.state == bundlevisor::protocol::BundleState::Ready
        })
        .and_then(|b| b.pid)
        .unwrap_or_else(|| panic!("{name} is not ready"))
}

/// SIGKILLs `pid`; the instant it was sent.
pub fn sigkill(pid: u32) -> Instant {
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    sent
}

/// Calls a tool of a bundle and returns the text of its first content block.
pub async fn tool_text(client: &mut Client, name: &str, tool: &str, arguments: Value) -> String {
    let out = call(
        client,
        method::CALL,
        json!({"name": name, "tool": tool, "arguments": arguments, "timeout_ms": 600_000}),
    )
    .await;
    assert_ne!(out["isError"], json!(true), "{name}/{tool}: {out}");
    out["content"][0]["text"].as_str().unwrap().to_string()
}

/// Lifecycle events as they arrive, stamped with the bench's clock.
pub struct EventTap {
    rx: mpsc::UnboundedReceiver<(Instant, LifecycleEvent)>,
}

impl EventTap {
    pub async fn start(d: &BenchDaemon) -> EventTap {
        let mut client = d.connect().await;
        let _: Value = client
            .request(method::EVENTS, json!({}), |_| {})
            .await
            .unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(n)) = client.next_notification().await {
                let at = Instant::now();
                if let Ok(e) = serde_json::from_value::<LifecycleEvent>(n.params) {
                    if tx.send((at, e)).is_err() {
                        return;
                    }
                }
            }
        });
        EventTap { rx }
    }

    /// The arrival time of the next event of `name` with `kind`; earlier
    /// events are dropped.
    pub async fn wait(&mut self, name: &str, kind: EventKind) -> Instant {
        let deadline = Duration::from_secs(60);
        tokio::time::timeout(deadline, async {
            loop {
                let (at, e) = self.rx.recv().await.expect("event stream ended");
                if e.name == name && e.kind == kind {
                    return at;
                }
                assert!(
                    !matches!(e.kind, EventKind::Failed | EventKind::ManifestRejected),
                    "{}: {:?} {}",
                    e.name,
                    e.kind,
                    e.message
                );
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: no {kind:?} event within {deadline:?}"))
    }

    /// Waits until `count` distinct bundles reported `kind`.
    pub async fn wait_count(&mut self, kind: EventKind, count: usize) -> Instant {
        self.wait_all(kind, count, HashSet::new()).await
    }

    /// Waits until `count` distinct bundles, counting those in `seen`,
    /// reported `kind`; returns the arrival of the last one.
    pub async fn wait_all(
        &mut self,
        kind: EventKind,
        count: usize,
        mut seen: HashSet<(String, String)>,
    ) -> Instant {
        let mut last = Instant::now();
        while seen.len() < count {
            let (at, e) = tokio::time::timeout(Duration::from_secs(120), self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("only {} of {count} bundles {kind:?}", seen.len()))
                .expect("event stream ended");
            if e.kind == kind && seen.insert((e.workspace, e.name)) {
                last = at;
            }
        }
        last
    }
}

/// An agent on `bundlevisor mcp -w WORKSPACE`: the process (killed on
/// drop) and the initialized rmcp client on its stdio.
pub async fn mcp_agent(
    d: &BenchDaemon,
    workspace: &str,
) -> (
    tokio::process::Child,
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
) {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["mcp", "--workspace", workspace])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bundlevisor mcp");
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = rmcp::ServiceExt::serve((), io).await.expect("initialize");
    (child, client)
}

/// When `count` bundles are all ready: at once if `status` says so, else
/// when the tap has seen the rest report `ready`.
pub async fn all_ready(ctl: &mut Client, tap: &mut EventTap, count: usize) -> Instant {
    let ready: HashSet<_> = status(ctl)
        .await
        .bundles
        .into_iter()
        .filter(|b| b.state == bundlevisor::protocol::BundleState::Ready)
        .map(|b| (b.workspace, b.name))
        .collect();
    if ready.len() == count {
        Instant::now()
    } else {
        tap.wait_all(EventKind::Ready, count, ready).await
    }
}

/// `VmRSS` of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Median and 99th percentile of a sample.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub median_us: f64,
    pub p99_us: f64,
    pub n: usize,
}

pub fn summarize(mut sample: Vec<Duration>) -> Summary {
    assert!(!sample.is_empty(), "empty sample");
    sample.sort();
    let at = |p: f64| sample[((sample.len() - 1) as f64 * p).round() as usize];
    Summary {
        median_us: at(0.5).as_secs_f64() * 1e6,
        p99_us: at(0.99).as_secs_f64() * 1e6,
        n: sample.len(),
    }
}

/// Raises this process's open-file soft limit to its hard limit (the
/// floors hold hundreds of child pipes at once).
pub fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Where the two ends of a measured round trip run: both on CPU 0, or on
/// CPUs 0 and 1. On a VM the placement alone moves a pipe round trip by
/// 2–4× (a cross-CPU wake-up costs 15–25 µs), so each figure and its floor
/// are measured pinned, in both placements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    SameCore,
    TwoCores,
}

impl Placement {
    /// The CPUs of the asking end and of the answering end.
    pub fn cpus(self) -> (usize, usize) {
        match self {
            Placement::SameCore => (0, 0),
            Placement::TwoCores => (0, 1),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Placement::SameCore => "pinned to one core",
            Placement::TwoCores => "pinned to two cores",
        }
    }
}

fn cpu_set(cpu: Option<usize>) -> nix::sched::CpuSet {
    let mut set = nix::sched::CpuSet::new();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for c in cpu.map_or(0..all, |c| c..c + 1) {
        set.set(c).expect("a CPU number");
    }
    set
}

/// Pins the calling thread to `cpu`, or lets it run anywhere (`None`).
pub fn pin_thread(cpu: Option<usize>) {
    let me = nix::unistd::Pid::from_raw(0);
    nix::sched::sched_setaffinity(me, &cpu_set(cpu)).expect("sched_setaffinity");
}

/// Pins every thread of process `pid` (threads it starts later inherit
/// it), or lets them run anywhere (`None`).
pub fn pin_process(pid: u32, cpu: Option<usize>) {
    let set = cpu_set(cpu);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process runs") {
        let tid: i32 = task.unwrap().file_name().to_string_lossy().parse().unwrap();
        // A thread that ended since the listing is no loss.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set);
    }
}
