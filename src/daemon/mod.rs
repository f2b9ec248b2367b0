//! The daemon: the actor tree (DaemonActor → WorkspaceActor → BundleActor),
//! the control server, and [`run`], which tests call in-process or the
//! binary calls from `bundlevisor daemon`.
//!
//! One daemon per process: actors are registered under global names
//! (`daemon`, `workspace/WS`, `bundle/WS/NAME`).

pub mod admission;
pub mod api;
pub mod board;
pub mod bundle;
pub mod conns;
pub mod control;
pub mod dashboard;
pub mod folder;
pub mod gateway;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod policy;
pub mod privileges;
pub mod resumed;
pub mod secret_watch;
pub mod source;
pub mod supervisor;
pub mod systemd;
pub mod trusted;
pub mod uid_claim;
pub mod watcher;
pub mod workspace;

/// Runs its closure when dropped, unless disarmed first (a session left,
/// a call forgotten, a call dropped before its answer).
pub(crate) struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnDrop<F> {
    pub(crate) fn new(done: F) -> OnDrop<F> {
        OnDrop(Some(done))
    }

    /// Not run after all.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done();
        }
    }
}

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use ractor::Actor;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::host_resources::access::AuditLog;
use crate::store::crypto::Cipher;
use crate::store::{Credentials, Store, StoreError};
use board::StatusBoard;
use supervisor::DaemonActor;

/// What every actor and the control server share.
pub struct Shared {
    pub config: Arc<Config>,
    pub store: Store,
    /// user_config values and OAuth tokens, encrypted.
    pub credentials: Credentials,
    /// One lock per bundle: `configure` and `auth` calls on a bundle run one
    /// at a time (store, respawn, outcome).
    pub configure_locks: std::sync::Mutex<BundleLocks>,
    /// Held for a whole `rotate-key` (new key file, re-sealing, rename):
    /// a second rotation waits for the first, so the key file always ends
    /// up holding the key the store is sealed with.
    pub key_rotation: Arc<tokio::sync::Mutex<()>>,
    /// Blocking file-system work on paths peers name, bounded per uid.
    pub path_work: admission::PathWork,
    /// Authorization-code flows between `auth.begin` and `auth.complete`,
    /// keyed by their `state`.
    pub pending_auth: std::sync::Mutex<std::collections::HashMap<String, PendingAuth>>,
    pub board: StatusBoard,
    pub metrics: metrics::Metrics,
    /// Where `GET /metrics` is served, if configured.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Bounds how many bundles start at once (boot reload is parallel up to this).
    pub start_permits: Semaphore,
    pub started_at: Instant,
    /// A collection of unpacked archives is due shortly (uninstalls
    /// coalesce into it).
    pub collect_pending: std::sync::atomic::AtomicBool,
    /// Cancelled once the boot reload has been done.
    pub booted: CancellationToken,
    /// Cancelled once the boot reload has settled (systemd's `READY=1`,
    /// and `/readyz`).
    pub settled: CancellationToken,
    /// Every bundle's stderr lines, for `logs -f`.
    pub log_lines: tokio::sync::broadcast::Sender<crate::protocol::LogLine>,
    /// Kills bundle groups left behind if the daemon is killed.
    pub reaper: Option<Arc<crate::bundle::reaper::Reaper>>,
    /// Where each bundle's cgroup goes, and what containment is in force.
    pub cgroups: Arc<crate::bundle::cgroup::Cgroups>,
    /// The ready session of each bundle, for calls that need not go
    /// through its actor.
    pub lanes: bundle::Lanes,
    /// Bumped by each `token revoke`: the HTTP gateway's token cache is
    /// dropped when it changes.
    pub tokens_revoked: std::sync::atomic::AtomicU64,
    /// The ids of the tokens revoked since the daemon started: a stdio
    /// session given one is refused from then on.
    pub revoked_tokens: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Each workspace's audit log (`STATE_DIR/audit/WS.jsonl`): one writer
    /// per file, shared by the workspace's actor (host-resources
    /// decisions) and its gateways (agents' calls).
    pub audit_logs: std::sync::Mutex<std::collections::HashMap<String, AuditLog>>,
    /// The model tools are also ranked by (`[search] model`).
    pub search_encoder: Option<Arc<bundlevisor_embed::Encoder>>,
    /// Each workspace's tool search index (`discovery = "search"`).
    pub tool_indexes:
        std::sync::Mutex<std::collections::HashMap<String, Arc<crate::tool_search::ToolIndex>>>,
    /// Where spans go (`[telemetry]`; nowhere by default).
    pub telemetry: crate::telemetry::Telemetry,
    /// The dashboard's sign-in codes and sessions.
    pub dashboard: dashboard::Logins,
    /// Where secret references are read from (`[secrets]`).
    pub secrets: crate::secret_ref::Sources,
    /// Respawns a bundle when a secret it was started with changes.
    pub secret_watch: secret_watch::SecretWatch,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another bundlevisor daemon is using the state dir {state_dir}{}; stop it first", .pid.as_ref().map(|p| format!(" (pid {p})")).unwrap_or_default())]
    StateDirLocked {
        state_dir: PathBuf,
        pid: Option<String>,
    },
    #[error("bundles run under uids of their own and cannot pass through {dir} (owner {owner}, mode {mode:o}) to their archives, environments and data in the state dir {state_dir}: let other users enter it (`chmod o+x {dir}`: they may enter it, not list it), or set state_dir to a folder every user can pass through (e.g. /var/lib/bundlevisor)")]
    StateDirUnreachable {
        dir: PathBuf,
        state_dir: PathBuf,
        owner: String,
        mode: u32,
    },
    #[error("another bundlevisor daemon is listening on {0}; stop it first or use another socket")]
    SocketInUse(PathBuf),
    #[error("{0} exists and is not a socket; remove it or choose another socket path")]
    SocketPathTaken(PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] crate::store::crypto::KeyError),
    #[error(transparent)]
    UidRange(#[from] uid_claim::ClaimError),
    #[error(transparent)]
    Capabilities(#[from] privileges::MissingCapabilities),
    #[error("actor system: {0}")]
    Actor(String),
    #[error("cannot serve metrics on {addr} (metrics_addr): {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot serve HTTPS: {0}")]
    Tls(String),
    #[error("cannot load the tool search model ([search] model = {path}): {source}; point it at a sentence-transformers folder (config.json, vocab.txt, model.safetensors), e.g. the one `make model` fetches, or remove the setting to rank tools by their words alone")]
    SearchModel {
        path: PathBuf,
        source: bundlevisor_embed::LoadError,
    },
    #[error("cannot export traces ([telemetry]): {0}")]
    Telemetry(String),
    #[error("cannot listen on [http] listen = {addr}: {source}")]
    Http {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// An authorization-code flow in progress for one bundle.
pub struct PendingAuth {
    pub workspace: String,
    pub name: String,
    pub flow: crate::oauth::Pending,
    pub started: Instant,
}

/// Per-bundle async locks, keyed by (workspace, name).
pub type BundleLocks = std::collections::HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>;

impl Shared {
    /// Runs `f` on one bundle's stored credentials, on the blocking pool.
    pub async fn credentials_of<T, F>(
        &self,
        workspace: &str,
        bundle: &str,
        f: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Credentials, &str, &str) -> Result<T, StoreError> + Send + 'static,
    {
        let (credentials, ws, b) = (
            self.credentials.clone(),
            workspace.to_string(),
            bundle.to_string(),
        );
        self.store.call(move |_| f(&credentials, &ws, &b)).await
    }

    /// A bundle's user_config values as a start injects them: those stored,
    /// and those its references point at, read now.
    pub async fn user_values(
        &self,
        workspace: &str,
        bundle: &str,
        owner: Option<u32>,
    ) -> Result<
        (
            std::collections::BTreeMap<String, crate::secret::Secret>,
            Vec<secret_watch::ReadRef>,
        ),
        secret_watch::ValuesError,
    > {
        let (mut values, stored) = self
            .credentials_of(workspace, bundle, |c, w, n| {
                Ok((c.values(w, n)?, c.refs(w, n)?))
            })
            .await
            .map_err(secret_watch::ValuesError::Store)?;
        let (read, refs) = secret_watch::read_refs(&self.secrets, stored, owner)
            .await
            .map_err(|(key, error)| secret_watch::ValuesError::Ref { key, error })?;
        values.extend(read);
        Ok((values, refs))
    }

    /// The audit log of `workspace`, started the first time it is asked for.
    pub fn audit_log(&self, workspace: &str) -> AuditLog {
        let mut logs = self.audit_logs.lock().unwrap_or_else(|p| p.into_inner());
        logs.entry(workspace.to_string())
            .or_insert_with(|| {
                let path = self
                    .config
                    .state_dir
                    .join("audit")
                    .join(format!("{workspace}.jsonl"));
                let logs = &self.config.logs;
                AuditLog::start(path, logs.max_bytes, logs.keep)
            })
            .clone()
    }

    /// The tool search index of `workspace`, made the first time it is
    /// asked for (its tools are indexed by the searches, as they come).
    pub fn tool_index(
        &self,
        workspace: &str,
    ) -> Result<Arc<crate::tool_search::ToolIndex>, crate::tool_search::SearchError> {
        let mut indexes = self.tool_indexes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = indexes.get(workspace) {
            return Ok(index.clone());
        }
        let index = Arc::new(match &self.search_encoder {
            Some(encoder) => crate::tool_search::ToolIndex::with_encoder(encoder.clone())?,
            None => crate::tool_search::ToolIndex::new()?,
        });
        indexes.insert(workspace.to_string(), index.clone());
        Ok(index)
    }

    /// Ends every index's embedding after the text at hand (the daemon
    /// stopping: the runtime waits for its blocking work).
    pub fn stop_tool_indexes(&self) {
        let indexes = self.tool_indexes.lock().unwrap_or_else(|p| p.into_inner());
        for index in indexes.values() {
            index.stop();
        }
    }

    /// The lock that serializes credential changes of one bundle.
    pub fn configure_lock(&self, workspace: &str, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .configure_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        locks
            .entry((workspace.to_string(), name.to_string()))
            .or_default()
            .clone()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn private_dir(path: &Path) -> Result<(), DaemonError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io_err(path))
}

/// The state dir and those of its folders that do not exist yet (the ones
/// the daemon is about to make).
fn absent_folders(state_dir: &Path) -> Vec<PathBuf> {
    let Ok(state_dir) = std::path::absolute(state_dir) else {
        return Vec::new();
    };
    state_dir
        .ancestors()
        .take_while(|p| !p.exists())
        .map(Path::to_path_buf)
        .collect()
}

/// A root daemon's bundles run under uids of their own and pass through the
/// folders above the state dir to their unpacked archives, environments and
/// data: each must let other users enter it (`o+x`, not list it). The
/// daemon's own folders (the ones it just made, and the control socket's)
/// are made so; any other folder is left as it is and the start refused,
/// naming it and the fix.
fn passable_to_bundles(
    state_dir: &Path,
    socket: &Path,
    made: &[PathBuf],
) -> Result<(), DaemonError> {
    use std::os::unix::fs::MetadataExt;
    let state = std::fs::canonicalize(state_dir).map_err(io_err(state_dir))?;
    // The state dir itself: entered, never listed (what is in it is 0700
    // or 0600 but for the bundles' own folders).
    if std::fs::metadata(&state).map_err(io_err(&state))?.mode() & 0o777 != 0o711 {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711))
            .map_err(io_err(&state))?;
    }
    let made: Vec<PathBuf> = made
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let socket_dir = socket.parent().and_then(|p| std::fs::canonicalize(p).ok());
    let me = nix::unistd::geteuid().as_raw();
    for dir in state.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(io_err(dir))?;
        let mode = meta.mode() & 0o7777;
        if mode & 0o001 != 0 {
            continue;
        }
        let own = made.iter().any(|m| m == dir) || socket_dir.as_deref() == Some(dir);
        if own && meta.uid() == me {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))
                .map_err(io_err(dir))?;
            tracing::info!(dir = %dir.display(), was = format!("{mode:o}"), "bundles pass through this folder of the daemon's to the state dir: other users may now enter it (not list it)");
            continue;
        }
        return Err(DaemonError::StateDirUnreachable {
            dir: dir.to_path_buf(),
            state_dir: state.clone(),
            owner: crate::bundle::reach::user_name(meta.uid()),
            mode,
        });
    }
    Ok(())
}

/// Creates the state dir `0700`, or tightens an existing one that group or
/// other users can read, write or enter (an older version, a careless
/// `mkdir`): the database, the credential key, the logs and every
/// workspace's files are inside. A root daemon's bundles (uids of their
/// own) may traverse it (`0711`) but still not list or write it.
fn private_state_dir(path: &Path, traversable: bool) -> Result<(), DaemonError> {
    private_dir(path)?;
    let mode = std::fs::metadata(path)
        .map_err(io_err(path))?
        .permissions()
        .mode()
        & 0o777;
    let allowed = if traversable { 0o711 } else { 0o700 };
    if mode & !allowed != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(allowed))
            .map_err(io_err(path))?;
        tracing::warn!(state_dir = %path.display(), was = format!("{mode:o}"), "the state dir was open to other users; tightened it to {allowed:o}");
    }
    Ok(())
}

/// Holds the state-dir lock for the daemon's lifetime (released by the
/// kernel even on SIGKILL).
fn lock_state_dir(state_dir: &Path) -> Result<Flock<File>, DaemonError> {
    let path = state_dir.join("daemon.lock");
    // The daemon's alone: the state dir can be entered by bundles, and one
    // that could open the lock could hold it against the next start.
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_err(&path))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(&path))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0).map_err(io_err(&path))?;
            writeln!(lock, "{}", std::process::id()).map_err(io_err(&path))?;
            Ok(lock)
        }
        Err((_, _)) => Err(DaemonError::StateDirLocked {
            state_dir: state_dir.to_path_buf(),
            pid: std::fs::read_to_string(&path)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        }),
    }
}

/// Binds the control socket (mode 0600; 0660 for `allowed_gids`, 0666 for
/// `allowed_uids`). A socket left by a crashed daemon is replaced; a live
/// one is refused.
fn bind_socket(
    path: &Path,
    control: &crate::config::ControlSettings,
) -> Result<UnixListener, DaemonError> {
    // Group access only for [control] allowed_gids (the first one).
    let group = control
        .allowed_gids
        .first()
        .map(|g| nix::unistd::Gid::from_raw(*g));
    let share = |p: &Path, mode: u32| -> Result<(), DaemonError> {
        if let Some(gid) = group {
            nix::unistd::chown(p, None, Some(gid))
                .map_err(|e| io_err(p)(std::io::Error::from(e)))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .map_err(io_err(p))?;
        }
        Ok(())
    };
    let mut created_parent = false;
    if let Some(parent) = path.parent() {
        if !parent.exists() {
            created_parent = true;
            private_dir(parent)?;
            share(parent, 0o710)?;
        } else if let Ok(meta) = std::fs::metadata(parent) {
            let mode = meta.permissions().mode() & 0o777;
            // (With allowed_uids other users must enter it: see below.)
            // Entering it (o+x) is fine: a root daemon's bundles pass through
            // it when the state dir is inside, and the socket is 0600.
            if mode & 0o006 != 0 && control.allowed_uids.is_empty() {
                tracing::warn!(dir = %parent.display(), mode = format!("{mode:o}"), "other users can list or write the control socket's folder; the socket itself is not open to them, but prefer a folder they can at most enter (0711 or 0700)");
            }
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(DaemonError::SocketPathTaken(path.to_path_buf()));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(DaemonError::SocketInUse(path.to_path_buf())),
            Err(_) => {
                tracing::warn!(socket = %path.display(), "removing a stale socket left by a daemon that did not stop cleanly");
                std::fs::remove_file(path).map_err(io_err(path))?;
            }
        }
    }
    let listener = UnixListener::bind(path).map_err(io_err(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err(path))?;
    share(path, 0o660)?;
    if !control.allowed_uids.is_empty() {
        open_to_allowed_uids(path, created_parent)?;
    }
    Ok(listener)
}

/// `[control] allowed_uids`: a socket file cannot name other users (no
/// ACLs here), so the socket becomes `0666` and a folder the daemon created
/// `0711` (entered by full path, not listed); who may talk to the daemon is
/// then decided by the peer-credentials check alone, as for any socket.
fn open_to_allowed_uids(path: &Path, created_parent: bool) -> Result<(), DaemonError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io_err(path))?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let (Some(parent), true) = (parent, created_parent) {
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711))
            .map_err(io_err(parent))?;
    }
    let enterable = parent
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o001 != 0)
                .unwrap_or(false)
        })
        .unwrap_or(true);
    if enterable {
        tracing::info!(socket = %path.display(), "[control] allowed_uids is set: the control socket is 0666 (its folder 0711) and every connection's peer uid/gid is checked");
    } else {
        tracing::warn!(socket = %path.display(), "[control] allowed_uids is set, but other users cannot enter the socket's folder: give it o+x (e.g. 0711), or let the daemon create it");
    }
    Ok(())
}

/// Loads the credential key and checks it against the store, finishing or
/// undoing a `rotate-key` that was cut short: a `KEY_FILE.new` left next to
/// the key file is the new key if the re-sealing committed (then it becomes
/// the key file), and a leftover otherwise (then it is removed).
fn open_credentials(
    store: Store,
    settings: &crate::config::CredentialsConfig,
    state_dir: &Path,
) -> Result<(Credentials, crate::store::crypto::KeyOrigin), DaemonError> {
    use crate::store::crypto;
    let (cipher, origin) = Cipher::load(settings, state_dir)?;
    let key_path = crypto::key_path(settings, state_dir);
    let pending = key_path
        .as_deref()
        .map(crypto::pending_key_path)
        .filter(|p| p.exists());
    match (Credentials::open(store.clone(), cipher), pending, key_path) {
        (Ok(credentials), Some(pending), _) => {
            tracing::warn!(file = %pending.display(), "removing the new key of a key rotation that did not commit; the stored secrets are still sealed with the current key");
            std::fs::remove_file(&pending).map_err(io_err(&pending))?;
            Ok((credentials, origin))
        }
        (Err(StoreError::KeyMismatch { .. }), Some(pending), Some(key_path)) => {
            let credentials = Credentials::open(store, Cipher::from_file(&pending)?)?;
            crypto::promote_pending_key(&key_path)?;
            tracing::warn!(file = %key_path.display(), "finished a key rotation that was cut short after the stored secrets were re-sealed");
            Ok((credentials, crypto::KeyOrigin::File(key_path)))
        }
        (opened, _, _) => Ok((opened?, origin)),
    }
}

/// Waits until the boot reload was done and every bundle it started has
/// settled (ready, failed or stopped; a bundle already retrying counts as
/// settled), at most `start_timeout`.
async fn boot_settled(shared: &Shared) {
    shared.booted.cancelled().await;
    let expected = shared
        .store
        .call(|s| s.installs())
        .await
        .map(|i| i.len())
        .unwrap_or(0);
    let deadline = tokio::time::Instant::now() + shared.config.bundles.start_timeout;
    let mut events = shared.board.subscribe();
    // On a terminal: a bar of the bundles that have come up (or settled).
    let progress = (expected > 0).then(|| crate::progress::bar(expected as u64, "boot reload"));
    loop {
        // A bundle already retrying (in a backoff) counts as settled.
        let (listed, starting) = shared.board.settling();
        let done = listed - starting;
        if let Some(p) = &progress {
            p.set_position(done.min(expected) as u64);
        }
        if listed >= expected && starting == 0 {
            return;
        }
        // Re-check at every transition.
        if tokio::time::timeout_at(deadline, events.recv())
            .await
            .is_err()
        {
            tracing::warn!("boot reload: some bundles are still starting after the start timeout");
            return;
        }
    }
}

/// How an install is listed before its actor has said anything.
pub fn expected_status(record: &crate::store::InstallRecord) -> crate::protocol::BundleStatus {
    crate::protocol::BundleStatus::new(
        &record.workspace,
        &record.name,
        crate::protocol::BundleState::Starting,
        record.source.display().to_string(),
    )
}

/// Sends `WATCHDOG=1` every `every`, as long as the actor tree answers.
async fn watchdog(every: Duration, daemon: ractor::ActorRef<supervisor::DaemonMsg>) {
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        match daemon.call(supervisor::DaemonMsg::Ping, Some(every)).await {
            Ok(ractor::rpc::CallResult::Success(())) => systemd::notify_or_warn("WATCHDOG=1"),
            _ => tracing::error!(
                "the daemon actor did not answer the watchdog check; not notifying systemd"
            ),
        }
    }
}

/// Runs the daemon until `shutdown` is cancelled, then stops every bundle
/// (SIGTERM, grace, SIGKILL), removes the socket and returns.
/// Descriptors the daemon holds per running bundle (its stdio pipes, the
/// process and cgroup handles, a log file, sockets of a remote session),
/// a generous estimate, and for itself.
const FILES_PER_BUNDLE: u64 = 16;
const FILES_BASE: u64 = 256;

/// Raises the open-files limit to its hard limit (the soft default of
/// 1,024 is what 48 bundles need by FILES_PER_BUNDLE, which is headroom
/// over the ~5 a stdio bundle holds), and says so when even that is too
/// low for the `bundles` installed.
fn open_files_for(bundles: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(
                from = soft,
                to = hard,
                "open-files limit raised to its hard limit"
            ),
            Err(e) => tracing::warn!(soft, hard, "cannot raise the open-files limit: {e}"),
        }
    }
    let limit = getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(s, _)| s);
    let needed = FILES_BASE + FILES_PER_BUNDLE * bundles as u64;
    if limit < needed {
        tracing::warn!(
            limit,
            needed,
            bundles,
            "the open-files limit is too low for the installed bundles; raise it (LimitNOFILE= in the systemd unit, or ulimit -Hn) to at least the needed count"
        );
    }
}

/// The state dir made private and locked, the database opened, the
/// credential key loaded (a rotation cut short finished or undone).
async fn open_state(config: &Config) -> Result<(Flock<File>, Store, Credentials), DaemonError> {
    // A root daemon runs bundles under uids of their own, which traverse
    // (never list) the state dir down to their sandbox folders.
    let root = nix::unistd::geteuid().is_root();
    let absent = absent_folders(&config.state_dir);
    private_state_dir(&config.state_dir, root)?;
    if root {
        passable_to_bundles(&config.state_dir, &config.socket, &absent)?;
    }
    private_dir(&config.state_dir.join("logs"))?;
    let lock = lock_state_dir(&config.state_dir)?;
    let db = config.db_path();
    let store = tokio::task::spawn_blocking(move || Store::open(&db))
        .await
        .map_err(|e| DaemonError::Actor(e.to_string()))??;
    // Bundles running as another user may traverse the state dir to reach
    // their sandbox folders: everything else in it is the daemon's alone.
    for suffix in ["", "-wal", "-shm"] {
        let mut path = config.db_path().into_os_string();
        path.push(suffix);
        let path = PathBuf::from(path);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(io_err(&path))?;
        }
    }
    let (credentials, key_origin) = {
        let (store, settings, dir) = (
            store.clone(),
            config.credentials.clone(),
            config.state_dir.clone(),
        );
        tokio::task::spawn_blocking(move || open_credentials(store, &settings, &dir))
            .await
            .map_err(|e| DaemonError::Actor(e.to_string()))??
    };
    tracing::info!(key = %key_origin, "credential key loaded");
    Ok((lock, store, credentials))
}

/// The daemon's listeners, bound before anything starts.
struct Listeners {
    control: UnixListener,
    metrics: Option<tokio::net::TcpListener>,
    http: Option<tokio::net::TcpListener>,
    http_tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

async fn bind_listeners(config: &Config) -> Result<Listeners, DaemonError> {
    let control = bind_socket(&config.socket, &config.control)?;
    let metrics = match config.metrics_addr {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Metrics { addr, source })?;
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "metrics are served beyond loopback: anyone who can reach this address sees bundle names and counts");
            }
            Some(listener)
        }
    };
    let http_tls = http::tls_config(&config.http).map_err(DaemonError::Tls)?;
    let http = match config.http.listen {
        None => None,
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Http { addr, source })?,
        ),
    };
    Ok(Listeners {
        control,
        metrics,
        http,
        http_tls,
    })
}

/// Containment before anything is spawned: the daemon the subreaper of
/// what bundles fork away, each bundle's cgroup found (an earlier
/// daemon's leftovers removed; said loudly when there is none), and the
/// reaper helper that kills bundles if the daemon dies.
async fn contain(
    config: &Config,
    shutdown: &CancellationToken,
) -> (
    crate::bundle::cgroup::Cgroups,
    Option<Arc<crate::bundle::reaper::Reaper>>,
) {
    // Whatever a bundle forks away stays in the daemon's process tree (the
    // control socket refuses the daemon's descendants).
    if let Err(e) = crate::bundle::orphans::adopt() {
        tracing::warn!("cannot become the subreaper of bundle processes ({e}); a bundle's double-forked descendants leave the daemon's process tree");
    }
    tokio::spawn(crate::bundle::orphans::reap(shutdown.clone()));
    let cgroups = {
        let (settings, state_dir) = (config.sandbox.clone(), config.state_dir.clone());
        tokio::task::spawn_blocking(move || {
            crate::bundle::cgroup::Cgroups::detect(&settings, &state_dir)
        })
        .await
        .unwrap_or_else(|e| crate::bundle::cgroup::Cgroups::none(&e.to_string()))
    };
    if cgroups.available() {
        tracing::info!("containment: {}", cgroups.containment);
        if let Some(advice) = &cgroups.advice {
            tracing::info!("{advice}");
        }
    } else {
        tracing::warn!("containment: {}", cgroups.containment);
    }
    let reaper = match crate::bundle::reaper::Reaper::spawn(&config.state_dir) {
        Ok(r) => {
            for folder in cgroups.folders() {
                r.track_folder(folder);
            }
            Some(Arc::new(r))
        }
        Err(e) => {
            tracing::warn!("cannot start the reaper helper ({e}); a bundle's grandchildren may outlive a killed daemon");
            None
        }
    };
    (cgroups, reaper)
}

/// Serves until `shutdown`: once the boot reload has settled, says so
/// (and to systemd), and keeps systemd's watchdog fed.
async fn serve_until(
    shutdown: &CancellationToken,
    shared: &Shared,
    daemon: &ractor::ActorRef<supervisor::DaemonMsg>,
) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = boot_settled(shared) => {
            shared.settled.cancel();
            let (_, bundles) = shared.board.snapshot(false);
            let ready = bundles.iter().filter(|b| b.state == crate::protocol::BundleState::Ready).count();
            let message = format!("boot reload done: {ready} of {} bundles ready", bundles.len());
            tracing::info!(elapsed_ms = shared.started_at.elapsed().as_millis() as u64, "{message}");
            systemd::notify_or_warn(&format!("READY=1\nSTATUS={message}"));
            let watchdog = systemd::watchdog_interval().map(|every| tokio::spawn(watchdog(every, daemon.clone())));
            shutdown.cancelled().await;
            if let Some(w) = watchdog {
                w.abort();
            }
        }
    }
}

/// A root daemon gives bundles uids from its range: no other daemon on the
/// host may use the same ones at once. Claimed after the listeners are
/// bound, so that a daemon refused for its state dir, socket or listeners
/// says that (and the socket just bound goes when the claim fails).
fn claim_uids(config: &Config) -> Result<Option<uid_claim::UidClaim>, DaemonError> {
    if !nix::unistd::geteuid().is_root() || config.sandbox.user.is_some() {
        return Ok(None);
    }
    match uid_claim::claim(config.sandbox.uid_range, &config.state_dir) {
        Ok(claim) => Ok(Some(claim)),
        Err(e) => {
            let _ = std::fs::remove_file(&config.socket);
            Err(e.into())
        }
    }
}

/// Tracing as `[telemetry]` says (the exporter's client is built off the
/// runtime).
async fn telemetry(
    config: &Config,
) -> Result<
    (
        crate::telemetry::Telemetry,
        Option<crate::telemetry::Exporter>,
    ),
    DaemonError,
> {
    let settings = config.telemetry.clone();
    let started =
        tokio::task::spawn_blocking(move || crate::telemetry::Telemetry::start(&settings))
            .await
            .map_err(|e| DaemonError::Actor(e.to_string()))?
            .map_err(DaemonError::Telemetry)?;
    if let Some(endpoint) = &config.telemetry.otlp_endpoint {
        tracing::info!(endpoint = %crate::telemetry::traces_url(endpoint), "exporting traces over OTLP");
    }
    Ok(started)
}

/// The model of `[search] model`, loaded off the runtime (some 90 MB).
async fn search_encoder(
    config: &Config,
) -> Result<Option<Arc<bundlevisor_embed::Encoder>>, DaemonError> {
    let Some(path) = config.search.model.clone() else {
        return Ok(None);
    };
    let started = Instant::now();
    let folder = path.clone();
    let loaded = tokio::task::spawn_blocking(move || bundlevisor_embed::Encoder::load(&folder))
        .await
        .map_err(|e| DaemonError::Actor(e.to_string()))?;
    let encoder = loaded.map_err(|source| DaemonError::SearchModel {
        path: path.clone(),
        source,
    })?;
    tracing::info!(
        model = %path.display(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "tool search ranks by meaning too"
    );
    Ok(Some(Arc::new(encoder)))
}

/// Where secret references are read from, and the task that respawns a
/// bundle when one changes (until `shutdown`).
fn watch_secrets(
    config: &Config,
    shutdown: &CancellationToken,
) -> (crate::secret_ref::Sources, secret_watch::SecretWatch) {
    let secrets = crate::secret_ref::Sources::of(config);
    let (watch, watching) = secret_watch::SecretWatch::new(
        secrets.clone(),
        Box::new(respawn_rotated),
        shutdown.clone(),
    );
    tokio::spawn(watching);
    (secrets, watch)
}

/// Respawns a bundle whose referenced secret changed (daemon::secret_watch).
fn respawn_rotated(workspace: &str, name: &str) {
    let Ok(actor) = api::Api::bundle_actor(workspace, name) else {
        return;
    };
    let (workspace, name) = (workspace.to_string(), name.to_string());
    tokio::spawn(async move {
        let asked = api::Api::ask(
            &actor,
            |port| bundle::BundleMsg::Respawn(lifecycle::Respawn::Rotated, port),
            Duration::from_secs(10),
            "the bundle's actor",
        )
        .await;
        if let Err(e) = asked {
            tracing::warn!(workspace = %workspace, bundle = %name, "cannot respawn the bundle with its changed secret: {e}");
        }
    });
}

pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), DaemonError> {
    privileges::check()?;
    let (_lock, store, credentials) = open_state(&config).await?;
    let search_encoder = search_encoder(&config).await?;
    let (telemetry, exporter) = telemetry(&config).await?;
    let listeners = bind_listeners(&config).await?;
    let socket = config.socket.clone();
    let metrics_addr = listeners.metrics.as_ref().and_then(|l| l.local_addr().ok());
    let _uid_claim = claim_uids(&config)?;
    let (cgroups, reaper) = contain(&config, &shutdown).await;
    let board = StatusBoard::default();
    // A watched folder's workspace is the daemon's from the start, before
    // its first bundle is found.
    for watch in &config.watch {
        board.add_workspace(&watch.workspace);
    }
    let cgroups = Arc::new(cgroups);
    let started_at = Instant::now();
    let (secrets, secret_watch) = watch_secrets(&config, &shutdown);
    let shared = Arc::new(Shared {
        secrets,
        secret_watch,
        reaper,
        metrics: metrics::Metrics::new(board.clone(), cgroups.clone(), started_at),
        cgroups,
        tokens_revoked: Default::default(),
        revoked_tokens: Default::default(),
        audit_logs: Default::default(),
        search_encoder,
        tool_indexes: Default::default(),
        telemetry,
        dashboard: Default::default(),
        lanes: Default::default(),
        log_lines: tokio::sync::broadcast::channel(4096).0,
        start_permits: Semaphore::new(config.bundles.max_concurrent_starts),
        config: Arc::new(config),
        store,
        credentials,
        configure_locks: Default::default(),
        key_rotation: Default::default(),
        path_work: Default::default(),
        pending_auth: Default::default(),
        board,
        metrics_addr,
        started_at,
        collect_pending: Default::default(),
        booted: CancellationToken::new(),
        settled: CancellationToken::new(),
    });
    // Every install is listed (as `starting`) from the first answer the
    // socket gives: a script polling after a start never sees them gone.
    let installs = shared.store.call(|s| s.installs()).await?;
    open_files_for(installs.len());
    for record in &installs {
        shared.board.expect(expected_status(record));
    }
    let args = supervisor::DaemonArgs {
        shared: shared.clone(),
        installs,
    };
    let (daemon, daemon_task) = Actor::spawn(Some("daemon".into()), DaemonActor, args)
        .await
        .map_err(|e| DaemonError::Actor(e.to_string()))?;
    let dirs = shared.config.watch.iter().map(|w| w.dir.clone()).collect();
    let watcher = tokio::spawn(watcher::run(
        dirs,
        daemon.clone(),
        shared.config.watch_debounce,
        shutdown.clone(),
    ));
    let control = tokio::spawn(control::serve(
        listeners.control,
        daemon.clone(),
        shared.clone(),
        shutdown.clone(),
    ));
    let metrics_http = listeners.metrics.map(|listener| {
        tracing::info!(addr = ?metrics_addr, "serving GET /metrics");
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(http::serve_ops(
            listener,
            api::Api::new(daemon.clone(), shared.clone()),
        )))
    });
    let http_gateway = listeners.http.map(|listener| {
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(http::serve(
            listener,
            listeners.http_tls,
            api::Api::new(daemon.clone(), shared.clone()),
            shared.clone(),
            shutdown.clone(),
        )))
    });
    tracing::info!(socket = %socket.display(), pid = std::process::id(), "daemon listening");

    serve_until(&shutdown, &shared, &daemon).await;
    systemd::notify_or_warn("STOPPING=1");
    tracing::info!("shutting down: stopping every bundle");
    shared.start_permits.close();
    shared.stop_tool_indexes();
    daemon.stop(Some("shutdown".into()));
    drop(metrics_http);
    drop(http_gateway);
    let _ = daemon_task.await;
    let _ = control.await;
    let _ = watcher.await;
    let _ = std::fs::remove_file(&socket);
    // Every bundle has stopped and its cgroup is gone: the folders above go too.
    let cgroups = shared.cgroups.clone();
    let _ = tokio::task::spawn_blocking(move || cgroups.remove_all()).await;
    // The spans of the last requests and stops go before the daemon does.
    if let Some(exporter) = exporter {
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    tracing::info!("daemon stopped");
    Ok(())
}
