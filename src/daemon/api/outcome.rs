//! Waiting for a bundle: until it is ready (a call that may wait), and for
//! the outcome of its next start — the one sequence `restart`,
//! `configure` and `auth` share: subscribe, respawn, wait.

use std::future::Future;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{limit, Api, ApiError};
use crate::daemon::board::Event;
use crate::daemon::bundle::{BundleMsg, Respawn};
use crate::daemon::Shared;
use crate::protocol::{BundleState, BundleStatus, EventKind};

impl Api {
    /// Respawns a bundle (`why`) and waits for the outcome of its new
    /// start, passing each of its transitions to `seen` as it happens.
    pub async fn respawn_and_wait<F: Future<Output = ()>>(
        &self,
        workspace: &str,
        name: &str,
        why: Respawn,
        seen: impl FnMut(Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        let actor = Api::bundle_actor(workspace, name)?;
        // Subscribed before the respawn: no transition is missed.
        let events = self.shared.board.subscribe();
        Api::ask(
            &actor,
            |r| BundleMsg::Respawn(why, r),
            limit::ANSWER,
            "the bundle's actor",
        )
        .await?;
        self.wait_outcome(events, workspace, name, seen).await
    }

    /// Waits for the bundle's next start to end in ready or not, passing
    /// each transition to `seen`. A start that fails (even one that will
    /// be retried after a backoff) is reported as not started.
    pub async fn wait_outcome<F: Future<Output = ()>>(
        &self,
        mut events: broadcast::Receiver<Event>,
        workspace: &str,
        name: &str,
        mut seen: impl FnMut(Event) -> F,
    ) -> Result<BundleStatus, ApiError> {
        let settings = &self.shared.config.bundles;
        let limit = settings.start_timeout + settings.stop_grace + Duration::from_secs(5);
        let begun = tokio::time::Instant::now();
        let mut deadline = begun + limit;
        let mut started = false;
        let mut preparing = false;
        let not_started = |state, message: &str| ApiError::NotStarted {
            workspace: workspace.to_string(),
            name: name.to_string(),
            state,
            message: message.to_string(),
        };
        loop {
            let event = match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) => {
                    return Err(ApiError::Timeout(format!(
                        "bundle {name:?} did not become ready within {}; see `bundlevisor status` and `bundlevisor logs {name}`",
                        humantime::format_duration(Duration::from_secs(begun.elapsed().as_secs()))
                    )))
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(ApiError::unavailable("event stream closed"))
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    // Missed events: the board has the latest state.
                    started = true;
                    match self.shared.board.get(workspace, name) {
                        Some(s) if s.state == BundleState::Ready => return Ok(s),
                        Some(s) if s.state.needs_operator() => {
                            return Err(not_started(
                                s.state,
                                s.last_error.as_deref().unwrap_or("unknown"),
                            ))
                        }
                        _ => continue,
                    }
                }
                Ok(Ok(event)) => event,
            };
            if event.workspace != workspace || event.name != name {
                continue;
            }
            let (kind, state, message) = (event.kind, event.state, event.message.clone());
            seen(event).await;
            match kind {
                EventKind::Starting => started = true,
                // Building the environment (or unpacking an archive again)
                // has a deadline of its own.
                EventKind::Preparing | EventKind::Unpacking if !preparing => {
                    preparing = true;
                    deadline = tokio::time::Instant::now() + self.shared.config.uv.timeout + limit;
                }
                // An upgrade whose environment could not be built: the
                // running version keeps running.
                EventKind::ManifestRejected if preparing && !started => {
                    return Err(not_started(
                        BundleState::Failed,
                        &format!("{message}; the running version keeps running"),
                    ))
                }
                EventKind::Ready if started => {
                    return self
                        .shared
                        .board
                        .get(workspace, name)
                        .ok_or_else(|| ApiError::not_found(workspace, name));
                }
                EventKind::Failed
                | EventKind::Stopped
                | EventKind::Restarting
                | EventKind::NeedsConfig
                | EventKind::NeedsAuth
                    if started =>
                {
                    return Err(not_started(state, &message))
                }
                _ => {}
            }
        }
    }
}

/// Waits (until `deadline`) for the bundle to become ready, after a call
/// was refused because it was not. `events` was subscribed before that
/// call, so the transition to ready cannot be missed — and the board,
/// which may still show the ready state of a session that just ended (the
/// bundle actor learns of the exit a moment after the call sees the closed
/// transport), is only consulted when events were lost.
pub(super) async fn wait_ready(
    shared: &Shared,
    events: &mut broadcast::Receiver<Event>,
    workspace: &str,
    name: &str,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        let state = match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) | Ok(Err(broadcast::error::RecvError::Closed)) => return false,
            Ok(Ok(e)) if e.workspace == workspace && e.name == name => e.state,
            Ok(Ok(_)) => continue,
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                match shared.board.get(workspace, name) {
                    Some(s) => s.state,
                    None => return false,
                }
            }
        };
        match state {
            BundleState::Ready => return true,
            s if s.is_coming_up() => {}
            _ => return false,
        }
    }
}
