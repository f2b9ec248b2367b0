//! The bundle lifecycle as one pure state machine.
//!
//! [`Lifecycle::step`] takes one [`Input`] (a start is due, a start ended,
//! the process exited, the liveness check gave up, a 401, an operator's
//! respawn, a refused manifest change, shutdown) and the current time, moves
//! the [`Phase`] and returns the [`Effect`]s the BundleActor runs: start a
//! task, schedule a start, stop or drain a session, answer the calls that
//! waited, publish an event. It does no I/O and reads no clock; the restart
//! decision is [`RestartTracker::decide`] with the jitter it is given. So
//! every transition is tested here on a paused clock, and the table in
//! docs/ARCHITECTURE.md is checked against [`table`] by a test.
//!
//! The session type `S` is the actor's live connection (peer, lifeline,
//! tools); a phase owns it, so a session belongs to exactly one generation
//! and everything known about it (since when it is ready, why the daemon
//! killed it) goes away with it.

use std::time::Duration;

use tokio::time::Instant;

use super::policy::{Decision, RestartTracker, Stop};
use crate::config::{RestartPolicy, Supervision};
use crate::protocol::{BundleState, EventKind, ExitStatus};

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
}

/// Why a bundle is stopped and started again at once on request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// `bundlevisor restart`.
    Operator,
    /// `configure` stored new user_config values.
    Reconfigured,
    /// `auth` stored new tokens.
    Authorized,
    /// A watched manifest changed and passed validation.
    Upgrade { version: String },
    /// The files of a failed watched bundle changed.
    FilesChanged,
}

impl Why {
    fn event(&self) -> (EventKind, String) {
        match self {
            Why::Operator => (EventKind::Restarting, "restarting on request".into()),
            Why::Reconfigured => (
                EventKind::Reconfigured,
                "user_config changed: restarting with the new values".into(),
            ),
            Why::Authorized => (
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
}

/// What happened.
#[derive(Debug)]
pub enum Input<S> {
    /// A scheduled start of `generation` is due.
    Start { generation: u64 },
    /// The start task of `generation` ended; `reauthorized`: a remote
    /// bundle got a new token on the way.
    Started {
        generation: u64,
        result: Result<(S, bool), StartFailure>,
    },
    /// The process (or remote session) of `generation` ended.
    Exited { generation: u64, exit: Exit },
    /// The liveness check gave up on the process of `generation`.
    Unresponsive { generation: u64, reason: String },
    /// A remote server answered 401 on the session of `generation`.
    AuthExpired { generation: u64 },
    /// Stop whatever runs and start again at once; clears the breaker.
    Respawn(Why),
    /// A watched manifest change was refused; the bundle keeps its version.
    Rejected(String),
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

/// What the actor must do, in order.
#[derive(Debug)]
pub enum Effect<S> {
    /// Run the start task of `generation`.
    Spawn { generation: u64 },
    /// Send `Start { generation }` after `delay` (zero: at once).
    Schedule { generation: u64, delay: Duration },
    /// Stop `session` (SIGTERM, `stop_grace`, SIGKILL) in a task, then send
    /// `Start { generation }` if given.
    Stop { session: S, then_start: Option<u64> },
    /// The session ended by itself: drop its handle (what is left of its
    /// process group dies with it).
    Release(S),
    /// Kill the ready session's process; its exit comes back as `Exited`.
    Kill,
    /// Close `session` once the calls in flight on it are done (401 rebuild).
    Drain(S),
    /// Cancel the start task in progress; a half-started process dies with it.
    AbortStart,
    /// Send the calls that waited for a rebuild to the new session.
    FlushQueue,
    /// Refuse the calls that waited: the rebuild did not come up.
    FailQueue(String),
    /// Publish an event (and the status it leads to).
    Publish(Note),
}

/// What the restart decision needs besides the history.
pub struct Env<'a> {
    pub supervision: &'a Supervision,
    pub policy: RestartPolicy,
    /// In [0, 1): spreads the backoff of bundles that crash together.
    pub jitter: f64,
}

/// Where a call to the bundle goes now.
#[derive(Debug)]
pub enum Route<'a, S> {
    /// To the ready session.
    Send(&'a S),
    /// Wait for the session being rebuilt after a 401.
    Queue,
    /// Not now: the bundle is in `state`.
    Refuse {
        state: BundleState,
        last_error: Option<String>,
    },
}

/// One bundle's lifecycle: the phase, the generation, the restart history
/// and the counters `status` and the metrics show.
#[derive(Debug)]
pub struct Lifecycle<S> {
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
}

impl<S> Lifecycle<S> {
    /// A bundle coming up for the first time in this actor; `restarts` and
    /// `crashes` carry over from a panicked predecessor. [`begin`](Self::begin)
    /// gives the effects of its first start.
    pub fn new(restarts: u32, crashes: u64) -> Lifecycle<S> {
        Lifecycle {
            phase: Phase::Starting { reauth: false },
            generation: 0,
            tracker: RestartTracker::default(),
            restarts,
            crashes,
            last_error: None,
        }
    }

    /// The first start: announce it and run it.
    pub fn begin(&self) -> Vec<Effect<S>> {
        vec![
            Effect::Publish(Note::new(EventKind::Starting, "starting")),
            Effect::Spawn {
                generation: self.generation,
            },
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

    /// Where a call goes now.
    pub fn route(&self) -> Route<'_, S> {
        match &self.phase {
            Phase::Ready { session, .. } => Route::Send(session),
            p if p.reauthing() => Route::Queue,
            p => Route::Refuse {
                state: p.state(),
                last_error: self.last_error.clone(),
            },
        }
    }

    /// Moves the lifecycle by one input; returns what the actor must do.
    pub fn step(&mut self, input: Input<S>, now: Instant, env: &Env) -> Vec<Effect<S>> {
        let current = |g: u64| g == self.generation;
        match input {
            Input::Start { generation } if current(generation) => match self.phase {
                Phase::Restarting { reauth } => {
                    if !reauth {
                        self.restarts += 1;
                    }
                    self.phase = Phase::Starting { reauth };
                    vec![
                        Effect::Publish(Note::new(EventKind::Starting, "starting")),
                        Effect::Spawn { generation },
                    ]
                }
                _ => Vec::new(),
            },
            Input::Started { generation, result } if !current(generation) => match result {
                // A superseded start that came up anyway: not ours any more.
                Ok((session, _)) => vec![Effect::Stop {
                    session,
                    then_start: None,
                }],
                Err(_) => Vec::new(),
            },
            Input::Started { result, .. } if !matches!(self.phase, Phase::Starting { .. }) => {
                match result {
                    Ok((session, _)) => vec![Effect::Stop {
                        session,
                        then_start: None,
                    }],
                    Err(_) => Vec::new(),
                }
            }
            Input::Started {
                result: Ok((session, reauthorized)),
                ..
            } => {
                self.phase = Phase::Ready {
                    session,
                    since: now,
                    kill: None,
                };
                self.last_error = None;
                let mut effects = Vec::new();
                if reauthorized {
                    effects.push(Effect::Publish(Note::new(
                        EventKind::Reauthorized,
                        "new token obtained; session rebuilt",
                    )));
                }
                effects.push(Effect::Publish(Note::new(EventKind::Ready, "ready")));
                effects.push(Effect::FlushQueue);
                effects
            }
            Input::Started {
                result: Err(StartFailure { kind, reason }),
                ..
            } => {
                let mut effects = vec![Effect::FailQueue(reason.clone())];
                let down = match kind {
                    FailKind::Config => Phase::Failed { reason },
                    FailKind::NeedsConfig => Phase::NeedsConfig { reason },
                    FailKind::NeedsAuth => Phase::NeedsAuth { reason },
                    FailKind::Transient => {
                        self.crashes += 1;
                        effects.extend(self.after_stop(
                            Stop::Failure(reason),
                            None,
                            None,
                            now,
                            env,
                        ));
                        return effects;
                    }
                };
                effects.extend(self.settle(down));
                effects
            }
            Input::Exited { generation, exit } if current(generation) => {
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
                    None => {
                        Stop::Failure(match crate::bundle::process::telling_line(&exit.stderr) {
                            Some(line) => format!("process exited ({}): {line}", exit.text),
                            None => format!("process exited ({})", exit.text),
                        })
                    }
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
            Input::Unresponsive { generation, reason } if current(generation) => {
                match &mut self.phase {
                    Phase::Ready { kill, .. } if kill.is_none() => {
                        *kill = Some(reason);
                        vec![Effect::Kill]
                    }
                    _ => Vec::new(),
                }
            }
            Input::AuthExpired { generation } if current(generation) => {
                // The first 401 of this session: one rebuild, however many
                // calls were refused (they wait for it). Not a restart.
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
            Input::Respawn(why) => {
                self.tracker.reset();
                self.generation += 1;
                let mut effects = Vec::new();
                if self.phase.reauthing() {
                    effects.push(Effect::FailQueue(
                        "the bundle is being restarted".to_string(),
                    ));
                }
                let old = std::mem::replace(&mut self.phase, Phase::Restarting { reauth: false });
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
            Input::Rejected(reason) => {
                let message = match self.phase {
                    Phase::Ready { .. } | Phase::Starting { .. } => format!(
                        "manifest change rejected, the running version keeps running: {reason}"
                    ),
                    _ => format!("manifest change rejected: {reason}"),
                };
                self.last_error = Some(message.clone());
                vec![Effect::Publish(Note::new(
                    EventKind::ManifestRejected,
                    message,
                ))]
            }
            Input::Shutdown => {
                self.generation += 1;
                let mut effects = vec![Effect::FailQueue("the bundle is stopping".to_string())];
                match std::mem::replace(
                    &mut self.phase,
                    Phase::Stopped {
                        reason: "stopped".into(),
                    },
                ) {
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
            // Stale: an earlier generation's start, exit, liveness report or 401.
            Input::Start { .. }
            | Input::Exited { .. }
            | Input::Unresponsive { .. }
            | Input::AuthExpired { .. } => Vec::new(),
        }
    }

    /// Down until the operator acts.
    fn settle(&mut self, down: Phase<S>) -> Vec<Effect<S>> {
        let (kind, reason) = match &down {
            Phase::Failed { reason } => (EventKind::Failed, reason.clone()),
            Phase::NeedsConfig { reason } => (EventKind::NeedsConfig, reason.clone()),
            Phase::NeedsAuth { reason } => (EventKind::NeedsAuth, reason.clone()),
            Phase::Stopped { reason } => (EventKind::Stopped, reason.clone()),
            _ => unreachable!("settle is only given a down phase"),
        };
        if kind != EventKind::Stopped {
            self.last_error = Some(reason.clone());
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
        env: &Env,
    ) -> Vec<Effect<S>> {
        let mut effects: Vec<Effect<S>> = before.map(Effect::Publish).into_iter().collect();
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
                    self.last_error = Some(reason.clone());
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

/// The transition table, as docs/ARCHITECTURE.md shows it; every row is
/// exercised against [`Lifecycle::step`] by the tests below.
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

    struct World {
        sup: Supervision,
        policy: RestartPolicy,
        lc: Lifecycle<&'static str>,
    }

    impl World {
        fn new() -> World {
            World {
                sup: super::super::policy::test_supervision(),
                policy: RestartPolicy::Always,
                lc: Lifecycle::new(0, 0),
            }
        }

        fn step(&mut self, input: Input<&'static str>) -> Vec<Effect<&'static str>> {
            let env = Env {
                supervision: &self.sup,
                policy: self.policy,
                jitter: 0.5,
            };
            self.lc.step(input, Instant::now(), &env)
        }

        fn g(&self) -> u64 {
            self.lc.generation()
        }

        fn up(&mut self, session: &'static str) {
            let g = self.g();
            self.step(Input::Started {
                generation: g,
                result: Ok((session, false)),
            });
            assert_eq!(self.lc.state(), BundleState::Ready);
        }

        fn exit(&mut self, code: i32) -> Vec<Effect<&'static str>> {
            let g = self.g();
            self.step(Input::Exited {
                generation: g,
                exit: exit(code),
            })
        }

        /// Runs the start the last step scheduled.
        fn due(&mut self) {
            let g = self.g();
            self.step(Input::Start { generation: g });
            assert_eq!(self.lc.state(), BundleState::Starting);
        }
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
            stderr: vec!["last words".into()],
        }
    }

    fn notes<S>(effects: &[Effect<S>]) -> Vec<(EventKind, String)> {
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
        w.step(Input::Respawn(Why::Operator));
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
        w.step(Input::Respawn(Why::Operator));
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
            w.step(Input::Respawn(Why::Operator));
            w.due();
            let g = w.g();
            let effects = w.step(Input::Started {
                generation: g,
                result: Err(failure(kind)),
            });
            assert_eq!(w.lc.state(), state);
            assert!(matches!(effects[0], Effect::FailQueue(_)));
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
        let effects = w.step(Input::AuthExpired { generation: g });
        assert!(matches!(effects[0], Effect::Drain("s1")));
        assert!(matches!(w.lc.route(), Route::Queue));
        // Further 401s of the old session change nothing.
        assert!(w.step(Input::AuthExpired { generation: g }).is_empty());
        w.due();
        assert!(matches!(w.lc.route(), Route::Queue));
        let g = w.g();
        let effects = w.step(Input::Started {
            generation: g,
            result: Ok(("s2", true)),
        });
        assert_eq!(
            notes(&effects).iter().map(|n| n.0).collect::<Vec<_>>(),
            vec![EventKind::Reauthorized, EventKind::Ready]
        );
        assert!(matches!(effects.last(), Some(Effect::FlushQueue)));
        assert!(matches!(w.lc.route(), Route::Send(&"s2")));
        assert_eq!(w.lc.restarts(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_superseded_start_is_stopped_when_it_comes_up() {
        let mut w = World::new();
        let first = w.g();
        let effects = w.step(Input::Respawn(Why::Upgrade {
            version: "2.0.0".into(),
        }));
        assert!(matches!(
            effects[..],
            [
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
            result: Ok(("old", false)),
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
        assert!(matches!(effects[0], Effect::FailQueue(_)));
        assert!(matches!(
            effects[1],
            Effect::Stop {
                session: "s",
                then_start: None
            }
        ));
        assert_eq!(w.lc.state(), BundleState::Stopped);
        // Nothing that was under way can bring it back.
        let g = w.g();
        assert!(w.step(Input::Start { generation: g }).is_empty());
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
        assert_eq!(
            states.len(),
            BundleState::ALL.len(),
            "every state has a phase"
        );
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
