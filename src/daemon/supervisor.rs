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
    /// Reload the stored installs, then reconcile the watched folders.
    Boot,
    /// Reconcile `config.watch[index]` with what its folder holds now.
    Rescan { index: usize },
    /// Liveness of the actor tree (the systemd watchdog asks).
    Ping(RpcReplyPort<()>),
    /// The actor of a workspace, created on first use.
    Workspace {
        name: String,
        reply: RpcReplyPort<Result<ActorRef<WorkspaceMsg>, InstallError>>,
    },
}

pub struct DaemonState {
    shared: Arc<Shared>,
    workspaces: HashMap<String, ActorRef<WorkspaceMsg>>,
    /// Watched bundle path → hash of the manifest last seen there, so a
    /// rescan touches only what changed.
    seen: HashMap<PathBuf, u64>,
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

impl DaemonState {
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

    async fn supervise(
        &mut self,
        myself: &ActorRef<DaemonMsg>,
        record: &InstallRecord,
    ) -> Result<(), InstallError> {
        let ws = self.workspace(myself, &record.workspace).await?;
        let (name, source) = (record.name.clone(), record.source.clone());
        match ws
            .call(
                |reply| WorkspaceMsg::Add {
                    name,
                    source,
                    reply,
                },
                Some(Duration::from_secs(10)),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(InstallError::Internal),
            Ok(_) => Err(InstallError::Internal(
                "workspace did not answer in time".into(),
            )),
            Err(e) => Err(InstallError::Internal(format!(
                "workspace unavailable: {e}"
            ))),
        }
    }

    async fn install(
        &mut self,
        myself: &ActorRef<DaemonMsg>,
        path: PathBuf,
        workspace: String,
        origin: Origin,
    ) -> Result<InstallRecord, InstallError> {
        check_name("workspace", &workspace).map_err(InstallError::InvalidName)?;
        let source = path.canonicalize().map_err(|e| InstallError::NoSuchPath {
            path: path.clone(),
            reason: format!(
                "{e}; give a bundle folder containing manifest.json, or a manifest file"
            ),
        })?;
        let src = source.clone();
        let loaded = tokio::task::spawn_blocking(move || crate::manifest::load(&src))
            .await
            .map_err(|e| InstallError::Internal(e.to_string()))??;
        crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)?;
        crate::bundle::sandbox::check_install(
            &self.shared.config.sandbox,
            &self.shared.config.protected_paths(),
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
        let inserted = self
            .shared
            .store
            .call(move |store| {
                if store.insert(&rec)? {
                    Ok(Ok(()))
                } else {
                    Ok(Err(store.get(&rec.workspace, &rec.name)?.unwrap_or(rec)))
                }
            })
            .await?;
        if let Err(existing) = inserted {
            return Err(InstallError::AlreadyInstalled {
                workspace: existing.workspace,
                name: existing.name,
                source_path: existing.source.display().to_string(),
            });
        }
        tracing::info!(workspace = %record.workspace, bundle = %record.name, source = %record.source.display(), "bundle installed");
        self.shared.board.emit(LifecycleEvent::new(
            &record.workspace,
            &record.name,
            EventKind::Installed,
            BundleState::Starting,
            format!("installed from {}", record.source.display()),
        ));
        if let Err(e) = self.supervise(myself, &record).await {
            // Keep the state database in line with what runs.
            let (ws, name) = (record.workspace.clone(), record.name.clone());
            if let Err(undo) = self.shared.store.call(move |s| s.remove(&ws, &name)).await {
                tracing::error!(workspace = %record.workspace, bundle = %record.name, "install failed and its record could not be removed: {undo}");
            }
            return Err(e);
        }
        Ok(record)
    }

    async fn boot(&mut self, myself: &ActorRef<DaemonMsg>) {
        let installs = match self.shared.store.call(|s| s.installs()).await {
            Ok(installs) => installs,
            Err(e) => {
                tracing::error!("boot reload: cannot read installs: {e}");
                Vec::new()
            }
        };
        tracing::info!(bundles = installs.len(), "boot reload");
        for record in &installs {
            // Each bundle re-reads and re-gates its manifest as it starts; a
            // bad one shows as failed with the reason.
            if let Err(e) = self.supervise(myself, record).await {
                tracing::error!(workspace = %record.workspace, bundle = %record.name, "boot reload: {e}");
            }
        }
        for index in 0..self.shared.config.watch.len() {
            self.rescan(myself, index).await;
        }
    }

    /// Removes an install from the store and announces it; returns the
    /// workspace that still has to stop the bundle (the caller waits for it).
    async fn remove(
        &mut self,
        workspace: &str,
        name: &str,
    ) -> Result<Option<ActorRef<WorkspaceMsg>>, InstallError> {
        let (ws, n) = (workspace.to_string(), name.to_string());
        if !self.shared.store.call(move |s| s.remove(&ws, &n)).await? {
            return Err(InstallError::NotInstalled {
                workspace: workspace.to_string(),
                name: name.to_string(),
            });
        }
        tracing::info!(workspace = %workspace, bundle = %name, "bundle uninstalled");
        self.shared.board.emit(LifecycleEvent::new(
            workspace,
            name,
            EventKind::Uninstalled,
            BundleState::Stopped,
            "uninstalled",
        ));
        Ok(self.workspaces.get(workspace).cloned())
    }

    /// An operator's uninstall: refused for bundles that a watched folder
    /// provides (the folder is their source of truth; the next rescan would
    /// bring them back).
    async fn remove_by_operator(
        &mut self,
        workspace: &str,
        name: &str,
    ) -> Result<Option<ActorRef<WorkspaceMsg>>, InstallError> {
        let (ws, n) = (workspace.to_string(), name.to_string());
        let record = self.shared.store.call(move |s| s.get(&ws, &n)).await?;
        if let Some(record) = record.filter(|r| r.origin == Origin::Watch) {
            return Err(InstallError::Watched {
                name: record.name,
                source_path: record.source.display().to_string(),
            });
        }
        self.remove(workspace, name).await
    }

    /// Uninstalls without waiting for the process to be gone.
    async fn remove_in_background(&mut self, workspace: &str, name: &str) {
        match self.remove(workspace, name).await {
            Ok(Some(ws)) => {
                tokio::spawn(stop_bundle(ws, name.to_string()));
            }
            Ok(None) => {}
            Err(e) => tracing::error!(workspace, bundle = name, "uninstall: {e}"),
        }
    }

    /// Reconciles one watched folder: new bundles are installed, changed
    /// manifests upgrade their bundle (or are rejected while the running
    /// version keeps running), removed ones are uninstalled.
    async fn rescan(&mut self, myself: &ActorRef<DaemonMsg>, index: usize) {
        let Some(watch) = self.shared.config.watch.get(index).cloned() else {
            return;
        };
        let (dir, seen) = (watch.dir.clone(), self.seen.clone());
        let sandbox = self.shared.config.sandbox.clone();
        let protected = self.shared.config.protected_paths();
        let Ok(Some((dir, found))) =
            tokio::task::spawn_blocking(move || scan(&dir, &seen, &sandbox, &protected)).await
        else {
            tracing::warn!(dir = %watch.dir.display(), "watched folder is missing; its bundles keep running");
            return;
        };
        let installs = match self.shared.store.call(|s| s.installs()).await {
            Ok(all) => all,
            Err(e) => {
                tracing::error!(
                    "watched folder {}: cannot read installs: {e}",
                    dir.display()
                );
                return;
            }
        };
        let here: Vec<InstallRecord> = installs
            .into_iter()
            .filter(|r| r.workspace == watch.workspace && r.source.parent() == Some(dir.as_path()))
            .collect();
        for f in found.iter() {
            // `f.manifest` is Some exactly when the content differs from `previous`.
            let previous = self.seen.insert(f.path.clone(), f.hash);
            let record = here.iter().find(|r| r.source == f.path);
            match (record, &f.manifest) {
                (None, Some(Ok(_))) => match self
                    .install(
                        myself,
                        f.path.clone(),
                        watch.workspace.clone(),
                        Origin::Watch,
                    )
                    .await
                {
                    Ok(_) | Err(InstallError::AlreadyInstalled { .. }) => {}
                    Err(e) => self.reject(&watch.workspace, &f.path, &e.to_string()),
                },
                (None, Some(Err(reason))) => self.reject(&watch.workspace, &f.path, reason),
                // First sight of an installed bundle (boot): its start reads this very file.
                (Some(_), _) if previous.is_none() => {}
                (Some(record), Some(Ok(loaded))) => {
                    if loaded.manifest.name != record.name {
                        tracing::info!(workspace = %watch.workspace, "watched bundle renamed from {:?} to {:?}", record.name, loaded.manifest.name);
                        self.remove_in_background(&record.workspace, &record.name)
                            .await;
                        if let Err(e) = self
                            .install(
                                myself,
                                f.path.clone(),
                                watch.workspace.clone(),
                                Origin::Watch,
                            )
                            .await
                        {
                            self.reject(&watch.workspace, &f.path, &e.to_string());
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
                self.remove_in_background(&record.workspace, &record.name)
                    .await;
            }
        }
    }

    /// A watched manifest that is not (yet) installable: logged and announced
    /// once per content.
    fn reject(&self, workspace: &str, path: &Path, reason: &str) {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        tracing::warn!(workspace, path = %path.display(), "watched folder: bundle not installed: {reason}");
        self.shared.board.emit(LifecycleEvent::new(
            workspace,
            &name,
            EventKind::ManifestRejected,
            BundleState::Failed,
            reason,
        ));
    }
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
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<DaemonMsg>,
        shared: Arc<Shared>,
    ) -> Result<DaemonState, ActorProcessingErr> {
        myself.send_message(DaemonMsg::Boot)?;
        Ok(DaemonState {
            shared,
            workspaces: HashMap::new(),
            seen: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<DaemonMsg>,
        msg: DaemonMsg,
        st: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DaemonMsg::Boot => {
                st.boot(&myself).await;
                st.shared.booted.cancel();
            }
            DaemonMsg::Install {
                path,
                workspace,
                origin,
                reply,
            } => {
                let _ = reply.send(st.install(&myself, path, workspace, origin).await);
            }
            DaemonMsg::Uninstall {
                workspace,
                name,
                reply,
            } => match st.remove_by_operator(&workspace, &name).await {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                // Wait for the process to be gone in a task: the daemon keeps serving meanwhile.
                Ok(Some(ws)) => {
                    tokio::spawn(async move {
                        stop_bundle(ws, name).await;
                        let _ = reply.send(Ok(()));
                    });
                }
                Ok(None) => {
                    let _ = reply.send(Ok(()));
                }
            },
            DaemonMsg::Rescan { index } => st.rescan(&myself, index).await,
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
                match st.shared.store.call(|s| s.installs()).await {
                    Ok(installs) => {
                        for record in installs.iter().filter(|r| r.workspace == name) {
                            if let Err(e) = st.supervise(&myself, record).await {
                                tracing::error!(workspace = %name, bundle = %record.name, "{e}");
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(workspace = %name, "cannot read installs to restore the workspace's bundles: {e}")
                    }
                }
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
