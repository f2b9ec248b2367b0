//! BundleActor: owns one installed bundle's process and MCP session.
//!
//! The lifecycle is [`Lifecycle`](super::lifecycle::Lifecycle), a pure state
//! machine; this actor turns messages into its inputs and runs the effects
//! it returns (start tasks, timers, stops, events). `start.rs` is the start
//! task (which manifest, plan, sandbox, connect, OAuth retry); `call.rs` the
//! one path of a request to the bundle.

mod call;
mod session;
mod start;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::Peer;
use rmcp::RoleClient;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::lifecycle::{Effect, Env, Exit, Input, Lifecycle, Note, Route, StartFailure, Why};
use super::Shared;
use crate::bundle::process::{ExitInfo, StderrTail};
use crate::bundle::HostContext;
use crate::config::Supervision;
use crate::host_resources::HostRequest;
use crate::manifest::LoadedManifest;
use crate::protocol::{
    BundleState, BundleStatus, EventKind, ExitStatus, LifecycleEvent, SandboxRecord,
};

pub use call::{run, Ask, CallError, PendingCall};
pub use session::{Lane, Lanes, Live};
pub use start::{snapshot_files, snapshot_path, Started};

/// Registry name of a bundle's actor.
pub fn actor_name(workspace: &str, name: &str) -> String {
    format!("bundle/{workspace}/{name}")
}

/// Stderr lines attached to an `exited` event.
const CRASH_STDERR_LINES: usize = 10;

pub struct BundleActor;

pub struct BundleArgs {
    pub workspace: String,
    pub name: String,
    pub source: PathBuf,
    pub shared: Arc<Shared>,
    /// Handle to the owning WorkspaceActor for host-resources requests.
    pub host_port: DerivedActorRef<HostRequest>,
    /// Restarts and crashes so far (carried over from a panicked actor).
    pub restarts: u32,
    pub crashes: u64,
    /// The manifest the install validated; None: read it from disk.
    pub manifest: Option<Box<LoadedManifest>>,
}

pub enum BundleMsg {
    /// A scheduled start is due.
    Start {
        generation: u64,
    },
    Started {
        generation: u64,
        result: Result<Box<Started>, StartFailure>,
    },
    /// The sandbox of the start `generation` is ready (sent before the
    /// process is spawned, so `status` shows it while the bundle starts).
    SandboxReady {
        generation: u64,
        record: SandboxRecord,
    },
    Exited {
        generation: u64,
        exit: ExitInfo,
        stderr: Vec<String>,
    },
    /// The liveness check gave up on the process.
    Unresponsive {
        generation: u64,
        reason: String,
    },
    /// Stop the current process (if any) and start again at once, because
    /// of `Respawn`; answers once the new start is under way.
    Respawn(Respawn, RpcReplyPort<()>),
    /// The manifest changed and passed validation: restart with it.
    Upgrade(Box<LoadedManifest>),
    /// The environment of an upgrade (a uv bundle's) is built: restart with it.
    Prepared(Box<LoadedManifest>),
    /// The manifest changed but was refused: keep running, say why.
    ManifestRejected(String),
    /// The files of a failed watched bundle changed: start it again (from
    /// the manifest on disk, breaker cleared).
    Retry,
    /// A request to the bundle (a tool call or a passed-through MCP request).
    Call(PendingCall),
    /// A remote server answered 401 on the session of `generation` (to a
    /// call, which is retried once on the rebuilt session, or to a ping).
    AuthExpired {
        generation: u64,
        call: Option<PendingCall>,
        /// The server's challenge (a 403 `insufficient_scope` names the
        /// scope the next token needs).
        challenge: Option<String>,
    },
    Tools(RpcReplyPort<(BundleState, Vec<Value>)>),
    /// The manifest the bundle runs (None before its first start).
    Manifest(RpcReplyPort<Option<LoadedManifest>>),
    #[cfg(feature = "fault-injection")]
    Panic,
}

/// Why a bundle is respawned on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Respawn {
    /// `bundlevisor restart`.
    Operator,
    /// `configure` stored new user_config values.
    Reconfigured,
    /// `auth` stored new tokens.
    Authorized,
}

pub struct BundleActorState {
    args: BundleArgs,
    lc: Lifecycle<Arc<Live>>,
    /// The manifest the bundle runs (the last good one).
    manifest: Option<LoadedManifest>,
    /// A validated manifest the next start must use (install, upgrade).
    next_manifest: Option<LoadedManifest>,
    /// The next start reads the disk (first start, operator restart).
    reread: bool,
    /// The challenge of the 401 or 403 that ended the last session: the
    /// next start gets a token for it before connecting.
    challenge: Option<String>,
    /// The sandbox of the current generation (stdio bundles).
    sandbox: Option<SandboxRecord>,
    /// The archive the bundle runs from, if it came as one.
    archive: Option<crate::protocol::ArchiveInfo>,
    /// The start in progress (aborted if dropped).
    start_task: Option<AbortOnDropHandle<()>>,
    /// The environment of an upgrade being built while the running
    /// version serves (aborted if dropped: a newer upgrade, an uninstall).
    preparing: Option<AbortOnDropHandle<()>>,
    /// Calls waiting for the session rebuilt after a 401, each with
    /// whether it may still be retried after another 401.
    queued: Vec<(PendingCall, bool)>,
    /// The generation whose session is published in `Shared::lanes`.
    published: Option<u64>,
    /// The liveness check of the ready session (of that generation).
    pinger: Option<(u64, AbortOnDropHandle<()>)>,
}

impl BundleActorState {
    /// The bundle's current line in `status`.
    fn status(&self) -> BundleStatus {
        let live = self.lc.session();
        BundleStatus {
            workspace: self.args.workspace.clone(),
            name: self.args.name.clone(),
            version: self.manifest.as_ref().map(|m| m.manifest.version.clone()),
            state: self.lc.state(),
            pid: live.and_then(|l| l.session.lifeline.pid()),
            uptime_secs: None,
            restarts: self.lc.restarts(),
            tools: live.map_or(0, |l| l.session.tools.len()),
            last_error: self.lc.last_error().map(str::to_string),
            source: self.args.source.display().to_string(),
            sandbox: self.sandbox.clone(),
            usage: None,
            archive: self.archive.clone(),
        }
    }

    fn update_board(&self) {
        let ready_since = self.lc.ready_since().map(Instant::into_std);
        self.args
            .shared
            .board
            .update(self.status(), ready_since, self.lc.crashes());
    }

    fn supervision(&self) -> &Supervision {
        &self.args.shared.config.supervision
    }

    /// Feeds one input to the lifecycle and runs what it asks for.
    fn step(&mut self, myself: &ActorRef<BundleMsg>, input: Input<Arc<Live>>) {
        let effects = self.decide(input, fastrand::f64());
        self.run(myself, effects);
        self.publish_lane();
        let ready = self.lc.session().map(|l| l.generation);
        if self.pinger.as_ref().map(|(g, _)| *g) != ready {
            self.pinger = None;
        }
    }

    /// Publishes the session calls may run on directly: the ready one, or
    /// none (then every call comes through the actor).
    fn publish_lane(&mut self) {
        let source = match self.lc.route() {
            Route::Send(_) => Some(self.lc.generation()),
            _ => None,
        };
        if source == self.published {
            return;
        }
        self.published = source;
        let lane = match self.lc.route() {
            Route::Send(live) => Some(live.clone()),
            _ => None,
        };
        self.args
            .shared
            .lanes
            .publish(&self.args.workspace, &self.args.name, lane);
    }

    fn decide(&mut self, input: Input<Arc<Live>>, jitter: f64) -> Vec<Effect<Arc<Live>>> {
        let shared = self.args.shared.clone();
        let sup = &shared.config.supervision;
        let env = Env {
            supervision: sup,
            policy: sup.restart_for(&self.args.workspace, &self.args.name),
            jitter,
        };
        self.lc.step(input, Instant::now(), &env)
    }

    /// Runs the effects of one step; then the status it led to is
    /// published, followed by its events in order.
    fn run(&mut self, myself: &ActorRef<BundleMsg>, effects: Vec<Effect<Arc<Live>>>) {
        let grace = self.args.shared.config.bundles.stop_grace;
        let mut notes = Vec::new();
        for effect in effects {
            match effect {
                Effect::Spawn { generation } => self.spawn_start(myself, generation),
                Effect::Schedule { generation, delay } => {
                    let start = move || BundleMsg::Start { generation };
                    if delay.is_zero() {
                        let _ = myself.send_message(start());
                    } else {
                        myself.send_after(delay, start);
                    }
                }
                Effect::Stop {
                    session,
                    then_start,
                } => {
                    let myself = myself.clone();
                    tokio::spawn(async move {
                        session.session.lifeline.stop(grace).await;
                        if let Some(generation) = then_start {
                            let _ = myself.send_message(BundleMsg::Start { generation });
                        }
                    });
                }
                Effect::Release(session) => drop(session),
                Effect::Kill => {
                    if let Some(live) = self.lc.session() {
                        let lifeline = live.session.lifeline.clone();
                        tokio::spawn(async move { lifeline.stop(grace).await });
                    }
                }
                Effect::Drain(session) => self.drain(session),
                Effect::AbortStart => self.start_task = None,
                Effect::FlushQueue => {
                    for (call, retry) in std::mem::take(&mut self.queued) {
                        self.send(myself, call, retry);
                    }
                }
                Effect::FailQueue(reason) => {
                    for (call, _) in self.queued.drain(..) {
                        let _ = call.reply.send(Err(CallError::NotReady {
                            state: self.lc.state(),
                            last_error: Some(reason.clone()),
                        }));
                    }
                }
                Effect::Publish(note) => notes.push(note),
            }
        }
        if notes.is_empty() {
            return;
        }
        self.update_board();
        for note in notes {
            self.log(&note);
            self.args.shared.board.emit(self.event(note));
        }
    }

    fn event(&self, note: Note) -> LifecycleEvent {
        let mut event = LifecycleEvent::new(
            &self.args.workspace,
            &self.args.name,
            note.kind,
            self.lc.state(),
            note.message,
        );
        event.attempt = note.attempt;
        event.delay_ms = note.delay_ms;
        event.exit = note.exit;
        event.stderr = note.stderr;
        event
    }

    fn log(&self, note: &Note) {
        let (ws, bundle, message) = (&self.args.workspace, &self.args.name, &note.message);
        match note.kind {
            EventKind::Failed => {
                tracing::warn!(workspace = %ws, bundle = %bundle, "bundle failed: {message}")
            }
            EventKind::NeedsConfig => {
                tracing::warn!(workspace = %ws, bundle = %bundle, "bundle needs configuration: {message}")
            }
            EventKind::NeedsAuth => {
                tracing::warn!(workspace = %ws, bundle = %bundle, "bundle needs authorization: {message}")
            }
            EventKind::Ready => {
                let live = self.lc.session();
                tracing::info!(workspace = %ws, bundle = %bundle, pid = ?live.and_then(|l| l.session.lifeline.pid()), tools = live.map_or(0, |l| l.session.tools.len()), "bundle ready")
            }
            EventKind::Restarting | EventKind::Upgrading | EventKind::Reconfigured => {
                tracing::info!(workspace = %ws, bundle = %bundle, "{message}")
            }
            EventKind::ManifestRejected => {
                tracing::warn!(workspace = %ws, bundle = %bundle, "{message}")
            }
            _ => tracing::debug!(workspace = %ws, bundle = %bundle, kind = ?note.kind, "{message}"),
        }
    }

    /// Restarts with the validated new manifest.
    fn upgrade(&mut self, myself: &ActorRef<BundleMsg>, manifest: LoadedManifest) {
        let version = manifest.manifest.version.clone();
        self.next_manifest = Some(manifest);
        self.step(myself, Input::Respawn(Why::Upgrade { version }));
    }

    /// Builds the environment of a uv bundle's new version while the
    /// running one serves: the restart comes once it is built, and a build
    /// that fails rejects the upgrade (the running version keeps running).
    fn prepare_upgrade(&mut self, myself: &ActorRef<BundleMsg>, manifest: LoadedManifest) {
        let shared = self.args.shared.clone();
        let (workspace, name) = (self.args.workspace.clone(), self.args.name.clone());
        let myself = myself.clone();
        self.preparing = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let built = start::build_uv_environment(
                &shared,
                &workspace,
                &name,
                &manifest,
                BundleState::Ready,
            )
            .await;
            let _ = myself.send_message(match built {
                Ok(_) => BundleMsg::Prepared(Box::new(manifest)),
                Err(e) => BundleMsg::ManifestRejected(format!(
                    "version {} of the bundle cannot run: {e}",
                    manifest.manifest.version
                )),
            });
        })));
    }

    /// Starts the task that brings generation `generation` up. Held by the
    /// actor: a start superseded by a newer one, or cut short by an
    /// uninstall or shutdown, is aborted, and its half-started process
    /// killed with it (the Lifeline guard).
    fn spawn_start(&mut self, myself: &ActorRef<BundleMsg>, generation: u64) {
        self.sandbox = None;
        let wanted = match self.next_manifest.take() {
            Some(m) => start::Wanted::Exactly(m),
            None if self.reread || self.manifest.is_none() => start::Wanted::FromDisk {
                last_good: self.manifest.clone(),
            },
            None => start::Wanted::Exactly(self.manifest.clone().expect("checked above")),
        };
        self.reread = false;
        let challenge = self.challenge.take();
        let shared = self.args.shared.clone();
        let (workspace, name, source) = (
            self.args.workspace.clone(),
            self.args.name.clone(),
            self.args.source.clone(),
        );
        let host = HostContext::new(&workspace, &name, self.args.host_port.clone());
        let myself = myself.clone();
        self.start_task = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let report = {
                let myself = myself.clone();
                move |record| {
                    let _ = myself.send_message(BundleMsg::SandboxReady { generation, record });
                }
            };
            let attempt = start::Attempt { wanted, challenge };
            let result = start::start(&shared, &workspace, &name, source, attempt, host, report)
                .await
                .map(Box::new);
            if let Err(ractor::MessagingErr::SendErr(BundleMsg::Started {
                result: Ok(started),
                ..
            })) = myself.send_message(BundleMsg::Started { generation, result })
            {
                // The actor is gone: do not leave the process behind.
                started
                    .session
                    .lifeline
                    .stop(shared.config.bundles.stop_grace)
                    .await;
            }
        })));
    }

    /// A start ended: a ready session for the lifecycle (with its exit
    /// watcher and pinger), or the failure.
    fn started(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        generation: u64,
        result: Result<Box<Started>, StartFailure>,
    ) {
        let mut rejected = None;
        let result = result.map(|started| {
            let Started {
                mut session,
                manifest,
                archive,
                reauthorized,
                rejected: refused,
            } = *started;
            let excluded = self
                .args
                .shared
                .config
                .excluded_tools(&self.args.workspace, &self.args.name);
            session
                .tools
                .retain(|t| !excluded.iter().any(|e| e == t.name.as_ref()));
            if generation == self.lc.generation() {
                self.manifest = Some(manifest);
                self.archive = archive;
                rejected = refused;
                watch_exit(
                    session.lifeline.observer(),
                    session.stderr.clone(),
                    myself.clone(),
                    generation,
                );
                self.pinger = spawn_pinger(
                    session.peer.clone(),
                    self.supervision(),
                    myself.clone(),
                    generation,
                )
                .map(|p| (generation, p));
            }
            let timeout = self.args.shared.config.bundles.call_timeout;
            (Live::new(session, generation, timeout), reauthorized)
        });
        self.step(myself, Input::Started { generation, result });
        if let Some(why) = rejected {
            self.step(myself, Input::Rejected(why));
        }
    }

    /// Routes a request: to the ready session, into the queue of a 401
    /// rebuild, or refused with the state the bundle is in.
    fn send(&mut self, myself: &ActorRef<BundleMsg>, call: PendingCall, retry: bool) {
        match self.lc.route() {
            Route::Send(live) => {
                if let Some(tool) = call.tool() {
                    if !live.serves(tool) {
                        let _ = call.reply.send(Err(CallError::NoSuchTool));
                        return;
                    }
                }
                if live.closed() {
                    // The session just ended and its exit is on the way: the
                    // call was never sent, and the bundle is about to restart
                    // (a caller may wait for that).
                    let _ = call.reply.send(Err(CallError::NotReady {
                        state: BundleState::Restarting,
                        last_error: Some("the bundle's session just ended".into()),
                    }));
                    return;
                }
                let lane = live.lane();
                call::spawn(lane, call, retry, myself.clone());
            }
            Route::Queue => self.queued.push((call, retry)),
            Route::Refuse { state, last_error } => {
                let _ = call
                    .reply
                    .send(Err(CallError::NotReady { state, last_error }));
            }
        }
    }

    /// The old session of a 401 rebuild is not cut: requests in flight on
    /// it finish (or come back with their own 401 and wait for the new
    /// session), and it is closed once idle or after the call timeout.
    fn drain(&self, old: Arc<Live>) {
        let limit = self.args.shared.config.bundles.call_timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limit, old.idle()).await;
            old.session.lifeline.stop(Duration::ZERO).await;
        });
    }
}

#[ractor::async_trait]
impl Actor for BundleActor {
    type Msg = BundleMsg;
    type State = BundleActorState;
    type Arguments = BundleArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<BundleMsg>,
        mut args: BundleArgs,
    ) -> Result<BundleActorState, ActorProcessingErr> {
        let lc = Lifecycle::new(args.restarts, args.crashes);
        let next_manifest = args.manifest.take().map(|m| *m);
        Ok(BundleActorState {
            args,
            lc,
            manifest: None,
            next_manifest,
            reread: false,
            challenge: None,
            sandbox: None,
            archive: None,
            start_task: None,
            preparing: None,
            queued: Vec::new(),
            published: None,
            pinger: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<BundleMsg>,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        let effects = st.lc.begin();
        st.run(&myself, effects);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<BundleMsg>,
        msg: BundleMsg,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BundleMsg::Start { generation } => st.step(&myself, Input::Start { generation }),
            BundleMsg::SandboxReady { generation, record } => {
                if generation == st.lc.generation() {
                    st.sandbox = Some(record);
                    st.update_board();
                }
            }
            BundleMsg::Started { generation, result } => st.started(&myself, generation, result),
            BundleMsg::Exited {
                generation,
                exit,
                stderr,
            } => {
                let live = st.lc.session().filter(|_| generation == st.lc.generation());
                if exit.oom_killed {
                    st.args
                        .shared
                        .metrics
                        .oom_killed(&st.args.workspace, &st.args.name);
                }
                let exit = Exit {
                    status: ExitStatus {
                        code: exit.code,
                        signal: exit.signal,
                        oom_killed: exit.oom_killed,
                    },
                    text: exit.to_string(),
                    pid: live.and_then(|l| l.session.lifeline.pid()),
                    violation: live.and_then(|l| l.session.violation.get()),
                    stderr,
                };
                st.step(&myself, Input::Exited { generation, exit });
            }
            BundleMsg::Unresponsive { generation, reason } => {
                if generation == st.lc.generation() {
                    tracing::warn!(workspace = %st.args.workspace, bundle = %st.args.name, "{reason}; killing the bundle");
                }
                st.step(&myself, Input::Unresponsive { generation, reason });
            }
            BundleMsg::Respawn(why, reply) => {
                let why = match why {
                    Respawn::Operator => {
                        st.reread = true;
                        Why::Operator
                    }
                    Respawn::Reconfigured => Why::Reconfigured,
                    Respawn::Authorized => Why::Authorized,
                };
                st.step(&myself, Input::Respawn(why));
                let _ = reply.send(());
            }
            BundleMsg::Upgrade(manifest) => {
                st.preparing = None;
                if manifest.manifest.is_uv() && st.lc.state() == BundleState::Ready {
                    st.prepare_upgrade(&myself, *manifest);
                } else {
                    st.upgrade(&myself, *manifest);
                }
            }
            BundleMsg::Prepared(manifest) => {
                st.preparing = None;
                st.upgrade(&myself, *manifest);
            }
            BundleMsg::ManifestRejected(reason) => st.step(&myself, Input::Rejected(reason)),
            BundleMsg::Retry => {
                st.reread = true;
                st.step(&myself, Input::Respawn(Why::FilesChanged));
            }
            BundleMsg::Call(call) => {
                let excluded = st
                    .args
                    .shared
                    .config
                    .excluded_tools(&st.args.workspace, &st.args.name);
                if call.tool().is_some_and(|t| excluded.iter().any(|e| e == t)) {
                    let _ = call.reply.send(Err(CallError::NoSuchTool));
                } else {
                    st.send(&myself, call, true);
                }
            }
            BundleMsg::AuthExpired {
                generation,
                call,
                challenge,
            } => {
                if st.lc.generation() == generation {
                    st.challenge = challenge;
                }
                st.step(&myself, Input::AuthExpired { generation });
                // Retried once: on the rebuilt session (queued meanwhile),
                // or on a later session that is already up.
                if let Some(call) = call {
                    st.send(&myself, call, false);
                }
            }
            BundleMsg::Tools(reply) => {
                let tools = st
                    .lc
                    .session()
                    .map(|l| {
                        l.session
                            .tools
                            .iter()
                            .filter_map(|t| serde_json::to_value(t).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let _ = reply.send((st.lc.state(), tools));
            }
            BundleMsg::Manifest(reply) => {
                let _ = reply.send(st.manifest.clone());
            }
            #[cfg(feature = "fault-injection")]
            BundleMsg::Panic => panic!(
                "fault injection: bundle actor {} panics on request",
                st.args.name
            ),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<BundleMsg>,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        st.args
            .shared
            .lanes
            .publish(&st.args.workspace, &st.args.name, None);
        let effects = st.decide(Input::Shutdown, 0.0);
        // The process is stopped here, not in a task: the actor is gone
        // only once its process is.
        let mut rest = Vec::new();
        for effect in effects {
            match effect {
                Effect::Stop { session, .. } => {
                    let exit = session
                        .session
                        .lifeline
                        .stop(st.args.shared.config.bundles.stop_grace)
                        .await;
                    tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, "bundle stopped ({exit})");
                }
                other => rest.push(other),
            }
        }
        st.run(&myself, rest);
        Ok(())
    }
}

/// Reports the process's exit (with its last stderr lines) to the actor.
fn watch_exit(
    observer: crate::bundle::process::ProcessObserver,
    stderr: StderrTail,
    myself: ActorRef<BundleMsg>,
    generation: u64,
) {
    tokio::spawn(async move {
        let exit = observer.wait().await;
        stderr.drained(Duration::from_millis(200)).await;
        let mut lines = stderr.lines();
        let keep = lines.len().saturating_sub(CRASH_STDERR_LINES);
        let stderr = lines.split_off(keep);
        let _ = myself.send_message(BundleMsg::Exited {
            generation,
            exit,
            stderr,
        });
    });
}

/// Pings the bundle every `ping_interval` while it is ready; after
/// `ping_failures` failures in a row it reports the bundle unresponsive.
fn spawn_pinger(
    peer: Peer<RoleClient>,
    sup: &Supervision,
    myself: ActorRef<BundleMsg>,
    generation: u64,
) -> Option<AbortOnDropHandle<()>> {
    if sup.ping_interval.is_zero() {
        return None;
    }
    let (interval, timeout, threshold) = (sup.ping_interval, sup.ping_timeout, sup.ping_failures);
    Some(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0;
        loop {
            ticks.tick().await;
            let ping = ClientRequest::PingRequest(PingRequest {
                method: Default::default(),
                extensions: Default::default(),
            });
            let last = match tokio::time::timeout(timeout, peer.send_request(ping)).await {
                Ok(Ok(_)) => {
                    failures = 0;
                    continue;
                }
                Ok(Err(e))
                    if crate::bundle::connect::wants_token(
                        e.is_authorization_required(),
                        e.auth_challenge(),
                    ) =>
                {
                    let _ = myself.send_message(BundleMsg::AuthExpired {
                        generation,
                        call: None,
                        challenge: e.auth_challenge().map(str::to_string),
                    });
                    return;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {}", humantime::format_duration(timeout)),
            };
            failures += 1;
            if failures >= threshold {
                let reason = format!("liveness check failed: {failures} pings in a row ({last})");
                let _ = myself.send_message(BundleMsg::Unresponsive { generation, reason });
                return;
            }
        }
    })))
}
