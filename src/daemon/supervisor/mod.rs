//! DaemonActor: the root of the actor tree. Owns the workspaces, reloads
//! every install at boot, reconciles the watched folders, and restarts a
//! WorkspaceActor that fails (re-adding its bundles). Its handlers never
//! wait on slow work: installs, uninstalls and folder scans run in tasks
//! (`install.rs`, `super::folder`) and report back by message.

pub(crate) mod install;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::bundle::{actor_name, BundleMsg};
use super::folder::{scan, Found, Scan};
use super::workspace::{WorkspaceActor, WorkspaceArgs, WorkspaceMsg};
use super::Shared;
use crate::names::check_name;
use crate::protocol::{BundleState, EventKind, LifecycleEvent};
use crate::store::{InstallRecord, Origin};
pub use install::InstallError;
use install::{forget, install, stop_bundle, supervise, uninstall};

pub struct DaemonActor;

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
    Rescan {
        index: usize,
        /// Entries a rename brought into it (complete when they arrived).
        arrived: Vec<std::ffi::OsString>,
    },
    /// A folder's scan is done: reconcile it (the actor's part is a diff;
    /// installs and uninstalls run in tasks).
    Scanned { index: usize, scan: Option<Scan> },
    /// The installs and uninstalls of a folder's reconcile are done.
    Reconciled { index: usize },
    /// A watched file whose install was refused because its bundle's name
    /// is another file's (an archive swapped for its folder): looked at
    /// again by the next scan, once that one is gone.
    Unseen(PathBuf),
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
    /// Per folder: entries renamed into it that its next scan has to know.
    arrived: HashMap<usize, std::collections::BTreeSet<std::ffi::OsString>>,
    /// Boot: folders whose first reconcile is not done yet.
    booting: Option<std::collections::HashSet<usize>>,
    /// Fingerprints of failed watched bundles' files (a change retries them).
    trees: HashMap<PathBuf, u64>,
    /// When unpacked archives were last collected.
    last_collect: Option<std::time::Instant>,
}

/// How often reconciles may collect unpacked archives nothing names.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// How often a folder with a bundle still arriving, or a failed bundle, is
/// looked at again (file writes deep in a bundle raise no event).
const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

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
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = supervise(&shared, &ws, &record, None).await {
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
        let arrived = self.arrived.remove(&index).unwrap_or_default();
        let (shared, seen, myself) = (self.shared.clone(), self.seen.clone(), myself.clone());
        // Failed bundles of this folder: their files are fingerprinted, so
        // a fix copied in retries them.
        let (_, statuses) = self.shared.board.snapshot(false);
        let trees: std::collections::HashSet<PathBuf> = statuses
            .iter()
            .filter(|b| b.workspace == watch.workspace && b.state == BundleState::Failed)
            .map(|b| PathBuf::from(&b.source))
            .collect();
        tokio::spawn(async move {
            let (dir, config) = (watch.dir.clone(), shared.config.clone());
            let board = shared.board.clone();
            let found = tokio::task::spawn_blocking(move || {
                let ask = super::folder::ScanInputs {
                    seen: &seen,
                    config: &config,
                    quiet: config.watch_debounce,
                    trees: &trees,
                    arrived: &arrived,
                    trust: super::trusted::Trust {
                        read_only_volume: watch.read_only_volume,
                    },
                    workspace: &watch.workspace,
                    board: &board,
                };
                scan(&dir, &ask)
            })
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
        // Looked up per entry: a map, not a search (a folder of n bundles
        // would cost n² comparisons a rescan).
        let by_source: HashMap<PathBuf, InstallRecord> =
            here.iter().map(|r| (r.source.clone(), r.clone())).collect();
        let found_paths: std::collections::HashSet<&Path> =
            found.iter().map(|f| f.path.as_path()).collect();
        let mut work = Vec::new();
        // Look again later: a bundle still arriving, or a failed one whose
        // files are watched for a fix.
        let mut again = false;
        let mut settling = false;
        // Bundles whose file went: one of the same name that came (an
        // archive swapped for its folder) is installed once it is gone.
        let leaving: std::collections::HashSet<&str> = here
            .iter()
            .filter(|r| r.origin == Origin::Watch && !found_paths.contains(r.source.as_path()))
            .map(|r| r.name.as_str())
            .collect();
        for f in found.iter() {
            if let Some(why) = &f.settling {
                // Not taken yet: the next scan parses it again.
                tracing::info!(workspace = %watch.workspace, path = %f.path.display(), "watched bundle not complete yet: {why}");
                settling = true;
                continue;
            }
            again |= self.retry_if_fixed(f, by_source.get(&f.path));
            // `f.manifest` is Some exactly when the content differs from `previous`.
            let previous = self.seen.insert(f.path.clone(), f.hash);
            let record = by_source.get(&f.path);
            match (record, &f.manifest) {
                (None, Some(Ok(loaded))) if leaving.contains(loaded.manifest.name.as_str()) => {
                    self.seen.remove(&f.path);
                    again = true;
                }
                (None, Some(Ok(_))) => {
                    let path = f.path.clone();
                    match self
                        .install(myself, path.clone(), watch.workspace.clone(), Origin::Watch)
                        .await
                    {
                        Ok(task) => {
                            work.push(self.report_install(myself, task, &watch.workspace, path))
                        }
                        Err(e) => self.reject(&watch.workspace, &f.path, &e.to_string()),
                    }
                }
                (None, Some(Err(reason))) => self.reject(&watch.workspace, &f.path, reason),
                // First sight of an installed bundle (boot): its start reads this very file.
                (Some(_), _) if previous.is_none() => {}
                (Some(record), Some(Ok(loaded))) => {
                    if loaded.manifest.name != record.name {
                        tracing::info!(workspace = %watch.workspace, "watched bundle renamed from {:?} to {:?}", record.name, loaded.manifest.name);
                        work.push(self.rename(myself, record, &f.path, &watch.workspace).await);
                    } else if let Some(actor) =
                        ActorRef::<BundleMsg>::where_is(actor_name(&record.workspace, &record.name))
                    {
                        let _ = actor.send_message(BundleMsg::Upgrade {
                            manifest: Box::new(loaded.clone()),
                            source: record.source.clone(),
                        });
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
            if !found_paths.contains(record.source.as_path()) {
                self.seen.remove(&record.source);
                work.push(self.remove_in_background(record));
            }
        }
        // A bundle still arriving is looked at once its files may have
        // been quiet long enough; a failed one's files every second.
        let wait = match (settling, again) {
            (true, _) => Some(self.shared.config.watch_debounce),
            (false, true) => Some(self.shared.config.watch_debounce.max(RECHECK_EVERY)),
            (false, false) => None,
        };
        if let Some(wait) = wait {
            myself.send_after(wait, move || DaemonMsg::Rescan {
                index,
                arrived: Vec::new(),
            });
        }
        let myself = myself.clone();
        tokio::spawn(async move {
            for task in work {
                let _ = task.await;
            }
            let _ = myself.send_message(DaemonMsg::Reconciled { index });
        });
    }

    /// A watched bundle whose files are watched for a fix (it failed):
    /// started again when they changed. True while they are watched.
    fn retry_if_fixed(&mut self, f: &Found, record: Option<&InstallRecord>) -> bool {
        let Some(tree) = f.tree else {
            self.trees.remove(&f.path);
            return false;
        };
        let before = self.trees.insert(f.path.clone(), tree);
        if let (Some(before), Some(record)) = (before, record) {
            if before != tree {
                if let Some(actor) =
                    ActorRef::<BundleMsg>::where_is(actor_name(&record.workspace, &record.name))
                {
                    tracing::info!(workspace = %record.workspace, bundle = %record.name, "the files of a failed bundle changed: starting it again");
                    let _ = actor.send_message(BundleMsg::Retry);
                }
            }
        }
        true
    }

    /// A watched bundle whose manifest now names another bundle: the old
    /// one uninstalled, the new one installed from `path` (both in tasks).
    async fn rename(
        &mut self,
        myself: &ActorRef<DaemonMsg>,
        record: &InstallRecord,
        path: &Path,
        workspace: &str,
    ) -> tokio::task::JoinHandle<()> {
        let removed = self.remove_in_background(record);
        let installed = self
            .install(
                myself,
                path.to_path_buf(),
                workspace.to_string(),
                Origin::Watch,
            )
            .await;
        match installed {
            Ok(task) => {
                let report = self.report_install(myself, task, workspace, path.to_path_buf());
                tokio::spawn(async move {
                    let _ = tokio::join!(removed, report);
                })
            }
            Err(e) => {
                self.reject(workspace, path, &e.to_string());
                removed
            }
        }
    }

    /// Awaits a watched install; a refusal is announced like a rejected manifest.
    fn report_install(
        &self,
        myself: &ActorRef<DaemonMsg>,
        task: tokio::task::JoinHandle<Result<InstallRecord, InstallError>>,
        workspace: &str,
        path: PathBuf,
    ) -> tokio::task::JoinHandle<()> {
        let (shared, workspace) = (self.shared.clone(), workspace.to_string());
        let myself = myself.clone();
        tokio::spawn(async move {
            match task.await {
                Ok(Ok(_)) => {}
                Ok(Err(InstallError::AlreadyInstalled { .. })) => {
                    let _ = myself.send_message(DaemonMsg::Unseen(path));
                }
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

/// A bundle that fails in a watched folder gets its folder looked at: from
/// then on its files are fingerprinted, and a fix copied in retries it.
fn follow_failures(shared: Arc<Shared>, myself: ActorRef<DaemonMsg>) {
    if shared.config.watch.is_empty() {
        return;
    }
    let mut events = shared.board.subscribe();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(e) if e.kind == EventKind::Failed => {
                    for (index, watch) in shared.config.watch.iter().enumerate() {
                        if watch.workspace == e.workspace
                            && myself
                                .send_message(DaemonMsg::Rescan {
                                    index,
                                    arrived: Vec::new(),
                                })
                                .is_err()
                        {
                            return;
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                _ => {}
            }
        }
    });
}

/// How long an unpacked archive no install names is kept: a version just
/// unpacked for an upgrade is not taken from under the start that uses it.
const ARCHIVE_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// [`collect_archives`] once, a moment after the first of a run of
/// uninstalls (each would read every install and saved manifest: removing
/// n bundles was O(n²)).
pub(crate) fn collect_archives_soon(shared: Arc<Shared>) {
    use std::sync::atomic::Ordering;
    if shared.collect_pending.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async move {
        // A debounce, not a synchronisation: the uninstalls of a run land
        // within it and are collected together.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        shared.collect_pending.store(false, Ordering::Release);
        collect_archives(shared);
    });
}

/// Removes, in a task, the unpacked archives nothing runs or names any
/// more: not an install's source, not a running bundle's, not a kept last
/// good manifest's.
fn collect_archives(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let Ok(installs) = shared.store.call(|s| s.installs()).await else {
            return;
        };
        let (_, running) = shared.board.snapshot(false);
        let state_dir = shared.config.state_dir.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let root = crate::archive::root(&state_dir);
            let mut keep: std::collections::HashSet<String> = installs
                .iter()
                .filter_map(|r| crate::archive::unpacked_sha(&r.source, &root))
                .collect();
            keep.extend(
                running
                    .iter()
                    .filter_map(|b| b.archive.as_ref())
                    .map(|a| a.sha256.clone()),
            );
            keep.extend(
                super::bundle::snapshot_files(&state_dir)
                    .iter()
                    .filter_map(|f| crate::archive::unpacked_sha(f, &root)),
            );
            crate::archive::collect_garbage(&root, &keep, ARCHIVE_GRACE)
        })
        .await;
        match removed {
            Ok(Ok(0)) | Err(_) => {}
            Ok(Ok(n)) => tracing::info!(
                removed = n,
                "unpacked archives no install runs any more were removed"
            ),
            Ok(Err(e)) => tracing::warn!("cannot remove old unpacked archives: {e}"),
        }
    });
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
            myself.send_message(DaemonMsg::Rescan {
                index,
                arrived: Vec::new(),
            })?;
        }
        if folders == 0 {
            args.shared.booted.cancel();
        }
        follow_failures(args.shared.clone(), myself.clone());
        Ok(DaemonState {
            shared: args.shared,
            workspaces: HashMap::new(),
            seen: HashMap::new(),
            rescans: HashMap::new(),
            arrived: HashMap::new(),
            booting: Some((0..folders).collect()),
            trees: HashMap::new(),
            last_collect: None,
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
                    let result = uninstall(shared.clone(), ws, workspace, name).await;
                    if result.is_ok() {
                        collect_archives_soon(shared);
                    }
                    let _ = reply.send(result);
                });
            }
            DaemonMsg::Rescan { index, arrived } => {
                st.arrived.entry(index).or_default().extend(arrived);
                st.scan(&myself, index)
            }
            DaemonMsg::Scanned { index, scan } => match scan {
                Some(scan) => st.reconcile(&myself, index, scan).await,
                None => myself.send_message(DaemonMsg::Reconciled { index })?,
            },
            DaemonMsg::Unseen(path) => {
                st.seen.remove(&path);
            }
            DaemonMsg::Reconciled { index } => {
                // At most once a minute: a folder with a failed bundle is
                // rescanned every second, and collecting reads the store.
                let due = st.last_collect.is_none_or(|t| t.elapsed() >= COLLECT_EVERY);
                if due {
                    st.last_collect = Some(std::time::Instant::now());
                    collect_archives(st.shared.clone());
                }
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
