//! ManifestWatcher: turns filesystem events in the watched folders into
//! debounced "rescan folder N" requests to the DaemonActor, which computes
//! the diff (install / upgrade / uninstall). A rename into a watched folder
//! (or into a bundle folder, as editors save) skips the debounce: what a
//! rename brings is complete. Events are only hints: a
//! rescan reads the whole folder, so a rename into place, a slow writer or a
//! burst of editor temp files all end in the same reconcile.
//!
//! Each folder and each bundle subfolder is watched non-recursively (a
//! bundle's own tree, say `node_modules`, costs no watches). A folder that is
//! deleted keeps its bundles running (an unmounted volume must not uninstall
//! everything); when it reappears it is watched again and rescanned.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecursiveMode, Watcher};
use ractor::ActorRef;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::supervisor::DaemonMsg;

/// How often missing folders are checked for again.
const REARM_EVERY: Duration = Duration::from_millis(500);

/// Runs until `shutdown`; `dirs[i]` is `config.watch[i].dir`.
pub async fn run(
    dirs: Vec<PathBuf>,
    daemon: ActorRef<DaemonMsg>,
    debounce: Duration,
    shutdown: CancellationToken,
) {
    if dirs.is_empty() {
        return;
    }
    // (folder index, the entry of the folder a rename brought, if any)
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Option<std::ffi::OsString>)>();
    let roots = dirs.clone();
    let handler = move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        // Reading a manifest produces Access events: reacting to them would loop.
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        // The destination of a rename: the last path of the event.
        let renamed_to = match event.kind {
            EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both)) => {
                event.paths.last()
            }
            _ => None,
        };
        for (i, root) in roots.iter().enumerate() {
            if event.paths.iter().any(|p| p.starts_with(root)) || event.paths.is_empty() {
                // The folder's own entry it brought (a bundle folder or file).
                let arrived = renamed_to
                    .and_then(|p| p.strip_prefix(root).ok())
                    .and_then(|rel| rel.components().next())
                    .map(|c| c.as_os_str().to_os_string());
                let _ = tx.send((i, arrived));
            }
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(
                "cannot watch folders ({}); bundles in watched folders are only installed at start",
                explained(&e)
            );
            return;
        }
    };
    let mut watched: HashSet<PathBuf> = HashSet::new();
    let mut present = present(&dirs).await;
    for dir in &dirs {
        arm(&mut watcher, &mut watched, dir, wanted(dir).await);
    }
    let mut rearm = tokio::time::interval(REARM_EVERY);
    loop {
        let mut pending = BTreeSet::new();
        // Per folder, the entries renamed into it.
        let mut arrived: std::collections::BTreeMap<usize, Vec<std::ffi::OsString>> =
            Default::default();
        let mut note = |pending: &mut BTreeSet<usize>,
                        (i, a): (usize, Option<std::ffi::OsString>)| {
            pending.insert(i);
            arrived.entry(i).or_default().extend(a.clone());
            a.is_some()
        };
        let mut renamed_in = false;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(e) = rx.recv() => renamed_in = note(&mut pending, e),
            _ = rearm.tick() => {
                for (i, (dir, now)) in dirs.iter().zip(self::present(&dirs).await).enumerate() {
                    if now && !present[i] {
                        tracing::info!(dir = %dir.display(), "watched folder is back; rescanning");
                        pending.insert(i);
                    } else if !now && present[i] {
                        tracing::warn!(dir = %dir.display(), "watched folder disappeared; its bundles keep running until it is back");
                    }
                    present[i] = now;
                }
                if pending.is_empty() {
                    continue;
                }
            }
        }
        // Debounce: wait until the folders have been quiet for `debounce`,
        // unless something was renamed into place: a rename is atomic, so
        // the folder or file it brought is complete and is taken at once.
        loop {
            if renamed_in {
                while let Ok(e) = rx.try_recv() {
                    note(&mut pending, e);
                }
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Some(e) = rx.recv() => renamed_in |= note(&mut pending, e),
                _ = tokio::time::sleep(debounce) => break,
            }
        }
        for &i in &pending {
            let want = wanted(&dirs[i]).await;
            arm(&mut watcher, &mut watched, &dirs[i], want);
            let arrived = arrived.remove(&i).unwrap_or_default();
            if daemon
                .send_message(DaemonMsg::Rescan { index: i, arrived })
                .is_err()
            {
                return;
            }
        }
    }
}

/// Which of `dirs` exist now (on the blocking pool: the daemon's event
/// loop never waits on a file system).
async fn present(dirs: &[PathBuf]) -> Vec<bool> {
    let dirs = dirs.to_vec();
    let n = dirs.len();
    tokio::task::spawn_blocking(move || dirs.iter().map(|d| d.is_dir()).collect())
        .await
        .unwrap_or_else(|_| vec![false; n])
}

/// `dir` and its immediate subfolders, read on the blocking pool.
async fn wanted(dir: &Path) -> HashSet<PathBuf> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut want: HashSet<PathBuf> = HashSet::new();
        if dir.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                want.extend(
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.is_dir()),
                );
            }
            want.insert(dir);
        }
        want
    })
    .await
    .unwrap_or_default()
}

/// Watches `want` (a folder and its immediate subfolders, non-recursively),
/// dropping watches of subfolders of `dir` that are gone.
fn arm(
    watcher: &mut impl Watcher,
    watched: &mut HashSet<PathBuf>,
    dir: &Path,
    want: HashSet<PathBuf>,
) {
    let stale: Vec<PathBuf> = watched
        .iter()
        .filter(|p| p.starts_with(dir) && !want.contains(*p))
        .cloned()
        .collect();
    for path in stale {
        let _ = watcher.unwatch(&path);
        watched.remove(&path);
    }
    // Watching again is cheap and idempotent, and it re-arms a folder that
    // was deleted and recreated under the same name (the kernel dropped the
    // old watch with the old inode).
    for path in want {
        match watcher.watch(&path, RecursiveMode::NonRecursive) {
            Ok(()) => {
                watched.insert(path);
            }
            Err(e) => tracing::warn!(path = %path.display(), "cannot watch: {}", explained(&e)),
        }
    }
}

/// A watch error, with the kernel limit to raise when one ran out.
fn explained(e: &notify::Error) -> String {
    let errno = match &e.kind {
        notify::ErrorKind::Io(io) => io.raw_os_error(),
        notify::ErrorKind::MaxFilesWatch => Some(nix::libc::ENOSPC),
        _ => None,
    };
    match errno {
        Some(nix::libc::ENOSPC) => format!(
            "{e}: the inotify watch limit is reached; raise it with sysctl fs.inotify.max_user_watches (now {})",
            inotify_limit("max_user_watches")
        ),
        Some(nix::libc::EMFILE) => format!(
            "{e}: the inotify instance limit is reached; raise it with sysctl fs.inotify.max_user_instances (now {})",
            inotify_limit("max_user_instances")
        ),
        _ => e.to_string(),
    }
}

fn inotify_limit(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_limit_that_ran_out_names_the_sysctl_to_raise() {
        let watches = notify::Error::io(std::io::Error::from_raw_os_error(nix::libc::ENOSPC));
        assert!(explained(&watches).contains("fs.inotify.max_user_watches (now "));
        let instances = notify::Error::io(std::io::Error::from_raw_os_error(nix::libc::EMFILE));
        assert!(explained(&instances).contains("fs.inotify.max_user_instances (now "));
        let other = notify::Error::path_not_found();
        assert!(!explained(&other).contains("sysctl"));
    }
}
