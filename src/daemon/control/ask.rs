//! One way to ask an actor: with a timeout named after what is asked (all
//! of them in [`limit`]), and the errors every handler shares when a
//! bundle or a workspace is not there or the daemon is going away.

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use serde_json::json;

use super::Ctx;
use crate::daemon::bundle::{actor_name, BundleMsg};
use crate::daemon::supervisor::{DaemonMsg, InstallError};
use crate::daemon::workspace::WorkspaceMsg;
use crate::manifest::ManifestError;
use crate::protocol::{ErrorKind, RpcError};

/// How long the control server waits for an actor, by what it asks.
pub(super) mod limit {
    use std::time::Duration;

    /// A question an actor answers from its state (tools, a respawn set
    /// under way, a workspace's actor).
    pub const ANSWER: Duration = Duration::from_secs(10);
    /// A workspace file operation (a large put or get).
    pub const FILES: Duration = Duration::from_secs(120);
    /// An install: longer than the daemon's own deadlines (reading and
    /// checking 30 s, the workspace taking the bundle `stop_grace` + 10 s),
    /// so the daemon, not the control server, says what took too long.
    pub const INSTALL: Duration = Duration::from_secs(120);
    /// An uninstall: until the bundle's process is gone.
    pub const UNINSTALL: Duration = Duration::from_secs(90);
    /// Slack on top of a call's own timeout (the bundle answers the
    /// timeout, the actor does not).
    pub const CALL_SLACK: Duration = Duration::from_secs(5);
}

/// Asks `actor` and waits for its answer at most `limit`; `what` names
/// who did not answer.
pub(super) async fn ask<M, R>(
    actor: &ActorRef<M>,
    msg: impl FnOnce(RpcReplyPort<R>) -> M,
    limit: Duration,
    what: &str,
) -> Result<R, RpcError>
where
    M: ractor::Message,
    R: Send + 'static,
{
    match actor.call(msg, Some(limit)).await {
        Ok(CallResult::Success(r)) => Ok(r),
        Ok(CallResult::Timeout) => Err(RpcError::new(
            ErrorKind::Timeout,
            format!(
                "{what} did not answer within {}",
                humantime::format_duration(limit)
            ),
        )),
        Ok(CallResult::SenderError) => Err(unavailable(format!("{what} went away"))),
        Err(e) => Err(unavailable(e)),
    }
}

pub(super) fn not_found(workspace: &str, name: &str) -> RpcError {
    RpcError::new(
        ErrorKind::BundleNotFound,
        format!("no bundle {name:?} in workspace {workspace:?}; `bundlevisor status` lists the installed bundles"),
    )
}

pub(super) fn bundle_actor(workspace: &str, name: &str) -> Result<ActorRef<BundleMsg>, RpcError> {
    ActorRef::<BundleMsg>::where_is(actor_name(workspace, name))
        .ok_or_else(|| not_found(workspace, name))
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(
        ErrorKind::ShuttingDown,
        format!("the daemon could not handle the request: {e}"),
    )
}

/// The actor of a workspace (created on first use).
pub(super) async fn workspace(ctx: &Ctx, name: &str) -> Result<ActorRef<WorkspaceMsg>, RpcError> {
    let name = name.to_string();
    ask(
        &ctx.daemon,
        |reply| DaemonMsg::Workspace { name, reply },
        limit::ANSWER,
        "the daemon",
    )
    .await?
    .map_err(install_error)
}

/// An install, uninstall or workspace refusal of the DaemonActor, by its
/// stable kind.
pub(super) fn install_error(e: InstallError) -> RpcError {
    let message = e.to_string();
    match e {
        InstallError::InvalidName(_) => RpcError::new(ErrorKind::InvalidName, message),
        InstallError::NoSuchPath { path, .. } => RpcError::new(ErrorKind::InvalidParams, message)
            .with("path", path.display().to_string()),
        InstallError::Manifest(m) => {
            let err = RpcError::new(ErrorKind::ManifestInvalid, message);
            match m {
                ManifestError::Invalid { problems, .. } => err.with(
                    "problems",
                    problems
                        .iter()
                        .map(|p| json!({"path": p.path, "message": p.message}))
                        .collect::<Vec<_>>(),
                ),
                _ => err,
            }
        }
        InstallError::Gate(g) => RpcError::new(ErrorKind::GateRefused, message)
            .with("bundle", g.bundle)
            .with("missing", g.missing),
        InstallError::Sandbox(_) => RpcError::new(ErrorKind::SandboxRefused, message),
        InstallError::Untrusted(_) => RpcError::new(ErrorKind::BundleUntrusted, message),
        InstallError::Archive(crate::archive::ArchiveError::Refused { .. }) => {
            RpcError::new(ErrorKind::ArchiveRefused, message)
        }
        InstallError::Archive(_) => RpcError::new(ErrorKind::InvalidParams, message),
        InstallError::AlreadyInstalled { .. } => {
            RpcError::new(ErrorKind::AlreadyInstalled, message)
        }
        InstallError::NotInstalled { .. } => RpcError::new(ErrorKind::BundleNotFound, message),
        InstallError::Watched { .. } => RpcError::new(ErrorKind::WatchedBundle, message),
        InstallError::TimedOut(_) => RpcError::new(ErrorKind::Timeout, message),
        InstallError::Store(_) | InstallError::Internal(_) => {
            RpcError::new(ErrorKind::Internal, message)
        }
    }
}
