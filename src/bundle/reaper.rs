//! The reaper: a small helper process (the daemon binary re-executed as
//! `bundlevisor __reap`) in a session of its own. The daemon tells it, over
//! a pipe, which process groups are alive (`+PGID [CGROUP]` / `-PGID`
//! lines). When the pipe reaches EOF — the daemon exited, even by SIGKILL —
//! it SIGKILLs every group still registered, and kills its cgroup (what
//! left the group with `setsid`), and exits.
//!
//! Why: `PR_SET_PDEATHSIG` takes down a bundle's leader with the daemon, but
//! not the grandchildren the bundle started (`npx` → `node`); without the
//! reaper they would be orphaned when the daemon is killed.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Writes each line to the helper's pipe, in order, until the daemon drops
/// the sender (or the helper is gone).
fn write_lines(pipe: Option<ChildStdin>, rx: std::sync::mpsc::Receiver<String>) {
    let Some(mut pipe) = pipe else { return };
    while let Ok(line) = rx.recv() {
        if pipe.write_all(line.as_bytes()).is_err() {
            tracing::warn!(
                "the reaper helper is gone; bundles' grandchildren may outlive a killed daemon"
            );
            return;
        }
    }
}

/// The hidden subcommand that runs the reaper.
pub const SUBCOMMAND: &str = "__reap";

pub struct Reaper {
    /// Lines for the helper, written by a thread of their own: a pipe write
    /// may block, and the daemon's event loop never waits on one.
    lines: std::sync::mpsc::Sender<String>,
    writer: Option<std::thread::JoinHandle<()>>,
    child: Mutex<Child>,
}

impl Reaper {
    /// Starts the helper. `state_dir` only names the daemon it serves (in
    /// its command line, for operators and tests).
    pub fn spawn(state_dir: &Path) -> std::io::Result<Reaper> {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.arg(SUBCOMMAND)
            .arg(state_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: setsid is async-signal-safe. Its own session keeps it out
        // of the terminal's Ctrl-C and out of every bundle's group.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let spawning = super::orphans::spawning();
        let mut child = cmd.spawn()?;
        super::orphans::own(child.id());
        drop(spawning);
        let pipe = child.stdin.take();
        let (lines, rx) = std::sync::mpsc::channel::<String>();
        let writer = std::thread::Builder::new()
            .name("reaper-pipe".into())
            .spawn(move || write_lines(pipe, rx))?;
        Ok(Reaper {
            lines,
            writer: Some(writer),
            child: Mutex::new(child),
        })
    }

    fn send(&self, line: String) {
        let _ = self.lines.send(line);
    }

    /// A new bundle process group, and the folders of the cgroup that
    /// holds its tree (tab-separated on the line).
    pub fn track(&self, pgid: u32, cgroup: Vec<PathBuf>) {
        let dirs: Vec<String> = cgroup.iter().map(|d| d.display().to_string()).collect();
        match dirs.is_empty() {
            true => self.send(format!("+{pgid}\n")),
            false => self.send(format!("+{pgid} {}\n", dirs.join("\t"))),
        }
    }

    /// A folder of bundle cgroups (the daemon's instance folder in one
    /// hierarchy): removed, with its empty workspace folders, at the end.
    pub fn track_folder(&self, folder: &Path) {
        self.send(format!("*{}\n", folder.display()));
    }

    /// A group that is gone (with its cgroup).
    pub fn forget(&self, pgid: u32) {
        self.send(format!("-{pgid}\n"));
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // EOF: the helper kills what is still registered (nothing, after an
        // orderly shutdown) and exits; reap it.
        // Dropping the sender ends the writer, which closes the pipe.
        drop(std::mem::replace(
            &mut self.lines,
            std::sync::mpsc::channel().0,
        ));
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let _ = self.child.lock().unwrap_or_else(|p| p.into_inner()).wait();
    }
}

/// Body of `bundlevisor __reap`: reads the registrations from stdin until
/// EOF, then kills the groups left.
pub fn run() -> std::process::ExitCode {
    // pgid → the folders of its bundle's cgroup.
    let mut groups: BTreeMap<i32, Vec<PathBuf>> = BTreeMap::new();
    let mut folders = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, rest) = line.split_at(line.len().min(1));
        if op == "*" {
            folders.push(PathBuf::from(rest));
            continue;
        }
        let (pgid, cgroup) = match rest.split_once(' ') {
            Some((pgid, dirs)) => (pgid, dirs.split('\t').map(PathBuf::from).collect()),
            None => (rest, Vec::new()),
        };
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        if pgid <= 1 {
            continue;
        }
        match op {
            "+" => {
                groups.insert(pgid, cgroup);
            }
            "-" => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for (pgid, dirs) in &groups {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
        // Descendants that left the group (setsid) are in the cgroup.
        let killed = dirs
            .iter()
            .any(|d| std::fs::write(d.join("cgroup.kill"), "1").is_ok());
        if !killed {
            for d in dirs {
                kill_listed(d);
            }
        }
    }
    // The emptied cgroups go, and their workspace and instance folders when
    // nothing else is in them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    for dir in groups.values().flatten() {
        while std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir(dir);
    }
    for folder in folders {
        remove_empty(&folder, 4);
    }
    std::process::ExitCode::SUCCESS
}

/// Removes the cgroup folders below `dir` and `dir` itself, deepest first;
/// one that still holds a process stays.
fn remove_empty(dir: &Path, depth: usize) {
    if depth > 0 {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty(&entry.path(), depth - 1);
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// SIGKILLs every process a (cgroup v1) cgroup lists, until it is empty.
fn kill_listed(cgroup: &Path) {
    for _ in 0..16 {
        let listed = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = listed
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
