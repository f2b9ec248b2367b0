//! The bundle lifecycle as one pure state machine, and all of a bundle's
//! lifecycle state.
//!
//! [`Lifecycle::step`] takes one [`Input`] (a start is due, a start ended,
//! the process exited, the liveness check gave up, a 401, an operator's
//! respawn, an upgrade, a refused manifest change, a call, shutdown) and the
//! current time, moves the [`Phase`] and returns the [`Effect`]s the
//! BundleActor runs: start a task (with the manifest it must use), schedule
//! a start, stop or drain a session, run or refuse a call, publish an event.
//! Besides the phase it keeps what the next start needs (the running
//! manifest, an upgrade's, whether to read the disk, a 401's challenge), the
//! calls that wait for a rebuilt session, the tools `[[exclude_tools]]`
//! removes, and the restart history and counters. It does no I/O and reads
//! no clock; the restart decision is [`RestartTracker::decide`] with the
//! jitter it is given. So its transitions are tested here on a paused
//! clock, and the table in docs/ARCHITECTURE.md is checked against
//! [`table`] by a test.
//!
//! The lifecycle never looks inside the actor's types: a session answers
//! [`Session`] (which tools it serves, whether its transport closed), a
//! manifest [`Manifest`] (its version, whether it needs an environment built
//! before it can start), a call [`Call`] (the tool it names). A phase owns
//! its session, so a session belongs to exactly one generation and
//! everything known about it (since when it is ready, why the daemon killed
//! it) goes away with it.

use std::time::Duration;

use tokio::time::Instant;

use super::policy::{Decision, RestartTracker, Stop};
use crate::config::{RestartPolicy, Supervision};
use crate::protocol::{BundleState, EventKind, ExitStatus};

/// What the lifecycle asks of a ready session.
pub trait Session {
    /// The session lists `tool` (excluded tools are not listed).
    fn serves(&self, tool: &str) -> bool;
    /// Its transport closed: it just ended, and its exit is on the way.
    fn closed(&self) -> bool;
}

/// What the lifecycle asks of a manifest.
pub trait Manifest: Clone {
    fn version(&self) -> &str;
    /// An environment must be built before this version can start (a uv
    /// bundle's): an upgrade builds it while the running version serves.
    fn needs_environment(&self) -> bool;
    /// Runs exactly what `other` would (the same unpacked archive): putting
    /// it in place again changes nothing.
    fn same_as(&self, _other: &Self) -> bool {
        false
    }
}

/// What the lifecycle asks of a request to the bundle.
pub trait Call {
    /// The tool a tool call names; None for a passed-through MCP request.
    fn tool(&self) -> Option<&str>;
}

/// Where a bundle is in its life. Each variant carries what is true only in it.
#[derive(Debug)]
pub enum Phase<S> {
    /// The start task of the current generation runs. `reauth`: it rebuilds
    /// a remote session after a 401 (calls wait for it).
    Starting { reauth: bool },
    /// Serving on `session` since `since`. `kill`: why the daemon killed
    /// this session's process (liveness), to explain its exit.
    Ready {
        session: S,
        since: Instant,
        kill: Option<String>,
    },
    /// The start of the current generation is due later: after a backoff,
    /// once the previous process has stopped, or (`reauth`) at once.
    Restarting { reauth: bool },
    /// Down until the operator acts (restart, fix the manifest).
    Failed { reason: String },
    /// Down until `configure` stores the missing values.
    NeedsConfig { reason: String },
    /// Down until `auth` stores a token.
    NeedsAuth { reason: String },
    /// Exited cleanly (and the policy keeps it down), or shut down.
    Stopped { reason: String },
}

impl<S> Phase<S> {
    pub fn state(&self) -> BundleState {
        match self {
            Phase::Starting { .. } => BundleState::Starting,
            Phase::Ready { .. } => BundleState::Ready,
            Phase::Restarting { .. } => BundleState::Restarting,
            Phase::Failed { .. } => BundleState::Failed,
            Phase::NeedsConfig { .. } => BundleState::NeedsConfig,
            Phase::NeedsAuth { .. } => BundleState::NeedsAuth,
            Phase::Stopped { .. } => BundleState::Stopped,
        }
    }

    fn reauthing(&self) -> bool {
        matches!(
            self,
            Phase::Starting { reauth: true } | Phase::Restarting { reauth: true }
        )
    }
}

/// Why a start failed, as far as the lifecycle cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
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

/// A failed start.
#[derive(Debug)]
pub struct StartFailure {
    pub kind: FailKind,
    pub reason: String,
}

/// A start that came up.
#[derive(Debug)]
pub struct Up<S, M> {
    pub session: S,
    /// The manifest it runs (the last good one from now on).
    pub manifest: M,
    /// A remote bundle got a new token on the way.
    pub reauthorized: bool,
    /// The manifest on disk was refused, and the last good one runs instead.
    pub rejected: Option<String>,
}

/// A session's end, as its watcher saw it.
#[derive(Debug, Clone)]
pub struct Exit {
    pub status: ExitStatus,
    /// `exit code 1`, `killed by SIGKILL`.
    pub text: String,
    /// The process's pid; None for a remote session.
    pub pid: Option<u32>,
    /// A protocol violation that made the daemon end the session.
    pub violation: Option<String>,
    /// The last stderr lines.
    pub stderr: Vec<String>,
    /// The one of them that says most about the crash, if any.
    pub telling: Option<String>,
}

/// Why an operator asks for a bundle to be stopped and started again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Respawn {
    /// `bundlevisor restart`: the manifest is read from disk again.
    Operator,
    /// `configure` stored new user_config values.
    Reconfigured,
    /// `auth` stored new tokens.
    Authorized,
    /// A secret one of its user_config values refers to changed where it
    /// is kept (daemon::secret_watch).
    Rotated,
}

/// Why a bundle is stopped and started again at once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Why {
    Asked(Respawn),
    /// A watched manifest changed and passed validation.
    Upgrade {
        version: String,
    },
    /// The files of a failed watched bundle changed.
    FilesChanged,
}

impl Why {
    fn event(&self) -> (EventKind, String) {
        match self {
            Why::Asked(Respawn::Operator) => {
                (EventKind::Restarting, "restarting on request".into())
            }
            Why::Asked(Respawn::Reconfigured) => (
                EventKind::Reconfigured,
                "user_config changed: restarting with the new values".into(),
            ),
            Why::Asked(Respawn::Rotated) => (
                EventKind::Reconfigured,
                "a secret its user_config refers to changed: restarting with the new value".into(),
            ),
            Why::Asked(Respawn::Authorized) => (
                EventKind::Reauthorized,
                "authorized by the operator: starting with the new token".into(),
            ),
            Why::Upgrade { version } => (
                EventKind::Upgrading,
                format!("manifest changed (version {version}): restarting with it"),
            ),
            Why::FilesChanged => (
                EventKind::Restarting,
                "the bundle's files changed: starting it again".into(),
            ),
        }
    }

    /// The next start reads the manifest from disk (falling back to the
    /// last good one) instead of reusing the running one.
    fn rereads(&self) -> bool {
        matches!(self, Why::Asked(Respawn::Operator) | Why::FilesChanged)
    }
}

/// Which manifest a start uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted<M> {
    /// This one, already validated (the running one, an install's, an upgrade's).
    Exactly(M),
    /// The file on disk; if it no longer passes, `last_good` (or the copy
    /// kept in the state dir).
    FromDisk { last_good: Option<M> },
}

/// What happened.
#[derive(Debug)]
pub enum Input<S, M, C> {
    /// A scheduled start of `generation` is due.
    Start { generation: u64 },
    /// The start task of `generation` ended.
    Started {
        generation: u64,
        result: Result<Up<S, M>, StartFailure>,
    },
    /// The process (or remote session) of `generation` ended.
    Exited { generation: u64, exit: Exit },
    /// The liveness check gave up on the process of `generation`.
    Unresponsive { generation: u64, reason: String },
    /// A remote server answered 401 (or 403 `insufficient_scope`, whose
    /// `challenge` the next start gets a token for) on the session of
    /// `generation`, to a ping or to `call` (retried once, on the rebuilt
    /// session).
    AuthExpired {
        generation: u64,
        challenge: Option<String>,
        call: Option<C>,
    },
    /// Stop whatever runs and start again at once; clears the breaker.
    Respawn(Respawn),
    /// A watched manifest changed and passed validation: restart with it.
    Upgrade(M),
    /// The environment of an upgrade is built: restart with it.
    Prepared(M),
    /// The files of a failed watched bundle changed: start it again from
    /// the manifest on disk, breaker cleared.
    FilesChanged,
    /// A manifest change was refused; the bundle keeps its version.
    Rejected(String),
    /// A request to the bundle.
    Call(C),
    /// Uninstall or daemon shutdown.
    Shutdown,
}

/// An event to publish, stamped by the actor with the state after the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub kind: EventKind,
    pub message: String,
    pub attempt: Option<u32>,
    pub delay_ms: Option<u64>,
    pub exit: Option<ExitStatus>,
    pub stderr: Vec<String>,
}

impl Note {
    fn new(kind: EventKind, message: impl Into<String>) -> Note {
        Note {
            kind,
            message: message.into(),
            attempt: None,
            delay_ms: None,
            exit: None,
            stderr: Vec::new(),
        }
    }
}

/// Why a call is answered without running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The bundle has no such tool, or `[[exclude_tools]]` removed it.
    NoSuchTool,
    /// Not now: the bundle is in `state`.
    NotReady {
        state: BundleState,
        last_error: Option<String>,
    },
}

/// What the actor must do, in order.
#[derive(Debug)]
pub enum Effect<S, M, C> {
    /// Run the start task of `generation` with `manifest`; a remote bundle
    /// gets a token for `challenge` first.
    Spawn {
        generation: u64,
        manifest: Wanted<M>,
        challenge: Option<String>,
    },
    /// Send `Start { generation }` after `delay` (zero: at once).
    Schedule { generation: u64, delay: Duration },
    /// Stop `session` (SIGTERM, `stop_grace`, SIGKILL) in a task, then send
    /// `Start { generation }` if given.
    Stop { session: S, then_start: Option<u64> },
    /// The session ended by itself: drop its handle (what is left of its
    /// process group dies with it).
    Release(S),
    /// Watch the session that just became ready: its exit, its liveness.
    Watch,
    /// Kill the ready session's process; its exit comes back as `Exited`.
    Kill,
    /// Close `session` once the calls in flight on it are done (401 rebuild).
    Drain(S),
    /// Cancel the start task in progress; a half-started process dies with it.
    AbortStart,
    /// Build the environment of the upgrade `M` while the running version
    /// serves (replacing a build under way); `Prepared` comes back, or
    /// `Rejected` if it cannot be built.
    Prepare(M),
    /// Drop a build of an upgrade's environment under way.
    AbortPrepare,
    /// Run `call` on the ready session; `retry`: a 401 may send it back
    /// once.
    Send { call: C, retry: bool },
    /// Answer `call` without running it.
    Refuse { call: C, refusal: Refusal },
    /// The ready session may take tool calls directly (`Shared::lanes`).
    OpenLane,
    /// It may no longer: every call goes through the actor.
    CloseLane,
    /// Publish an event (and the status it leads to).
    Publish(Note),
}

/// What the restart decision needs besides the history.
pub struct RestartRules<'a> {
    pub supervision: &'a Supervision,
    pub policy: RestartPolicy,
    /// In [0, 1): spreads the backoff of bundles that crash together.
    pub jitter: f64,
}

/// Where a call goes now.
enum Route {
    Send,
    Queue,
    Refuse(Refusal),
}

/// One bundle's lifecycle: the phase, the generation, what the next start
/// uses, the calls waiting for a rebuild, the restart history and the
/// counters `status` and the metrics show.
#[derive(Debug)]
pub struct Lifecycle<S, M, C> {
    phase: Phase<S>,
    /// Bumped for every start that is scheduled; inputs of an earlier
    /// generation are stale (a restart during a start or a backoff never
    /// leaks a process or kills the new one).
    generation: u64,
    tracker: RestartTracker,
    /// Starts after the first one, for any reason but a 401 rebuild (which
    /// keeps the bundle's run): crash restarts, `restart`, upgrades,
    /// `configure` and `auth`, and the restart of a panicked actor.
    restarts: u32,
    /// Stops nobody asked for: crashes (any exit but code 0), failed
    /// liveness checks, starts that failed and are retried.
    crashes: u64,
    last_error: Option<String>,
    /// When `last_error` happened (Unix seconds).
    last_error_at: Option<i64>,
    /// The manifest the bundle runs (the last good one).
    manifest: Option<M>,
    /// A validated manifest the next start must use (install, upgrade).
    next_manifest: Option<M>,
    /// The next start reads the disk (operator restart, files changed).
    reread: bool,
    /// The challenge of the 401 or 403 that ended the last session: the
    /// next start gets a token for it before connecting.
    challenge: Option<String>,
    /// Calls waiting for the session rebuilt after a 401, each with
    /// whether it may still be retried after another 401.
    queued: Vec<(C, bool)>,
    /// The tools `[[exclude_tools]]` removes from this bundle.
    excluded: Vec<String>,
    /// The generation whose session takes calls directly (`OpenLane`).
    lane: Option<u64>,
}

impl<S: Session, M: Manifest, C: Call> Lifecycle<S, M, C> {
    /// A bundle coming up for the first time in this actor; `restarts` and
    /// `crashes` carry over from a panicked predecessor; `installed` is the
    /// manifest an install validated (None: read the disk). [`begin`](Self::begin)
    /// gives the effects of its first start.
    pub fn new(
        restarts: u32,
        crashes: u64,
        installed: Option<M>,
        excluded: Vec<String>,
    ) -> Lifecycle<S, M, C> {
        Lifecycle {
            phase: Phase::Starting { reauth: false },
            generation: 0,
            tracker: RestartTracker::default(),
            restarts,
            crashes,
            last_error: None,
            last_error_at: None,
            manifest: None,
            next_manifest: installed,
            reread: false,
            challenge: None,
            queued: Vec::new(),
            excluded,
            lane: None,
        }
    }

    /// The first start: announce it and run it.
    pub fn begin(&mut self) -> Vec<Effect<S, M, C>> {
        vec![
            Effect::Publish(Note::new(EventKind::Starting, "starting")),
            self.spawn(),
        ]
    }

    pub fn phase(&self) -> &Phase<S> {
        &self.phase
    }

    pub fn state(&self) -> BundleState {
        self.phase.state()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    pub fn crashes(&self) -> u64 {
        self.crashes
    }

    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// When the last error happened (Unix seconds).
    pub fn last_error_at(&self) -> Option<i64> {
        self.last_error_at
    }

    /// The bundle's latest failure, kept (with its time) until the next.
    fn note_error(&mut self, reason: String) {
        self.last_error = Some(reason);
        self.last_error_at = Some(crate::clock::unix_secs());
    }

    /// The manifest the bundle runs (None before its first start).
    pub fn manifest(&self) -> Option<&M> {
        self.manifest.as_ref()
    }

    /// Whether `[[exclude_tools]]` removes `tool` from this bundle: the
    /// one decision, applied to the session's tool list when it comes up
    /// and to every call.
    pub fn excludes(&self, tool: &str) -> bool {
        self.excluded.iter().any(|e| e == tool)
    }

    /// The ready session, if any.
    pub fn session(&self) -> Option<&S> {
        match &self.phase {
            Phase::Ready { session, .. } => Some(session),
            _ => None,
        }
    }

    /// Since when the bundle is ready.
    pub fn ready_since(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Ready { since, .. } => Some(*since),
            _ => None,
        }
    }

    /// Moves the lifecycle by one input; returns what the actor must do.
    /// The step ends with the lane's change, if the ready session changed.
    pub fn step(
        &mut self,
        input: Input<S, M, C>,
        now: Instant,
        env: &RestartRules,
    ) -> Vec<Effect<S, M, C>> {
        let mut effects = self.transition(input, now, env);
        let lane = self.session().map(|_| self.generation);
        if lane != self.lane {
            self.lane = lane;
            effects.push(match lane {
                Some(_) => Effect::OpenLane,
                None => Effect::CloseLane,
            });
        }
        effects
    }

    fn transition(
        &mut self,
        input: Input<S, M, C>,
        now: Instant,
        env: &RestartRules,
    ) -> Vec<Effect<S, M, C>> {
        let now_generation = self.generation;
        let current = |g: u64| g == now_generation;
        match input {
            Input::Start { generation } if current(generation) => self.start_due(),
            Input::Started { generation, result } => {
                self.started(current(generation), result, now, env)
            }
            Input::Exited { generation, exit } if current(generation) => {
                self.exited(exit, now, env)
            }
            Input::Unresponsive { generation, reason } if current(generation) => {
                match &mut self.phase {
                    Phase::Ready { kill, .. } if kill.is_none() => {
                        *kill = Some(reason);
                        vec![Effect::Kill]
                    }
                    _ => Vec::new(),
                }
            }
            Input::AuthExpired {
                generation,
                challenge,
                call,
            } => {
                let mut effects = Vec::new();
                if current(generation) {
                    self.challenge = challenge;
                    effects = self.auth_expired();
                }
                // Retried once: on the rebuilt session (queued meanwhile),
                // or on a later session that is already up.
                if let Some(call) = call {
                    effects.extend(self.route(call, false));
                }
                effects
            }
            Input::Respawn(asked) => self.restart(Why::Asked(asked)),
            Input::Upgrade(manifest) => {
                let running = self
                    .manifest
                    .as_ref()
                    .filter(|_| matches!(self.phase, Phase::Ready { .. }));
                if running.is_some_and(|r| r.same_as(&manifest)) {
                    // What runs, put back: only a build of another version
                    // that was under way is dropped.
                    return vec![Effect::AbortPrepare];
                }
                if manifest.needs_environment() && matches!(self.phase, Phase::Ready { .. }) {
                    // Built while the running version serves; the restart
                    // comes once it is.
                    return vec![Effect::Prepare(manifest)];
                }
                let mut effects = vec![Effect::AbortPrepare];
                effects.extend(self.upgrade(manifest));
                effects
            }
            Input::Prepared(manifest) => self.upgrade(manifest),
            Input::FilesChanged => self.restart(Why::FilesChanged),
            Input::Rejected(reason) => self.rejected(reason),
            Input::Call(call) => self.route(call, true),
            Input::Shutdown => {
                self.generation += 1;
                let old = std::mem::replace(
                    &mut self.phase,
                    Phase::Stopped {
                        reason: "stopped".into(),
                    },
                );
                let mut effects = self.refuse_queued("the bundle is stopping");
                match old {
                    Phase::Ready { session, .. } => effects.push(Effect::Stop {
                        session,
                        then_start: None,
                    }),
                    Phase::Starting { .. } => effects.push(Effect::AbortStart),
                    _ => {}
                }
                effects.push(Effect::Publish(Note::new(EventKind::Stopped, "stopped")));
                effects
            }
            // Stale: an earlier generation's start, exit or liveness report.
            Input::Start { .. } | Input::Exited { .. } | Input::Unresponsive { .. } => Vec::new(),
        }
    }

    /// The start task of the current generation, with the manifest it must
    /// use: an install's or an upgrade's; the disk's (the running one as
    /// fallback) after an operator restart, a change of a failed bundle's
    /// files, or when none runs yet; else the running one.
    fn spawn(&mut self) -> Effect<S, M, C> {
        let manifest = match (self.next_manifest.take(), &self.manifest) {
            (Some(m), _) => Wanted::Exactly(m),
            (None, Some(running)) if !self.reread => Wanted::Exactly(running.clone()),
            (None, last_good) => Wanted::FromDisk {
                last_good: last_good.clone(),
            },
        };
        self.reread = false;
        Effect::Spawn {
            generation: self.generation,
            manifest,
            challenge: self.challenge.take(),
        }
    }

    /// A scheduled start is due.
    fn start_due(&mut self) -> Vec<Effect<S, M, C>> {
        let Phase::Restarting { reauth } = self.phase else {
            return Vec::new();
        };
        if !reauth {
            self.restarts += 1;
        }
        self.phase = Phase::Starting { reauth };
        vec![
            Effect::Publish(Note::new(EventKind::Starting, "starting")),
            self.spawn(),
        ]
    }

    fn started(
        &mut self,
        current: bool,
        result: Result<Up<S, M>, StartFailure>,
        now: Instant,
        env: &RestartRules,
    ) -> Vec<Effect<S, M, C>> {
        if !current || !matches!(self.phase, Phase::Starting { .. }) {
            // A superseded start that came up anyway: not ours any more.
            return match result {
                Ok(up) => vec![Effect::Stop {
                    session: up.session,
                    then_start: None,
                }],
                Err(_) => Vec::new(),
            };
        }
        let Up {
            session,
            manifest,
            reauthorized,
            rejected,
        } = match result {
            Ok(up) => up,
            Err(failure) => return self.start_failed(failure, now, env),
        };
        self.phase = Phase::Ready {
            session,
            since: now,
            kill: None,
        };
        self.manifest = Some(manifest);
        // The last failure stays shown (with its time) after the recovery.
        let mut effects = vec![Effect::Watch];
        if reauthorized {
            effects.push(Effect::Publish(Note::new(
                EventKind::Reauthorized,
                "new token obtained; session rebuilt",
            )));
        }
        effects.push(Effect::Publish(Note::new(EventKind::Ready, "ready")));
        for (call, retry) in std::mem::take(&mut self.queued) {
            effects.extend(self.route(call, retry));
        }
        if let Some(why) = rejected {
            effects.extend(self.rejected(why));
        }
        effects
    }

    fn start_failed(
        &mut self,
        StartFailure { kind, reason }: StartFailure,
        now: Instant,
        env: &RestartRules,
    ) -> Vec<Effect<S, M, C>> {
        let down = match kind {
            FailKind::Config => Phase::Failed {
                reason: reason.clone(),
            },
            FailKind::NeedsConfig => Phase::NeedsConfig {
                reason: reason.clone(),
            },
            FailKind::NeedsAuth => Phase::NeedsAuth {
                reason: reason.clone(),
            },
            FailKind::Transient => {
                self.crashes += 1;
                let decided = self.after_stop(Stop::Failure(reason.clone()), None, None, now, env);
                let mut effects = self.refuse_queued(&reason);
                effects.extend(decided);
                return effects;
            }
        };
        let settled = self.settle(down);
        let mut effects = self.refuse_queued(&reason);
        effects.extend(settled);
        effects
    }

    fn exited(&mut self, exit: Exit, now: Instant, env: &RestartRules) -> Vec<Effect<S, M, C>> {
        // Only a ready session has a watcher that reports its exit.
        if !matches!(self.phase, Phase::Ready { .. }) {
            return Vec::new();
        }
        let Phase::Ready {
            session,
            since,
            kill,
        } = std::mem::replace(&mut self.phase, Phase::Restarting { reauth: false })
        else {
            return Vec::new();
        };
        let stop = match exit.violation.clone().or(kill) {
            Some(reason) => Stop::Failure(format!("{reason}; process {}", exit.text)),
            None if exit.status.code == Some(0) => {
                Stop::Clean("process exited cleanly (exit code 0)".into())
            }
            None if exit.pid.is_none() => {
                Stop::Failure("the remote session ended (connection closed)".into())
            }
            None => Stop::Failure(match &exit.telling {
                Some(line) => format!("process exited ({}): {line}", exit.text),
                None => format!("process exited ({})", exit.text),
            }),
        };
        if matches!(stop, Stop::Failure(_)) {
            self.crashes += 1;
        }
        let mut exited = Note::new(
            EventKind::Exited,
            match exit.pid {
                Some(pid) => format!("process {pid} exited ({})", exit.text),
                None => "remote session ended".to_string(),
            },
        );
        exited.exit = Some(exit.status);
        exited.stderr = exit.stderr;
        let mut effects = vec![Effect::Release(session)];
        effects.extend(self.after_stop(
            stop,
            Some(now.saturating_duration_since(since)),
            Some(exited),
            now,
            env,
        ));
        effects
    }

    /// The first 401 of the ready session: one rebuild, however many calls
    /// were refused (they wait for it). Not a restart.
    fn auth_expired(&mut self) -> Vec<Effect<S, M, C>> {
        if !matches!(self.phase, Phase::Ready { .. }) {
            return Vec::new();
        }
        let Phase::Ready { session, .. } =
            std::mem::replace(&mut self.phase, Phase::Restarting { reauth: true })
        else {
            return Vec::new();
        };
        self.generation += 1;
        vec![
            Effect::Drain(session),
            Effect::Publish(Note::new(
                EventKind::Restarting,
                "the remote server answered 401 (authorization expired): getting a new token and rebuilding the session",
            )),
            Effect::Schedule {
                generation: self.generation,
                delay: Duration::ZERO,
            },
        ]
    }

    /// Restarts with the validated new manifest.
    fn upgrade(&mut self, manifest: M) -> Vec<Effect<S, M, C>> {
        let version = manifest.version().to_string();
        self.next_manifest = Some(manifest);
        self.restart(Why::Upgrade { version })
    }

    /// Stops whatever runs and starts again at once; clears the breaker.
    fn restart(&mut self, why: Why) -> Vec<Effect<S, M, C>> {
        self.tracker.reset();
        self.generation += 1;
        if why.rereads() {
            self.reread = true;
        }
        let reauthing = self.phase.reauthing();
        let old = std::mem::replace(&mut self.phase, Phase::Restarting { reauth: false });
        let mut effects = Vec::new();
        if reauthing {
            effects.extend(self.refuse_queued("the bundle is being restarted"));
        }
        let (kind, message) = why.event();
        effects.push(Effect::Publish(Note::new(kind, message)));
        let generation = self.generation;
        match old {
            Phase::Ready { session, .. } => effects.push(Effect::Stop {
                session,
                then_start: Some(generation),
            }),
            Phase::Starting { .. } => {
                effects.push(Effect::AbortStart);
                effects.push(Effect::Schedule {
                    generation,
                    delay: Duration::ZERO,
                });
            }
            _ => effects.push(Effect::Schedule {
                generation,
                delay: Duration::ZERO,
            }),
        }
        effects
    }

    fn rejected(&mut self, reason: String) -> Vec<Effect<S, M, C>> {
        let message = match self.phase {
            Phase::Ready { .. } | Phase::Starting { .. } => {
                format!("manifest change rejected, the running version keeps running: {reason}")
            }
            _ => format!("manifest change rejected: {reason}"),
        };
        self.note_error(message.clone());
        vec![Effect::Publish(Note::new(
            EventKind::ManifestRejected,
            message,
        ))]
    }

    /// Where a call goes: an excluded or unknown tool is refused in any
    /// state; the ready session runs it unless its transport just closed;
    /// a 401 rebuild queues it; any other state refuses it.
    fn route(&mut self, call: C, retry: bool) -> Vec<Effect<S, M, C>> {
        let route = match (&self.phase, call.tool()) {
            (_, Some(tool)) if self.excludes(tool) => Route::Refuse(Refusal::NoSuchTool),
            (Phase::Ready { session, .. }, tool) => {
                if tool.is_some_and(|t| !session.serves(t)) {
                    Route::Refuse(Refusal::NoSuchTool)
                } else if session.closed() {
                    // Its exit is on the way: the call was never sent, and
                    // the bundle is about to restart (a caller may wait).
                    Route::Refuse(Refusal::NotReady {
                        state: BundleState::Restarting,
                        last_error: Some("the bundle's session just ended".into()),
                    })
                } else {
                    Route::Send
                }
            }
            (p, _) if p.reauthing() => Route::Queue,
            (p, _) => Route::Refuse(Refusal::NotReady {
                state: p.state(),
                // (kept after a recovery: not the reason a start is slow)
                last_error: self
                    .last_error
                    .clone()
                    .filter(|_| p.state() != BundleState::Starting),
            }),
        };
        match route {
            Route::Send => vec![Effect::Send { call, retry }],
            Route::Queue => {
                self.queued.push((call, retry));
                Vec::new()
            }
            Route::Refuse(refusal) => vec![Effect::Refuse { call, refusal }],
        }
    }

    /// Refuses the calls that waited for a rebuild that will not come,
    /// with the state the step leads to (called once the phase moved).
    fn refuse_queued(&mut self, reason: &str) -> Vec<Effect<S, M, C>> {
        let state = self.phase.state();
        std::mem::take(&mut self.queued)
            .into_iter()
            .map(|(call, _)| Effect::Refuse {
                call,
                refusal: Refusal::NotReady {
                    state,
                    last_error: Some(reason.to_string()),
                },
            })
            .collect()
    }

    /// Down until the operator acts.
    fn settle(&mut self, down: Phase<S>) -> Vec<Effect<S, M, C>> {
        let (kind, reason) = match &down {
            Phase::Failed { reason } => (EventKind::Failed, reason.clone()),
            Phase::NeedsConfig { reason } => (EventKind::NeedsConfig, reason.clone()),
            Phase::NeedsAuth { reason } => (EventKind::NeedsAuth, reason.clone()),
            Phase::Stopped { reason } => (EventKind::Stopped, reason.clone()),
            _ => unreachable!("settle is only given a down phase"),
        };
        if kind != EventKind::Stopped {
            self.note_error(reason.clone());
        }
        self.phase = down;
        vec![Effect::Publish(Note::new(kind, reason))]
    }

    /// The bundle stopped running: restart, stay down or trip the breaker.
    /// `before` (the `exited` event) is published ahead of the decision's.
    fn after_stop(
        &mut self,
        stop: Stop,
        ready_for: Option<Duration>,
        before: Option<Note>,
        now: Instant,
        env: &RestartRules,
    ) -> Vec<Effect<S, M, C>> {
        let mut effects: Vec<Effect<S, M, C>> = before.map(Effect::Publish).into_iter().collect();
        let decision = self.tracker.decide(
            env.supervision,
            env.policy,
            &stop,
            ready_for,
            now,
            env.jitter,
        );
        match decision {
            Decision::Restart { attempt, delay } => {
                self.generation += 1;
                self.phase = Phase::Restarting { reauth: false };
                if let Stop::Failure(reason) = &stop {
                    self.note_error(reason.clone());
                }
                let when = if delay.is_zero() {
                    "at once".to_string()
                } else {
                    let delay = Duration::from_millis(delay.as_millis() as u64);
                    format!("in {}", humantime::format_duration(delay))
                };
                let mut note = Note::new(
                    EventKind::Restarting,
                    format!("{}; restarting {when} (attempt {attempt})", stop.reason()),
                );
                note.attempt = Some(attempt);
                note.delay_ms = Some(delay.as_millis() as u64);
                effects.push(Effect::Publish(note));
                effects.push(Effect::Schedule {
                    generation: self.generation,
                    delay,
                });
            }
            Decision::StayDown => effects.extend(self.settle(match stop {
                Stop::Clean(reason) => Phase::Stopped { reason },
                Stop::Failure(reason) => Phase::Failed { reason },
            })),
            Decision::Tripped(reason) => effects.extend(self.settle(Phase::Failed { reason })),
        }
        effects
    }
}

/// One row of the transition table in docs/ARCHITECTURE.md.
pub struct Row {
    pub from: &'static str,
    pub input: &'static str,
    pub to: &'static str,
}

/// The transition table, as docs/ARCHITECTURE.md shows it (a test checks
/// the doc against it). It summarizes [`Lifecycle::step`]; the tests below
/// exercise `step` itself, not the rows one by one.
pub fn table() -> Vec<Row> {
    let row = |from, input, to| Row { from, input, to };
    vec![
        row(
            "(new actor)",
            "install, boot reload, panicked actor restarted",
            "starting",
        ),
        row("starting", "initialize + tools/list done", "ready"),
        row(
            "starting",
            "spawn/handshake failed, start timeout (counted as a crash)",
            "restarting / failed (policy)",
        ),
        row(
            "starting",
            "manifest invalid, gate refused, credentials undecryptable",
            "failed (never retried)",
        ),
        row(
            "starting",
            "a required user_config value is missing",
            "needs_config (until `configure`)",
        ),
        row(
            "starting",
            "remote server answered 401 and no silent token helped",
            "needs_auth (until `auth`)",
        ),
        row(
            "ready",
            "process exited with code 0",
            "restarting (`always`) / stopped",
        ),
        row(
            "ready",
            "process crashed, liveness kill, remote session ended",
            "restarting / failed (policy)",
        ),
        row(
            "ready",
            "liveness check gave up",
            "ready (process killed; its exit explains why)",
        ),
        row(
            "ready",
            "remote server answered 401",
            "restarting (rebuild, not counted as a restart)",
        ),
        row(
            "restarting",
            "backoff elapsed / old process stopped",
            "starting",
        ),
        row(
            "any",
            "`restart`, upgrade, `configure`, `auth`, a failed watched bundle's files changed",
            "restarting (breaker cleared)",
        ),
        row(
            "any",
            "watched manifest edited but invalid",
            "unchanged (`last_error`, `manifest_rejected`)",
        ),
        row("any", "uninstall, daemon shutdown", "stopped"),
        row("any", "input of an earlier generation", "unchanged"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A session is its name; it serves every tool but `missing`, and the
    /// one named `closed` has a transport that just closed.
    impl Session for &'static str {
        fn serves(&self, tool: &str) -> bool {
            tool != "missing"
        }
        fn closed(&self) -> bool {
            *self == "closed"
        }
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Man {
        version: &'static str,
        /// Needs an environment built before it starts.
        uv: bool,
    }

    impl Manifest for Man {
        fn version(&self) -> &str {
            self.version
        }
        fn needs_environment(&self) -> bool {
            self.uv
        }
    }

    fn v(version: &'static str) -> Man {
        Man { version, uv: false }
    }

    /// A call of the tool it names; `Req("")` is a passed-through request.
    #[derive(Debug, PartialEq, Eq)]
    struct Req(&'static str);

    impl Call for Req {
        fn tool(&self) -> Option<&str> {
            (!self.0.is_empty()).then_some(self.0)
        }
    }

    type Effects = Vec<Effect<&'static str, Man, Req>>;

    struct World {
        sup: Supervision,
        policy: RestartPolicy,
        lc: Lifecycle<&'static str, Man, Req>,
    }

    impl World {
        /// A bundle installed with version 1.0.0, whose `hidden` tool is excluded.
        /// Its first start is under way.
        fn new() -> World {
            let mut lc = Lifecycle::new(0, 0, Some(v("1.0.0")), vec!["hidden".into()]);
            lc.begin();
            World {
                sup: super::super::policy::test_supervision(),
                policy: RestartPolicy::Always,
                lc,
            }
        }

        fn step(&mut self, input: Input<&'static str, Man, Req>) -> Effects {
            let env = RestartRules {
                supervision: &self.sup,
                policy: self.policy,
                jitter: 0.5,
            };
            self.lc.step(input, Instant::now(), &env)
        }

        fn g(&self) -> u64 {
            self.lc.generation()
        }

        fn started(&mut self, session: &'static str, manifest: Man) -> Effects {
            let g = self.g();
            self.step(Input::Started {
                generation: g,
                result: Ok(Up {
                    session,
                    manifest,
                    reauthorized: false,
                    rejected: None,
                }),
            })
        }

        fn up(&mut self, session: &'static str) {
            self.started(session, v("1.0.0"));
            assert_eq!(self.lc.state(), BundleState::Ready);
        }

        fn exit(&mut self, code: i32) -> Effects {
            let g = self.g();
            self.step(Input::Exited {
                generation: g,
                exit: exit(code),
            })
        }

        /// Runs the start the last step scheduled; returns the manifest
        /// and challenge it is given.
        fn due(&mut self) -> (Wanted<Man>, Option<String>) {
            let g = self.g();
            let effects = self.step(Input::Start { generation: g });
            assert_eq!(self.lc.state(), BundleState::Starting);
            spawned(effects)
        }
    }

    fn spawned(effects: Effects) -> (Wanted<Man>, Option<String>) {
        effects
            .into_iter()
            .find_map(|e| match e {
                Effect::Spawn {
                    manifest,
                    challenge,
                    ..
                } => Some((manifest, challenge)),
                _ => None,
            })
            .expect("a start is spawned")
    }

    fn refusals(effects: &Effects) -> Vec<(&'static str, Refusal)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Refuse { call, refusal } => Some((call.0, refusal.clone())),
                _ => None,
            })
            .collect()
    }

    fn sent(effects: &Effects) -> Vec<(&'static str, bool)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Send { call, retry } => Some((call.0, *retry)),
                _ => None,
            })
            .collect()
    }

    fn exit(code: i32) -> Exit {
        Exit {
            status: ExitStatus {
                code: Some(code),
                signal: None,
                oom_killed: false,
            },
            text: format!("exit code {code}"),
            pid: Some(42),
            violation: None,
            stderr: vec!["at main.js:1".into(), "last words".into()],
            telling: Some("last words".into()),
        }
    }

    fn notes(effects: &Effects) -> Vec<(EventKind, String)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish(n) => Some((n.kind, n.message.clone())),
                _ => None,
            })
            .collect()
    }

    fn failure(kind: FailKind) -> StartFailure {
        StartFailure {
            kind,
            reason: "why".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_after_a_stable_run_restarts_at_once_and_counts_once() {
        let mut w = World::new();
        w.up("s1");
        tokio::time::advance(Duration::from_secs(11)).await;
        let effects = w.exit(3);
        assert!(matches!(effects[0], Effect::Release("s1")));
        assert_eq!(
            notes(&effects).iter().map(|n| n.0).collect::<Vec<_>>(),
            vec![EventKind::Exited, EventKind::Restarting]
        );
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::Schedule { delay, .. } if delay.is_zero()
        )));
        assert_eq!(w.lc.state(), BundleState::Restarting);
        // The counter moves when the start happens, not when it is decided.
        assert_eq!((w.lc.restarts(), w.lc.crashes()), (0, 1));
        w.due();
        assert_eq!(w.lc.restarts(), 1);
        // The crash's most telling stderr line comes with it.
        assert_eq!(
            w.lc.last_error(),
            Some("process exited (exit code 3): last words")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_reason_belongs_to_its_session_only() {
        // The liveness check kills session 1; an operator restart replaces
        // it before its exit arrives; session 2's own crash must be
        // reported as what it is.
        let mut w = World::new();
        w.up("s1");
        let g1 = w.g();
        let effects = w.step(Input::Unresponsive {
            generation: g1,
            reason: "liveness check failed: 2 pings in a row".into(),
        });
        assert!(matches!(effects[..], [Effect::Kill]));
        w.step(Input::Respawn(Respawn::Operator));
        w.due();
        w.up("s2");
        // The old session's exit is stale.
        assert!(w
            .step(Input::Exited {
                generation: g1,
                exit: exit(137)
            })
            .is_empty());
        let effects = w.exit(3);
        let restarting = &notes(&effects)[1].1;
        assert!(
            restarting.starts_with("process exited (exit code 3)"),
            "{restarting}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_liveness_kill_explains_the_exit_of_its_own_session() {
        let mut w = World::new();
        w.up("s1");
        let g = w.g();
        w.step(Input::Unresponsive {
            generation: g,
            reason: "liveness check failed".into(),
        });
        // A second report for the same session kills nothing more.
        assert!(w
            .step(Input::Unresponsive {
                generation: g,
                reason: "again".into()
            })
            .is_empty());
        let effects = w.exit(137);
        assert!(notes(&effects)[1]
            .1
            .starts_with("liveness check failed; process exit code 137"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_loop_backs_off_then_trips_the_breaker() {
        let mut w = World::new();
        for attempt in 1..=3u32 {
            w.up("s");
            let effects = w.exit(1);
            let delay = effects
                .iter()
                .find_map(|e| match e {
                    Effect::Schedule { delay, .. } => Some(*delay),
                    _ => None,
                })
                .unwrap();
            assert!(delay >= Duration::from_millis(40) * attempt, "{delay:?}");
            tokio::time::advance(delay).await;
            w.due();
        }
        w.up("s");
        let effects = w.exit(1);
        assert_eq!(w.lc.state(), BundleState::Failed);
        assert!(notes(&effects)[1]
            .1
            .starts_with("crash loop: 3 restarts within 30s"));
        assert_eq!((w.lc.restarts(), w.lc.crashes()), (3, 4));
        // An operator restart clears the breaker and counts as a restart.
        w.step(Input::Respawn(Respawn::Operator));
        w.due();
        assert_eq!(w.lc.restarts(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_starts_are_crashes_and_are_retried_by_policy() {
        let mut w = World::new();
        let g = w.g();
        w.step(Input::Started {
            generation: g,
            result: Err(failure(FailKind::Transient)),
        });
        assert_eq!(w.lc.state(), BundleState::Restarting);
        assert_eq!(w.lc.crashes(), 1);
        for (kind, state) in [
            (FailKind::Config, BundleState::Failed),
            (FailKind::NeedsConfig, BundleState::NeedsConfig),
            (FailKind::NeedsAuth, BundleState::NeedsAuth),
        ] {
            w.step(Input::Respawn(Respawn::Operator));
            w.due();
            let g = w.g();
            let effects = w.step(Input::Started {
                generation: g,
                result: Err(failure(kind)),
            });
            assert_eq!(w.lc.state(), state);
            assert!(refusals(&effects).is_empty(), "no call waited");
            assert_eq!(w.lc.crashes(), 1, "not a crash: {kind:?}");
            assert_eq!(w.lc.last_error(), Some("why"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_exit_stays_down_under_on_failure() {
        let mut w = World::new();
        w.policy = RestartPolicy::OnFailure;
        w.up("s");
        let effects = w.exit(0);
        assert_eq!(w.lc.state(), BundleState::Stopped);
        assert_eq!(w.lc.crashes(), 0);
        assert_eq!(notes(&effects)[1].0, EventKind::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_401_rebuilds_once_queues_calls_and_is_not_a_restart() {
        let mut w = World::new();
        w.up("s1");
        let g = w.g();
        let expired = |call| Input::AuthExpired {
            generation: g,
            challenge: None,
            call,
        };
        // The call that got the 401 waits for the rebuilt session, and
        // is not retried a second time.
        let effects = w.step(expired(Some(Req("add"))));
        assert!(matches!(effects[0], Effect::Drain("s1")));
        assert!(sent(&effects).is_empty());
        // Further 401s of the old session rebuild nothing; their calls wait too.
        let effects = w.step(expired(Some(Req("echo"))));
        assert!(effects.is_empty(), "{effects:?}");
        w.due();
        assert!(
            w.step(Input::Call(Req("sum"))).is_empty(),
            "a new call waits as well"
        );
        let g = w.g();
        let effects = w.step(Input::Started {
            generation: g,
            result: Ok(Up {
                session: "s2",
                manifest: v("1.0.0"),
                reauthorized: true,
                rejected: None,
            }),
        });
        assert_eq!(
            notes(&effects).iter().map(|n| n.0).collect::<Vec<_>>(),
            vec![EventKind::Reauthorized, EventKind::Ready]
        );
        assert_eq!(
            sent(&effects),
            vec![("add", false), ("echo", false), ("sum", true)]
        );
        assert_eq!(w.lc.session(), Some(&"s2"));
        assert_eq!(w.lc.restarts(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_superseded_start_is_stopped_when_it_comes_up() {
        let mut w = World::new();
        let first = w.g();
        let effects = w.step(Input::Upgrade(v("2.0.0")));
        assert!(matches!(
            effects[..],
            [
                Effect::AbortPrepare,
                Effect::Publish(_),
                Effect::AbortStart,
                Effect::Schedule { .. }
            ]
        ));
        assert_eq!(
            notes(&effects)[0].1,
            "manifest changed (version 2.0.0): restarting with it"
        );
        let effects = w.step(Input::Started {
            generation: first,
            result: Ok(Up {
                session: "old",
                manifest: v("1.0.0"),
                reauthorized: false,
                rejected: None,
            }),
        });
        assert!(matches!(
            effects[..],
            [Effect::Stop {
                session: "old",
                then_start: None
            }]
        ));
        assert_eq!(w.lc.state(), BundleState::Restarting);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_manifest_keeps_the_running_version() {
        let mut w = World::new();
        w.up("s");
        let effects = w.step(Input::Rejected("bad".into()));
        assert_eq!(w.lc.state(), BundleState::Ready);
        assert_eq!(
            notes(&effects)[0].1,
            "manifest change rejected, the running version keeps running: bad"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_session_and_refuses_waiting_calls() {
        let mut w = World::new();
        w.up("s");
        let effects = w.step(Input::Shutdown);
        assert!(matches!(
            effects[0],
            Effect::Stop {
                session: "s",
                then_start: None
            }
        ));
        assert!(matches!(effects.last(), Some(Effect::CloseLane)));
        assert_eq!(w.lc.state(), BundleState::Stopped);
        // Nothing that was under way can bring it back.
        let g = w.g();
        assert!(w.step(Input::Start { generation: g }).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_uses_the_installed_manifest_then_the_running_one() {
        let mut lc: Lifecycle<&'static str, Man, Req> =
            Lifecycle::new(0, 0, Some(v("1.0.0")), Vec::new());
        assert_eq!(spawned(lc.begin()), (Wanted::Exactly(v("1.0.0")), None));
        let mut w = World::new();
        w.up("s1");
        assert_eq!(w.lc.manifest(), Some(&v("1.0.0")));
        tokio::time::advance(Duration::from_secs(11)).await;
        w.exit(1);
        // A crash restart runs what ran, without reading the disk.
        assert_eq!(w.due(), (Wanted::Exactly(v("1.0.0")), None));
        // So do `configure` and `auth`.
        w.up("s2");
        w.step(Input::Respawn(Respawn::Reconfigured));
        assert_eq!(w.due().0, Wanted::Exactly(v("1.0.0")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_start_without_an_install_reads_the_disk() {
        let mut lc: Lifecycle<&'static str, Man, Req> = Lifecycle::new(2, 1, None, Vec::new());
        assert_eq!(
            spawned(lc.begin()),
            (Wanted::FromDisk { last_good: None }, None)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_operator_restart_reads_the_disk_with_the_running_manifest_as_fallback() {
        let mut w = World::new();
        w.up("s1");
        w.step(Input::Respawn(Respawn::Operator));
        assert_eq!(
            w.due().0,
            Wanted::FromDisk {
                last_good: Some(v("1.0.0"))
            }
        );
        // Only that start: the next crash restart runs what the disk gave.
        w.up("s2");
        tokio::time::advance(Duration::from_secs(11)).await;
        w.exit(1);
        assert_eq!(w.due().0, Wanted::Exactly(v("1.0.0")));
        // A failed watched bundle whose files changed reads the disk too.
        w.step(Input::FilesChanged);
        assert!(matches!(w.due().0, Wanted::FromDisk { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upgrade_restarts_with_its_manifest_which_then_runs() {
        let mut w = World::new();
        w.up("s1");
        let effects = w.step(Input::Upgrade(v("2.0.0")));
        assert_eq!(
            notes(&effects),
            vec![(
                EventKind::Upgrading,
                "manifest changed (version 2.0.0): restarting with it".into()
            )]
        );
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::Stop {
                session: "s1",
                then_start: Some(_)
            }
        )));
        assert_eq!(w.due().0, Wanted::Exactly(v("2.0.0")));
        w.started("s2", v("2.0.0"));
        assert_eq!(w.lc.manifest(), Some(&v("2.0.0")));
        assert_eq!(w.lc.restarts(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_upgrade_that_needs_an_environment_is_built_while_the_running_version_serves() {
        let mut w = World::new();
        w.up("s1");
        let uv = Man {
            version: "2.0.0",
            uv: true,
        };
        let effects = w.step(Input::Upgrade(uv.clone()));
        assert!(matches!(&effects[..], [Effect::Prepare(m)] if *m == uv));
        assert_eq!(w.lc.session(), Some(&"s1"), "still serving");
        // Built: now the restart, with it.
        let effects = w.step(Input::Prepared(uv.clone()));
        assert_eq!(notes(&effects)[0].0, EventKind::Upgrading);
        assert_eq!(w.due().0, Wanted::Exactly(uv.clone()));
        // A bundle that is not serving has nothing to keep running: its
        // start builds the environment.
        let effects = w.step(Input::Upgrade(Man {
            version: "3.0.0",
            uv: true,
        }));
        assert!(matches!(effects[0], Effect::AbortPrepare));
        assert_eq!(notes(&effects)[0].0, EventKind::Upgrading);
    }

    #[tokio::test(start_paused = true)]
    async fn the_challenge_of_a_401_goes_to_the_next_start_only() {
        let mut w = World::new();
        w.up("s1");
        let g = w.g();
        w.step(Input::AuthExpired {
            generation: g,
            challenge: Some("Bearer error=\"insufficient_scope\"".into()),
            call: None,
        });
        assert_eq!(
            w.due(),
            (
                Wanted::Exactly(v("1.0.0")),
                Some("Bearer error=\"insufficient_scope\"".into())
            )
        );
        w.started("s2", v("1.0.0"));
        w.step(Input::Respawn(Respawn::Authorized));
        assert_eq!(w.due().1, None);
        // A stale session's 401 leaves no challenge behind.
        w.up("s3");
        w.step(Input::AuthExpired {
            generation: g,
            challenge: Some("stale".into()),
            call: None,
        });
        assert_eq!(w.lc.session(), Some(&"s3"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_excluded_tool_is_refused_in_every_state_and_an_unknown_one_when_ready() {
        let mut w = World::new();
        let effects = w.step(Input::Call(Req("hidden")));
        assert_eq!(refusals(&effects), vec![("hidden", Refusal::NoSuchTool)]);
        assert!(w.lc.excludes("hidden") && !w.lc.excludes("add"));
        // Any other call is told the bundle is starting.
        let effects = w.step(Input::Call(Req("missing")));
        assert!(matches!(
            &refusals(&effects)[..],
            [(
                "missing",
                Refusal::NotReady {
                    state: BundleState::Starting,
                    ..
                }
            )]
        ));
        w.up("s1");
        for tool in ["hidden", "missing"] {
            let effects = w.step(Input::Call(Req(tool)));
            assert_eq!(refusals(&effects), vec![(tool, Refusal::NoSuchTool)]);
        }
        let effects = w.step(Input::Call(Req("add")));
        assert_eq!(sent(&effects), vec![("add", true)]);
        // A passed-through request names no tool: it runs.
        let effects = w.step(Input::Call(Req("")));
        assert_eq!(sent(&effects), vec![("", true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_on_a_session_whose_transport_closed_is_told_the_bundle_restarts() {
        let mut w = World::new();
        w.up("closed");
        let effects = w.step(Input::Call(Req("add")));
        assert_eq!(
            refusals(&effects),
            vec![(
                "add",
                Refusal::NotReady {
                    state: BundleState::Restarting,
                    last_error: Some("the bundle's session just ended".into())
                }
            )]
        );
        assert_eq!(w.lc.state(), BundleState::Ready, "its exit decides");
    }

    #[tokio::test(start_paused = true)]
    async fn calls_waiting_for_a_rebuild_are_refused_with_the_state_it_ended_in() {
        let mut w = World::new();
        w.up("s1");
        let g = w.g();
        w.step(Input::AuthExpired {
            generation: g,
            challenge: None,
            call: Some(Req("add")),
        });
        w.due();
        let g = w.g();
        let effects = w.step(Input::Started {
            generation: g,
            result: Err(failure(FailKind::NeedsAuth)),
        });
        assert_eq!(
            refusals(&effects),
            vec![(
                "add",
                Refusal::NotReady {
                    state: BundleState::NeedsAuth,
                    last_error: Some("why".into())
                }
            )]
        );
        // And on shutdown, as stopping.
        w.step(Input::Respawn(Respawn::Authorized));
        w.due();
        w.up("s2");
        let g = w.g();
        w.step(Input::AuthExpired {
            generation: g,
            challenge: None,
            call: Some(Req("echo")),
        });
        let effects = w.step(Input::Shutdown);
        assert_eq!(
            refusals(&effects),
            vec![(
                "echo",
                Refusal::NotReady {
                    state: BundleState::Stopped,
                    last_error: Some("the bundle is stopping".into())
                }
            )]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_lane_opens_with_a_ready_session_and_closes_when_it_goes() {
        let mut w = World::new();
        let effects = w.started("s1", v("1.0.0"));
        assert!(matches!(effects[0], Effect::Watch));
        assert!(matches!(effects.last(), Some(Effect::OpenLane)));
        // Nothing changes for the lane while the same session serves.
        let effects = w.step(Input::Call(Req("add")));
        assert!(!effects
            .iter()
            .any(|e| matches!(e, Effect::OpenLane | Effect::CloseLane)));
        let g = w.g();
        let effects = w.step(Input::AuthExpired {
            generation: g,
            challenge: None,
            call: None,
        });
        assert!(matches!(effects.last(), Some(Effect::CloseLane)));
        w.due();
        let effects = w.started("s2", v("1.0.0"));
        assert!(matches!(effects.last(), Some(Effect::OpenLane)));
        tokio::time::advance(Duration::from_secs(11)).await;
        let effects = w.exit(1);
        assert!(matches!(effects.last(), Some(Effect::CloseLane)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_disk_manifest_shows_while_the_last_good_one_runs() {
        let mut w = World::new();
        w.up("s1");
        w.step(Input::Respawn(Respawn::Operator));
        w.due();
        let g = w.g();
        let effects = w.step(Input::Started {
            generation: g,
            result: Ok(Up {
                session: "s2",
                manifest: v("1.0.0"),
                reauthorized: false,
                rejected: Some("half-written".into()),
            }),
        });
        assert_eq!(
            notes(&effects).iter().map(|n| n.0).collect::<Vec<_>>(),
            vec![EventKind::Ready, EventKind::ManifestRejected]
        );
        assert_eq!(w.lc.state(), BundleState::Ready);
        assert_eq!(
            w.lc.last_error(),
            Some("manifest change rejected, the running version keeps running: half-written")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_is_explained_by_its_telling_stderr_line_or_its_exit_alone() {
        let mut w = World::new();
        w.up("s1");
        tokio::time::advance(Duration::from_secs(11)).await;
        let g = w.g();
        let effects = w.step(Input::Exited {
            generation: g,
            exit: Exit {
                telling: None,
                ..exit(2)
            },
        });
        assert_eq!(w.lc.last_error(), Some("process exited (exit code 2)"));
        // The event carries the stderr lines as they were.
        assert!(effects.iter().any(|e| matches!(
            e,
            Effect::Publish(n) if n.kind == EventKind::Exited && n.stderr.len() == 2
        )));
    }

    /// The predicates the control server and the gateway use agree with
    /// the phases they stand for.
    #[tokio::test(start_paused = true)]
    async fn state_predicates_agree_with_the_phases() {
        let phases: Vec<Phase<()>> = vec![
            Phase::Starting { reauth: false },
            Phase::Restarting { reauth: true },
            Phase::Ready {
                session: (),
                since: Instant::now(),
                kill: None,
            },
            Phase::Failed { reason: "x".into() },
            Phase::NeedsConfig { reason: "x".into() },
            Phase::NeedsAuth { reason: "x".into() },
            Phase::Stopped { reason: "x".into() },
        ];
        for p in &phases {
            let state = p.state();
            let coming_up = matches!(p, Phase::Starting { .. } | Phase::Restarting { .. });
            let down_for_operator = matches!(
                p,
                Phase::Failed { .. } | Phase::NeedsConfig { .. } | Phase::NeedsAuth { .. }
            );
            assert_eq!(state.is_coming_up(), coming_up, "{state:?}");
            assert_eq!(state.needs_operator(), down_for_operator, "{state:?}");
        }
        let states: std::collections::BTreeSet<_> =
            phases.iter().map(|p| p.state().as_str()).collect();
        // `unpacking` comes before a bundle has a lifecycle: the board
        // shows an archive being unpacked for an install.
        let lived: std::collections::BTreeSet<_> = BundleState::ALL
            .into_iter()
            .filter(|s| *s != BundleState::Unpacking)
            .map(BundleState::as_str)
            .collect();
        assert_eq!(states, lived, "every state has a phase");
    }

    /// The table in docs/ARCHITECTURE.md is the one [`table`] gives.
    #[test]
    fn the_transition_table_in_the_architecture_doc_is_this_one() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ARCHITECTURE.md"))
                .unwrap();
        let mut expected = String::from("| from | input | to |\n|---|---|---|\n");
        for r in table() {
            expected.push_str(&format!("| {} | {} | {} |\n", r.from, r.input, r.to));
        }
        assert!(
            doc.contains(&expected),
            "docs/ARCHITECTURE.md must contain the lifecycle table exactly as lifecycle::table() gives it:\n\n{expected}"
        );
    }
}
