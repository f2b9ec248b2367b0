//! The daemon adopts what its bundles leave behind. It is a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`): a bundle's descendant whose parent
//! exits — a double fork, a daemonizing server — is re-parented to the
//! daemon instead of init, so every process a bundle starts stays in the
//! daemon's process tree. That is what makes the control socket's
//! process-ancestry check (a peer that descends from the daemon is a bundle)
//! hold against processes that `setsid()` and fork away.
//!
//! Adopted processes are the daemon's children, so it must reap them when
//! they exit: [`reap`] does, on every SIGCHLD, for each child the daemon did
//! not spawn itself. The children it did spawn ([`own`]) are waited for by
//! their owners (tokio's `Child::wait`), never here.

use std::collections::HashSet;
use std::sync::Mutex;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Pids the daemon spawned and whose owners wait for them.
static OWNED: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

/// Held (shared) from a spawn until its pid is [`own`]ed, and (exclusive)
/// by a reaping pass: a child that exits at once is never reaped in the
/// moment between its spawn and its registration, which would leave its
/// owner's `wait` with ECHILD.
static SPAWNING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Hold the result across `spawn()` and [`own`].
pub fn spawning() -> std::sync::RwLockReadGuard<'static, ()> {
    SPAWNING.read().unwrap_or_else(|e| e.into_inner())
}

fn owned<T>(f: impl FnOnce(&mut HashSet<u32>) -> T) -> T {
    let mut set = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    f(set.get_or_insert_with(HashSet::new))
}

/// Marks `pid` as spawned by the daemon (its owner waits for it).
pub fn own(pid: u32) {
    owned(|s| s.insert(pid));
}

/// The owner has waited for `pid`.
pub fn release(pid: u32) {
    owned(|s| s.remove(&pid));
}

/// Makes this process the subreaper of its descendants.
pub fn adopt() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

/// This process's children, from `/proc/self/task/*/children`.
fn children() -> Vec<u32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    pids
}

/// Reaps every exited child that no owner waits for; returns how many.
pub fn reap_adopted() -> usize {
    let _no_spawn_in_between = SPAWNING.write().unwrap_or_else(|e| e.into_inner());
    let mut reaped = 0;
    let mut adopted = children();
    // One look at the owned set for all of them (2,000 children at 2,000
    // bundles, nearly all owned).
    owned(|s| adopted.retain(|pid| !s.contains(pid)));
    for pid in adopted {
        match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(_) => reaped += 1,
        }
    }
    reaped
}

/// Reaps adopted processes on every SIGCHLD until `shutdown`.
pub async fn reap(shutdown: tokio_util::sync::CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        tracing::warn!(
            "cannot watch SIGCHLD; processes adopted from bundles are reaped only at exit"
        );
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sigchld.recv() => {
                // Off the event loop: the children list grows with the
                // bundles, and a bundle's exit is handled meanwhile.
                let n = tokio::task::spawn_blocking(reap_adopted).await.unwrap_or(0);
                if n > 0 {
                    tracing::debug!(reaped = n, "reaped processes adopted from bundles");
                }
            }
        }
    }
}
