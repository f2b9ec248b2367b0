//! DaemonActor: the root of the actor tree. Owns the workspaces, records
//! installs in the state database, reloads every install at boot, and
//! restarts a WorkspaceActor that fails (re-adding its bundles).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::workspace::{WorkspaceActor, WorkspaceArgs, WorkspaceMsg};
use super::Shared;
use crate::host_resources::PROVIDED_CAPABILITIES;
use crate::manifest::{GateRefusal, ManifestError};
use crate::names::check_name;
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
    #[error("bundle {name:?} is already installed in workspace {workspace:?} (from {source_path}); uninstall it first, or use `bundlevisor restart {name}`")]
    AlreadyInstalled {
        workspace: String,
        name: String,
        source_path: String,
    },
    #[error("bundle {name:?} is not installed in workspace {workspace:?}")]
    NotInstalled { workspace: String, name: String },
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
    /// Reload the stored installs, then install what the watched folders add.
    Boot,
}

pub struct DaemonState {
    shared: Arc<Shared>,
    workspaces: HashMap<String, ActorRef<WorkspaceMsg>>,
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
        let record = InstallRecord {
            workspace,
            name: loaded.manifest.name.clone(),
            source,
            origin,
            installed_at: unix_now(),
        };
        let store = self.shared.store.clone();
        let rec = record.clone();
        let inserted = tokio::task::spawn_blocking(
            move || -> Result<Result<(), InstallRecord>, StoreError> {
                if store.insert(&rec)? {
                    Ok(Ok(()))
                } else {
                    Ok(Err(store.get(&rec.workspace, &rec.name)?.unwrap_or(rec)))
                }
            },
        )
        .await
        .map_err(|e| InstallError::Internal(e.to_string()))??;
        if let Err(existing) = inserted {
            return Err(InstallError::AlreadyInstalled {
                workspace: existing.workspace,
                name: existing.name,
                source_path: existing.source.display().to_string(),
            });
        }
        tracing::info!(workspace = %record.workspace, bundle = %record.name, source = %record.source.display(), "bundle installed");
        if let Err(e) = self.supervise(myself, &record).await {
            // Keep the state database in line with what runs.
            let store = self.shared.store.clone();
            let (ws, name) = (record.workspace.clone(), record.name.clone());
            let _ = tokio::task::spawn_blocking(move || store.remove(&ws, &name)).await;
            return Err(e);
        }
        Ok(record)
    }

    async fn boot(&mut self, myself: &ActorRef<DaemonMsg>) {
        let store = self.shared.store.clone();
        let installs = match tokio::task::spawn_blocking(move || store.installs()).await {
            Ok(Ok(installs)) => installs,
            Ok(Err(e)) => {
                tracing::error!("boot reload: cannot read installs: {e}");
                Vec::new()
            }
            Err(e) => {
                tracing::error!("boot reload: {e}");
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
        for watch in self.shared.config.watch.clone() {
            for path in bundle_paths(&watch.dir) {
                let installed = installs
                    .iter()
                    .any(|r| r.workspace == watch.workspace && r.source == path);
                if installed {
                    continue;
                }
                match self
                    .install(myself, path.clone(), watch.workspace.clone(), Origin::Watch)
                    .await
                {
                    Ok(_) | Err(InstallError::AlreadyInstalled { .. }) => {}
                    Err(e) => {
                        tracing::error!(workspace = %watch.workspace, path = %path.display(), "watched folder: bundle not installed: {e}")
                    }
                }
            }
        }
    }
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
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    paths.sort();
    paths
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
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
            } => {
                let store = st.shared.store.clone();
                let (ws, n) = (workspace.clone(), name.clone());
                let removed = tokio::task::spawn_blocking(move || store.remove(&ws, &n)).await;
                let result = match removed {
                    Ok(Ok(true)) => Ok(()),
                    Ok(Ok(false)) => Err(InstallError::NotInstalled {
                        workspace: workspace.clone(),
                        name: name.clone(),
                    }),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(InstallError::Internal(e.to_string())),
                };
                if result.is_err() {
                    let _ = reply.send(result);
                    return Ok(());
                }
                tracing::info!(workspace = %workspace, bundle = %name, "bundle uninstalled");
                match st.workspaces.get(&workspace).cloned() {
                    // Wait for the process to be gone in a task: the daemon keeps serving meanwhile.
                    Some(ws) => {
                        tokio::spawn(async move {
                            let _ = ws
                                .call(
                                    |r| WorkspaceMsg::Remove { name, reply: r },
                                    Some(Duration::from_secs(60)),
                                )
                                .await;
                            let _ = reply.send(Ok(()));
                        });
                    }
                    None => {
                        let _ = reply.send(Ok(()));
                    }
                }
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
                let store = st.shared.store.clone();
                let installs = tokio::task::spawn_blocking(move || store.installs()).await;
                if let Ok(Ok(installs)) = installs {
                    for record in installs.iter().filter(|r| r.workspace == name) {
                        if let Err(e) = st.supervise(&myself, record).await {
                            tracing::error!(workspace = %name, bundle = %record.name, "{e}");
                        }
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
