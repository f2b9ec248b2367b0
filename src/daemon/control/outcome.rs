//! Waiting for a bundle: until it is ready (a call that may wait), and for
//! the outcome of its next start — the one sequence `restart`,
//! `configure` and `auth` share: subscribe, respawn, wait.

use std::time::Duration;

use tokio::sync::broadcast;

use super::ask::{ask, bundle_actor, limit, not_found, unavailable};
use super::{Ctx, Outbox};
use crate::daemon::board::Event;
use crate::daemon::bundle::{BundleMsg, Respawn};
use crate::protocol::{BundleState, BundleStatus, ErrorKind, EventKind, RpcError};

/// Respawns a bundle (`why`) and waits for the outcome of its new start,
/// forwarding each transition as a progress notification.
pub(super) async fn respawn_and_wait(
    ctx: &Ctx,
    out: &Outbox,
    workspace: &str,
    name: &str,
    why: Respawn,
) -> Result<BundleStatus, RpcError> {
    let actor = bundle_actor(workspace, name)?;
    // Subscribed before the respawn: no transition is missed.
    let events = ctx.shared.board.subscribe();
    ask(
        &actor,
        |r| BundleMsg::Respawn(why, r),
        limit::ANSWER,
        "the bundle's actor",
    )
    .await?;
    wait_outcome(events, ctx, workspace, name, out).await
}

/// Waits (until `deadline`) for the bundle to become ready, after a call
/// was refused because it was not. `events` was subscribed before that
/// call, so the transition to ready cannot be missed — and the board,
/// which may still show the ready state of a session that just ended (the
/// bundle actor learns of the exit a moment after the call sees the closed
/// transport), is only consulted when events were lost.
pub(super) async fn wait_ready(
    ctx: &Ctx,
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
                match ctx.shared.board.get(workspace, name) {
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

/// A start that did not reach ready; the kind says whether the operator
/// must configure or authorize it.
fn not_started(workspace: &str, name: &str, state: BundleState, message: &str) -> RpcError {
    let (kind, what) = match state {
        BundleState::NeedsConfig => (ErrorKind::NeedsConfig, "needs configuration"),
        BundleState::NeedsAuth => (ErrorKind::NeedsAuth, "needs authorization"),
        _ => (ErrorKind::StartFailed, "failed to start"),
    };
    RpcError::new(kind, format!("bundle {name:?} {what}: {message}"))
        .with("workspace", workspace)
        .with("name", name)
        .with("state", state.as_str())
}

/// Waits for the bundle's next start to end in ready or not, forwarding
/// each transition as a progress notification. A start that fails (even one
/// that will be retried after a backoff) is reported as `start_failed`.
pub(super) async fn wait_outcome(
    mut events: broadcast::Receiver<Event>,
    ctx: &Ctx,
    workspace: &str,
    name: &str,
    out: &Outbox,
) -> Result<BundleStatus, RpcError> {
    let settings = &ctx.shared.config.bundles;
    let limit = settings.start_timeout + settings.stop_grace + Duration::from_secs(5);
    let begun = tokio::time::Instant::now();
    let mut deadline = begun + limit;
    let mut started = false;
    let mut preparing = false;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => {
                return Err(RpcError::new(
                    ErrorKind::Timeout,
                    format!(
                        "bundle {name:?} did not become ready within {}; see `bundlevisor status` and `bundlevisor logs {name}`",
                        humantime::format_duration(Duration::from_secs(begun.elapsed().as_secs()))
                    ),
                ))
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => return Err(unavailable("event stream closed")),
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                // Missed events: the board has the latest state.
                started = true;
                match ctx.shared.board.get(workspace, name) {
                    Some(s) if s.state == BundleState::Ready => return Ok(s),
                    Some(s) if s.state.needs_operator() => {
                        return Err(not_started(workspace, name, s.state, s.last_error.as_deref().unwrap_or("unknown")))
                    }
                    _ => continue,
                }
            }
            Ok(Ok(event)) => event,
        };
        if event.workspace != workspace || event.name != name {
            continue;
        }
        out.progress(&event).await;
        match event.kind {
            EventKind::Starting => started = true,
            // Building the environment has a deadline of its own.
            EventKind::Preparing if !preparing => {
                preparing = true;
                deadline = tokio::time::Instant::now() + ctx.shared.config.uv.timeout + limit;
            }
            EventKind::Ready if started => {
                return ctx
                    .shared
                    .board
                    .get(workspace, name)
                    .ok_or_else(|| not_found(workspace, name));
            }
            EventKind::Failed
            | EventKind::Stopped
            | EventKind::Restarting
            | EventKind::NeedsConfig
            | EventKind::NeedsAuth
                if started =>
            {
                return Err(not_started(workspace, name, event.state, &event.message))
            }
            _ => {}
        }
    }
}
