//! The status board: the latest status of every bundle, written by the
//! BundleActors at each transition and read by the control server without
//! a round trip through the actor tree. Every transition is also published
//! as an [`Event`] on a broadcast channel (install and restart wait on it).
//! The counters (`restarts` in the status, `crashes` beside it) are the
//! BundleActor's lifecycle's own: the board only keeps what it was told, so
//! `status` and the metrics cannot disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio::sync::broadcast;

use crate::protocol::{BundleState, BundleStatus, EventKind, LifecycleEvent, UnpackProgress};

/// Lifecycle events are published as they happen.
pub type Event = LifecycleEvent;

struct Entry {
    status: BundleStatus,
    ready_since: Option<Instant>,
    crashes: u64,
}

#[derive(Default)]
struct Inner {
    bundles: BTreeMap<(String, String), Entry>,
    workspaces: BTreeSet<String>,
    /// Bundles whose state is `Starting`, kept with every change so that
    /// the boot's progress is O(1) to read (not a copy of the board per
    /// event: that was O(n²) over a boot).
    starting: usize,
    /// Archives being unpacked, by (workspace, archive file): the name
    /// they are shown under, and how far they are.
    unpacking: BTreeMap<(String, PathBuf), (String, UnpackProgress)>,
}

/// What happened to a bundle since the daemon started (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Starts after the first one, except a 401 session rebuild
    /// (`status.restarts`).
    pub restarts: u64,
    /// Stops nobody asked for: exits other than code 0, liveness kills,
    /// failed starts that are retried.
    pub crashes: u64,
}

/// Lifecycle events kept for a look back (a bundle's page): the newest.
const RECENT_EVENTS: usize = 1024;

#[derive(Clone)]
pub struct StatusBoard {
    inner: Arc<RwLock<Inner>>,
    events: broadcast::Sender<Event>,
    recent: Arc<std::sync::Mutex<std::collections::VecDeque<Event>>>,
    /// How many events were published so far.
    emitted: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for StatusBoard {
    fn default() -> Self {
        StatusBoard {
            inner: Arc::default(),
            events: broadcast::channel(1024).0,
            recent: Arc::default(),
            emitted: Arc::default(),
        }
    }
}

impl StatusBoard {
    /// Records a bundle's status (its state, or a detail of it, changed).
    pub fn update(&self, status: BundleStatus, ready_since: Option<Instant>, crashes: u64) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(status.workspace.clone());
        let key = (status.workspace.clone(), status.name.clone());
        let entry = Entry {
            status,
            ready_since,
            crashes,
        };
        let starting = entry.status.state == crate::protocol::BundleState::Starting;
        let old = inner.bundles.insert(key, entry);
        let new_is_starting = usize::from(starting);
        let old_was_starting = usize::from(
            old.is_some_and(|e| e.status.state == crate::protocol::BundleState::Starting),
        );
        inner.starting = inner.starting + new_is_starting - old_was_starting;
    }

    /// Lists an installed bundle as `starting` unless it is listed already
    /// (the daemon lists its installs before its socket answers).
    pub fn expect(&self, status: BundleStatus) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(status.workspace.clone());
        let key = (status.workspace.clone(), status.name.clone());
        if let std::collections::btree_map::Entry::Vacant(slot) = inner.bundles.entry(key) {
            let starting = status.state == crate::protocol::BundleState::Starting;
            slot.insert(Entry {
                status,
                ready_since: None,
                crashes: 0,
            });
            inner.starting += usize::from(starting);
        }
    }

    /// Publishes a lifecycle event (kept among the recent ones). No
    /// subscriber is fine.
    pub fn emit(&self, event: Event) {
        {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() == RECENT_EVENTS {
                recent.pop_front();
            }
            recent.push_back(event.clone());
        }
        // Counted before it is sent: whoever hears it reads a count that
        // includes it.
        self.emitted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.events.send(event);
    }

    /// How many events were published so far: what a look at the state
    /// taken after reading it has seen the effects of.
    pub fn emitted(&self) -> u64 {
        self.emitted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The last `n` events of one bundle still kept, newest first.
    pub fn recent(&self, workspace: &str, name: &str, n: usize) -> Vec<Event> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .rev()
            .filter(|e| e.workspace == workspace && e.name == name)
            .take(n)
            .cloned()
            .collect()
    }

    /// Restarts and crashes of every installed bundle.
    pub fn counts(&self) -> BTreeMap<(String, String), Counts> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .iter()
            .map(|(k, e)| {
                let counts = Counts {
                    restarts: u64::from(e.status.restarts),
                    crashes: e.crashes,
                };
                (k.clone(), counts)
            })
            .collect()
    }

    /// A bundle's counters as last published, to carry them over to the
    /// actor that replaces a panicked one.
    pub fn counters(&self, workspace: &str, name: &str) -> Option<(u32, u64)> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .get(&(workspace.to_string(), name.to_string()))
            .map(|e| (e.status.restarts, e.crashes))
    }

    pub fn remove(&self, workspace: &str, name: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let old = inner
            .bundles
            .remove(&(workspace.to_string(), name.to_string()));
        if old.is_some_and(|e| e.status.state == crate::protocol::BundleState::Starting) {
            inner.starting -= 1;
        }
    }

    /// (bundles listed, of them starting), in O(1).
    pub fn settling(&self) -> (usize, usize) {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (inner.bundles.len(), inner.starting)
    }

    /// The names of one workspace's bundles, in O(log n + its bundles).
    pub fn names_in(&self, workspace: &str) -> Vec<String> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let from = (workspace.to_string(), String::new());
        inner
            .bundles
            .range(from..)
            .take_while(|((ws, _), _)| ws == workspace)
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    pub fn add_workspace(&self, workspace: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(workspace.to_string());
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn get(&self, workspace: &str, name: &str) -> Option<BundleStatus> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .get(&(workspace.to_string(), name.to_string()))
            .map(|e| with_uptime(e, true))
    }

    /// Every bundle, ordered by workspace then name, with uptimes computed now.
    /// Each sandbox's path lists only with `paths` (`status` without them
    /// is a tenth of the bytes).
    pub fn snapshot(&self, paths: bool) -> (Vec<String>, Vec<BundleStatus>) {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (
            inner.workspaces.iter().cloned().collect(),
            inner
                .bundles
                .values()
                .map(|e| with_uptime(e, paths))
                .collect(),
        )
    }
}

impl StatusBoard {
    /// Shows the unpack of `archive` for `workspace` in `status` until the
    /// row is dropped; [`UnpackRow::tell`] moves it on. An installed bundle
    /// of that source (a watched archive's upgrade) gets the progress
    /// beside its state; otherwise a row in state `unpacking` is named
    /// after the archive's file, its manifest not read yet.
    pub fn unpacking(&self, workspace: &str, archive: &Path) -> UnpackRow {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let source = archive.display().to_string();
        let installed = inner
            .bundles
            .iter()
            .find(|((ws, _), e)| ws == workspace && e.status.source == source)
            .map(|((_, name), e)| (name.clone(), e.status.state));
        let file_stem = || {
            let stem = archive.file_stem().unwrap_or(archive.as_os_str());
            stem.to_string_lossy().into_owned()
        };
        let (name, state) = installed.unwrap_or_else(|| (file_stem(), BundleState::Unpacking));
        let key = (workspace.to_string(), archive.to_path_buf());
        let progress = UnpackProgress { entries: 0, of: 0 };
        inner
            .unpacking
            .insert(key.clone(), (name.clone(), progress));
        UnpackRow {
            board: self.clone(),
            key,
            name,
            state,
        }
    }

    /// A progress callback for [`crate::archive::unpack`] that shows the
    /// unpack of `archive` from its first entry until the callback is
    /// dropped (an archive found unpacked shows nothing).
    pub fn unpack_progress(&self, workspace: &str, archive: &Path) -> impl FnMut(u64, u64) {
        let (board, workspace, archive) =
            (self.clone(), workspace.to_string(), archive.to_path_buf());
        let mut row: Option<UnpackRow> = None;
        move |entries, of| {
            let first = row.is_none();
            row.get_or_insert_with(|| board.unpacking(&workspace, &archive))
                .tell(entries, of);
            if first {
                hold_unpack();
            }
        }
    }

    /// `bundles` (a snapshot) with the unpacks in progress: as the progress
    /// of the installed bundle they upgrade, or as rows of their own
    /// (`workspaces` then lists their workspace), ordered as the board is.
    pub fn with_unpacking(&self, workspaces: &mut Vec<String>, bundles: &mut Vec<BundleStatus>) {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        if inner.unpacking.is_empty() {
            return;
        }
        for ((workspace, archive), (name, progress)) in &inner.unpacking {
            let source = archive.display().to_string();
            match bundles
                .iter_mut()
                .find(|b| &b.workspace == workspace && b.source == source)
            {
                Some(b) => b.unpacking = Some(*progress),
                None => bundles.push(BundleStatus {
                    unpacking: Some(*progress),
                    ..BundleStatus::new(workspace, name, BundleState::Unpacking, source)
                }),
            }
            if !workspaces.contains(workspace) {
                workspaces.push(workspace.clone());
            }
        }
        workspaces.sort();
        bundles.sort_by(|a, b| (&a.workspace, &a.name).cmp(&(&b.workspace, &b.name)));
    }
}

/// An archive's unpack, shown in `status` while it lives (see
/// [`StatusBoard::unpacking`]).
pub struct UnpackRow {
    board: StatusBoard,
    key: (String, PathBuf),
    name: String,
    /// The state its events carry: the installed bundle's, or `unpacking`.
    state: BundleState,
}

impl UnpackRow {
    /// `entries` of `of` are written: shown in `status`, and told as an
    /// `unpacking` event.
    pub fn tell(&self, entries: u64, of: u64) {
        {
            let mut inner = self.board.inner.write().unwrap_or_else(|p| p.into_inner());
            if let Some((_, progress)) = inner.unpacking.get_mut(&self.key) {
                *progress = UnpackProgress { entries, of };
            }
        }
        let file = self.key.1.file_name().unwrap_or(self.key.1.as_os_str());
        let file = file.to_string_lossy();
        let message = if entries == of {
            format!("unpacked {file} ({of} entries)")
        } else {
            format!("unpacking {file}: {entries} of {of} entries")
        };
        self.board.emit(LifecycleEvent::new(
            &self.key.0,
            &self.name,
            EventKind::Unpacking,
            self.state,
            message,
        ));
    }
}

impl Drop for UnpackRow {
    fn drop(&mut self) {
        let mut inner = self.board.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.unpacking.remove(&self.key);
    }
}

/// fault-injection `hold_unpack`: an unpack, once shown, waits until the
/// FIFO `BUNDLEVISOR_FAULT_GATE` is opened for writing and closed (a test
/// looks at it meanwhile).
fn hold_unpack() {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("BUNDLEVISOR_FAULT").is_some_and(|v| v == "hold_unpack") {
        if let Some(gate) = std::env::var_os("BUNDLEVISOR_FAULT_GATE") {
            let _ = std::fs::read(gate);
        }
    }
}

fn with_uptime(entry: &Entry, paths: bool) -> BundleStatus {
    // The sandbox apart, so that its lists are not copied to be dropped.
    let sandbox = entry.status.sandbox.as_ref().map(|s| match paths {
        true => s.clone(),
        false => crate::protocol::SandboxRecord {
            read: Vec::new(),
            write: Vec::new(),
            execute: Vec::new(),
            sandbox_id: s.sandbox_id.clone(),
            sandbox_path: s.sandbox_path.clone(),
            strategy: s.strategy.clone(),
            landlock: s.landlock.clone(),
            created: s.created,
            uid: s.uid,
            isolation: s.isolation.clone(),
            landlock_abi: s.landlock_abi,
            containment: s.containment.clone(),
            cgroup: s.cgroup.clone(),
            limits: s.limits.clone(),
        },
    });
    let status = &entry.status;
    BundleStatus {
        workspace: status.workspace.clone(),
        name: status.name.clone(),
        version: status.version.clone(),
        state: status.state,
        pid: status.pid,
        uptime_secs: entry.ready_since.map(|t| t.elapsed().as_secs()),
        restarts: status.restarts,
        tools: status.tools,
        last_error: status.last_error.clone(),
        last_error_at: status.last_error_at,
        source: status.source.clone(),
        sandbox,
        usage: status.usage.clone(),
        archive: status.archive.clone(),
        mcp: status.mcp.clone(),
        unpacking: status.unpacking,
        secret_refs: status.secret_refs.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::BundleState;

    fn status(workspace: &str, name: &str, state: BundleState) -> BundleStatus {
        BundleStatus::new(workspace, name, state, String::new())
    }

    /// Issue 22: the boot's progress is read in O(1), so it must stay
    /// equal to a count over the board through every kind of change.
    #[test]
    fn the_starting_count_follows_every_change() {
        let board = StatusBoard::default();
        let counted = |board: &StatusBoard| {
            let (_, all) = board.snapshot(false);
            let starting = all
                .iter()
                .filter(|b| b.state == BundleState::Starting)
                .count();
            (all.len(), starting)
        };
        board.expect(status("w", "a", BundleState::Starting));
        board.expect(status("w", "b", BundleState::Starting));
        // Expected again (a second boot listing): no double count.
        board.expect(status("w", "a", BundleState::Starting));
        assert_eq!(board.settling(), (2, 2));
        board.update(status("w", "a", BundleState::Ready), None, 0);
        assert_eq!(board.settling(), counted(&board));
        board.update(status("w", "a", BundleState::Starting), None, 0);
        board.update(status("w", "a", BundleState::Starting), None, 0);
        assert_eq!(board.settling(), (2, 2));
        board.update(status("w", "b", BundleState::Failed), None, 0);
        board.remove("w", "a");
        board.remove("w", "a");
        assert_eq!(board.settling(), (1, 0));
        assert_eq!(board.settling(), counted(&board));
    }

    /// Issue 37: `status` of a list leaves each sandbox's path lists out
    /// unless asked (they were 2 KiB of a bundle's 2.2), and keeps every
    /// other field; `get` (one bundle) keeps them.
    #[test]
    fn a_snapshot_has_the_sandbox_paths_only_when_asked() {
        let board = StatusBoard::default();
        let mut st = status("w", "a", BundleState::Ready);
        st.version = Some("1.0.0".into());
        st.pid = Some(42);
        st.sandbox = Some(crate::protocol::SandboxRecord {
            sandbox_id: "w/a".into(),
            sandbox_path: "/s/w/a".into(),
            strategy: "landlock".into(),
            landlock: "enforced (ABI 7)".into(),
            created: true,
            uid: 2000,
            isolation: "own uid 2000".into(),
            landlock_abi: Some(7),
            read: vec!["/usr".into(), "/lib".into()],
            write: vec!["/s/w/a/data".into()],
            execute: vec!["/usr/bin".into()],
            containment: "cgroup v2".into(),
            cgroup: Some("/sys/fs/cgroup/x".into()),
            limits: vec!["pids.max 64".into()],
        });
        board.update(st.clone(), None, 0);
        let (_, with) = board.snapshot(true);
        assert_eq!(with, [st.clone()]);
        assert_eq!(board.get("w", "a").as_ref(), Some(&st));
        let (_, without) = board.snapshot(false);
        let mut lean = st.clone();
        let sandbox = lean.sandbox.as_mut().unwrap();
        (sandbox.read, sandbox.write, sandbox.execute) = (vec![], vec![], vec![]);
        assert_eq!(without, [lean]);
        let json = serde_json::to_string(&without[0]).unwrap();
        assert!(
            !json.contains("\"read\"") && json.contains("pids.max 64"),
            "{json}"
        );
    }

    /// One workspace's names, not its neighbours' (whose names sort
    /// right after it).
    #[test]
    fn names_in_lists_one_workspace_only() {
        let board = StatusBoard::default();
        for (ws, name) in [("a", "x"), ("ab", "y"), ("a", "z"), ("", "q"), ("b", "x")] {
            board.update(status(ws, name, BundleState::Ready), None, 0);
        }
        assert_eq!(board.names_in("a"), ["x", "z"]);
        assert_eq!(board.names_in("ab"), ["y"]);
        assert!(board.names_in("c").is_empty());
    }
}
