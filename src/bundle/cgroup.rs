//! Containment: every bundle in a cgroup of its own (docs/security.md,
//! "Containment").
//!
//! A process group holds a bundle's process and what it forks, but a
//! descendant that calls `setsid()` leaves it. A cgroup holds every
//! descendant, whatever it does, so a bundle is stopped by killing its
//! cgroup (`cgroup.kill`), and its whole tree is limited and measured.
//!
//! - Layout: `ROOT/INSTANCE/w-WS/b-NAME/gN`, `INSTANCE` a digest of the
//!   state dir (several daemons share a machine, and each cleans up only
//!   its own). The prefixes keep a name from meeting a control file of the
//!   folder it is made in: a bundle named `tasks` (a file in every cgroup
//!   v1 folder) or `cgroup.procs` (in every one) would otherwise not start.
//!   `ROOT` is `[sandbox] cgroup_root`, or the daemon's own cgroup when it
//!   was delegated to it (the daemon moves itself into `OWN/daemon`, so
//!   that `OWN` may hand controllers to its children), or
//!   `MOUNT/bundlevisor` when the daemon sits at the top of the hierarchy
//!   (a container, a VM).
//! - cgroup v2 gives `cgroup.kill` and the controllers enabled for the
//!   daemon; on a hybrid host (cgroup v1 controllers beside an empty v2
//!   hierarchy) the memory, pids and cpu limits come from the v1 ones,
//!   each with the same layout below the daemon's own v1 cgroup.
//! - A child joins before it runs: the cgroup.procs files are opened in the
//!   daemon and the child writes `0` to each after its clone, before it drops
//!   its uid and execs ([`BundleCgroup::procs_files`]).
//! - What is in force is said in `status` (`sandbox.containment`,
//!   `sandbox.limits`) and at start; where no cgroup is writable the
//!   daemon says so loudly and falls back to process groups.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{CgroupLimits, Enforcement, SandboxSettings};

/// The controllers bundlevisor uses, as cgroup v2 names them.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// How long a killed cgroup may take to empty.
const EMPTY_WITHIN: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot make the bundle's cgroup {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("[sandbox] cgroups = \"required\", but {0}")]
    Required(String),
}

/// What the daemon found at start: where bundle cgroups go, and how.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// `ROOT/INSTANCE` in the cgroup v2 hierarchy (None: no writable one).
    v2: Option<PathBuf>,
    /// The controllers enabled for bundles in v2.
    v2_controllers: Vec<&'static str>,
    /// cgroup v1 hierarchies that give what v2 does not: controller file
    /// prefix (`memory`, `pids`, `cpu`, `cpuacct`) → `OWN/bundlevisor/INSTANCE`.
    v1: BTreeMap<&'static str, PathBuf>,
    /// Said in `status` and at start.
    pub containment: String,
    /// Said at start, when moving a process into a cgroup waits for the
    /// kernel (see [`moves_wait`]).
    pub advice: Option<String>,
    mode: Enforcement,
}

/// One line of `/proc/self/mountinfo` that mounts a cgroup hierarchy.
struct Mount {
    point: PathBuf,
    v2: bool,
    /// v1: the controllers of the hierarchy (super options).
    controllers: Vec<String>,
    /// The `favordynmods` super option.
    favordynmods: bool,
}

fn cgroup_mounts() -> Vec<Mount> {
    mounts_in(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The cgroup hierarchies of a `mountinfo` text.
fn mounts_in(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1).unwrap_or_default();
            let favordynmods = options.split(',').any(|o| o == "favordynmods");
            match fstype {
                "cgroup2" => Some(Mount {
                    point: PathBuf::from(point),
                    v2: true,
                    controllers: Vec::new(),
                    favordynmods,
                }),
                "cgroup" => Some(Mount {
                    point: PathBuf::from(point),
                    v2: false,
                    controllers: options.split(',').map(str::to_string).collect(),
                    favordynmods,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The daemon's own cgroup path in each hierarchy (`""` → v2, else the v1
/// controller list), from `/proc/self/cgroup`.
fn own_paths() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?.to_string();
            let path = parts.next()?.to_string();
            Some((controllers, path))
        })
        .collect()
}

fn below(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// A named counter of a flat keyed file (`oom_kill 3` in `memory.events`).
fn keyed(path: &Path, key: &str) -> Option<u64> {
    read(path)?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Makes `dir` (and its parents); true if it can be written to.
fn make(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).is_ok() && dir.join("cgroup.procs").exists()
}

/// The instance folder of the daemon with this state dir.
fn instance(state_dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let canonical = state_dir
        .canonicalize()
        .unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("i-{hex}")
}

impl Cgroups {
    /// No cgroups: process groups only (`[sandbox] cgroups = "off"`, and tests).
    pub fn none(why: &str) -> Cgroups {
        Cgroups {
            v2: None,
            v2_controllers: Vec::new(),
            v1: BTreeMap::new(),
            containment: format!(
                "process group only: {why}; a bundle's descendants that leave its process group (setsid) can outlive it"
            ),
            advice: None,
            mode: Enforcement::Off,
        }
    }

    /// Finds where bundle cgroups can go and prepares it; what is left by a
    /// daemon of this state dir that was killed is emptied and removed.
    pub fn detect(settings: &SandboxSettings, state_dir: &Path) -> Cgroups {
        if settings.cgroups == Enforcement::Off {
            return Cgroups::none("[sandbox] cgroups = \"off\"");
        }
        let mounts = cgroup_mounts();
        let own = own_paths();
        let instance = instance(state_dir);
        let mut notes = Vec::new();
        // cgroup v2: the root of bundle cgroups.
        let mut v2 = None;
        let mut v2_controllers = Vec::new();
        if let Some(mount) = mounts.iter().find(|m| m.v2) {
            let own_v2 = own
                .iter()
                .find(|(c, _)| c.is_empty())
                .map(|(_, p)| p.clone())
                .unwrap_or_else(|| "/".into());
            let root = match &settings.cgroup_root {
                Some(root) => Some(root.clone()),
                None if own_v2 == "/" => Some(mount.point.join("bundlevisor")),
                None => delegate(&below(&mount.point, &own_v2), &mut notes),
            };
            if let Some(root) = root {
                let base = root.join(&instance);
                if make(&base) {
                    v2_controllers = enable(&root, &mut notes);
                    v2_controllers.retain(|c| enable(&base, &mut notes).contains(c));
                    v2 = Some(base);
                } else {
                    notes.push(format!("{} is not writable", root.display()));
                }
            }
        } else {
            notes.push("no cgroup v2 hierarchy is mounted".into());
        }
        // cgroup v1 hierarchies for the controllers v2 does not give.
        let mut v1 = BTreeMap::new();
        for (name, files) in [
            ("memory", "memory"),
            ("pids", "pids"),
            ("cpu", "cpu"),
            ("cpu", "cpuacct"),
        ] {
            if v2_controllers.contains(&name) {
                continue;
            }
            let Some(mount) = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == files))
            else {
                continue;
            };
            let own_v1 = own
                .iter()
                .find(|(c, _)| c.split(',').any(|c| c == files))
                .map(|(_, p)| p.clone())
                .unwrap_or_else(|| "/".into());
            let base = below(&mount.point, &own_v1)
                .join("bundlevisor")
                .join(&instance);
            if make(&base) {
                v1.insert(files, base);
            }
        }
        let used: Vec<&Mount> = (mounts.iter())
            .filter(|m| match m.v2 {
                true => v2.is_some(),
                false => v1.values().any(|base| base.starts_with(&m.point)),
            })
            .collect();
        let cgroups = Cgroups {
            containment: describe(v2.as_deref(), &v2_controllers, &v1, &notes),
            advice: moves_wait(&used),
            v2,
            v2_controllers,
            v1,
            mode: settings.cgroups,
        };
        cgroups.clean_up("a bundle cgroup an earlier daemon left behind");
        cgroups
    }

    /// The daemon's folders of bundle cgroups (`ROOT/INSTANCE` in each hierarchy).
    pub fn folders(&self) -> Vec<&Path> {
        self.v2
            .iter()
            .chain(self.v1.values())
            .map(PathBuf::as_path)
            .collect()
    }

    /// Whether bundles get a cgroup at all.
    pub fn available(&self) -> bool {
        self.v2.is_some() || !self.v1.is_empty()
    }

    /// Kills and removes every bundle cgroup of this daemon (left by one
    /// that was killed before it could).
    fn clean_up(&self, why: &str) {
        for base in self.v2.iter().chain(self.v1.values()) {
            for ws in std::fs::read_dir(base).into_iter().flatten().flatten() {
                for b in std::fs::read_dir(ws.path()).into_iter().flatten().flatten() {
                    let bundle = BundleCgroup::at(self, &ws.file_name(), &b.file_name());
                    for leaf in std::fs::read_dir(b.path()).into_iter().flatten().flatten() {
                        if !leaf.file_type().is_ok_and(|t| t.is_dir()) {
                            continue;
                        }
                        let cg = bundle.with_leaf(&leaf.file_name());
                        let killed = cg.kill();
                        cg.wait_empty(EMPTY_WITHIN);
                        cg.remove();
                        tracing::warn!(cgroup = %leaf.path().display(), killed, "removed {why}");
                    }
                    bundle.remove();
                }
                let _ = std::fs::remove_dir(ws.path());
            }
        }
    }

    /// At shutdown: kills and removes what is left, then the workspace and
    /// instance folders.
    pub fn remove_all(&self) {
        self.clean_up("a bundle cgroup still there at shutdown");
        for base in self.v2.iter().chain(self.v1.values()) {
            let _ = std::fs::remove_dir(base);
        }
    }

    /// A new cgroup for one start of a bundle (`…/w-WS/b-NAME/gN`), below the
    /// bundle's folder, which carries its limits. Each start has its own:
    /// the end of an earlier one (killing and removing its cgroup) never
    /// touches the next.
    pub fn create(
        &self,
        workspace: &str,
        bundle: &str,
        limits: CgroupLimits,
    ) -> Result<Option<BundleCgroup>, CgroupError> {
        if !self.available() {
            if self.mode == Enforcement::Required {
                return Err(CgroupError::Required(self.containment.clone()));
            }
            return Ok(None);
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CgroupError::Io { path, source }
        };
        let bundle_dirs = BundleCgroup::of(
            self,
            std::ffi::OsStr::new(workspace),
            std::ffi::OsStr::new(bundle),
        );
        if let Some(dir) = &bundle_dirs.v2 {
            let ws = dir.parent().unwrap_or(dir);
            std::fs::create_dir_all(ws).map_err(io(ws))?;
            let mut notes = Vec::new();
            enable(ws, &mut notes);
        }
        for dir in bundle_dirs.v2.iter().chain(bundle_dirs.v1.values()) {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let limits = bundle_dirs.apply(limits);
        let mut cg = bundle_dirs.with_leaf(&next_leaf());
        for dir in cg.dirs() {
            std::fs::create_dir(&dir).map_err(io(&dir))?;
        }
        cg.limits = limits;
        cg.oom_before = cg.oom_kills();
        Ok(Some(cg))
    }

    /// A bundle's memory (whole tree, bytes) and CPU time (microseconds),
    /// from its cgroup; None where there is no cgroup or no controller.
    pub fn usage(&self, workspace: &str, bundle: &str) -> (Option<u64>, Option<u64>) {
        let cg = BundleCgroup::of(
            self,
            std::ffi::OsStr::new(workspace),
            std::ffi::OsStr::new(bundle),
        );
        (cg.memory(), cg.cpu_usec())
    }
}

/// Moves the daemon into `OWN/daemon` so that `OWN` (delegated to it) may
/// enable controllers for its children; `OWN/bundlevisor` is the root.
fn delegate(own: &Path, notes: &mut Vec<String>) -> Option<PathBuf> {
    let leaf = own.join("daemon");
    let moved = make(&leaf) && write(&leaf.join("cgroup.procs"), "0").is_ok();
    if !moved {
        notes.push(format!(
            "the daemon's cgroup {} is not delegated to it (Delegate=yes)",
            own.display()
        ));
        return None;
    }
    Some(own.join("bundlevisor"))
}

/// Enables what it can of [`CONTROLLERS`] for the children of `dir`.
fn enable(dir: &Path, notes: &mut Vec<String>) -> Vec<&'static str> {
    let offered = read(&dir.join("cgroup.controllers")).unwrap_or_default();
    let mut enabled = Vec::new();
    for c in CONTROLLERS {
        if !offered.split_whitespace().any(|o| o == c) {
            continue;
        }
        let already = read(&dir.join("cgroup.subtree_control"))
            .is_some_and(|s| s.split_whitespace().any(|o| o == c));
        if already || write(&dir.join("cgroup.subtree_control"), &format!("+{c}")).is_ok() {
            enabled.push(c);
        } else {
            notes.push(format!("cannot enable {c} in {}", dir.display()));
        }
    }
    enabled
}

fn describe(
    v2: Option<&Path>,
    v2_controllers: &[&str],
    v1: &BTreeMap<&'static str, PathBuf>,
    notes: &[String],
) -> String {
    let mut controllers: Vec<String> = v2_controllers.iter().map(|c| c.to_string()).collect();
    controllers.extend(
        v1.keys()
            .filter(|c| **c != "cpuacct")
            .map(|c| format!("{c} (v1)")),
    );
    let limits = if controllers.is_empty() {
        "no controllers for limits".to_string()
    } else {
        format!("limits from {}", controllers.join(", "))
    };
    let why = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    match (v2, v1.values().next()) {
        (Some(base), _) => format!(
            "cgroup v2 ({}/w-WS/b-NAME/gN, killed with cgroup.kill); {limits}{why}",
            base.display()
        ),
        (None, Some(base)) => format!(
            "cgroup v1 ({}/w-WS/b-NAME/gN, every process in it killed); {limits}{why}",
            base.display()
        ),
        (None, None) => format!(
            "process group only: no writable cgroup{why}; a bundle's descendants that leave its process group (setsid) can outlive it"
        ),
    }
}

/// What to say when a bundle's start will wait for the kernel: moving a
/// process into a cgroup takes the kernel's threadgroup lock for writing,
/// which, unless the hierarchy is mounted with `favordynmods` (or the
/// kernel booted with `cgroup_favordynmods=true`), waits for an RCU grace
/// period — 5–13 ms a move on the test VM, several moves a start (one a
/// hierarchy): most of a crash's restart. The lock is one for every
/// hierarchy, so one mount with the option is enough.
fn moves_wait(used: &[&Mount]) -> Option<String> {
    if used.is_empty() || used.iter().any(|m| m.favordynmods) {
        return None;
    }
    let v2 = used.iter().find(|m| m.v2).or(used.first())?;
    Some(format!(
        "each bundle start moves its process into {} cgroup hierarchies, and each move waits for an RCU grace period (milliseconds) because no cgroup hierarchy is mounted with favordynmods; for restarts several times faster, boot with cgroup_favordynmods=true or `mount -o remount,favordynmods {}`, at a small cost to every fork and exit on the host (docs/scaling.md)",
        used.len(),
        v2.point.display()
    ))
}

/// The name of a start's folder: `gN`, N counting the daemon's starts.
fn next_leaf() -> std::ffi::OsString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STARTS: AtomicU64 = AtomicU64::new(1);
    format!("g{}", STARTS.fetch_add(1, Ordering::Relaxed)).into()
}

/// One start's cgroup: its leaf folder in each hierarchy, below the
/// bundle's folder (limits, usage and the OOM count are the bundle's).
#[derive(Debug, Clone)]
pub struct BundleCgroup {
    /// `…/w-WS/b-NAME` in v2, and in each v1 hierarchy.
    v2: Option<PathBuf>,
    v1: BTreeMap<&'static str, PathBuf>,
    v2_controllers: Vec<&'static str>,
    /// The start's folder below them (`gN`); empty: the bundle's folder itself.
    leaf: std::ffi::OsString,
    /// OOM kills in the bundle's folder when this start began.
    oom_before: u64,
    /// The limits in force, and the ones asked for that are not (`status`).
    pub limits: Vec<String>,
}

impl BundleCgroup {
    /// The folders of `bundle` of `workspace` (no start's leaf).
    fn of(
        cgroups: &Cgroups,
        workspace: &std::ffi::OsStr,
        bundle: &std::ffi::OsStr,
    ) -> BundleCgroup {
        let prefixed = |prefix: &str, name: &std::ffi::OsStr| {
            let mut dir = std::ffi::OsString::from(prefix);
            dir.push(name);
            dir
        };
        BundleCgroup::at(cgroups, &prefixed("w-", workspace), &prefixed("b-", bundle))
    }

    /// The bundle folder `bundle` in the workspace folder `workspace`, as
    /// they are named on disk.
    fn at(
        cgroups: &Cgroups,
        workspace: &std::ffi::OsStr,
        bundle: &std::ffi::OsStr,
    ) -> BundleCgroup {
        BundleCgroup {
            v2: cgroups.v2.as_ref().map(|b| b.join(workspace).join(bundle)),
            v2_controllers: cgroups.v2_controllers.clone(),
            v1: cgroups
                .v1
                .iter()
                .map(|(c, b)| (*c, b.join(workspace).join(bundle)))
                .collect(),
            leaf: Default::default(),
            oom_before: 0,
            limits: Vec::new(),
        }
    }

    /// A folder for another start of the same bundle in the same place
    /// (a start tried again at once: the first one's folder goes with its
    /// process).
    pub fn next_start(&self) -> std::io::Result<BundleCgroup> {
        let cg = self.with_leaf(&next_leaf());
        for dir in cg.dirs() {
            std::fs::create_dir(&dir)?;
        }
        Ok(cg)
    }

    fn with_leaf(&self, leaf: &std::ffi::OsStr) -> BundleCgroup {
        BundleCgroup {
            leaf: leaf.to_os_string(),
            ..self.clone()
        }
    }

    /// The start's folders in every hierarchy (the processes are there).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.v2
            .iter()
            .chain(self.v1.values())
            .map(|d| d.join(&self.leaf))
            .collect()
    }

    /// The folder shown in `status` (the v2 one, else the first v1 one).
    pub fn path(&self) -> Option<PathBuf> {
        self.dirs().into_iter().next()
    }

    /// Where controller `c`'s files are for the bundle: its v2 folder if
    /// `c` is enabled there, else its v1 folder.
    fn dir_of(&self, c: &str) -> Option<(&Path, bool)> {
        if self.v2_controllers.contains(&c) {
            return self.v2.as_deref().map(|p| (p, true));
        }
        self.v1.get(c).map(|p| (p.as_path(), false))
    }

    /// Writes the limits; returns what is in force and what is not.
    fn apply(&self, limits: CgroupLimits) -> Vec<String> {
        let mut said = Vec::new();
        let mut set = |what: String, c: &str, files: &[(&str, String)]| match self.dir_of(c) {
            None => said.push(format!("{what}: not in force (no {c} controller)")),
            Some((dir, _)) => {
                let failed = files
                    .iter()
                    .filter(|(f, _)| dir.join(f).exists())
                    .find_map(|(f, v)| write(&dir.join(f), v).err().map(|e| format!("{f}: {e}")));
                match failed {
                    None => said.push(what),
                    Some(e) => said.push(format!("{what}: not in force ({e})")),
                }
            }
        };
        let v2 = |c: &str| self.dir_of(c).is_some_and(|(_, v2)| v2);
        if let Some(bytes) = limits.memory_max {
            let files = if v2("memory") {
                vec![
                    ("memory.max", bytes.to_string()),
                    ("memory.swap.max", "0".to_string()),
                ]
            } else {
                vec![
                    ("memory.limit_in_bytes", bytes.to_string()),
                    ("memory.memsw.limit_in_bytes", bytes.to_string()),
                ]
            };
            set(format!("memory.max {bytes}"), "memory", &files);
        }
        if let Some(n) = limits.pids_max {
            set(
                format!("pids.max {n}"),
                "pids",
                &[("pids.max", n.to_string())],
            );
        }
        if let Some(cpus) = limits.cpu_max {
            let quota = ((cpus * 100_000.0).round() as u64).max(1000);
            let files = if v2("cpu") {
                vec![("cpu.max", format!("{quota} 100000"))]
            } else {
                vec![
                    ("cpu.cfs_period_us", "100000".to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ]
            };
            set(format!("cpu.max {cpus} CPUs"), "cpu", &files);
        }
        said
    }

    /// The `cgroup.procs` files a new process joins, opened for writing:
    /// the child writes `0` to each before it execs.
    pub fn procs_files(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.dirs()
            .iter()
            .map(|dir| {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))?;
                Ok(OwnedFd::from(file))
            })
            .collect()
    }

    fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs()
            .iter()
            .filter_map(|d| read(&d.join("cgroup.procs")))
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process in the cgroup (`cgroup.kill`, or each pid in
    /// v1); returns how many there were.
    pub fn kill(&self) -> usize {
        let pids = self.pids();
        if pids.is_empty() {
            return 0;
        }
        let killed_all = self
            .v2
            .as_ref()
            .is_some_and(|d| write(&d.join(&self.leaf).join("cgroup.kill"), "1").is_ok());
        if !killed_all {
            // No cgroup.kill: each pid, again while new ones appear (a
            // fork between the read and the kill).
            for _ in 0..16 {
                let pids = self.pids();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        pids.len()
    }

    /// Waits (polling) until no process is left, at most `limit`.
    pub fn wait_empty(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let empty = match &self.v2 {
                Some(d) => keyed(&d.join(&self.leaf).join("cgroup.events"), "populated")
                    .is_none_or(|n| n == 0),
                None => self.pids().is_empty(),
            };
            if empty {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Processes the kernel's OOM killer killed so far: in the bundle's
    /// folder (v2 counts its whole subtree there), or in the start's (v1
    /// counts them where the victim was).
    pub fn oom_kills(&self) -> u64 {
        match self.dir_of("memory") {
            Some((d, true)) => keyed(&d.join("memory.events"), "oom_kill").unwrap_or(0),
            Some((d, false)) => {
                keyed(&d.join(&self.leaf).join("memory.oom_control"), "oom_kill").unwrap_or(0)
            }
            None => 0,
        }
    }

    /// Memory of the whole tree, in bytes.
    pub fn memory(&self) -> Option<u64> {
        let (dir, v2) = self.dir_of("memory")?;
        let file = if v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        read(&dir.join(file))?.trim().parse().ok()
    }

    /// CPU time of the whole tree, in microseconds.
    pub fn cpu_usec(&self) -> Option<u64> {
        if let Some(d) = &self.v2 {
            if let Some(usec) = keyed(&d.join("cpu.stat"), "usage_usec") {
                return Some(usec);
            }
        }
        let d = self.v1.get("cpuacct")?;
        let ns: u64 = read(&d.join("cpuacct.usage"))?.trim().parse().ok()?;
        Some(ns / 1000)
    }

    /// Removes the (empty) cgroup folders of the start.
    pub fn remove(&self) {
        for dir in self.dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// After the bundle's leader exited: kills what is left of the start's
    /// tree, waits for it to go, and removes its cgroup; says whether the
    /// OOM killer struck meanwhile. Blocking.
    pub fn finish(&self) -> bool {
        let oom = self.oom_kills() > self.oom_before;
        self.kill();
        if !self.wait_empty(EMPTY_WITHIN) {
            tracing::warn!(cgroup = ?self.path(), "a bundle cgroup did not empty after cgroup.kill");
        }
        self.remove();
        oom
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_differs_per_state_dir_and_is_stable() {
        let a = instance(Path::new("/nonexistent/a"));
        assert_eq!(a, instance(Path::new("/nonexistent/a")));
        assert_ne!(a, instance(Path::new("/nonexistent/b")));
        assert!(a.starts_with("i-") && a.len() == 14, "{a}");
    }

    /// Issue 37, point 4: a start's cgroup moves wait for an RCU grace
    /// period unless a hierarchy is mounted with `favordynmods`; the
    /// daemon says so at start, naming the fix, only when it applies.
    #[test]
    fn a_start_that_waits_for_the_kernel_is_said_with_its_fix() {
        let hybrid = "\
35 26 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 26 0:31 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
37 26 0:32 / /sys/fs/cgroup/pids rw,relatime shared:12 - cgroup cgroup rw,pids
38 26 0:33 / /proc rw - proc proc rw
";
        let mounts = mounts_in(hybrid);
        assert_eq!(mounts.len(), 3);
        let all: Vec<&Mount> = mounts.iter().collect();
        let advice = moves_wait(&all).expect("no hierarchy favours moves");
        assert!(
            advice.contains("3 cgroup hierarchies")
                && advice.contains("mount -o remount,favordynmods /sys/fs/cgroup/unified")
                && advice.contains("cgroup_favordynmods=true"),
            "{advice}"
        );
        let favoured = hybrid.replace(
            "cgroup2 rw,nsdelegate",
            "cgroup2 rw,nsdelegate,favordynmods",
        );
        let mounts = mounts_in(&favoured);
        assert!(mounts[0].favordynmods && !mounts[1].favordynmods);
        assert_eq!(moves_wait(&mounts.iter().collect::<Vec<_>>()), None);
        // No cgroup used: nothing to say.
        assert_eq!(moves_wait(&[]), None);
    }

    #[test]
    fn keyed_files_are_read_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        std::fs::write(&f, "low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n").unwrap();
        assert_eq!(keyed(&f, "oom_kill"), Some(2));
        assert_eq!(keyed(&f, "oom"), Some(1));
        assert_eq!(keyed(&f, "populated"), None);
    }

    #[test]
    fn no_cgroup_is_said_with_what_that_means() {
        let none = describe(
            None,
            &[],
            &BTreeMap::new(),
            &["no cgroup v2 hierarchy is mounted".into()],
        );
        assert!(none.starts_with("process group only"), "{none}");
        assert!(none.contains("setsid"), "{none}");
        let v2 = describe(
            Some(Path::new("/sys/fs/cgroup/bundlevisor/i-1")),
            &["memory", "pids"],
            &BTreeMap::new(),
            &[],
        );
        assert!(
            v2.contains("cgroup.kill") && v2.contains("memory, pids"),
            "{v2}"
        );
    }
}
