//! Installs and uninstalls, each run in a task of its own (never in the
//! DaemonActor's handler): read, validate, gate, record, supervise; forget
//! and stop.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;

use super::super::source::SourceError;
use super::super::workspace::WorkspaceMsg;
use super::super::Shared;
use crate::host_resources::PROVIDED_CAPABILITIES;
use crate::manifest::{GateRefusal, LoadedManifest, ManifestError};
use crate::protocol::{BundleState, EventKind, LifecycleEvent};
use crate::store::{InstallRecord, Origin, StoreError};

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
    Archive(#[from] crate::archive::ArchiveError),
    #[error(transparent)]
    Gate(#[from] GateRefusal),
    #[error(transparent)]
    Sandbox(#[from] crate::bundle::sandbox::SandboxError),
    /// Others may write what the bundle runs, or it is unsigned where
    /// signatures are required.
    #[error("{0}")]
    Untrusted(String),
    #[error("bundle {name:?} is already installed in workspace {workspace:?} (from {source_path}); `bundlevisor upgrade PATH` runs this one in its place, `bundlevisor restart {name}` restarts it")]
    AlreadyInstalled {
        workspace: String,
        name: String,
        source_path: String,
    },
    #[error("bundle {name:?} is not installed in workspace {workspace:?}")]
    NotInstalled { workspace: String, name: String },
    #[error("bundle {name:?} is not installed in workspace {workspace:?}; `bundlevisor install PATH` installs it")]
    NotInstalledToUpgrade { workspace: String, name: String },
    #[error("bundle {name:?} comes from a watched folder, which decides its version: put the new version at {source_path} instead")]
    WatchedUpgrade { name: String, source_path: String },
    #[error("bundle {name:?} was uninstalled or installed again while it was being upgraded; nothing was changed, try again")]
    Moved { name: String },
    #[error("the archive holds bundle {found:?}, not {expected:?}; upgrade {expected:?} with an archive of it, or install this one")]
    OtherBundle { expected: String, found: String },
    #[error("bundle {name:?} comes from a watched folder; remove {source_path} from the folder to uninstall it (its stored credentials are kept: then `bundlevisor uninstall {name} --purge` deletes them)")]
    Watched { name: String, source_path: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}; nothing was installed, try again")]
    TimedOut(String),
    #[error("{0}")]
    Internal(String),
}

/// How long reading and checking a bundle may take; past it, nothing is
/// recorded and the install is refused.
const INSTALL_DEADLINE: Duration = Duration::from_secs(30);

/// Reads and checks the bundle at `path` for `workspace`, as an install
/// or an upgrade does (manifest, gate, trust, entry point, runtimes,
/// sandbox), under a deadline; the source to record and its manifest.
pub async fn checked(
    shared: &Shared,
    path: PathBuf,
    workspace: &str,
    origin: Origin,
) -> Result<(PathBuf, LoadedManifest), InstallError> {
    // Reading the manifest and walking the bundle folder is blocking work,
    // under a deadline. Nothing is recorded before it is done, and once the
    // record is written the install completes: a caller that was told
    // "timed out" never finds the bundle installed later.
    let (src, sandbox, protected, config) = (
        path.clone(),
        shared.config.sandbox.clone(),
        shared.config.protected_paths(),
        shared.config.clone(),
    );
    let in_workspace = workspace.to_string();
    let board = shared.board.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let missing = |e: std::io::Error| InstallError::NoSuchPath {
            path: src.clone(),
            reason: format!(
                "{e}; give a bundle folder containing manifest.json, or a manifest file"
            ),
        };
        // A watched folder's link (a ConfigMap volume's `NAME.json ->
        // ..data/NAME.json`) stays the source: what it points at changes
        // with each update, the link does not.
        let source = match (origin, src.is_symlink(), src.parent(), src.file_name()) {
            (Origin::Watch, true, Some(parent), Some(name)) => {
                parent.canonicalize().map_err(missing)?.join(name)
            }
            _ => src.canonicalize().map_err(missing)?,
        };
        let mut progress = board.unpack_progress(&in_workspace, &source);
        let loaded = super::super::source::load_with(&source, &config, &mut progress);
        drop(progress);
        let loaded = loaded.map_err(|e| match e {
            SourceError::Archive(e) => InstallError::Archive(e),
            SourceError::Manifest(e) => InstallError::Manifest(e),
        })?;
        // A CLI install of an archive runs from its unpacked copy: the
        // downloaded file may go. A watched archive stays the source (the
        // folder is its source of truth; a change upgrades it).
        let source = match origin {
            Origin::Cli if super::super::source::is_archive(&source) => loaded.dir.clone(),
            _ => source,
        };
        crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES)?;
        super::super::trusted::may_run(&loaded, &source, &config)
            .map_err(InstallError::Untrusted)?;
        loaded.check_entry_point()?;
        check_runtimes(&loaded, &config.uv)?;
        crate::bundle::sandbox::check_install(&sandbox, &protected, &loaded, &in_workspace)?;
        Ok::<_, InstallError>((source, loaded))
    });
    let (source, loaded) = tokio::time::timeout(INSTALL_DEADLINE, checked)
        .await
        .map_err(|_| {
            InstallError::TimedOut(format!(
                "reading and checking {} took longer than {}",
                path.display(),
                humantime::format_duration(INSTALL_DEADLINE)
            ))
        })?
        .map_err(|e| InstallError::Internal(e.to_string()))??;
    Ok((source, loaded))
}

/// Reads, validates, gates and records an install, then has the workspace
/// supervise it (undone if that fails). Runs in a task.
pub async fn install(
    shared: Arc<Shared>,
    ws: ActorRef<WorkspaceMsg>,
    path: PathBuf,
    workspace: String,
    origin: Origin,
) -> Result<InstallRecord, InstallError> {
    let (source, loaded) = checked(&shared, path, &workspace, origin).await?;
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
    if let Err(existing) = inserted {
        return Err(InstallError::AlreadyInstalled {
            workspace: existing.workspace,
            name: existing.name,
            source_path: existing.source.display().to_string(),
        });
    }
    tracing::info!(workspace = %record.workspace, bundle = %record.name, source = %record.source.display(), "bundle installed");
    shared.board.emit(LifecycleEvent::new(
        &record.workspace,
        &record.name,
        EventKind::Installed,
        BundleState::Starting,
        format!("installed from {}", record.source.display()),
    ));
    if let Err(e) = supervise(&shared, &ws, &record, Some(loaded)).await {
        // Keep the state database in line with what runs.
        let (w, name) = (record.workspace.clone(), record.name.clone());
        if let Err(undo) = shared.store.call(move |s| s.remove(&w, &name)).await {
            tracing::error!(workspace = %record.workspace, bundle = %record.name, "install failed and its record could not be removed: {undo}");
        }
        return Err(e);
    }
    Ok(record)
}

/// `compatibility.runtimes`: the node / python on the daemon's `PATH` must
/// satisfy the manifest's range (for a uv bundle: the `[uv] python` its
/// environment is made with), and a uv bundle needs uv. Blocking (runs
/// `--version`).
fn check_runtimes(
    loaded: &LoadedManifest,
    uv: &crate::config::UvSettings,
) -> Result<(), ManifestError> {
    use crate::manifest::Problem;
    let is_uv = loaded.manifest.is_uv();
    let mut problems: Vec<Problem> = loaded
        .manifest
        .runtimes
        .iter()
        .filter_map(|(runtime, range)| {
            let program = match runtime.as_str() {
                "node" => "node".to_string(),
                _ if is_uv => uv.python.display().to_string(),
                _ => "python3".to_string(),
            };
            let why = match crate::bundle::process::runtime_version(&program) {
                Ok(found) if range.matches(&found) => return None,
                Ok(found) => format!(
                    "the bundle requires {runtime} {range}; the {program} on the daemon's PATH is {found}"
                ),
                Err(e) => format!("the bundle requires {runtime} {range}, but {e}"),
            };
            Some(Problem {
                path: format!("$.compatibility.runtimes.{runtime}"),
                message: why,
            })
        })
        .collect();
    if is_uv {
        let program = uv.command.display().to_string();
        if let Err(e) = crate::bundle::process::runtime_version(&program) {
            problems.push(Problem {
                path: "$.server.type".into(),
                message: format!(
                    "a uv bundle's environment is built with uv, but {e}; install uv (`pip install uv`), or set [uv] command to its path"
                ),
            });
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(ManifestError::Invalid {
        path: loaded.file.clone(),
        problems,
    })
}

/// Has a workspace supervise an install (`manifest`: validated by the install).
pub async fn supervise(
    shared: &Shared,
    ws: &ActorRef<WorkspaceMsg>,
    record: &InstallRecord,
    manifest: Option<LoadedManifest>,
) -> Result<(), InstallError> {
    let (name, source) = (record.name.clone(), record.source.clone());
    let manifest = manifest.map(Box::new);
    // A bundle of the same name that is still stopping is waited for.
    let limit = shared.config.bundles.stop_grace + Duration::from_secs(10);
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
pub async fn forget(shared: &Shared, workspace: &str, name: &str) -> Result<(), InstallError> {
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
pub async fn uninstall(
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

/// Asks a workspace to stop a bundle and waits until its process is gone.
pub async fn stop_bundle(ws: ActorRef<WorkspaceMsg>, name: String) {
    let _ = ws
        .call(
            |r| WorkspaceMsg::Remove { name, reply: r },
            Some(Duration::from_secs(60)),
        )
        .await;
}
