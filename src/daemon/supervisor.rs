//! DaemonActor: the root of the actor tree. Owns the workspaces, records
//! installs in the state database, reloads every install at boot, and
//! restarts a WorkspaceActor that fails (re-adding its bundles).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::bundle::{actor_name, BundleMsg};
use super::workspace::{WorkspaceActor, WorkspaceArgs, WorkspaceMsg};
use super::Shared;
use crate::config::SandboxSettings;
use crate::host_resources::PROVIDED_CAPABILITIES;
use crate::manifest::{GateRefusal, LoadedManifest, ManifestError};
use crate::names::check_name;
use crate::protocol::{BundleState, EventKind, LifecycleEvent};
use crate::store::{InstallRecord, Origin, StoreError};

pub struct DaemonActor;

/// Why an install or uninstall was refused.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{0}")]
    InvalidName(String),
    #[error("nothing to install at {path}: {reason}")]
    NoSuchPath { path: PathBuf, reason: String },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Gate(#[from] GateRefusal),
    #[error(transparent)]
    Sandbox(#[from] crate::bundle::sandbox::SandboxError),
    #[error("bundle {name:?} is already installed in workspace {workspace:?} (from {source_path}); uninstall it first, or use `bundlevisor restart {name}`")]
    AlreadyInstalled {
        workspace: String,
        name: String,
        source_path: String,
    },
    #[error("bundle {name:?} is not installed in workspace {workspace:?}")]
    NotInstalled { workspace: String, name: String },
    #[error("bundle {name:?} comes from a watched folder; remove {source_path} from the folder to uninstall it")]
    Watched { name: String, source_path: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}; nothing was installed, try again")]
    TimedOut(String),
    #[error("{0}")]
    Internal(String),
}

pub enum DaemonMsg {
    Install {
        path: PathBuf,
        workspace: String,
        origin: Origin,
        reply: RpcReplyPort<Result<InstallRecord, InstallError>>,
    },
    Uninstall {
        workspace: String,
        name: String,
        reply: RpcReplyPort<Result<(), InstallError>>,
    },
    /// Supervise these stored installs (boot reload, a restarted workspace).
    Restore(Vec<InstallRecord>),
    /// Reconcile `config.watch[index]` with what its folder holds now.
    Rescan { index: usize },
    /// A folder's scan is done: reconcile it (the actor's part is a diff;
    /// installs and uninstalls run in tasks).
    Scanned { index: usize, scan: Option<Scan> },
    /// The installs and uninstalls of a folder's reconcile are done.
    Reconciled { index: usize },
    /// Liveness of the actor tree (the systemd watchdog asks).
    Ping(RpcReplyPort<()>),
    /// The actor of a workspace, created on first use.
    Workspace {
        name: String,
        reply: RpcReplyPort<Result<ActorRef<WorkspaceMsg>, InstallError>>,
    },
}

/// What the DaemonActor starts with.
pub struct DaemonArgs {
    pub shared: Arc<Shared>,
    /// The stored installs, read before the socket answered.
    pub installs: Vec<InstallRecord>,
}

pub struct DaemonState {
    shared: Arc<Shared>,
    workspaces: HashMap<String, ActorRef<WorkspaceMsg>>,
    /// Watched bundle path → hash of the manifest last seen there, so a
    /// rescan touches only what changed.
    seen: HashMap<PathBuf, u64>,
    /// Folders being reconciled; `true`: scan again when done (an event
    /// arrived meanwhile). A folder is reconciled by one scan at a time.
    rescans: HashMap<usize, bool>,
    /// Boot: folders whose first reconcile is not done yet.
    booting: Option<std::collections::HashSet<usize>>,
}

/// A watched folder as one scan found it, with the installs recorded then.
pub struct Scan {
    dir: PathBuf,
    found: Vec<Found>,
    installs: Vec<InstallRecord>,
}

/// One bundle found in a watched folder.
struct Found {
    path: PathBuf,
    hash: u64,
    /// The validated (and gated) manifest; None when its content is the one
    /// seen last time (nothing to do, so it is not parsed again).
    manifest: Option<Result<LoadedManifest, String>>,
}

/// Reads every bundle of a watched folder, each manifest once; parses only
/// those whose content hash differs from `seen`. None when the folder is missing.
fn scan(
    dir: &Path,
    seen: &HashMap<PathBuf, u64>,
    sandbox: &SandboxSettings,
    protected: &[PathBuf],
) -> Option<(PathBuf, Vec<Found>)> {
    let dir = dir.canonicalize().ok().filter(|d| d.is_dir())?;
    let untrusted = super::trusted::folder(&dir).err();
    if let Some(why) = &untrusted {
        tracing::error!("{why}; nothing in it is installed or changed until that is fixed");
    }
    let found = bundle_paths(&dir)
        .into_iter()
        .map(|path| {
            let file = crate::manifest::manifest_file(&path);
            let text = match &untrusted {
                Some(why) => Err(why.clone()),
                None => super::trusted::manifest_text(&path, &file),
            };
            let hash = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                match &text {
                    Ok(text) => text.hash(&mut h),
                    // A refusal is seen again until its cause is gone.
                    Err(why) => ("refused", why).hash(&mut h),
                }
                h.finish()
            };
            let manifest = (seen.get(&path) != Some(&hash)).then(|| {
                let loaded = crate::manifest::from_text(file, &text?).map_err(|e| e.to_string())?;
                crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)
                    .map_err(|e| e.to_string())?;
                crate::bundle::sandbox::check_install(sandbox, protected, &loaded)
                    .map_err(|e| e.to_string())?;
                Ok(loaded)
            });
            Found {
                path,
                hash,
                manifest,
            }
        })
        .collect();
    Some((dir, found))
}

/// How long an install may take before its record is written; past it,
/// nothing is recorded and the install is refused (a caller that gave up
/// never finds it done later).
const INSTALL_DEADLINE: Duration = Duration::from_secs(30);

/// Reads, validates, gates and records an install, then has the workspace
/// supervise it (undone if that fails). Runs in a task.
async fn install(
    shared: Arc<Shared>,
    ws: ActorRef<WorkspaceMsg>,
    path: PathBuf,
    workspace: String,
    origin: Origin,
) -> Result<InstallRecord, InstallError> {
    let checked = tokio::time::timeout(INSTALL_DEADLINE, async {
        let src = path.clone();
        let (source, loaded) = tokio::task::spawn_blocking(move || {
            let source = src.canonicalize().map_err(|e| InstallError::NoSuchPath {
                path: src.clone(),
                reason: format!(
                    "{e}; give a bundle folder containing manifest.json, or a manifest file"
                ),
            })?;
            let loaded = crate::manifest::load(&source)?;
            Ok::<_, InstallError>((source, loaded))
        })
        .await
        .map_err(|e| InstallError::Internal(e.to_string()))??;
        crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)?;
        crate::bundle::sandbox::check_install(
            &shared.config.sandbox,
            &shared.config.protected_paths(),
            &loaded,
        )?;
        let record = InstallRecord {
            workspace,
            name: loaded.manifest.name.clone(),
            source,
            origin,
            installed_at: crate::clock::unix_secs(),
        };
        let rec = record.clone();
        let inserted = shared
            .store
            .call(move |store| {
                if store.insert(&rec)? {
                    Ok(Ok(()))
                } else {
                    Ok(Err(store.get(&rec.workspace, &rec.name)?.unwrap_or(rec)))
                }
            })
            .await?;
        match inserted {
            Ok(()) => Ok((record, loaded)),
            Err(existing) => Err(InstallError::AlreadyInstalled {
                workspace: existing.workspace,
                name: existing.name,
                source_path: existing.source.display().to_string(),
            }),
        }
    });
    // The store write is the last step under the deadline: once the record
    // is written, the install completes.
    let (record, loaded) = checked.await.map_err(|_| {
        InstallError::TimedOut(format!(
            "reading and recording {} took longer than {}",
            path.display(),
            humantime::format_duration(INSTALL_DEADLINE)
        ))
    })??;
    tracing::info!(workspace = %record.workspace, bundle = %record.name, source = %record.source.display(), "bundle installed");
    shared.board.emit(LifecycleEvent::new(
        &record.workspace,
        &record.name,
        EventKind::Installed,
        BundleState::Starting,
        format!("installed from {}", record.source.display()),
    ));
    if let Err(e) = supervise(&ws, &record, Some(loaded)).await {
        // Keep the state database in line with what runs.
        let (w, name) = (record.workspace.clone(), record.name.clone());
        if let Err(undo) = shared.store.call(move |s| s.remove(&w, &name)).await {
            tracing::error!(workspace = %record.workspace, bundle = %record.name, "install failed and its record could not be removed: {undo}");
        }
        return Err(e);
    }
    Ok(record)
}

/// Has a workspace supervise an install (`manifest`: validated by the install).
async fn supervise(
    ws: &ActorRef<WorkspaceMsg>,
    record: &InstallRecord,
    manifest: Option<LoadedManifest>,
) -> Result<(), InstallError> {
    let (name, source) = (record.name.clone(), record.source.clone());
    let manifest = manifest.map(Box::new);
    // A bundle of the same name that is still stopping is waited for.
    let limit = Duration::from_secs(30);
    match ws
        .call(
            |reply| WorkspaceMsg::Add {
                name,
                source,
                manifest,
                reply,
            },
            Some(limit),
        )
        .await
    {
        Ok(ractor::rpc::CallResult::Success(r)) => {
            r.map_err(|e| InstallError::Internal(e.to_string()))
        }
        Ok(_) => Err(InstallError::TimedOut(
            "the workspace did not take the bundle in time".into(),
        )),
        Err(e) => Err(InstallError::Internal(format!(
            "workspace unavailable: {e}"
        ))),
    }
}

/// Removes an install from the store and announces it; true if it was there.
async fn forget(shared: &Shared, workspace: &str, name: &str) -> Result<(), InstallError> {
    let (ws, n) = (workspace.to_string(), name.to_string());
    if !shared.store.call(move |s| s.remove(&ws, &n)).await? {
        return Err(InstallError::NotInstalled {
            workspace: workspace.to_string(),
            name: name.to_string(),
        });
    }
    tracing::info!(workspace = %workspace, bundle = %name, "bundle uninstalled");
    shared.board.emit(LifecycleEvent::new(
        workspace,
        name,
        EventKind::Uninstalled,
        BundleState::Stopped,
        "uninstalled",
    ));
    Ok(())
}

/// An operator's uninstall: refused for bundles that a watched folder
/// provides (the folder is their source of truth; the next rescan would
/// bring them back). Answers once the process is gone.
async fn uninstall(
    shared: Arc<Shared>,
    ws: Option<ActorRef<WorkspaceMsg>>,
    workspace: String,
    name: String,
) -> Result<(), InstallError> {
    let (w, n) = (workspace.clone(), name.clone());
    let record = shared.store.call(move |s| s.get(&w, &n)).await?;
    if let Some(record) = record.filter(|r| r.origin == Origin::Watch) {
        return Err(InstallError::Watched {
            name: record.name,
            source_path: record.source.display().to_string(),
        });
    }
    forget(&shared, &workspace, &name).await?;
    if let Some(ws) = ws {
        stop_bundle(ws, name).await;
    }
    Ok(())
}

impl DaemonState {
    /// The actor of workspace `name`, started on first use (its start opens
    /// the workspace's file store: a few milliseconds, once).
    async fn workspace(
        &mut self,
        myself: &ActorRef<DaemonMsg>,
        name: &str,
    ) -> Result<ActorRef<WorkspaceMsg>, InstallError> {
        if let Some(ws) = self.workspaces.get(name) {
            return Ok(ws.clone());
        }
        let args = WorkspaceArgs {
            name: name.to_string(),
            shared: self.shared.clone(),
        };
        let (ws, _) = Actor::spawn_linked(
            Some(format!("workspace/{name}")),
            WorkspaceActor,
            args,
            myself.get_cell(),
        )
        .await
        .map_err(|e| InstallError::Internal(format!("cannot start workspace {name:?}: {e}")))?;
        self.workspaces.insert(name.to_string(), ws.clone());
        Ok(ws)
    }

    /// Starts an install in a task; `reply` gets its outcome.
    async fn install(
        &mut self,
        myself: &ActorRef<DaemonMsg>,
        path: PathBuf,
        workspace: String,
        origin: Origin,
    ) -> Result<tokio::task::JoinHandle<Result<InstallRecord, InstallError>>, InstallError> {
        check_name("workspace", &workspace).map_err(InstallError::InvalidName)?;
        let ws = self.workspace(myself, &workspace).await?;
        let shared = self.shared.clone();
        Ok(tokio::spawn(install(shared, ws, path, workspace, origin)))
    }

    /// Supervises stored installs; each bundle reads and gates its manifest
    /// as it starts (a bad one shows as failed with the reason).
    async fn restore(&mut self, myself: &ActorRef<DaemonMsg>, installs: Vec<InstallRecord>) {
        for record in installs {
            match self.workspace(myself, &record.workspace).await {
                Ok(ws) => {
                    tokio::spawn(async move {
                        if let Err(e) = supervise(&ws, &record, None).await {
                            tracing::error!(workspace = %record.workspace, bundle = %record.name, "cannot supervise the install: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::error!(workspace = %record.workspace, bundle = %record.name, "{e}")
                }
            }
        }
    }

    /// Uninstalls without waiting for the process to be gone.
    fn remove_in_background(&self, record: &InstallRecord) -> tokio::task::JoinHandle<()> {
        let (shared, ws) = (
            self.shared.clone(),
            self.workspaces.get(&record.workspace).cloned(),
        );
        let (workspace, name) = (record.workspace.clone(), record.name.clone());
        tokio::spawn(async move {
            match forget(&shared, &workspace, &name).await {
                Ok(()) => {
                    if let Some(ws) = ws {
                        tokio::spawn(stop_bundle(ws, name));
                    }
                }
                Err(e) => tracing::error!(workspace, bundle = name, "uninstall: {e}"),
            }
        })
    }

    /// Scans folder `index` in a task (reading a folder and its manifests
    /// is blocking work); the result comes back as `Scanned`.
    fn scan(&mut self, myself: &ActorRef<DaemonMsg>, index: usize) {
        if let Some(again) = self.rescans.get_mut(&index) {
            *again = true;
            return;
        }
        let Some(watch) = self.shared.config.watch.get(index).cloned() else {
            return;
        };
        self.rescans.insert(index, false);
        let (shared, seen, myself) = (self.shared.clone(), self.seen.clone(), myself.clone());
        tokio::spawn(async move {
            let sandbox = shared.config.sandbox.clone();
            let protected = shared.config.protected_paths();
            let dir = watch.dir.clone();
            let found =
                tokio::task::spawn_blocking(move || scan(&dir, &seen, &sandbox, &protected))
                    .await
                    .ok()
                    .flatten();
            let scan = match found {
                None => {
                    tracing::warn!(dir = %watch.dir.display(), "watched folder is missing; its bundles keep running");
                    None
                }
                Some((dir, found)) => match shared.store.call(|s| s.installs()).await {
                    Ok(installs) => Some(Scan {
                        dir,
                        found,
                        installs,
                    }),
                    Err(e) => {
                        tracing::error!(
                            "watched folder {}: cannot read installs: {e}",
                            dir.display()
                        );
                        None
                    }
                },
            };
            let _ = myself.send_message(DaemonMsg::Scanned { index, scan });
        });
    }

    /// Reconciles one watched folder with its scan: new bundles are
    /// installed, changed manifests upgrade their bundle (or are rejected
    /// while the running version keeps running), removed ones are
    /// uninstalled. The installs and uninstalls run in tasks; `Reconciled`
    /// comes back once they are done.
    async fn reconcile(&mut self, myself: &ActorRef<DaemonMsg>, index: usize, scan: Scan) {
        let Some(watch) = self.shared.config.watch.get(index).cloned() else {
            return;
        };
        let Scan {
            dir,
            found,
            installs,
        } = scan;
        let here: Vec<InstallRecord> = installs
            .into_iter()
            .filter(|r| r.workspace == watch.workspace && r.source.parent() == Some(dir.as_path()))
            .collect();
        let mut work = Vec::new();
        for f in found.iter() {
            // `f.manifest` is Some exactly when the content differs from `previous`.
            let previous = self.seen.insert(f.path.clone(), f.hash);
            let record = here.iter().find(|r| r.source == f.path);
            match (record, &f.manifest) {
                (None, Some(Ok(_))) => {
                    let path = f.path.clone();
                    match self
                        .install(myself, path.clone(), watch.workspace.clone(), Origin::Watch)
                        .await
                    {
                        Ok(task) => work.push(self.report_install(task, &watch.workspace, path)),
                        Err(e) => self.reject(&watch.workspace, &f.path, &e.to_string()),
                    }
                }
                (None, Some(Err(reason))) => self.reject(&watch.workspace, &f.path, reason),
                // First sight of an installed bundle (boot): its start reads this very file.
                (Some(_), _) if previous.is_none() => {}
                (Some(record), Some(Ok(loaded))) => {
                    if loaded.manifest.name != record.name {
                        tracing::info!(workspace = %watch.workspace, "watched bundle renamed from {:?} to {:?}", record.name, loaded.manifest.name);
                        let removed = self.remove_in_background(record);
                        let path = f.path.clone();
                        match self
                            .install(myself, path.clone(), watch.workspace.clone(), Origin::Watch)
                            .await
                        {
                            Ok(task) => {
                                let report = self.report_install(task, &watch.workspace, path);
                                work.push(tokio::spawn(async move {
                                    let _ = tokio::join!(removed, report);
                                }));
                            }
                            Err(e) => {
                                work.push(removed);
                                self.reject(&watch.workspace, &f.path, &e.to_string())
                            }
                        }
                    } else if let Some(actor) =
                        ActorRef::<BundleMsg>::where_is(actor_name(&record.workspace, &record.name))
                    {
                        let _ = actor.send_message(BundleMsg::Upgrade(Box::new(loaded.clone())));
                    }
                }
                (Some(record), Some(Err(reason))) => {
                    if let Some(actor) =
                        ActorRef::<BundleMsg>::where_is(actor_name(&record.workspace, &record.name))
                    {
                        let _ = actor.send_message(BundleMsg::ManifestRejected(reason.clone()));
                    }
                }
                _ => {}
            }
        }
        for record in here.iter().filter(|r| r.origin == Origin::Watch) {
            if !found.iter().any(|f| f.path == record.source) {
                self.seen.remove(&record.source);
                work.push(self.remove_in_background(record));
            }
        }
        let myself = myself.clone();
        tokio::spawn(async move {
            for task in work {
                let _ = task.await;
            }
            let _ = myself.send_message(DaemonMsg::Reconciled { index });
        });
    }

    /// Awaits a watched install; a refusal is announced like a rejected manifest.
    fn report_install(
        &self,
        task: tokio::task::JoinHandle<Result<InstallRecord, InstallError>>,
        workspace: &str,
        path: PathBuf,
    ) -> tokio::task::JoinHandle<()> {
        let (shared, workspace) = (self.shared.clone(), workspace.to_string());
        tokio::spawn(async move {
            match task.await {
                Ok(Ok(_)) | Ok(Err(InstallError::AlreadyInstalled { .. })) => {}
                Ok(Err(e)) => reject(&shared, &workspace, &path, &e.to_string()),
                Err(e) => reject(&shared, &workspace, &path, &e.to_string()),
            }
        })
    }

    fn reject(&self, workspace: &str, path: &Path, reason: &str) {
        reject(&self.shared, workspace, path, reason)
    }
}

/// A watched manifest that is not (yet) installable: logged and announced
/// once per content.
fn reject(shared: &Shared, workspace: &str, path: &Path, reason: &str) {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    tracing::warn!(workspace, path = %path.display(), "watched folder: bundle not installed: {reason}");
    shared.board.emit(LifecycleEvent::new(
        workspace,
        &name,
        EventKind::ManifestRejected,
        BundleState::Failed,
        reason,
    ));
}

/// Asks a workspace to stop a bundle and waits until its process is gone.
async fn stop_bundle(ws: ActorRef<WorkspaceMsg>, name: String) {
    let _ = ws
        .call(
            |r| WorkspaceMsg::Remove { name, reply: r },
            Some(Duration::from_secs(60)),
        )
        .await;
}

/// Bundles in a watched folder: `DIR/NAME/manifest.json` and `DIR/NAME.json`.
pub fn bundle_paths(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        tracing::warn!(dir = %dir.display(), "watched folder cannot be read");
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter(|p| {
            if p.is_dir() {
                p.join("manifest.json").is_file()
            } else {
                p.extension().is_some_and(|e| e == "json")
            }
        })
        // A link stays a path in the folder (and is refused by the scan).
        .filter_map(|p| {
            if p.is_symlink() {
                Some(p)
            } else {
                p.canonicalize().ok()
            }
        })
        .collect();
    paths.sort();
    paths
}

#[ractor::async_trait]
impl Actor for DaemonActor {
    type Msg = DaemonMsg;
    type State = DaemonState;
    type Arguments = DaemonArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<DaemonMsg>,
        args: DaemonArgs,
    ) -> Result<DaemonState, ActorProcessingErr> {
        tracing::info!(bundles = args.installs.len(), "boot reload");
        myself.send_message(DaemonMsg::Restore(args.installs))?;
        let folders = args.shared.config.watch.len();
        for index in 0..folders {
            myself.send_message(DaemonMsg::Rescan { index })?;
        }
        if folders == 0 {
            args.shared.booted.cancel();
        }
        Ok(DaemonState {
            shared: args.shared,
            workspaces: HashMap::new(),
            seen: HashMap::new(),
            rescans: HashMap::new(),
            booting: Some((0..folders).collect()),
        })
    }

    /// Every arm returns at once: installs, uninstalls and folder scans run
    /// in tasks and report back by message or reply port, so the watchdog
    /// ping, `files` and the gateway never queue behind them.
    async fn handle(
        &self,
        myself: ActorRef<DaemonMsg>,
        msg: DaemonMsg,
        st: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DaemonMsg::Restore(installs) => st.restore(&myself, installs).await,
            DaemonMsg::Install {
                path,
                workspace,
                origin,
                reply,
            } => match st.install(&myself, path, workspace, origin).await {
                Ok(task) => {
                    tokio::spawn(async move {
                        let result = task
                            .await
                            .unwrap_or_else(|e| Err(InstallError::Internal(e.to_string())));
                        let _ = reply.send(result);
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            DaemonMsg::Uninstall {
                workspace,
                name,
                reply,
            } => {
                let (shared, ws) = (st.shared.clone(), st.workspaces.get(&workspace).cloned());
                tokio::spawn(async move {
                    let _ = reply.send(uninstall(shared, ws, workspace, name).await);
                });
            }
            DaemonMsg::Rescan { index } => st.scan(&myself, index),
            DaemonMsg::Scanned { index, scan } => match scan {
                Some(scan) => st.reconcile(&myself, index, scan).await,
                None => myself.send_message(DaemonMsg::Reconciled { index })?,
            },
            DaemonMsg::Reconciled { index } => {
                if st.rescans.remove(&index) == Some(true) {
                    st.scan(&myself, index);
                } else if let Some(booting) = &mut st.booting {
                    booting.remove(&index);
                    if booting.is_empty() {
                        st.booting = None;
                        st.shared.booted.cancel();
                    }
                }
            }
            DaemonMsg::Ping(reply) => {
                let _ = reply.send(());
            }
            DaemonMsg::Workspace { name, reply } => {
                let result = match check_name("workspace", &name) {
                    Ok(()) => st.workspace(&myself, &name).await,
                    Err(e) => Err(InstallError::InvalidName(e)),
                };
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<DaemonMsg>,
        event: SupervisionEvent,
        st: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            let failed = st
                .workspaces
                .iter()
                .find(|(_, ws)| ws.get_id() == cell.get_id())
                .map(|(n, _)| n.clone());
            if let Some(name) = failed {
                tracing::error!(workspace = %name, "workspace actor failed: {err}; starting it again");
                st.workspaces.remove(&name);
                let (shared, myself) = (st.shared.clone(), myself.clone());
                tokio::spawn(async move {
                    match shared.store.call(|s| s.installs()).await {
                        Ok(installs) => {
                            let mine = installs
                                .into_iter()
                                .filter(|r| r.workspace == name)
                                .collect();
                            let _ = myself.send_message(DaemonMsg::Restore(mine));
                        }
                        Err(e) => {
                            tracing::error!(workspace = %name, "cannot read installs to restore the workspace's bundles: {e}")
                        }
                    }
                });
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<DaemonMsg>,
        st: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        let limit = st.shared.config.bundles.stop_grace + Duration::from_secs(10);
        myself
            .stop_children_and_wait(Some("daemon stopping".into()), Some(limit))
            .await;
        Ok(())
    }
}
