//! Secret references at a bundle's start and after: [`read_refs`] reads
//! every stored reference of a bundle (what its start injects), and
//! [`SecretWatch`] respawns a running bundle when a secret it was started
//! with changes where it is kept.
//!
//! What is watched is the *folder* of each referenced file (a systemd
//! credential, a `file:` reference, a `pass` entry): a Kubernetes Secret
//! volume is updated by renaming a new `..data` link over the old one, an
//! editor by renaming a new file over the old, and neither touches the
//! file's own inode. Events are hints: after the folder has been quiet for
//! [`QUIET`] (or [`MOST`] after the first change, for a folder that is
//! never quiet), each reference of the bundles watching it is read again, and
//! a bundle is respawned only when a value's SHA-256 (held in memory, never
//! written) differs from the one it was started with. A reference that
//! cannot be read at that moment (a file half replaced, deleted) keeps the
//! bundle running with what it has; the next change is looked at again.
//! References to the environment and the cloud stores are read again at
//! each start (`bundlevisor restart`), not watched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{FailKind, StartFailure};
use crate::secret::Secret;
use crate::secret_ref::{RefError, SecretRef, Sources};
use crate::store::StoredRef;

/// How long a watched folder must be quiet before its references are read
/// again (a `..data` swap is several renames and links).
const QUIET: Duration = Duration::from_millis(150);

/// The longest a change waits for its folder to be quiet.
const MOST: Duration = Duration::from_secs(2);

/// How often a folder that could not be watched (not there yet, removed)
/// is tried again.
const REARM_EVERY: Duration = Duration::from_secs(2);

/// One reference a running process was started with.
#[derive(Clone)]
pub struct ReadRef {
    pub key: String,
    pub reference: SecretRef,
    /// The operator it is read for.
    pub uid: u32,
    /// Unix seconds of the read.
    pub at: i64,
    /// SHA-256 of the value (only ever in memory).
    digest: [u8; 32],
    /// The file whose folder is watched.
    pub watch: Option<PathBuf>,
}

impl std::fmt::Debug for ReadRef {
    // The digest of a secret is not shown either.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadRef")
            .field("key", &self.key)
            .field("reference", &self.reference)
            .field("uid", &self.uid)
            .field("at", &self.at)
            .finish()
    }
}

impl ReadRef {
    pub fn status(&self) -> crate::protocol::SecretRefStatus {
        crate::protocol::SecretRefStatus {
            key: self.key.clone(),
            reference: self.reference.to_string(),
            resolved_at: self.at,
        }
    }
}

fn digest(value: &Secret) -> [u8; 32] {
    Sha256::digest(value.expose().as_bytes()).into()
}

/// The uid that owns a bundle's source (its folder, manifest or archive),
/// if it can be told.
pub async fn source_owner(source: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    tokio::fs::metadata(source).await.ok().map(|m| m.uid())
}

/// Reads every reference of `stored` for a start of a bundle whose source
/// `owner` owns: the values (to inject) and what was read, or the first
/// key whose reference gave no value.
pub async fn read_refs(
    sources: &Sources,
    stored: BTreeMap<String, StoredRef>,
    owner: Option<u32>,
) -> Result<(BTreeMap<String, Secret>, Vec<ReadRef>), (String, RefError)> {
    let mut values = BTreeMap::new();
    let mut read = Vec::with_capacity(stored.len());
    for (key, stored) in stored {
        let StoredRef {
            reference,
            uid,
            owner: set_for,
        } = stored;
        if let Some(set_for) = set_for.filter(|o| Some(*o) != owner) {
            let why = format!(
                "it was set while uid {set_for} owned the bundle's source, which uid {} owns now (installed again by someone else?); set it again with `configure --ref`",
                owner.map_or_else(|| "?".to_string(), |o| o.to_string())
            );
            let error = RefError {
                reference,
                why,
                transient: false,
            };
            return Err((key, error));
        }
        let reference: SecretRef = match reference.parse() {
            Ok(r) => r,
            Err(why) => {
                let error = RefError {
                    reference,
                    why,
                    transient: false,
                };
                return Err((key, error));
            }
        };
        let resolved = match sources.resolve(&reference, uid).await {
            Ok(r) => r,
            Err(e) => return Err((key, e)),
        };
        read.push(ReadRef {
            key: key.clone(),
            reference,
            uid,
            at: crate::clock::unix_secs(),
            digest: digest(&resolved.value),
            watch: resolved.watch,
        });
        values.insert(key, resolved.value);
    }
    Ok((values, read))
}

/// Why a bundle's values could not be had.
#[derive(Debug)]
pub enum ValuesError {
    Store(crate::store::StoreError),
    /// The reference of `key` gave no value.
    Ref {
        key: String,
        error: RefError,
    },
}

impl std::fmt::Display for ValuesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValuesError::Store(e) => e.fmt(f),
            ValuesError::Ref { key, error } => write!(f, "user_config {key}: {error}"),
        }
    }
}

impl ValuesError {
    /// As a start's failure: what an operator must fix is `needs_config`
    /// (never retried); a store that did not answer is retried by the
    /// restart policy.
    pub fn start_failure(&self, workspace: &str, name: &str) -> StartFailure {
        let (kind, fix) = match self {
            ValuesError::Store(_) => (FailKind::Config, String::new()),
            ValuesError::Ref { error, .. } if error.transient => (
                FailKind::Transient,
                "; tried again by the restart policy".to_string(),
            ),
            ValuesError::Ref { key, .. } => (
                FailKind::NeedsConfig,
                format!(
                    "; fix it, then `bundlevisor restart {name} -w {workspace}` (or `bundlevisor configure {name} -w {workspace} --ref {key}=...` to read it elsewhere)"
                ),
            ),
        };
        StartFailure {
            kind,
            reason: format!("{self}{fix}"),
        }
    }
}

enum Msg {
    /// The references the running process of a bundle was started with.
    Watch {
        bundle: (String, String),
        refs: Vec<ReadRef>,
    },
    Forget((String, String)),
    /// Something happened in a watched folder (removed: a removal).
    Changed(Vec<PathBuf>, bool),
}

/// Asks for a bundle (workspace, name) to be respawned.
pub type Respawner = Box<dyn Fn(&str, &str) + Send>;

/// Handle to the watcher task; cheap to clone.
#[derive(Clone)]
pub struct SecretWatch {
    tx: mpsc::UnboundedSender<Msg>,
}

impl SecretWatch {
    /// The handle, and the task to run (until `shutdown`) with `sources`,
    /// which calls `respawn(workspace, name)` for a bundle whose secret
    /// changed.
    pub fn new(
        sources: Sources,
        respawn: Respawner,
        shutdown: CancellationToken,
    ) -> (SecretWatch, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let events = tx.clone();
        (
            SecretWatch { tx },
            run(rx, events, (sources, respawn), shutdown),
        )
    }

    /// From now on, `refs` are what the bundle runs with (replacing what it
    /// ran with before).
    pub fn watch(&self, workspace: &str, name: &str, refs: &[ReadRef]) {
        let bundle = (workspace.to_string(), name.to_string());
        let msg = match refs.iter().any(|r| r.watch.is_some()) {
            true => Msg::Watch {
                bundle,
                refs: refs.to_vec(),
            },
            false => Msg::Forget(bundle),
        };
        let _ = self.tx.send(msg);
    }

    /// The bundle is gone (uninstalled, or the daemon stops).
    pub fn forget(&self, workspace: &str, name: &str) {
        let _ = self
            .tx
            .send(Msg::Forget((workspace.to_string(), name.to_string())));
    }
}

/// The folder watched for `file`.
fn folder(file: &Path) -> PathBuf {
    file.parent().unwrap_or(Path::new("/")).to_path_buf()
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Msg>,
    events: mpsc::UnboundedSender<Msg>,
    (sources, respawn): (Sources, Respawner),
    shutdown: CancellationToken,
) {
    let handler = move |res: notify::Result<notify::Event>| {
        if let Ok(event) = res {
            if !matches!(event.kind, notify::EventKind::Access(_)) {
                let removed = matches!(event.kind, notify::EventKind::Remove(_));
                let _ = events.send(Msg::Changed(event.paths, removed));
            }
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("cannot watch the folders of secret references ({e}); a changed secret reaches its bundle at its next restart");
            None
        }
    };
    let mut bundles: HashMap<(String, String), Vec<ReadRef>> = HashMap::new();
    // The folders the bundles' references are in, and those armed.
    let (mut wanted, mut watched) = (BTreeSet::<PathBuf>::new(), BTreeSet::<PathBuf>::new());
    let mut due = Due::default();
    let mut rearm = tokio::time::interval(REARM_EVERY);
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return,
            msg = rx.recv() => msg,
            _ = tokio::time::sleep_until(due.at), if !due.folders.is_empty() => {
                let folders = std::mem::take(&mut due.folders);
                let mut respawned = Vec::new();
                for (bundle, refs) in &bundles {
                    let concerned = refs
                        .iter()
                        .any(|r| r.watch.as_deref().is_some_and(|f| folders.contains(&folder(f))));
                    if concerned && changed(&sources, bundle, refs).await {
                        respawn(&bundle.0, &bundle.1);
                        respawned.push(bundle.clone());
                    }
                }
                // Until its new start says what it runs with.
                for bundle in respawned {
                    bundles.remove(&bundle);
                }
                continue;
            }
            _ = rearm.tick(), if wanted.len() > watched.len() => {
                if let Some(w) = watcher.as_mut() {
                    // A folder that is back (a volume mounted again) is
                    // armed, and what changed meanwhile looked at.
                    for back in arm(w, &wanted, &mut watched) {
                        due.add(back);
                    }
                }
                continue;
            }
        };
        let Some(msg) = msg else { return };
        match msg {
            Msg::Watch { bundle, refs } => {
                // What changed while it started is looked at too.
                for f in refs.iter().filter_map(|r| r.watch.as_deref().map(folder)) {
                    // Armed again: it may be a new folder under the old
                    // name (a volume mounted again) whose removal was
                    // not seen.
                    watched.remove(&f);
                    due.add(f);
                }
                bundles.insert(bundle, refs);
            }
            Msg::Forget(bundle) => {
                bundles.remove(&bundle);
            }
            Msg::Changed(paths, removed) => {
                for path in paths {
                    // A watched folder removed lost its watch: armed again
                    // once it is back.
                    if removed && watched.remove(&path) {
                        tracing::info!(folder = %path.display(), "a secret reference's folder was removed; it is watched again when it is back");
                        continue;
                    }
                    // An event names the folder itself or an entry of it.
                    for candidate in [path.clone(), folder(&path)] {
                        if watched.contains(&candidate) {
                            due.add(candidate);
                        }
                    }
                }
                continue;
            }
        }
        let Some(w) = watcher.as_mut() else {
            continue;
        };
        wanted = bundles
            .values()
            .flatten()
            .filter_map(|r| r.watch.as_deref().map(folder))
            .collect();
        for gone in watched.difference(&wanted) {
            let _ = w.unwatch(gone);
        }
        watched.retain(|f| wanted.contains(f));
        arm(w, &wanted, &mut watched);
        for failed in wanted.difference(&watched) {
            tracing::warn!(folder = %failed.display(), "cannot watch a secret reference's folder (yet); tried again every {REARM_EVERY:?}, and a change there reaches its bundles at their next restart meanwhile");
        }
    }
}

/// The folders to look at once they are quiet, and when.
struct Due {
    folders: BTreeSet<PathBuf>,
    /// When they are looked at: [`QUIET`] after the last change, at most
    /// [`MOST`] after the first.
    at: tokio::time::Instant,
    first: tokio::time::Instant,
}

impl Default for Due {
    fn default() -> Due {
        let now = tokio::time::Instant::now();
        Due {
            folders: BTreeSet::new(),
            at: now,
            first: now,
        }
    }
}

impl Due {
    fn add(&mut self, folder: PathBuf) {
        let now = tokio::time::Instant::now();
        if self.folders.is_empty() {
            self.first = now;
        }
        self.folders.insert(folder);
        self.at = (now + QUIET).min(self.first + MOST);
    }
}

/// Arms each of `wanted` not yet `watched` that can be; those newly armed.
fn arm(
    watcher: &mut notify::RecommendedWatcher,
    wanted: &BTreeSet<PathBuf>,
    watched: &mut BTreeSet<PathBuf>,
) -> Vec<PathBuf> {
    let mut armed = Vec::new();
    for folder in wanted.difference(&watched.clone()) {
        if watcher.watch(folder, RecursiveMode::NonRecursive).is_ok() {
            watched.insert(folder.clone());
            armed.push(folder.clone());
        }
    }
    armed
}

/// Reads `refs` of `bundle` again: whether a value changed.
async fn changed(
    sources: &Sources,
    (workspace, name): &(String, String),
    refs: &[ReadRef],
) -> bool {
    for r in refs.iter().filter(|r| r.watch.is_some()) {
        match sources.resolve(&r.reference, r.uid).await {
            Ok(now) if digest(&now.value) != r.digest => {
                tracing::info!(workspace = %workspace, bundle = %name, key = %r.key, reference = %r.reference, "a referenced secret changed; respawning the bundle");
                return true;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(workspace = %workspace, bundle = %name, key = %r.key, "{e}; the bundle keeps the value it was started with");
            }
        }
    }
    false
}
