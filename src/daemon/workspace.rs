//! WorkspaceActor: one per workspace. Supervises the workspace's
//! BundleActors (a panicked one is started again with the same install),
//! owns the workspace's FileStore, rate buckets (one per bundle) and audit
//! log, and answers its bundles' host-resources requests and the `files`
//! control requests; store I/O runs on the blocking pool.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::bundle::{actor_name, BundleActor, BundleArgs, BundleMsg};
use super::Shared;
use crate::files::{FileError, FileStore};
use crate::host_resources::access::{Action, AuditLog, Standing};
use crate::host_resources::rate::TokenBucket;
use crate::host_resources::{self, HostError, HostRequest};
use crate::protocol::{Checkpoint, FileRecord, Rollback};
use serde_json::Value;

pub struct WorkspaceActor;

/// Who reads workspace files as resources through `bundlevisor mcp` (in logs).
pub const GATEWAY_PRINCIPAL: &str = "(gateway)";

pub struct WorkspaceArgs {
    pub name: String,
    pub shared: Arc<Shared>,
}

/// Why a workspace could not take a bundle.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("bundle {name:?} is already supervised in workspace {workspace:?}")]
    AlreadySupervised { workspace: String, name: String },
    #[error("cannot start the actor of bundle {name:?}: {reason}")]
    Actor { name: String, reason: String },
}

pub enum WorkspaceMsg {
    /// Start supervising an installed bundle (`manifest`: the one the
    /// install validated). A bundle of that name still stopping (an
    /// uninstall a moment ago) is waited for first.
    Add {
        name: String,
        source: PathBuf,
        manifest: Option<Box<crate::manifest::LoadedManifest>>,
        reply: RpcReplyPort<Result<(), AddError>>,
    },
    /// Run a new version of a bundle (an operator's upgrade), from
    /// `source` from now on; refused for a bundle not supervised here or
    /// being uninstalled.
    Upgrade {
        name: String,
        source: PathBuf,
        manifest: Box<crate::manifest::LoadedManifest>,
        reply: RpcReplyPort<bool>,
    },
    /// Stop a bundle (uninstall); replies once its process is gone.
    Remove {
        name: String,
        reply: RpcReplyPort<bool>,
    },
    /// The actor of an uninstalled bundle has stopped (its process is gone).
    Removed { name: String },
    /// A bundle's `ai.nimblebrain/resources/*` request.
    Host(HostRequest),
    /// Retry starting a bundle actor whose restart failed.
    Respawn { name: String },
    /// An operation on the workspace's files.
    Files(FilesOp),
}

/// A file's record and its bytes.
pub type FileWithBytes = (FileRecord, Vec<u8>);

/// Operations on a workspace's FileStore (run on the blocking pool).
pub enum FilesOp {
    Put {
        path: PathBuf,
        /// The name to record (default: the path's last component).
        filename: Option<String>,
        tags: Vec<String>,
        mime: Option<String>,
        /// What `path` reads through (the opened file behind
        /// `/proc/self/fd/N`) and the caller's slot: held until the put is
        /// done, even when the caller stopped waiting.
        held: Box<dyn Send>,
        reply: RpcReplyPort<Result<FileRecord, FileError>>,
    },
    List(RpcReplyPort<Result<Vec<FileRecord>, FileError>>),
    Get {
        id: String,
        reply: RpcReplyPort<Result<Option<FileWithBytes>, FileError>>,
    },
    Remove {
        id: String,
        reply: RpcReplyPort<Result<bool, FileError>>,
    },
    Checkpoint(RpcReplyPort<Result<Checkpoint, FileError>>),
    /// The files as MCP resources (`resources/list`, `resources/read`) for
    /// the gateway: the host-resources resolver's own results, so MIME type
    /// and text/blob are decided in one place.
    Resources {
        request: host_resources::Request,
        reply: RpcReplyPort<Result<Result<Value, HostError>, FileError>>,
    },
    Rollback {
        checkpoint_id: String,
        reply: RpcReplyPort<Result<Option<Rollback>, FileError>>,
    },
}

impl From<HostRequest> for WorkspaceMsg {
    fn from(request: HostRequest) -> Self {
        WorkspaceMsg::Host(request)
    }
}

impl TryFrom<WorkspaceMsg> for HostRequest {
    type Error = ();
    fn try_from(msg: WorkspaceMsg) -> Result<Self, ()> {
        match msg {
            WorkspaceMsg::Host(request) => Ok(request),
            _ => Err(()),
        }
    }
}

struct BundleSlot {
    actor: Option<ActorRef<BundleMsg>>,
    source: PathBuf,
    /// Counters carried over to the actor that replaces a panicked one.
    restarts: u32,
    crashes: u64,
    manifest: Option<Box<crate::manifest::LoadedManifest>>,
    /// Uninstalled, and its actor is stopping: who waits for that, and an
    /// install of the same name that waits to start after it.
    stopping: Option<Stopping>,
}

struct Stopping {
    removers: Vec<RpcReplyPort<bool>>,
    then: Option<Add>,
}

/// An `Add` waiting for the previous bundle of its name to stop.
struct Add {
    source: PathBuf,
    manifest: Option<Box<crate::manifest::LoadedManifest>>,
    reply: RpcReplyPort<Result<(), AddError>>,
}

impl BundleSlot {
    fn new(add: Add) -> (BundleSlot, RpcReplyPort<Result<(), AddError>>) {
        let slot = BundleSlot {
            actor: None,
            source: add.source,
            restarts: 0,
            crashes: 0,
            manifest: add.manifest,
            stopping: None,
        };
        (slot, add.reply)
    }
}

pub struct WorkspaceState {
    /// Shared with every host-resources answer (counted per workspace).
    name: Arc<str>,
    shared: Arc<Shared>,
    bundles: HashMap<String, BundleSlot>,
    files: FileStore,
    /// Host-resources token buckets, by bundle.
    buckets: HashMap<String, TokenBucket>,
    /// Access decisions, by bundle and action (`Action as usize`).
    standings: HashMap<String, [Option<Standing>; 2]>,
    host_counters: super::metrics::HostCounters,
    audit: AuditLog,
}

/// Files up to this size whose record is cached are read on the event loop:
/// a read from the page cache costs less than the two thread wake-ups of
/// the blocking pool. Anything else (lists, larger files, records not yet
/// known — the database is never asked on the event loop) goes to the
/// blocking pool.
const INLINE_READ_MAX: u64 = 64 * 1024;

impl WorkspaceState {
    /// Stops a bundle's actor (an uninstall); `reply` answers once it has
    /// stopped (`Removed`), false at once for a bundle not here.
    fn remove(&mut self, myself: &ActorRef<WorkspaceMsg>, name: String, reply: RpcReplyPort<bool>) {
        let Some(slot) = self.bundles.get_mut(&name) else {
            let _ = reply.send(false);
            return;
        };
        if let Some(stopping) = &mut slot.stopping {
            stopping.removers.push(reply);
            return;
        }
        self.buckets.remove(&name);
        self.standings.remove(&name);
        slot.stopping = Some(Stopping {
            removers: vec![reply],
            then: None,
        });
        let actor = slot.actor.take();
        let ws = self.name.clone();
        let limit = self.shared.config.bundles.stop_grace + Duration::from_secs(5);
        let myself = myself.clone();
        tokio::spawn(async move {
            if let Some(actor) = actor {
                if let Err(e) = actor
                    .stop_and_wait(Some("uninstall".into()), Some(limit))
                    .await
                {
                    tracing::warn!(workspace = %ws, bundle = %name, "bundle actor did not stop in time: {e}");
                }
            }
            let _ = myself.send_message(WorkspaceMsg::Removed { name });
        });
    }

    /// Passes an operator's upgrade to a bundle's actor, its slot moved to
    /// the new source (which a replacement of a panicked actor reads);
    /// false for a bundle not here or being uninstalled.
    fn upgrade(
        &mut self,
        name: &str,
        source: PathBuf,
        manifest: Box<crate::manifest::LoadedManifest>,
    ) -> bool {
        let Some(slot) = self.bundles.get_mut(name).filter(|s| s.stopping.is_none()) else {
            return false;
        };
        slot.source = source.clone();
        if let Some(actor) = &slot.actor {
            let _ = actor.send_message(BundleMsg::Upgrade { manifest, source });
        }
        true
    }

    /// Scheme check → access decision (audited) → rate bucket → FileStore
    /// (on the blocking pool). The workspace is the one the connection was
    /// bound to; a refused request is answered as not found (no leak).
    fn host_request(&mut self, request: HostRequest) {
        let HostRequest {
            requester,
            method,
            params,
            reply,
        } = request;
        // Every answer is counted by outcome (metrics), then sent.
        let answer = {
            let counters = self.host_counters.clone();
            move |result: Result<host_resources::Answer, HostError>| {
                counters.count(&result);
                let _ = reply.send(result);
            }
        };
        let parsed = match host_resources::parse(&method, params.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                answer(Err(e));
                return;
            }
        };
        let (resource, action) = parsed.target();
        // Kept for this workspace's own bundles; a request bound to another
        // workspace (refused) is decided afresh each time.
        let fresh;
        let standing = if requester.workspace == *self.name {
            let standings = match self.standings.get_mut(requester.bundle.as_str()) {
                Some(s) => s,
                None => self.standings.entry(requester.bundle.clone()).or_default(),
            };
            standings[action as usize]
                .get_or_insert_with(|| Standing::new(&requester, action, &self.name))
        } else {
            fresh = Standing::new(&requester, action, &self.name);
            &fresh
        };
        self.audit.record_for(standing, resource);
        let decision = &standing.decision;
        if !decision.permitted {
            tracing::warn!(workspace = %self.name, principal = %decision.principal, "host-resources request refused: {}", decision.reason);
            let uri = if action == Action::Read { resource } else { "" };
            answer(Err(HostError::not_found(uri)));
            return;
        }
        let limits = &self.shared.config.host_resources;
        let now = tokio::time::Instant::now();
        let bucket = match self.buckets.get_mut(requester.bundle.as_str()) {
            Some(b) => b,
            None => self
                .buckets
                .entry(requester.bundle.clone())
                .or_insert_with(|| TokenBucket::new(limits.rate_per_sec, limits.burst, now)),
        };
        if let Err(retry_after_ms) = bucket.take(now) {
            answer(Err(host_resources::rate_limited(retry_after_ms)));
            return;
        }
        let (store, max) = (self.files.clone(), limits.max_read_bytes);
        if let Some(result) =
            host_resources::execute_cached(&store, max, INLINE_READ_MAX, &requester, &parsed)
        {
            answer(result);
            return;
        }
        tokio::task::spawn_blocking(move || {
            let result = host_resources::execute(&store, max, &requester, parsed);
            answer(result.map(|value| host_resources::Answer::encode(&value)))
        });
    }

    fn files_op(&self, op: FilesOp) {
        let store = self.files.clone();
        let (workspace, max) = (
            self.name.clone(),
            self.shared.config.host_resources.max_read_bytes,
        );
        tokio::task::spawn_blocking(move || match op {
            FilesOp::Put {
                path,
                filename,
                tags,
                mime,
                held,
                reply,
            } => {
                let _ = reply.send(store.put(&path, filename.as_deref(), tags, mime.as_deref()));
                drop(held);
            }
            FilesOp::List(reply) => {
                let _ = reply.send(store.list());
            }
            FilesOp::Get { id, reply } => {
                let result = match store.get(&id) {
                    Ok(Some(record)) => store.read(&id).map(|bytes| Some((record, bytes))),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                };
                let _ = reply.send(result);
            }
            FilesOp::Remove { id, reply } => {
                let _ = reply.send(store.remove(&id));
            }
            FilesOp::Checkpoint(reply) => {
                let _ = reply.send(store.checkpoint());
            }
            FilesOp::Resources { request, reply } => {
                let requester = host_resources::Requester {
                    workspace: workspace.to_string(),
                    bundle: GATEWAY_PRINCIPAL.to_string(),
                };
                let _ = reply.send(Ok(host_resources::execute(
                    &store, max, &requester, request,
                )));
            }
            FilesOp::Rollback {
                checkpoint_id,
                reply,
            } => {
                let _ = reply.send(store.rollback(&checkpoint_id));
            }
        });
    }

    async fn spawn_bundle(
        &self,
        myself: &ActorRef<WorkspaceMsg>,
        name: &str,
        slot: &mut BundleSlot,
    ) -> Result<ActorRef<BundleMsg>, AddError> {
        let args = BundleArgs {
            workspace: self.name.to_string(),
            name: name.to_string(),
            source: slot.source.clone(),
            shared: self.shared.clone(),
            host_port: myself.get_derived(),
            restarts: slot.restarts,
            crashes: slot.crashes,
            manifest: slot.manifest.take(),
        };
        Actor::spawn_linked(
            Some(actor_name(&self.name, name)),
            BundleActor,
            args,
            myself.get_cell(),
        )
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| AddError::Actor {
            name: name.to_string(),
            reason: e.to_string(),
        })
    }

    /// Starts supervising `name` with a new slot; answers the install.
    async fn add(&mut self, myself: &ActorRef<WorkspaceMsg>, name: String, add: Add) {
        let (mut slot, reply) = BundleSlot::new(add);
        let result = self.spawn_bundle(myself, &name, &mut slot).await;
        if let Ok(actor) = &result {
            slot.actor = Some(actor.clone());
            self.bundles.insert(name, slot);
        }
        let _ = reply.send(result.map(|_| ()));
    }
}

#[ractor::async_trait]
impl Actor for WorkspaceActor {
    type Msg = WorkspaceMsg;
    type State = WorkspaceState;
    type Arguments = WorkspaceArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkspaceMsg>,
        args: WorkspaceArgs,
    ) -> Result<WorkspaceState, ActorProcessingErr> {
        args.shared.board.add_workspace(&args.name);
        let host_counters = args.shared.metrics.workspace(&args.name);
        let (state_dir, ws, db) = (
            args.shared.config.state_dir.clone(),
            args.name.clone(),
            args.shared.store.clone(),
        );
        let files = tokio::task::spawn_blocking(move || FileStore::open(&state_dir, &ws, db))
            .await
            .map_err(|e| format!("file store of workspace {:?}: {e}", args.name))?
            .map_err(|e| format!("file store of workspace {:?}: {e}", args.name))?;
        let audit = args.shared.audit_log(&args.name);
        Ok(WorkspaceState {
            name: args.name.into(),
            shared: args.shared,
            bundles: HashMap::new(),
            files,
            buckets: HashMap::new(),
            standings: HashMap::new(),
            host_counters,
            audit,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        msg: WorkspaceMsg,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkspaceMsg::Add {
                name,
                source,
                manifest,
                reply,
            } => {
                let add = Add {
                    source,
                    manifest,
                    reply,
                };
                match st.bundles.get_mut(&name) {
                    None => st.add(&myself, name, add).await,
                    // Uninstalled a moment ago and still stopping: this
                    // install starts once the old process is gone (two
                    // actors never share a name, and the old one's exit
                    // never removes the new one from status).
                    Some(BundleSlot {
                        stopping: Some(stopping),
                        ..
                    }) if stopping.then.is_none() => stopping.then = Some(add),
                    Some(_) => {
                        let _ = add.reply.send(Err(AddError::AlreadySupervised {
                            workspace: st.name.to_string(),
                            name,
                        }));
                    }
                }
            }
            WorkspaceMsg::Upgrade {
                name,
                source,
                manifest,
                reply,
            } => {
                let _ = reply.send(st.upgrade(&name, source, manifest));
            }
            WorkspaceMsg::Remove { name, reply } => st.remove(&myself, name, reply),
            WorkspaceMsg::Removed { name } => {
                let Some(slot) = st.bundles.remove(&name) else {
                    return Ok(());
                };
                st.shared.board.remove(&st.name, &name);
                st.shared.metrics.forget(&st.name, &name);
                let snapshot =
                    super::bundle::snapshot_path(&st.shared.config.state_dir, &st.name, &name);
                let Stopping { removers, then } = slot.stopping.unwrap_or(Stopping {
                    removers: Vec::new(),
                    then: None,
                });
                if let Some(add) = then {
                    st.add(&myself, name, add).await;
                } else {
                    // The last good manifest goes with the install.
                    tokio::task::spawn_blocking(move || {
                        let _ = std::fs::remove_file(snapshot);
                    });
                }
                for reply in removers {
                    let _ = reply.send(true);
                }
            }
            WorkspaceMsg::Host(request) => st.host_request(request),
            WorkspaceMsg::Files(op) => st.files_op(op),
            WorkspaceMsg::Respawn { name } => {
                let Some(mut slot) = st.bundles.remove(&name) else {
                    return Ok(());
                };
                if slot.actor.is_some() || slot.stopping.is_some() {
                    st.bundles.insert(name, slot);
                    return Ok(());
                }
                let spawned = st.spawn_bundle(&myself, &name, &mut slot).await;
                slot.actor = spawned.as_ref().ok().cloned();
                st.bundles.insert(name.clone(), slot);
                if let Err(e) = spawned {
                    tracing::warn!(workspace = %st.name, bundle = %name, "{e}; retrying");
                    myself.send_after(Duration::from_millis(200), move || WorkspaceMsg::Respawn {
                        name,
                    });
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        event: SupervisionEvent,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        // The default would stop this actor when a child exits: never do that.
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            let failed = st.bundles.iter_mut().find(|(_, slot)| {
                slot.actor
                    .as_ref()
                    .is_some_and(|a| a.get_id() == cell.get_id())
            });
            if let Some((name, slot)) = failed {
                tracing::error!(workspace = %st.name, bundle = %name, "bundle actor failed: {err}; starting it again");
                slot.actor = None;
                // The replacement goes on counting where the failed one
                // stopped; bringing the bundle up again is one restart.
                let (restarts, crashes) = st
                    .shared
                    .board
                    .counters(&st.name, name)
                    .unwrap_or((slot.restarts, slot.crashes));
                slot.restarts = restarts + 1;
                slot.crashes = crashes;
                let name = name.clone();
                myself.send_message(WorkspaceMsg::Respawn { name })?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        let limit = st.shared.config.bundles.stop_grace + Duration::from_secs(5);
        myself
            .stop_children_and_wait(Some("workspace stopping".into()), Some(limit))
            .await;
        Ok(())
    }
}
