//! Bundle child processes: spawn with a scrubbed environment in a process
//! group of their own that dies with the daemon, watch for exit (the child's
//! `wait` is the truth about its life), stop the whole group, capture stderr.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::BufReader;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::reaper::Reaper;
use super::spawn::Process;
use crate::lines::{Line, LineReader};
use crate::logfile::{LogTarget, RotatingLog};
use crate::manifest::LaunchPlan;
use crate::protocol::LogLine;

/// Variables of the daemon's own environment that a bundle may see. Anything
/// else reaches a bundle only through its manifest's `env`.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME",
];

/// The stderr line that says most about why a process died: the last
/// exception line (`TypeError: …`, `ModuleNotFoundError: …`, `Error
/// [ERR_…]: …`), else the last line that is neither a stack frame nor a
/// runtime's banner (Node prints `Node.js v20…` last).
pub fn telling_line(lines: &[String]) -> Option<String> {
    let exception = |l: &str| {
        let Some((name, rest)) = l.split_once(": ") else {
            return false;
        };
        let name = name.split_once(" [").map_or(name, |(n, _)| n);
        !rest.is_empty()
            && !name.contains(char::is_whitespace)
            && name
                .rsplit('.')
                .next()
                .is_some_and(|n| n == "Error" || n.ends_with("Error") || n.ends_with("Exception"))
    };
    let noise = |l: &str| {
        l.is_empty()
            || l.starts_with("at ")
            || l.starts_with("File \"")
            || l.starts_with("Node.js v")
            || l.starts_with("Traceback ")
            || l == "^"
    };
    let trimmed = || lines.iter().rev().map(|l| l.trim());
    trimmed()
        .find(|l| exception(l))
        .or_else(|| trimmed().find(|l| !noise(l)))
        .map(str::to_string)
}

/// The version the runtime `program` on the daemon's `PATH` reports
/// (`node --version` → `20.20.2`, `python3 --version` → `3.11.2`), or why
/// there is none. Blocking (a short-lived probe, waited for here).
pub fn runtime_version(program: &str) -> Result<semver::Version, String> {
    let mut cmd = std::process::Command::new(program);
    cmd.arg("--version")
        .env_clear()
        .envs(std::env::var("PATH").map(|p| ("PATH", p)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawning = super::orphans::spawning();
    let child = cmd
        .spawn()
        .map_err(|e| format!("there is no {program} on the daemon's PATH ({e})"))?;
    let pid = child.id();
    super::orphans::own(pid);
    drop(spawning);
    let out = child.wait_with_output();
    super::orphans::release(pid);
    let out = out.map_err(|e| format!("`{program} --version` failed: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_version(&text).ok_or_else(|| format!("`{program} --version` said {:?}", text.trim()))
}

/// The first `X.Y[.Z]` in a `--version` answer (`v20.20.2`, `Python 3.11.2`).
fn parse_version(text: &str) -> Option<semver::Version> {
    text.split(|c: char| c.is_whitespace() || c == 'v')
        .find_map(|word| {
            let mut parts = word.split('.').map(|p| p.parse::<u64>().ok());
            let major = parts.next()??;
            let minor = parts.next()??;
            let patch = parts.next().flatten().unwrap_or(0);
            Some(semver::Version::new(major, minor, patch))
        })
}

/// Longest stderr line kept; longer lines are cut.
const MAX_STDERR_LINE: usize = 16 * 1024;
/// Stderr lines remembered for error messages.
const STDERR_TAIL: usize = 20;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The kernel's OOM killer struck in the bundle's cgroup.
    pub oom_killed: bool,
}

impl From<std::process::ExitStatus> for ExitInfo {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
            oom_killed: false,
        }
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oom_killed {
            f.write_str("killed by the kernel's OOM killer: the bundle reached its memory limit (memory_max); ")?;
        }
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => write!(f, "killed by {s}"),
                Err(_) => write!(f, "killed by signal {sig}"),
            },
            (None, None) => f.write_str("ended without an exit status"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start {command:?} in {cwd}: {source}")]
pub struct SpawnError {
    pub command: String,
    pub cwd: PathBuf,
    pub source: std::io::Error,
}

/// A freshly spawned bundle process and its pipes.
pub struct Spawned {
    pub pid: u32,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
    pub child: Process,
}

/// The environment a bundle gets: the allowlisted daemon variables, then the
/// manifest's own.
pub fn bundle_env(plan: &LaunchPlan) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = ENV_ALLOWLIST
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .filter(|(k, _)| !plan.env.contains_key(k))
        .collect();
    env.extend(plan.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Spawns the bundle. Must be called from a long-lived runtime thread, never
/// from `spawn_blocking`: `PR_SET_PDEATHSIG` fires when the spawning *thread*
/// exits.
pub(super) fn spawn(
    plan: &LaunchPlan,
    sandbox: Option<&super::sandbox::Sandbox>,
    channel: Option<&std::os::fd::OwnedFd>,
) -> Result<Spawned, SpawnError> {
    let spawn_error = |source| SpawnError {
        command: plan.command.clone(),
        cwd: plan.cwd.clone(),
        source,
    };
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = bundle_env(plan)
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let mut set = |key: &str, value: std::ffi::OsString| {
        env.retain(|(k, _)| k != key);
        env.push((key.into(), value));
    };
    let mut limits = super::sandbox::Rlimits::default();
    let mut ruleset = None;
    let mut user = None;
    // The cgroup.procs files the child joins (kept open here until the
    // spawn returns; close-on-exec, written by the child before its exec).
    let mut cgroup_files = Vec::new();
    if let Some(sb) = sandbox {
        for name in &sb.pass_env {
            if let (false, Some(value)) = (plan.env.contains_key(name), std::env::var_os(name)) {
                set(name, value);
            }
        }
        set("BUNDLEVISOR_DATA_DIR", sb.data.clone().into());
        set("HOME", sb.data.clone().into());
        set("TMPDIR", sb.tmp.clone().into());
        // Dropped in the child, after it joined its cgroup (the daemon's
        // uid may write cgroup.procs; the bundle's may not).
        user = sb.user;
        if let Some(cg) = &sb.cgroup {
            cgroup_files = cg.procs_files().map_err(&spawn_error)?;
        }
        limits = sb.limits;
        if let Some(rules) = &sb.landlock {
            ruleset = rules
                .ruleset_fd()
                .map_err(|e| spawn_error(std::io::Error::other(e)))?;
        }
    }
    if channel.is_some() {
        env.retain(|(k, _)| k != super::channel::CHANNEL_ENV);
        let fd = super::spawn::CHANNEL_FD.to_string();
        env.push((super::channel::CHANNEL_ENV.into(), fd.into()));
    }
    let launch = super::spawn::Launch {
        program: plan.command.as_ref(),
        args: &plan.args,
        env: &env,
        cwd: &plan.cwd,
        user,
        limits,
        ruleset: ruleset.as_ref(),
        cgroups: &cgroup_files,
        fd3: channel,
    };
    let spawning = super::orphans::spawning();
    let (child, stdin, stdout, stderr) = super::spawn::spawn(&launch).map_err(spawn_error)?;
    drop(cgroup_files);
    let pid = child.pid;
    super::orphans::own(pid);
    drop(spawning);
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr,
        child,
    })
}

fn signal_group(pgid: u32, signal: Signal) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid as i32), signal);
    }
}

/// SIGKILLs every process of `uid`: a bundle's own uid, which no other
/// process has, so its whole tree wherever it went (`setsid`, double
/// forks), where no cgroup holds it. A thread of its own takes the uid
/// (raw system call: that thread only, the daemon's others stay root) and
/// sends `kill(-1)`, which reaches exactly the processes that uid may
/// signal, in one pass the kernel makes under its task-list lock (a fork
/// racing it fails). The thread ends with the uid; nothing else runs on it.
pub fn kill_uid(uid: u32) {
    use nix::libc;
    if uid == 0 || !nix::unistd::geteuid().is_root() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("kill-uid".into())
        .spawn(move || {
            // SAFETY: raw system calls that change only this thread's
            // credentials, then signal; no memory is passed.
            unsafe {
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0 {
                    libc::kill(-1, libc::SIGKILL);
                }
            }
        })
        .map(|t| t.join());
}

/// SIGKILLs the process group when the last [`Lifeline`] is dropped before
/// the process was seen to exit: a dropped handle never leaks a process.
struct KillGuard {
    pgid: u32,
    exited: Arc<AtomicBool>,
    tree: Tree,
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        if !self.exited.load(Ordering::SeqCst) {
            signal_group(self.pgid, Signal::SIGKILL);
            // What left the group: the watcher removes the cgroup once the
            // leader is reaped.
            if let Some(cg) = &self.tree.cgroup {
                cg.kill();
            }
            if let Some(uid) = self.tree.uid {
                kill_uid(uid);
            }
        }
    }
}

/// The uids whose processes a [`Lifeline`] is still answerable for (a
/// bundle held by its own uid, without a cgroup): how many lifelines per
/// uid, until each one's last `kill_uid` is done. A new process of the
/// same bundle starts only once the uid is free ([`uid_free`]): the kill
/// of a superseded generation, which can land a moment after the next one
/// was started (an aborted start is dropped asynchronously), would
/// otherwise take the new process with it.
static HELD_UIDS: Mutex<Vec<(u32, usize)>> = Mutex::new(Vec::new());
static UID_RELEASED: tokio::sync::Notify = tokio::sync::Notify::const_new();

fn hold_uid(uid: u32) {
    let mut held = HELD_UIDS.lock().unwrap_or_else(|e| e.into_inner());
    match held.iter_mut().find(|(u, _)| *u == uid) {
        Some((_, n)) => *n += 1,
        None => held.push((uid, 1)),
    }
}

fn release_uid(uid: u32) {
    let mut held = HELD_UIDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = held.iter().position(|(u, _)| *u == uid) {
        held[i].1 -= 1;
        if held[i].1 == 0 {
            held.swap_remove(i);
        }
    }
    drop(held);
    UID_RELEASED.notify_waiters();
}

fn uid_held(uid: u32) -> bool {
    let held = HELD_UIDS.lock().unwrap_or_else(|e| e.into_inner());
    held.iter().any(|(u, _)| *u == uid)
}

/// Waits (at most `limit`) until no earlier process of `uid` is still to
/// be killed; false when the limit passed first.
pub async fn uid_free(uid: u32, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let released = UID_RELEASED.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if !uid_held(uid) {
            return true;
        }
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            return false;
        }
    }
}

/// What holds a bundle's whole tree beyond its process group: its cgroup,
/// or, where it has none, its own uid ([`super::sandbox::Sandbox::tree_uid`]).
#[derive(Clone, Default)]
pub struct Tree {
    pub cgroup: Option<Arc<super::cgroup::BundleCgroup>>,
    pub uid: Option<u32>,
}

/// Observes a bundle process (or a remote bundle's session) and asks it to
/// stop. Holds no kill guard, so watcher tasks can keep one without keeping
/// the process alive.
#[derive(Clone)]
pub struct ProcessObserver {
    /// `None` for a remote session.
    pid: Option<u32>,
    stop_tx: mpsc::UnboundedSender<Duration>,
    exit_rx: watch::Receiver<Option<ExitInfo>>,
}

impl ProcessObserver {
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Asks for the group to be stopped: SIGTERM, then SIGKILL after `grace`.
    pub fn request_stop(&self, grace: Duration) {
        let _ = self.stop_tx.send(grace);
    }

    /// Waits until the process has exited and its group was killed.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit_rx.clone();
        let seen = rx.wait_for(Option::is_some).await.map(|v| *v);
        match seen {
            Ok(v) => v.expect("waited for Some"),
            // The watcher task is gone without a status: treat as killed.
            Err(_) => ExitInfo {
                code: None,
                signal: Some(Signal::SIGKILL as i32),
                oom_killed: false,
            },
        }
    }

    pub fn exited(&self) -> Option<ExitInfo> {
        *self.exit_rx.borrow()
    }
}

/// Owning handle of a bundle process (or remote session): dropping the last
/// clone kills the group (or closes the session).
#[derive(Clone)]
pub struct Lifeline {
    observer: ProcessObserver,
    _guard: Arc<Guard>,
}

/// Held only for its `Drop`: kills the group, or cancels the session.
enum Guard {
    Process(#[allow(dead_code)] KillGuard),
    Session(#[allow(dead_code)] tokio_util::sync::DropGuard),
}

impl Lifeline {
    /// Takes ownership of `child` and watches it in a task. The group is
    /// registered with `reaper` while it may be alive.
    pub fn watch(
        mut child: Process,
        pid: u32,
        reaper: Option<Arc<Reaper>>,
        tree: Tree,
    ) -> Lifeline {
        if let Some(r) = &reaper {
            r.track(
                pid,
                tree.cgroup.as_deref().map(|c| c.dirs()).unwrap_or_default(),
            );
        }
        let killer = tree.clone();
        let Tree { cgroup, uid } = tree;
        if let Some(uid) = uid {
            hold_uid(uid);
        }
        let (stop_tx, mut stop_rx) = mpsc::unbounded_channel::<Duration>();
        let (exit_tx, exit_rx) = watch::channel(None);
        let exited = Arc::new(AtomicBool::new(false));
        let flag = exited.clone();
        tokio::spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status,
                Some(grace) = stop_rx.recv() => terminate(&mut child, pid, grace).await,
            };
            super::orphans::release(pid);
            // Grandchildren may outlive a leader that exited on its own;
            // the cgroup (or the own uid) holds the ones that left its
            // group (setsid).
            signal_group(pid, Signal::SIGKILL);
            if let Some(uid) = uid {
                let _ = tokio::task::spawn_blocking(move || kill_uid(uid)).await;
                release_uid(uid);
            }
            let oom_killed = match cgroup {
                Some(cg) => tokio::task::spawn_blocking(move || cg.finish())
                    .await
                    .unwrap_or(false),
                None => false,
            };
            if let Some(r) = &reaper {
                r.forget(pid);
            }
            flag.store(true, Ordering::SeqCst);
            let info = match status {
                Ok(s) => ExitInfo {
                    oom_killed,
                    ..ExitInfo::from(s)
                },
                Err(e) => {
                    tracing::warn!(pid, error = %e, "waiting for a bundle process failed");
                    ExitInfo {
                        code: None,
                        signal: None,
                        oom_killed: false,
                    }
                }
            };
            let _ = exit_tx.send(Some(info));
        });
        Lifeline {
            observer: ProcessObserver {
                pid: Some(pid),
                stop_tx,
                exit_rx,
            },
            _guard: Arc::new(Guard::Process(KillGuard {
                pgid: pid,
                exited,
                tree: killer,
            })),
        }
    }

    /// The lifeline of a remote bundle's session, which `session` cancels:
    /// the session "exits" when it is cancelled, by [`Lifeline::stop`], by
    /// the transport ending, or when the last clone is dropped.
    pub fn session(session: CancellationToken) -> Lifeline {
        let (stop_tx, mut stop_rx) = mpsc::unbounded_channel::<Duration>();
        let (exit_tx, exit_rx) = watch::channel(None);
        let token = session.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = token.cancelled() => {}
                Some(_) = stop_rx.recv() => token.cancel(),
            }
            let _ = exit_tx.send(Some(ExitInfo {
                code: None,
                signal: None,
                oom_killed: false,
            }));
        });
        Lifeline {
            observer: ProcessObserver {
                pid: None,
                stop_tx,
                exit_rx,
            },
            _guard: Arc::new(Guard::Session(session.drop_guard())),
        }
    }

    pub fn observer(&self) -> ProcessObserver {
        self.observer.clone()
    }

    pub fn pid(&self) -> Option<u32> {
        self.observer.pid
    }

    /// Stops the group (SIGTERM, `grace`, SIGKILL) and waits for the exit.
    pub async fn stop(&self, grace: Duration) -> ExitInfo {
        self.observer.request_stop(grace);
        self.observer.wait().await
    }

    pub async fn wait(&self) -> ExitInfo {
        self.observer.wait().await
    }
}

async fn terminate(
    child: &mut Process,
    pgid: u32,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    signal_group(pgid, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(
                pid = pgid,
                ?grace,
                "bundle ignored SIGTERM; sending SIGKILL to its group"
            );
            signal_group(pgid, Signal::SIGKILL);
            child.wait().await
        }
    }
}

/// The last stderr lines of a bundle, for error messages.
#[derive(Clone)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    eof: watch::Receiver<bool>,
}

impl StderrTail {
    /// The tail of a bundle without stderr (a remote session): always empty.
    pub fn none() -> StderrTail {
        StderrTail {
            lines: Arc::default(),
            eof: watch::channel(true).1,
        }
    }

    fn push(&self, line: String) {
        let mut q = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == STDERR_TAIL {
            q.pop_front();
        }
        q.push_back(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    pub fn last(&self) -> Option<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .back()
            .cloned()
    }

    /// Waits (at most `limit`) until stderr reached EOF, so that the lines a
    /// process wrote just before dying are in the tail.
    pub async fn drained(&self, limit: Duration) {
        let mut eof = self.eof.clone();
        let _ = tokio::time::timeout(limit, eof.wait_for(|done| *done)).await;
    }
}

/// Reads the bundle's stderr line by line into its (rotating) log file,
/// `tracing` and the followers' bus, until EOF. Returns the tail buffer it fills.
pub fn capture_stderr(
    stderr: ChildStderr,
    target: LogTarget,
    workspace: &str,
    bundle: &str,
    redactor: crate::secret::Redactor,
) -> StderrTail {
    let (eof_tx, eof) = watch::channel(false);
    let tail = StderrTail {
        lines: Arc::default(),
        eof,
    };
    let out = tail.clone();
    let (workspace, bundle) = (workspace.to_string(), bundle.to_string());
    let allowance = CopiedLines::of(&workspace, &bundle);
    tokio::spawn(async move {
        let mut file = match RotatingLog::open(&target.path, target.max_bytes, target.keep).await {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(path = %target.path.display(), error = %e, "cannot open bundle log; stderr goes to tracing only");
                None
            }
        };
        let mut lines = LineReader::new(BufReader::new(stderr), MAX_STDERR_LINE);
        loop {
            let line = match lines.next_line().await {
                // Secrets are masked before the line goes anywhere.
                Ok(Line::Text(line)) => match redactor.redact(&line) {
                    std::borrow::Cow::Borrowed(_) => line,
                    std::borrow::Cow::Owned(masked) => masked,
                },
                Ok(Line::TooLong) => format!(
                    "[bundlevisor: stderr line longer than {MAX_STDERR_LINE} bytes dropped]"
                ),
                Ok(Line::Eof) | Err(_) => break,
            };
            copy_to_daemon_log(&allowance, &workspace, &bundle, &line);
            if let Some(f) = file.as_mut() {
                if let Err(e) = f.append(&line).await {
                    tracing::warn!(path = %target.path.display(), error = %e, "bundle log write failed; stderr goes to tracing only");
                    file = None;
                }
            }
            if let Some(bus) = &target.bus {
                let _ = bus.send(LogLine {
                    workspace: workspace.clone(),
                    name: bundle.clone(),
                    line: line.clone(),
                });
            }
            out.push(line);
        }
        if let Some(mut f) = file {
            let _ = f.flush().await;
        }
        let told = allowance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_untold(true);
        tell_left_out(&workspace, &bundle, told);
        let _ = eof_tx.send(true);
    });
    tail
}

/// Stderr lines of one bundle a second that reach the daemon's own log
/// (journald in production), after a burst of [`COPIED_BURST`]; the
/// bundle's own log, `logs` and `logs -f` keep every line.
pub const COPIED_PER_SEC: f64 = 100.0;
pub const COPIED_BURST: f64 = 1000.0;

/// One bundle's allowance of lines copied to the daemon's log (kept
/// across its restarts, so a crash loop does not refill it).
struct CopiedLines {
    tokens: f64,
    last: std::time::Instant,
    left_out: u64,
    told: std::time::Instant,
}

type Allowance = Arc<std::sync::Mutex<CopiedLines>>;

static COPIED: std::sync::Mutex<BTreeMap<(String, String), Allowance>> =
    std::sync::Mutex::new(BTreeMap::new());

impl CopiedLines {
    /// The bundle's allowance (looked up once per start).
    fn of(workspace: &str, bundle: &str) -> Allowance {
        let mut all = COPIED.lock().unwrap_or_else(|e| e.into_inner());
        all.entry((workspace.to_string(), bundle.to_string()))
            .or_insert_with(|| {
                let now = std::time::Instant::now();
                Arc::new(std::sync::Mutex::new(CopiedLines {
                    tokens: COPIED_BURST,
                    last: now,
                    left_out: 0,
                    told: now,
                }))
            })
            .clone()
    }

    /// How many lines were left out since it last said so, to be said now
    /// (`now`), or once a second while lines are left out.
    fn take_untold(&mut self, now: bool) -> Option<u64> {
        if self.left_out == 0 || !(now || self.told.elapsed() >= Duration::from_secs(1)) {
            return None;
        }
        self.told = std::time::Instant::now();
        Some(std::mem::take(&mut self.left_out))
    }
}

/// Says how many lines of the bundle the daemon's log left out.
fn tell_left_out(workspace: &str, bundle: &str, count: Option<u64>) {
    if let Some(count) = count {
        tracing::warn!(target: "bundle_stderr", workspace = %workspace, bundle = %bundle, "{count} stderr lines of this bundle were not copied to the daemon's log (at most {COPIED_PER_SEC} a second); `bundlevisor logs {bundle} -w {workspace}` has every line");
    }
}

/// Copies one stderr line to the daemon's log, within the bundle's
/// allowance.
fn copy_to_daemon_log(allowance: &Allowance, workspace: &str, bundle: &str, line: &str) {
    let (allowed, told) = {
        let mut c = allowance.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let refill = now.duration_since(c.last).as_secs_f64() * COPIED_PER_SEC;
        c.tokens = (c.tokens + refill).min(COPIED_BURST);
        c.last = now;
        let allowed = c.tokens >= 1.0;
        if allowed {
            c.tokens -= 1.0;
        } else {
            c.left_out += 1;
        }
        (allowed, c.take_untold(allowed))
    };
    tell_left_out(workspace, bundle, told);
    if allowed {
        tracing::info!(target: "bundle_stderr", workspace = %workspace, bundle = %bundle, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn plan(script: &str) -> LaunchPlan {
        LaunchPlan {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::from([("BUNDLE_OWN".to_string(), "yes".to_string())]),
            cwd: std::env::temp_dir(),
            paths: Vec::new(),
            redactor: Default::default(),
        }
    }

    fn alive(pid: u32) -> bool {
        nix::sys::signal::kill(Pid::from_raw(pid as i32), None).is_ok()
    }

    /// Issue 22: a start does not fork the daemon (a fork copies its page
    /// tables and descriptors, which made a start cost grow with the
    /// number of bundles). `fork` runs the atfork handlers in the forking
    /// thread; the `clone(CLONE_VM | CLONE_VFORK)` start does not.
    #[tokio::test]
    async fn a_start_does_not_fork_the_daemon() {
        thread_local! {
            static FORKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        }
        extern "C" fn counted() {
            FORKS.with(|f| f.set(f.get() + 1));
        }
        // SAFETY: registers a handler that only touches a thread-local cell.
        assert_eq!(
            unsafe { nix::libc::pthread_atfork(Some(counted), None, None) },
            0
        );
        // The handler is live: a fork from this thread is counted.
        let mut forked = std::process::Command::new("/bin/true");
        // SAFETY: an empty pre_exec closure forces the fork path.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut forked, || Ok(()));
        }
        forked.status().unwrap();
        let baseline = FORKS.with(|f| f.get());
        assert!(baseline >= 1, "the atfork handler never ran");
        let s = spawn(&plan("exit 3"), None, None).unwrap();
        assert_eq!(FORKS.with(|f| f.get()), baseline, "the start forked");
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        assert_eq!(life.wait().await.code, Some(3));
    }

    /// The start blocks every signal around its clone: the bundle must not
    /// inherit that (a blocked SIGTERM would make it unstoppable but by
    /// SIGKILL), nor the daemon's ignored SIGPIPE.
    #[tokio::test]
    async fn a_bundle_starts_with_no_signal_blocked_or_ignored() {
        let s = spawn(&plan("kill -TERM $$; exit 0"), None, None).unwrap();
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        assert_eq!(life.wait().await.signal, Some(nix::libc::SIGTERM));
        let s = spawn(&plan("kill -PIPE $$; exit 0"), None, None).unwrap();
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        assert_eq!(life.wait().await.signal, Some(nix::libc::SIGPIPE));
    }

    #[tokio::test]
    async fn exit_is_seen_and_reports_the_code() {
        let s = spawn(&plan("exit 7"), None, None).unwrap();
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        assert_eq!(
            life.wait().await,
            ExitInfo {
                code: Some(7),
                signal: None,
                oom_killed: false,
            }
        );
        assert_eq!(life.wait().await.to_string(), "exit code 7");
    }

    #[tokio::test]
    async fn stop_kills_a_group_that_ignores_sigterm_including_grandchildren() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!(
            "trap '' TERM; sh -c 'trap \"\" TERM; echo $$ > {p}; while :; do sleep 1; done' & while :; do sleep 1; done",
            p = pidfile.display()
        );
        let s = spawn(&plan(&script), None, None).unwrap();
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        let grandchild = poll_file(&pidfile).await;
        assert!(alive(grandchild));
        let exit = life.stop(Duration::from_millis(200)).await;
        assert_eq!(exit.signal, Some(Signal::SIGKILL as i32));
        assert!(
            wait_dead(grandchild).await,
            "grandchild {grandchild} survived"
        );
    }

    #[tokio::test]
    async fn dropping_the_lifeline_kills_the_group() {
        let s = spawn(&plan("while :; do sleep 1; done"), None, None).unwrap();
        let pid = s.pid;
        let life = Lifeline::watch(s.child, s.pid, None, Tree::default());
        let observer = life.observer();
        drop(life);
        assert_eq!(observer.wait().await.signal, Some(Signal::SIGKILL as i32));
        assert!(wait_dead(pid).await);
    }

    #[tokio::test]
    async fn environment_is_scrubbed_to_the_allowlist_plus_bundle_env() {
        std::env::set_var("BUNDLEVISOR_TEST_LEAK", "leaked");
        let s = spawn(&plan("env"), None, None).unwrap();
        let mut out = String::new();
        let mut stdout = s.stdout;
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out)
            .await
            .unwrap();
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert!(names.contains(&"BUNDLE_OWN"), "{names:?}");
        assert!(!names.contains(&"BUNDLEVISOR_TEST_LEAK"), "{names:?}");
        for name in names {
            assert!(
                ENV_ALLOWLIST.contains(&name)
                    || name == "BUNDLE_OWN"
                    || name == "PWD"
                    || name == "SHLVL"
                    || name == "_",
                "unexpected {name}"
            );
        }
    }

    async fn poll_file(path: &std::path::Path) -> u32 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                if let Ok(pid) = text.trim().parse() {
                    return pid;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} never appeared",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls until `pid` is gone (reaped by init, or a zombie of ours).
    async fn wait_dead(pid: u32) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'));
            if stat.is_empty() || zombie {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[test]
    fn the_telling_line_of_a_crash_is_its_exception() {
        let lines = |text: &str| text.lines().map(str::to_string).collect::<Vec<_>>();
        let node = lines(
            "/srv/b/index.js:3\n    throw new TypeError(\"boom\");\n    ^\n\nTypeError: boom\n    at Object.<anonymous> (/srv/b/index.js:3:11)\n    at node:internal/main:1:1\n\nNode.js v20.20.2",
        );
        assert_eq!(telling_line(&node).as_deref(), Some("TypeError: boom"));
        let missing = lines("node:internal/modules/cjs/loader:1\nError: Cannot find module '/x.js'\n    at Module._resolveFilename\n{\n  code: 'MODULE_NOT_FOUND'\n}\n\nNode.js v20.20.2");
        assert_eq!(
            telling_line(&missing).as_deref(),
            Some("Error: Cannot find module '/x.js'")
        );
        let python = lines("Traceback (most recent call last):\n  File \"/srv/b/server.py\", line 1, in <module>\n    import fastmcp\nModuleNotFoundError: No module named 'fastmcp'");
        assert_eq!(
            telling_line(&python).as_deref(),
            Some("ModuleNotFoundError: No module named 'fastmcp'")
        );
        let esm = lines("Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod'\n    at packageResolve\nNode.js v20.20.2");
        assert_eq!(
            telling_line(&esm).as_deref(),
            Some("Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod'")
        );
        assert_eq!(
            telling_line(&lines("starting\nport 80 in use\n")).as_deref(),
            Some("port 80 in use")
        );
        assert_eq!(telling_line(&[]), None);
    }

    #[test]
    fn runtime_versions_are_read_from_what_they_print() {
        assert_eq!(
            parse_version("v20.20.2\n"),
            Some(semver::Version::new(20, 20, 2))
        );
        assert_eq!(
            parse_version("Python 3.11\n"),
            Some(semver::Version::new(3, 11, 0))
        );
        assert_eq!(parse_version("no version here"), None);
        // A program that is not there says so.
        let missing = runtime_version("bundlevisor-no-such-runtime").unwrap_err();
        assert!(
            missing.contains("no bundlevisor-no-such-runtime on the daemon's PATH"),
            "{missing}"
        );
    }
}
