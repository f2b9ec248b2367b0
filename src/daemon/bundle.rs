//! BundleActor: owns one installed bundle's process and MCP session.
//!
//! Lifecycle (docs/ARCHITECTURE.md): `starting → ready`; a stop (exit,
//! failed start, failed liveness check) asks the [`RestartTracker`]:
//! `restarting` (after a backoff, `starting` again), `failed` (policy says
//! no, breaker tripped, or a configuration error no restart can fix) or
//! `stopped` (clean exit under `on-failure`/`never`). An operator restart or
//! a manifest upgrade goes `restarting → starting` at once and clears the
//! breaker. Each start runs in a task that ends in a `Started` message; a
//! generation number discards starts, exits and liveness reports of an
//! earlier start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientRequest, PingRequest,
    ProgressNotificationParam, ServerResult, Tool,
};
use rmcp::service::Peer;
use rmcp::service::PeerRequestOptions;
use rmcp::RoleClient;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::policy::{Decision, RestartTracker, Stop};
use super::Shared;
use crate::bundle::process::{ExitInfo, Lifeline, StderrTail};
use crate::bundle::{connect, ConnectError, ConnectOptions, Connection, HostContext};
use crate::config::Supervision;
use crate::host_resources::{HostRequest, PROVIDED_CAPABILITIES};
use crate::manifest::{LoadedManifest, Plan, PlanError, RemotePlan};
use crate::oauth::Silent;
use crate::protocol::{
    BundleState, BundleStatus, EventKind, ExitStatus, LifecycleEvent, SandboxRecord,
};
use crate::store::TokenSet;

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
    /// Restarts so far (kept across actor restarts by the WorkspaceActor).
    pub restarts: u32,
}

/// Why a tool call could not be made.
#[derive(Debug)]
pub enum CallError {
    NotReady {
        state: BundleState,
        last_error: Option<String>,
    },
    Timeout(Duration),
    Failed(String),
    /// The caller cancelled the call.
    Cancelled,
    /// The bundle has no such tool, or `[[exclude_tools]]` removed it.
    NoSuchTool,
}

/// Why a start failed.
pub struct StartFailure {
    kind: FailKind,
    reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailKind {
    /// May succeed if tried again: the restart policy decides.
    Transient,
    /// A configuration problem (manifest, gate, unreadable credentials)
    /// that a restart cannot fix: `failed`, no restart is attempted.
    Config,
    /// A required user_config value is missing: `needs_config`.
    NeedsConfig,
    /// Only an operator-completed authorization can help: `needs_auth`.
    NeedsAuth,
}

pub enum BundleMsg {
    /// Start (again); `manifest` is an already validated upgrade.
    Start {
        generation: u64,
        manifest: Option<Box<LoadedManifest>>,
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
    /// The manifest changed but was refused: keep running, say why.
    ManifestRejected(String),
    Call(PendingCall),
    /// A remote server answered 401 on the session of `generation` (to a
    /// call, which is retried once on the rebuilt session, or to a ping).
    AuthExpired {
        generation: u64,
        call: Option<PendingCall>,
    },
    Tools(RpcReplyPort<(BundleState, Vec<Value>)>),
    /// A clone of the live session's peer, for requests passed through.
    Peer(RpcReplyPort<Result<Peer<RoleClient>, CallError>>),
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

impl Respawn {
    fn event(self) -> (EventKind, &'static str) {
        match self {
            Respawn::Operator => (EventKind::Restarting, "restarting on request"),
            Respawn::Reconfigured => (
                EventKind::Reconfigured,
                "user_config changed: restarting with the new values",
            ),
            Respawn::Authorized => (
                EventKind::Reauthorized,
                "authorized by the operator: starting with the new token",
            ),
        }
    }
}

/// A tool call on its way to the bundle.
pub struct PendingCall {
    pub tool: String,
    pub arguments: Option<Map<String, Value>>,
    pub timeout: Option<Duration>,
    /// Cancelling it cancels the call (`notifications/cancelled` to the bundle).
    pub cancel: CancellationToken,
    /// Where the bundle's progress notifications for this call go.
    pub progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    pub reply: RpcReplyPort<Result<Value, CallError>>,
}

/// A successful start.
pub struct Started {
    connection: Connection,
    version: String,
    /// A remote bundle got a new token on the way (refresh or client credentials).
    reauthorized: bool,
}

struct Live {
    peer: Peer<RoleClient>,
    lifeline: Lifeline,
    ready_since: Instant,
    _pinger: Option<AbortOnDropHandle<()>>,
    in_flight: InFlight,
    progress: ProgressDispatcher,
    violation: crate::bundle::guard::Violation,
}

/// How long progress that raced its call's answer is still forwarded.
const PROGRESS_STRAGGLER_WAIT: Duration = Duration::from_millis(20);

/// The next progress notification of a subscription; never, without one.
async fn next_progress(
    subscription: &mut Option<rmcp::handler::client::progress::ProgressSubscriber>,
) -> Option<ProgressNotificationParam> {
    match subscription.as_mut() {
        Some(s) => match futures::StreamExt::next(s).await {
            Some(p) => Some(p),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Sends `notifications/cancelled` for a request whose answer nobody waits for.
struct AbandonGuard(Option<(Peer<RoleClient>, rmcp::model::RequestId)>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some((peer, id)) = self.0.take() {
            tokio::spawn(async move {
                let note = CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the caller".into()),
                );
                let _ = peer.notify_cancelled(note).await;
            });
        }
    }
}

/// Counts the tool calls in flight on one session, so a session being
/// replaced can be closed once they are done.
#[derive(Clone, Default)]
struct InFlight(Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>);

struct InFlightGuard(InFlight);

impl InFlight {
    fn enter(&self) -> InFlightGuard {
        self.0 .0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    async fn idle(&self) {
        loop {
            let notified = self.0 .1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0 .0.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self
            .0
             .0
             .0
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0 .0 .1.notify_waiters();
        }
    }
}

pub struct BundleActorState {
    args: BundleArgs,
    state: BundleState,
    generation: u64,
    live: Option<Live>,
    tools: Vec<Tool>,
    version: Option<String>,
    last_error: Option<String>,
    tracker: RestartTracker,
    /// Set when the daemon kills the process (liveness), to explain the exit.
    kill_reason: Option<String>,
    /// A remote session is being rebuilt after a 401.
    reauthing: bool,
    /// The sandbox of the running process (stdio bundles).
    sandbox: Option<SandboxRecord>,
    /// The start in progress (aborted if dropped).
    start_task: Option<AbortOnDropHandle<()>>,
    /// Calls waiting for the rebuilt session, each with whether it may still
    /// be retried after another 401 (a call is retried once).
    awaiting_auth: Vec<(PendingCall, bool)>,
}

impl BundleActorState {
    fn event(&self, kind: EventKind, message: impl Into<String>) -> LifecycleEvent {
        LifecycleEvent::new(
            &self.args.workspace,
            &self.args.name,
            kind,
            self.state,
            message,
        )
    }

    /// The bundle's current line in `status`, and since when it is ready.
    fn status(&self) -> (BundleStatus, Option<std::time::Instant>) {
        let status = BundleStatus {
            workspace: self.args.workspace.clone(),
            name: self.args.name.clone(),
            version: self.version.clone(),
            state: self.state,
            pid: self.live.as_ref().and_then(|l| l.lifeline.pid()),
            uptime_secs: None,
            restarts: self.args.restarts,
            tools: self.tools.len(),
            last_error: self.last_error.clone(),
            source: self.args.source.display().to_string(),
            sandbox: self.sandbox.clone(),
            usage: None,
        };
        let ready_since = self
            .live
            .as_ref()
            .filter(|_| self.state == BundleState::Ready)
            .map(|l| l.ready_since.into_std());
        (status, ready_since)
    }

    fn publish(&self, event: LifecycleEvent) {
        let (status, ready_since) = self.status();
        self.args.shared.board.publish(status, ready_since, event);
    }

    fn supervision(&self) -> &Supervision {
        &self.args.shared.config.supervision
    }

    fn fail(&mut self, reason: String, before: Option<LifecycleEvent>) {
        tracing::warn!(workspace = %self.args.workspace, bundle = %self.args.name, "bundle failed: {reason}");
        self.settle(BundleState::Failed, EventKind::Failed, reason, before);
    }

    /// Not running, and waiting for the operator (`failed`, `needs_config`,
    /// `needs_auth`): nothing is retried until they act.
    fn settle(
        &mut self,
        state: BundleState,
        kind: EventKind,
        reason: String,
        before: Option<LifecycleEvent>,
    ) {
        self.state = state;
        self.tools.clear();
        self.last_error = Some(reason.clone());
        self.emit_before(before);
        self.publish(self.event(kind, reason));
    }

    /// Emits an event that precedes the decision's (e.g. `exited`), stamped
    /// with the state the decision led to.
    fn emit_before(&self, before: Option<LifecycleEvent>) {
        if let Some(mut e) = before {
            e.state = self.state;
            self.args.shared.board.emit(e);
        }
    }

    /// The bundle stopped running: restart, stay down or trip the breaker.
    fn after_stop(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        stop: Stop,
        ready_for: Option<Duration>,
        before: Option<LifecycleEvent>,
    ) {
        let policy = self
            .supervision()
            .restart_for(&self.args.workspace, &self.args.name);
        let sup = self.args.shared.config.supervision.clone();
        match self.tracker.decide(
            &sup,
            policy,
            &stop,
            ready_for,
            Instant::now(),
            fastrand::f64(),
        ) {
            Decision::Restart { attempt, delay } => {
                self.generation += 1;
                self.args.restarts += 1;
                self.state = BundleState::Restarting;
                self.tools.clear();
                if let Stop::Failure(reason) = &stop {
                    self.last_error = Some(reason.clone());
                }
                self.emit_before(before);
                let when = if delay.is_zero() {
                    "at once".to_string()
                } else {
                    let delay = Duration::from_millis(delay.as_millis() as u64);
                    format!("in {}", humantime::format_duration(delay))
                };
                let message = format!("{}; restarting {when} (attempt {attempt})", stop.reason());
                tracing::info!(workspace = %self.args.workspace, bundle = %self.args.name, "{message}");
                let mut event = self.event(EventKind::Restarting, message);
                event.attempt = Some(attempt);
                event.delay_ms = Some(delay.as_millis() as u64);
                self.publish(event);
                let generation = self.generation;
                let start = move || BundleMsg::Start {
                    generation,
                    manifest: None,
                };
                if delay.is_zero() {
                    let _ = myself.send_message(start());
                } else {
                    myself.send_after(delay, start);
                }
            }
            Decision::StayDown => match stop {
                Stop::Clean(reason) => {
                    self.state = BundleState::Stopped;
                    self.tools.clear();
                    self.emit_before(before);
                    self.publish(self.event(EventKind::Stopped, reason));
                }
                Stop::Failure(reason) => self.fail(reason, before),
            },
            Decision::Tripped(reason) => self.fail(reason, before),
        }
    }

    /// Runs a tool call on a clone of the peer. A 401 from a remote server
    /// sends the call back to the actor to be retried once (`retry`) on the
    /// rebuilt session.
    fn spawn_call(&self, myself: &ActorRef<BundleMsg>, call: PendingCall, retry: bool) {
        let Some(live) = self.live.as_ref() else {
            let _ = call.reply.send(Err(CallError::NotReady {
                state: self.state,
                last_error: self.last_error.clone(),
            }));
            return;
        };
        let peer = live.peer.clone();
        let in_flight = live.in_flight.enter();
        let dispatcher = live.progress.clone();
        let timeout = call
            .timeout
            .unwrap_or(self.args.shared.config.bundles.call_timeout);
        let (generation, myself) = (self.generation, myself.clone());
        tokio::spawn(async move {
            let mut params = CallToolRequestParams::new(call.tool.clone());
            if let Some(arguments) = call.arguments.clone() {
                params = params.with_arguments(arguments);
            }
            let request = ClientRequest::CallToolRequest(rmcp::model::Request::new(params));
            let handle = match peer
                .send_cancellable_request(request, PeerRequestOptions::no_options())
                .await
            {
                Ok(handle) => handle,
                Err(e) => {
                    let _ = call.reply.send(Err(CallError::Failed(e.to_string())));
                    return;
                }
            };
            // Until the answer arrives, dropping this (timeout, cancel)
            // sends notifications/cancelled to the bundle.
            let mut abandon = AbandonGuard(Some((peer.clone(), handle.id.clone())));
            // Progress: the bundle reports against the token rmcp put in the
            // request. Forwarded in order, ahead of the answer.
            let mut subscription = match &call.progress {
                Some(_) => Some(dispatcher.subscribe(handle.progress_token.clone()).await),
                None => None,
            };
            let response = tokio::time::timeout(timeout, handle.await_response());
            tokio::pin!(response);
            let mut reported = false;
            let outcome = loop {
                tokio::select! {
                    biased;
                    Some(p) = next_progress(&mut subscription) => {
                        reported = true;
                        if let Some(tx) = &call.progress {
                            let _ = tx.send(p).await;
                        }
                    }
                    r = &mut response => break Some(r),
                    _ = call.cancel.cancelled() => break None,
                }
            };
            // rmcp hands each notification to a task of its own, so one a
            // reporting bundle sent just before its answer may still be on
            // its way. (Calls that reported nothing do not wait: every MCP
            // client asks for progress, few tools send any.)
            if let (true, Some(sub), Some(tx)) = (reported, subscription.as_mut(), &call.progress) {
                while let Ok(Some(p)) =
                    tokio::time::timeout(PROGRESS_STRAGGLER_WAIT, futures::StreamExt::next(sub))
                        .await
                {
                    let _ = tx.send(p).await;
                }
            }
            if let Some(Ok(_)) = &outcome {
                abandon.0 = None;
            }
            drop(abandon);
            let result = match outcome {
                None => Err(CallError::Cancelled),
                Some(Err(_)) => Err(CallError::Timeout(timeout)),
                Some(Ok(Err(e))) if retry && e.is_authorization_required() => {
                    let _ = myself.send_message(BundleMsg::AuthExpired {
                        generation,
                        call: Some(call),
                    });
                    return;
                }
                Some(Ok(Err(e))) => Err(CallError::Failed(e.to_string())),
                Some(Ok(Ok(ServerResult::CallToolResult(r)))) => {
                    serde_json::to_value(r).map_err(|e| CallError::Failed(e.to_string()))
                }
                Some(Ok(Ok(other))) => Err(CallError::Failed(format!(
                    "the bundle answered tools/call with something else: {}",
                    serde_json::to_string(&other).unwrap_or_default()
                ))),
            };
            drop(in_flight);
            let _ = call.reply.send(result);
        });
    }

    /// Answers the calls that waited for a rebuild that did not come up.
    fn refuse_awaiting(&mut self, reason: &str) {
        for (call, _) in self.awaiting_auth.drain(..) {
            let _ = call.reply.send(Err(CallError::Failed(format!(
                "the session could not be rebuilt after a 401: {reason}"
            ))));
        }
    }

    /// A 401 on the live remote session: get a new token and rebuild it
    /// through the one connect function. The old session is not cut: calls
    /// in flight on it finish (or come back with their own 401 and wait for
    /// the new session), and it is closed once idle or after the call
    /// timeout. Not counted as a restart.
    fn rebuild_for_auth(&mut self, myself: &ActorRef<BundleMsg>) {
        tracing::info!(workspace = %self.args.workspace, bundle = %self.args.name, "remote server answered 401; getting a new token");
        self.generation += 1;
        self.reauthing = true;
        self.state = BundleState::Restarting;
        self.tools.clear();
        if let Some(old) = self.live.take() {
            let limit = self.args.shared.config.bundles.call_timeout;
            tokio::spawn(async move {
                let Live {
                    peer,
                    lifeline,
                    _pinger,
                    in_flight,
                    ..
                } = old;
                drop(_pinger);
                // Wait until nothing is in flight on the old session any more.
                let _ = tokio::time::timeout(limit, in_flight.idle()).await;
                drop(peer);
                lifeline.stop(Duration::ZERO).await;
            });
        }
        self.publish(self.event(
            EventKind::Restarting,
            "the remote server answered 401 (authorization expired): getting a new token and rebuilding the session",
        ));
        let generation = self.generation;
        let _ = myself.send_message(BundleMsg::Start {
            generation,
            manifest: None,
        });
    }

    /// Stops the current process in a task and starts again at once.
    fn restart_now(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        kind: EventKind,
        message: &str,
        manifest: Option<Box<LoadedManifest>>,
    ) {
        self.tracker.reset();
        self.generation += 1;
        self.args.restarts += 1;
        self.state = BundleState::Restarting;
        self.tools.clear();
        let live = self.live.take();
        self.publish(self.event(kind, message));
        let grace = self.args.shared.config.bundles.stop_grace;
        let generation = self.generation;
        let myself = myself.clone();
        tokio::spawn(async move {
            if let Some(live) = live {
                live.lifeline.stop(grace).await;
            }
            let _ = myself.send_message(BundleMsg::Start {
                generation,
                manifest,
            });
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
        myself: ActorRef<BundleMsg>,
        args: BundleArgs,
    ) -> Result<BundleActorState, ActorProcessingErr> {
        myself.send_message(BundleMsg::Start {
            generation: 0,
            manifest: None,
        })?;
        Ok(BundleActorState {
            args,
            state: BundleState::Starting,
            generation: 0,
            live: None,
            tools: Vec::new(),
            version: None,
            last_error: None,
            tracker: RestartTracker::default(),
            kill_reason: None,
            reauthing: false,
            sandbox: None,
            start_task: None,
            awaiting_auth: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BundleMsg>,
        msg: BundleMsg,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BundleMsg::Start {
                generation,
                manifest,
            } if generation == st.generation => {
                st.state = BundleState::Starting;
                st.tools.clear();
                st.publish(st.event(EventKind::Starting, "starting"));
                let shared = st.args.shared.clone();
                let (workspace, name, source) = (
                    st.args.workspace.clone(),
                    st.args.name.clone(),
                    st.args.source.clone(),
                );
                let host = HostContext::new(&workspace, &name, st.args.host_port.clone());
                // Held by the actor: a start superseded by a newer one, or
                // cut short by an uninstall or shutdown, is aborted, and its
                // half-started process killed with it (the Lifeline guard).
                st.start_task = Some(AbortOnDropHandle::new(tokio::spawn(async move {
                    let report = {
                        let myself = myself.clone();
                        move |record| {
                            let _ =
                                myself.send_message(BundleMsg::SandboxReady { generation, record });
                        }
                    };
                    let result = start(
                        &shared,
                        &workspace,
                        &name,
                        source,
                        manifest.map(|m| *m),
                        host,
                        report,
                    )
                    .await
                    .map(Box::new);
                    if let Err(ractor::MessagingErr::SendErr(BundleMsg::Started {
                        result: Ok(started),
                        ..
                    })) = myself.send_message(BundleMsg::Started { generation, result })
                    {
                        // The actor is gone: do not leave the process behind.
                        started
                            .connection
                            .lifeline
                            .stop(shared.config.bundles.stop_grace)
                            .await;
                    }
                })));
            }
            BundleMsg::Start { .. } => {}
            BundleMsg::SandboxReady { generation, record } => {
                if generation == st.generation {
                    st.sandbox = Some(record);
                    let (status, ready_since) = st.status();
                    st.args.shared.board.update(status, ready_since);
                }
            }
            BundleMsg::Started { generation, result } => {
                if generation != st.generation {
                    if let Ok(started) = result {
                        let grace = st.args.shared.config.bundles.stop_grace;
                        tokio::spawn(async move { started.connection.lifeline.stop(grace).await });
                    }
                    return Ok(());
                }
                match result.map(|started| *started) {
                    Ok(Started {
                        connection,
                        version,
                        reauthorized,
                    }) => {
                        let observer = connection.lifeline.observer();
                        let pinger = spawn_pinger(
                            connection.peer.clone(),
                            st.supervision(),
                            myself.clone(),
                            generation,
                        );
                        st.version = Some(version);
                        let excluded = st
                            .args
                            .shared
                            .config
                            .excluded_tools(&st.args.workspace, &st.args.name);
                        st.tools = connection
                            .tools
                            .into_iter()
                            .filter(|t| !excluded.iter().any(|e| e == t.name.as_ref()))
                            .collect();
                        st.live = Some(Live {
                            peer: connection.peer,
                            lifeline: connection.lifeline,
                            ready_since: Instant::now(),
                            _pinger: pinger,
                            in_flight: InFlight::default(),
                            progress: connection.progress,
                            violation: connection.violation,
                        });
                        st.state = BundleState::Ready;
                        st.last_error = None;
                        tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, pid = ?observer.pid(), tools = st.tools.len(), "bundle ready");
                        if reauthorized {
                            st.args.shared.board.emit(st.event(
                                EventKind::Reauthorized,
                                "new token obtained; session rebuilt",
                            ));
                        }
                        st.publish(st.event(EventKind::Ready, "ready"));
                        watch_exit(observer, connection.stderr, myself.clone(), generation);
                        st.reauthing = false;
                        for (call, retry) in std::mem::take(&mut st.awaiting_auth) {
                            st.spawn_call(&myself, call, retry);
                        }
                    }
                    Err(StartFailure { kind, reason }) => {
                        st.reauthing = false;
                        st.refuse_awaiting(&reason);
                        match kind {
                            FailKind::Config => st.fail(reason, None),
                            FailKind::NeedsConfig => {
                                tracing::warn!(workspace = %st.args.workspace, bundle = %st.args.name, "bundle needs configuration: {reason}");
                                st.settle(
                                    BundleState::NeedsConfig,
                                    EventKind::NeedsConfig,
                                    reason,
                                    None,
                                )
                            }
                            FailKind::NeedsAuth => {
                                tracing::warn!(workspace = %st.args.workspace, bundle = %st.args.name, "bundle needs authorization: {reason}");
                                st.settle(
                                    BundleState::NeedsAuth,
                                    EventKind::NeedsAuth,
                                    reason,
                                    None,
                                )
                            }
                            FailKind::Transient => {
                                st.after_stop(&myself, Stop::Failure(reason), None, None)
                            }
                        }
                    }
                }
            }
            BundleMsg::Exited {
                generation,
                exit,
                stderr,
            } => {
                if generation != st.generation {
                    return Ok(());
                }
                let Some(live) = st.live.take() else {
                    return Ok(());
                };
                let kill_reason = live.violation.get().or(st.kill_reason.take());
                let stop = match kill_reason {
                    Some(reason) => Stop::Failure(format!("{reason}; process {exit}")),
                    None if exit.code == Some(0) => {
                        Stop::Clean("process exited cleanly (exit code 0)".into())
                    }
                    None if live.lifeline.pid().is_none() => {
                        Stop::Failure("the remote session ended (connection closed)".into())
                    }
                    None => Stop::Failure(format!("process exited ({exit})")),
                };
                let mut exited = st.event(
                    EventKind::Exited,
                    match live.lifeline.pid() {
                        Some(pid) => format!("process {pid} exited ({exit})"),
                        None => "remote session ended".to_string(),
                    },
                );
                exited.exit = Some(ExitStatus {
                    code: exit.code,
                    signal: exit.signal,
                });
                exited.stderr = stderr;
                st.after_stop(
                    &myself,
                    stop,
                    Some(live.ready_since.elapsed()),
                    Some(exited),
                );
            }
            BundleMsg::Unresponsive { generation, reason } => {
                if let Some(live) = st.live.as_ref().filter(|_| generation == st.generation) {
                    tracing::warn!(workspace = %st.args.workspace, bundle = %st.args.name, "{reason}; killing the bundle");
                    st.kill_reason = Some(reason);
                    let (lifeline, grace) = (
                        live.lifeline.clone(),
                        st.args.shared.config.bundles.stop_grace,
                    );
                    tokio::spawn(async move { lifeline.stop(grace).await });
                }
            }
            BundleMsg::Respawn(why, reply) => {
                let (kind, message) = why.event();
                st.restart_now(&myself, kind, message, None);
                let _ = reply.send(());
            }
            BundleMsg::Upgrade(manifest) => {
                let message = format!(
                    "manifest changed (version {}): restarting with it",
                    manifest.manifest.version
                );
                st.restart_now(&myself, EventKind::Upgrading, &message, Some(manifest));
            }
            BundleMsg::ManifestRejected(reason) => {
                let running = matches!(st.state, BundleState::Ready | BundleState::Starting);
                let message = if running {
                    format!("manifest change rejected, the running version keeps running: {reason}")
                } else {
                    format!("manifest change rejected: {reason}")
                };
                st.last_error = Some(message.clone());
                st.publish(st.event(EventKind::ManifestRejected, message));
            }
            BundleMsg::Call(call) => {
                let excluded = st
                    .args
                    .shared
                    .config
                    .excluded_tools(&st.args.workspace, &st.args.name);
                if excluded.contains(&call.tool) {
                    let _ = call.reply.send(Err(CallError::NoSuchTool));
                } else if st.live.is_some() && st.state == BundleState::Ready {
                    let ended = st
                        .live
                        .as_ref()
                        .is_some_and(|l| l.peer.is_transport_closed());
                    if ended {
                        // The session just ended and its exit is on the way:
                        // the call was never sent, and the bundle is about to
                        // restart (a caller may wait for that).
                        let _ = call.reply.send(Err(CallError::NotReady {
                            state: BundleState::Restarting,
                            last_error: Some("the bundle's session just ended".into()),
                        }));
                    } else {
                        st.spawn_call(&myself, call, true);
                    }
                } else if st.reauthing {
                    st.awaiting_auth.push((call, true));
                } else {
                    let _ = call.reply.send(Err(CallError::NotReady {
                        state: st.state,
                        last_error: st.last_error.clone(),
                    }));
                }
            }
            BundleMsg::AuthExpired { generation, call } => {
                let current = generation == st.generation;
                match st.state {
                    BundleState::Ready if current => {
                        // The first 401 of this session: one rebuild, however
                        // many calls were refused (they wait for it).
                        st.awaiting_auth.extend(call.map(|c| (c, false)));
                        st.rebuild_for_auth(&myself);
                    }
                    // A later session is already up: retry there, once.
                    BundleState::Ready => {
                        if let Some(call) = call {
                            st.spawn_call(&myself, call, false);
                        }
                    }
                    // A rebuild is under way: retry after it.
                    _ if st.reauthing => st.awaiting_auth.extend(call.map(|c| (c, false))),
                    state => {
                        if let Some(call) = call {
                            let _ = call.reply.send(Err(CallError::NotReady {
                                state,
                                last_error: st.last_error.clone(),
                            }));
                        }
                    }
                }
            }
            BundleMsg::Peer(reply) => {
                let peer = match st.live.as_ref().filter(|_| st.state == BundleState::Ready) {
                    Some(live) => Ok(live.peer.clone()),
                    None => Err(CallError::NotReady {
                        state: st.state,
                        last_error: st.last_error.clone(),
                    }),
                };
                let _ = reply.send(peer);
            }
            BundleMsg::Tools(reply) => {
                let tools = st
                    .tools
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect();
                let _ = reply.send((st.state, tools));
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
        _myself: ActorRef<BundleMsg>,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        st.generation += 1;
        // A start in progress is aborted; its process dies with its guard.
        st.start_task = None;
        if let Some(live) = st.live.take() {
            let exit = live
                .lifeline
                .stop(st.args.shared.config.bundles.stop_grace)
                .await;
            tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, "bundle stopped ({exit})");
        }
        st.state = BundleState::Stopped;
        st.tools.clear();
        st.publish(st.event(EventKind::Stopped, "stopped"));
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
                Ok(Err(e)) if e.is_authorization_required() => {
                    let _ = myself.send_message(BundleMsg::AuthExpired {
                        generation,
                        call: None,
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

/// Reads and gates the manifest again (unless an upgrade brought a validated
/// one), resolves the launch plan and connects. Runs in a task, never in the
/// actor's handler.
async fn start(
    shared: &Shared,
    workspace: &str,
    name: &str,
    source: PathBuf,
    manifest: Option<LoadedManifest>,
    host: HostContext,
    report_sandbox: impl FnOnce(SandboxRecord),
) -> Result<Started, StartFailure> {
    let config = |reason: String| StartFailure {
        kind: FailKind::Config,
        reason,
    };
    let loaded = match manifest {
        Some(m) => m,
        None => tokio::task::spawn_blocking(move || crate::manifest::load(&source))
            .await
            .map_err(|e| config(format!("manifest reader failed: {e}")))?
            .map_err(|e| config(e.to_string()))?,
    };
    let manifest = &loaded.manifest;
    if manifest.name != name {
        return Err(config(format!(
            "manifest {} now names the bundle {:?}, but it was installed as {name:?}; uninstall and install it again",
            loaded.file.display(),
            manifest.name
        )));
    }
    crate::manifest::gate(manifest, PROVIDED_CAPABILITIES).map_err(|e| config(e.to_string()))?;
    let values = shared
        .credentials_of(workspace, name, |c, w, n| c.values(w, n))
        .await
        .map_err(|e| config(e.to_string()))?;
    let plan = manifest
        .plan(&loaded.dir, &values)
        .map_err(|e| match e {
            PlanError::MissingConfig(keys) => StartFailure {
                kind: FailKind::NeedsConfig,
                reason: format!(
                    "required user_config value(s) not set: {}; set them with `bundlevisor configure {name} -w {workspace} {}`",
                    keys.join(", "),
                    keys.iter().map(|k| format!("{k}=VALUE")).collect::<Vec<_>>().join(" ")
                ),
            },
            other => config(other.to_string()),
        })?;
    let _permit = shared
        .start_permits
        .acquire()
        .await
        .map_err(|_| config("daemon is shutting down".into()))?;
    // The sandbox of a stdio bundle: created (or found) before each start.
    let sandbox = match &plan {
        Plan::Stdio(launch) => {
            let (settings, state_dir, protected, ws, bundle, cwd, command) = (
                shared.config.sandbox.clone(),
                shared.config.state_dir.clone(),
                shared.config.protected_paths(),
                workspace.to_string(),
                name.to_string(),
                launch.cwd.clone(),
                launch.command.clone(),
            );
            // A bare manifest file's folder is not the bundle's to read.
            let folder = (!loaded.is_bare()).then(|| loaded.dir.clone());
            let prepared = tokio::task::spawn_blocking(move || {
                let target = crate::bundle::sandbox::Target {
                    workspace: &ws,
                    bundle: &bundle,
                    folder: folder.as_deref(),
                    command: &command,
                    cwd: &cwd,
                };
                crate::bundle::sandbox::prepare(&settings, &state_dir, &protected, &target)
            })
            .await
            .map_err(|e| config(format!("sandbox task failed: {e}")))?
            .map_err(|e| config(e.to_string()))?;
            Some(prepared)
        }
        Plan::Remote(_) => None,
    };
    if let Some(s) = &sandbox {
        report_sandbox(s.record.clone());
    }
    let opts = ConnectOptions {
        log: crate::bundle::logfile::LogTarget {
            path: shared.config.log_path(workspace, name),
            max_bytes: shared.config.logs.max_bytes,
            keep: shared.config.logs.keep,
            bus: Some(shared.log_lines.clone()),
        },
        start_timeout: shared.config.bundles.start_timeout,
        stop_grace: shared.config.bundles.stop_grace,
        host_resources: shared.config.host_resources.clone(),
        reaper: shared.reaper.clone(),
        bearer: None,
        max_message_bytes: shared.config.bundles.max_message_bytes,
        sandbox,
    };
    let (connection, reauthorized) = match &plan {
        Plan::Stdio(_) => (
            connect(&plan, host, &opts)
                .await
                .map_err(|e| transient(&plan, e))?,
            false,
        ),
        Plan::Remote(remote) => {
            connect_with_auth(shared, workspace, name, &plan, remote, host, opts).await?
        }
    };
    Ok(Started {
        connection,
        version: manifest.version.clone(),
        reauthorized,
    })
}

/// A start failure worth retrying; the text is redacted (a command line or
/// a stderr line may carry a secret).
fn transient(plan: &Plan, e: ConnectError) -> StartFailure {
    StartFailure {
        kind: FailKind::Transient,
        reason: plan.redactor().redact(&e.to_string()).into_owned(),
    }
}

/// A stored access token this close to its expiry is refreshed before use.
const EXPIRY_MARGIN_SECS: i64 = 30;

/// Connects a remote bundle with its stored token. On 401: one silent
/// token attempt (stored refresh token, then client credentials), stored at
/// once, and one rebuild through the one connect function. When only the
/// interactive flow can help: `needs_auth`, never a restart loop.
async fn connect_with_auth(
    shared: &Shared,
    workspace: &str,
    name: &str,
    plan: &Plan,
    remote: &RemotePlan,
    host: HostContext,
    mut opts: ConnectOptions,
) -> Result<(Connection, bool), StartFailure> {
    let stored = {
        shared
            .credentials_of(workspace, name, |c, w, n| c.tokens(w, n))
            .await
            .map_err(|e| StartFailure {
                kind: FailKind::Config,
                reason: e.to_string(),
            })?
            .unwrap_or_default()
    };
    opts.bearer = stored.access_token.clone();
    // A token known to have expired is refreshed first: no 401 round trip.
    let expired = stored.refresh_token.is_some()
        && stored
            .expires_at
            .is_some_and(|at| at <= crate::clock::unix_secs() + EXPIRY_MARGIN_SECS);
    let challenge = if expired {
        None
    } else {
        match connect(plan, host.clone(), &opts).await {
            Ok(connection) => return Ok((connection, false)),
            Err(ConnectError::Unauthorized { challenge }) => challenge,
            Err(e) => return Err(transient(plan, e)),
        }
    };
    let needs_auth = |why: &str| {
        StartFailure {
        kind: FailKind::NeedsAuth,
        reason: format!(
            "the remote server {} requires authorization ({why}); run `bundlevisor auth {name} -w {workspace}`",
            remote.url
        ),
    }
    };
    let save = |tokens: TokenSet| {
        shared.credentials_of(workspace, name, move |c, w, n| {
            c.set_tokens(w, n, Some(&tokens))
        })
    };
    let http = crate::oauth::http_client();
    match crate::oauth::obtain_silently(&http, remote, &stored, challenge.as_deref()).await {
        Err(e) => Err(StartFailure {
            // A URL or metadata the rules refuse does not get better by
            // retrying: the operator has to change the bundle or the server.
            kind: match e {
                crate::oauth::OAuthError::InsecureUrl { .. }
                | crate::oauth::OAuthError::Mismatch(_) => FailKind::Config,
                _ => FailKind::Transient,
            },
            reason: format!("the remote server wants a new token, and getting one failed: {e}"),
        }),
        Ok(Silent::Interactive(why)) => {
            // Tokens that no longer work are forgotten; a registered client is kept.
            let keep = TokenSet {
                client_id: stored.client_id.clone(),
                client_secret: stored.client_secret.clone(),
                ..Default::default()
            };
            if let Err(e) = save(keep).await {
                tracing::warn!(
                    workspace,
                    bundle = name,
                    "cannot forget refused tokens: {e}"
                );
            }
            Err(needs_auth(&why))
        }
        Ok(Silent::Tokens(tokens)) => {
            opts.bearer = tokens.access_token.clone();
            save(tokens).await.map_err(|e| StartFailure {
                kind: FailKind::Transient,
                reason: format!("cannot store the new token: {e}"),
            })?;
            tracing::info!(
                workspace,
                bundle = name,
                "new token obtained; rebuilding the session"
            );
            match connect(plan, host, &opts).await {
                Ok(connection) => Ok((connection, true)),
                Err(ConnectError::Unauthorized { .. }) => {
                    Err(needs_auth("it refused a freshly issued token"))
                }
                Err(e) => Err(transient(plan, e)),
            }
        }
    }
}
