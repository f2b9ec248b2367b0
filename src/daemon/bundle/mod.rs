//! BundleActor: owns one installed bundle's process and MCP session.
//!
//! All of a bundle's lifecycle state is [`Lifecycle`]'s, a pure state
//! machine (which manifest a start uses, the calls waiting for a rebuilt
//! session, which tools are excluded included); this actor holds it, its
//! mailbox and the handles of the effects it runs: it turns messages into
//! inputs and runs the effects `step` returns (start tasks, timers, stops,
//! calls, events). `start.rs` is the start task (manifest on disk, plan,
//! sandbox, connect, OAuth retry); `session.rs` the ready session
//! ([`Live`]) that the actor, [`Lanes`] and calls share; `call.rs` the one
//! path of a request to the bundle.

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
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::lifecycle::{
    self, Exit, FailKind, Input, Lifecycle, Note, Refusal, RestartRules, StartFailure, Up, Wanted,
};
use super::Shared;
use crate::bundle::HostContext;
use crate::config::Supervision;
use crate::host_resources::HostRequest;
use crate::manifest::LoadedManifest;
use crate::protocol::{
    BundleState, BundleStatus, EventKind, ExitStatus, LifecycleEvent, SandboxRecord,
};
use crate::telemetry::{Attribute, Kind, Span};

pub use super::lifecycle::Respawn;
pub use call::{run, Answered, BundleRequest, CallError, PendingCall};
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
    /// The ready session of `generation` ended (its watcher saw it).
    Exited {
        generation: u64,
        exit: Exit,
    },
    /// The liveness check gave up on the process.
    Unresponsive {
        generation: u64,
        reason: String,
    },
    /// Stop the current process (if any) and start again at once, because
    /// of `Respawn`; answers once the new start is under way.
    Respawn(Respawn, RpcReplyPort<()>),
    /// The manifest changed and passed validation: restart with it, from
    /// `source` from now on (an operator's upgrade brings a new copy).
    Upgrade {
        manifest: Box<LoadedManifest>,
        source: PathBuf,
    },
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
    Tools(RpcReplyPort<(BundleState, Vec<rmcp::model::Tool>)>),
    /// The manifest the bundle runs (None before its first start).
    Manifest(RpcReplyPort<Option<LoadedManifest>>),
    #[cfg(feature = "fault-injection")]
    Panic,
}

impl lifecycle::Session for Arc<Live> {
    fn serves(&self, tool: &str) -> bool {
        Live::serves(self, tool)
    }

    fn closed(&self) -> bool {
        Live::closed(self)
    }
}

impl lifecycle::Manifest for LoadedManifest {
    fn version(&self) -> &str {
        &self.manifest.version
    }

    fn needs_environment(&self) -> bool {
        self.manifest.is_uv()
    }

    fn same_as(&self, other: &Self) -> bool {
        same_archive(self, other)
    }
}

/// Both run from the same unpacked archive (`archives/SHA256`: the same
/// bytes) with the same manifest.
pub(crate) fn same_archive(a: &LoadedManifest, b: &LoadedManifest) -> bool {
    a.dir == b.dir
        && a.text == b.text
        && a.dir
            .parent()
            .is_some_and(|root| crate::archive::unpacked_sha(&a.dir, root).is_some())
}

impl lifecycle::Call for PendingCall {
    fn tool(&self) -> Option<&str> {
        PendingCall::tool(self)
    }
}

type Effect = lifecycle::Effect<Arc<Live>, LoadedManifest, PendingCall>;

pub struct BundleActorState {
    args: BundleArgs,
    lc: Lifecycle<Arc<Live>, LoadedManifest, PendingCall>,
    /// The sandbox of the current generation (stdio bundles).
    sandbox: Option<SandboxRecord>,
    /// The archive the bundle runs from, if it came as one.
    archive: Option<crate::protocol::ArchiveInfo>,
    /// The secret references the running process's values were read from.
    secret_refs: Vec<crate::protocol::SecretRefStatus>,
    /// The start in progress (aborted if dropped).
    start_task: Option<AbortOnDropHandle<()>>,
    /// The environment of an upgrade being built while the running
    /// version serves (aborted if dropped: a newer upgrade, an uninstall).
    preparing: Option<AbortOnDropHandle<()>>,
    /// The source an operator's upgrade just brought: taken by the build
    /// of its environment, else the bundle's source from now on.
    offered: Option<PathBuf>,
    /// The source of the upgrade whose environment is being built: the
    /// bundle's once built; given back to the old one in the install
    /// record if the build fails.
    building_from: Option<PathBuf>,
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
            version: self.lc.manifest().map(|m| m.manifest.version.clone()),
            state: self.lc.state(),
            pid: live.and_then(|l| l.session.lifeline.pid()),
            uptime_secs: None,
            restarts: self.lc.restarts(),
            tools: live.map_or(0, |l| l.session.tools.len()),
            last_error: self.lc.last_error().map(str::to_string),
            last_error_at: self.lc.last_error_at(),
            source: self.args.source.display().to_string(),
            sandbox: self.sandbox.clone(),
            usage: None,
            archive: self.archive.clone(),
            mcp: live.map(|l| crate::protocol::McpRevision {
                revision: l.session.revision.to_string(),
                why: l.session.revision_why.clone(),
            }),
            unpacking: None,
            secret_refs: self.secret_refs.clone(),
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
    fn step(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        input: Input<Arc<Live>, LoadedManifest, PendingCall>,
    ) {
        let effects = self.decide(input, fastrand::f64());
        self.run(myself, effects);
        // The pinger belongs to the ready session.
        let ready = self.lc.session().map(|l| l.generation);
        if self.pinger.as_ref().map(|(g, _)| *g) != ready {
            self.pinger = None;
        }
    }

    fn decide(
        &mut self,
        input: Input<Arc<Live>, LoadedManifest, PendingCall>,
        jitter: f64,
    ) -> Vec<Effect> {
        let shared = self.args.shared.clone();
        let sup = &shared.config.supervision;
        let env = RestartRules {
            supervision: sup,
            policy: sup.restart_for(&self.args.workspace, &self.args.name),
            jitter,
        };
        self.lc.step(input, Instant::now(), &env)
    }

    /// Runs the effects of one step; then the status it led to is
    /// published, followed by its events in order.
    fn run(&mut self, myself: &ActorRef<BundleMsg>, effects: Vec<Effect>) {
        let notes: Vec<Note> = effects
            .into_iter()
            .filter_map(|effect| self.run_one(myself, effect))
            .collect();
        if notes.is_empty() {
            return;
        }
        self.update_board();
        for note in notes {
            self.log(&note);
            self.args.shared.board.emit(self.event(note));
        }
    }

    /// Runs one effect; an event to publish is handed back.
    fn run_one(&mut self, myself: &ActorRef<BundleMsg>, effect: Effect) -> Option<Note> {
        let grace = self.args.shared.config.bundles.stop_grace;
        match effect {
            Effect::Spawn {
                generation,
                manifest,
                challenge,
            } => self.spawn_start(myself, generation, manifest, challenge),
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
            Effect::Watch => self.watch(myself),
            Effect::Kill => {
                if let Some(live) = self.lc.session() {
                    let lifeline = live.session.lifeline.clone();
                    tokio::spawn(async move { lifeline.stop(grace).await });
                }
            }
            Effect::Drain(session) => self.drain(session),
            Effect::AbortStart => self.start_task = None,
            Effect::Prepare(manifest) => {
                self.building_from = self.offered.take();
                self.prepare_upgrade(myself, manifest)
            }
            Effect::AbortPrepare => {
                self.preparing = None;
                self.building_from = None;
            }
            Effect::Send { call, retry } => match self.lc.session() {
                Some(live) => call::spawn(live.lane(), call, retry, myself.clone()),
                None => unreachable!("the lifecycle sends only to a ready session"),
            },
            Effect::Refuse { call, refusal } => {
                let _ = call.reply.send(Err(match refusal {
                    Refusal::NoSuchTool => CallError::NoSuchTool,
                    Refusal::NotReady { state, last_error } => {
                        CallError::NotReady { state, last_error }
                    }
                }));
            }
            Effect::OpenLane => self.publish_lane(self.lc.session().cloned()),
            Effect::CloseLane => self.publish_lane(None),
            Effect::Publish(note) => return Some(note),
        }
        None
    }

    /// Publishes the session calls may run on directly, or none (then
    /// every call comes through the actor).
    fn publish_lane(&self, live: Option<Arc<Live>>) {
        self.args
            .shared
            .lanes
            .publish(&self.args.workspace, &self.args.name, live);
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

    /// An operator's upgrade whose environment could not be built: the
    /// install record, moved to its copy when it was asked for, points at
    /// the version that runs again (unless the install changed since).
    fn give_back(&self, refused: PathBuf) {
        let (shared, running) = (self.args.shared.clone(), self.args.source.clone());
        let (workspace, name) = (self.args.workspace.clone(), self.args.name.clone());
        tokio::spawn(async move {
            let (w, n) = (workspace.clone(), name.clone());
            let back = shared
                .store
                .call(move |s| s.set_source(&w, &n, (&refused, &running)))
                .await;
            if let Err(e) = back {
                tracing::error!(workspace = %workspace, bundle = %name, "the refused upgrade's source could not be given back in the state database: {e}");
            }
        });
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

    /// Starts the task that brings generation `generation` up with the
    /// manifest the lifecycle chose. Held by the actor: a start superseded
    /// by a newer one, or cut short by an uninstall or shutdown, is
    /// aborted, and its half-started process killed with it (the Lifeline
    /// guard).
    fn spawn_start(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        generation: u64,
        wanted: Wanted<LoadedManifest>,
        challenge: Option<String>,
    ) {
        self.sandbox = None;
        let shared = self.args.shared.clone();
        let (workspace, name, source) = (
            self.args.workspace.clone(),
            self.args.name.clone(),
            self.args.source.clone(),
        );
        let host = HostContext::new(&workspace, &name, self.args.host_port.clone())
            .traced(shared.telemetry.clone());
        let myself = myself.clone();
        self.start_task = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let report = {
                let myself = myself.clone();
                move |record| {
                    let _ = myself.send_message(BundleMsg::SandboxReady { generation, record });
                }
            };
            let span = start_span(&shared, (&workspace, &name), generation);
            let attempt = start::Attempt {
                wanted,
                challenge,
                trace: span.trace().clone(),
            };
            let result = start::start(&shared, &workspace, &name, source, attempt, host, report)
                .await
                .map(Box::new);
            end_start_span(span, &result);
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

    /// A start ended: its session (without the excluded tools) for the
    /// lifecycle, or the failure.
    fn started(
        &mut self,
        myself: &ActorRef<BundleMsg>,
        generation: u64,
        result: Result<Box<Started>, StartFailure>,
    ) {
        if result.is_err() && generation == self.lc.generation() {
            // No process runs with what was read before.
            self.secret_refs.clear();
        }
        let result = result.map(|started| {
            let Started {
                mut session,
                manifest,
                archive,
                reauthorized,
                rejected,
                refs,
            } = *started;
            session.tools.retain(|t| !self.lc.excludes(&t.name));
            if generation == self.lc.generation() {
                self.archive = archive;
                self.secret_refs = refs.iter().map(|r| r.status()).collect();
                let (workspace, name) = (&self.args.workspace, &self.args.name);
                self.args.shared.secret_watch.watch(workspace, name, &refs);
            }
            let config = &self.args.shared.config;
            let timeouts = (config.bundles.call_timeout, config.http.input_timeout);
            Up {
                session: Live::new(session, generation, timeouts),
                manifest,
                reauthorized,
                rejected,
            }
        });
        self.step(myself, Input::Started { generation, result });
    }

    /// Watches the session that just became ready: its exit (with its
    /// last stderr lines) and its liveness.
    fn watch(&mut self, myself: &ActorRef<BundleMsg>) {
        let Some(live) = self.lc.session() else {
            return;
        };
        let (generation, peer) = (live.generation, live.session.peer.clone());
        watch_exit(live, myself.clone());
        self.pinger = spawn_pinger(peer, self.supervision(), myself.clone(), generation)
            .map(|p| (generation, p));
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
        let excluded = args
            .shared
            .config
            .excluded_tools(&args.workspace, &args.name);
        let installed = args.manifest.take().map(|m| *m);
        let lc = Lifecycle::new(args.restarts, args.crashes, installed, excluded);
        Ok(BundleActorState {
            args,
            lc,
            sandbox: None,
            archive: None,
            secret_refs: Vec::new(),
            start_task: None,
            preparing: None,
            offered: None,
            building_from: None,
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
        let input = match msg {
            BundleMsg::Start { generation } => Input::Start { generation },
            BundleMsg::SandboxReady { generation, record } => {
                if generation == st.lc.generation() {
                    st.sandbox = Some(record);
                    st.update_board();
                }
                return Ok(());
            }
            BundleMsg::Started { generation, result } => {
                st.started(&myself, generation, result);
                return Ok(());
            }
            BundleMsg::Exited { generation, exit } => {
                if exit.status.oom_killed {
                    st.args
                        .shared
                        .metrics
                        .oom_killed(&st.args.workspace, &st.args.name);
                }
                Input::Exited { generation, exit }
            }
            BundleMsg::Unresponsive { generation, reason } => {
                if generation == st.lc.generation() {
                    tracing::warn!(workspace = %st.args.workspace, bundle = %st.args.name, "{reason}; killing the bundle");
                }
                Input::Unresponsive { generation, reason }
            }
            BundleMsg::Respawn(why, reply) => {
                // A changed secret restarts a bundle that runs (or is
                // coming up) only: one stopped, failed or waiting for its
                // configuration stays so, its restart policy kept.
                let runs = matches!(st.lc.state(), BundleState::Ready | BundleState::Starting);
                if why != Respawn::Rotated || runs {
                    st.step(&myself, Input::Respawn(why));
                }
                let _ = reply.send(());
                return Ok(());
            }
            BundleMsg::Upgrade { manifest, source } => {
                st.offered = Some(source);
                // The archive put back is the one running (a copy seen half
                // written, then whole): nothing to upgrade.
                let running = st
                    .lc
                    .manifest()
                    .filter(|_| st.lc.state() == BundleState::Ready);
                if running.is_some_and(|r| same_archive(r, &manifest)) {
                    // (the lifecycle drops a build of another version)
                    tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, "the archive put in place is the one running: nothing to do");
                }
                Input::Upgrade(*manifest)
            }
            BundleMsg::Prepared(manifest) => {
                if let Some(source) = st.building_from.take() {
                    st.args.source = source;
                }
                Input::Prepared(*manifest)
            }
            BundleMsg::ManifestRejected(reason) => {
                if let Some(refused) = st.building_from.take() {
                    st.give_back(refused);
                }
                Input::Rejected(reason)
            }
            BundleMsg::Retry => Input::FilesChanged,
            BundleMsg::Call(call) => Input::Call(call),
            BundleMsg::AuthExpired {
                generation,
                call,
                challenge,
            } => Input::AuthExpired {
                generation,
                challenge,
                call,
            },
            BundleMsg::Tools(reply) => {
                let tools = st
                    .lc
                    .session()
                    .map(|l| l.session.tools.clone())
                    .unwrap_or_default();
                let _ = reply.send((st.lc.state(), tools));
                return Ok(());
            }
            BundleMsg::Manifest(reply) => {
                let _ = reply.send(st.lc.manifest().cloned());
                return Ok(());
            }
            #[cfg(feature = "fault-injection")]
            BundleMsg::Panic => panic!(
                "fault injection: bundle actor {} panics on request",
                st.args.name
            ),
        };
        st.step(&myself, input);
        // An upgrade that restarts at once runs from its source from now on.
        if let Some(source) = st.offered.take() {
            st.args.source = source;
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<BundleMsg>,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        st.publish_lane(None);
        st.args
            .shared
            .secret_watch
            .forget(&st.args.workspace, &st.args.name);
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

/// Reports the end of the ready session `live` to the actor: its exit, and
/// for a process its pid, a transport violation that ended it and its last
/// stderr lines (with the most telling one).
fn watch_exit(live: &Live, myself: ActorRef<BundleMsg>) {
    let (generation, session) = (live.generation, &live.session);
    let observer = session.lifeline.observer();
    let (pid, violation, stderr) = (
        session.lifeline.pid(),
        session.violation.clone(),
        session.stderr.clone(),
    );
    tokio::spawn(async move {
        let exit = observer.wait().await;
        stderr.drained(Duration::from_millis(200)).await;
        let mut lines = stderr.lines();
        let keep = lines.len().saturating_sub(CRASH_STDERR_LINES);
        let lines = lines.split_off(keep);
        let exit = Exit {
            status: ExitStatus {
                code: exit.code,
                signal: exit.signal,
                oom_killed: exit.oom_killed,
            },
            text: exit.to_string(),
            pid,
            violation: violation.get(),
            telling: crate::bundle::process::telling_line(&lines),
            stderr: lines,
        };
        let _ = myself.send_message(BundleMsg::Exited { generation, exit });
    });
}

/// Pings the bundle (`ping`; on MCP 2026-07-28, `server/discover`) every
/// `ping_interval` while it is ready; after
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
            // MCP 2026-07-28 has no `ping`: `server/discover`, which every
            // server of that revision must answer, is the cheap request.
            let modern = peer
                .peer_info()
                .is_some_and(|i| i.protocol_version >= rmcp::model::ProtocolVersion::V_2026_07_28);
            let ping = if modern {
                ClientRequest::DiscoverRequest(rmcp::model::DiscoverRequest::new(
                    rmcp::model::DiscoverRequestParams::default(),
                ))
            } else {
                ClientRequest::PingRequest(PingRequest {
                    method: Default::default(),
                    extensions: Default::default(),
                })
            };
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

/// The span of one start (a trace of its own): its sandbox, spawn,
/// handshake and token refresh are its children.
fn start_span(shared: &Shared, (workspace, name): (&str, &str), generation: u64) -> Span {
    shared.telemetry.root().span_with(Kind::Internal, || {
        let attributes = vec![
            Attribute::new("bundlevisor.workspace", workspace.to_string()),
            Attribute::new("bundlevisor.bundle", name.to_string()),
            Attribute::new("bundlevisor.generation", generation as i64),
        ];
        ("bundle.start".to_string(), attributes)
    })
}

/// Ends a start's span with how it went: the MCP revision it speaks, or
/// why it failed (the reason status shows, secrets already masked).
fn end_start_span(mut span: Span, result: &Result<Box<Started>, StartFailure>) {
    match result {
        Ok(started) => {
            let revision = started.session.revision.as_str().to_string();
            span.set(Attribute::new("mcp.protocol.version", revision));
            if let Some(server) = &started.session.server {
                span.set(Attribute::new(
                    "bundlevisor.server.version",
                    server.version.clone(),
                ));
            }
            span.end("ok", None);
        }
        Err(failure) => {
            let outcome = match failure.kind {
                FailKind::Transient => "failed",
                FailKind::Config => "config",
                FailKind::NeedsConfig => "needs_config",
                FailKind::NeedsAuth => "needs_auth",
            };
            span.end(outcome, Some(&failure.reason));
        }
    }
}
