//! The control socket's side of the daemon's API: its refusals as the
//! wire's `RpcError` (the one `From<ApiError>` of this face, keeping each
//! kind's details: a state, an MCP code, a manifest's problems), and the
//! shortcuts the handlers use to ask through [`Api`].

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use serde_json::{json, Value};

use super::Ctx;
use crate::daemon::api::{Api, ApiError};
use crate::daemon::bundle::BundleMsg;
use crate::daemon::supervisor::InstallError;
use crate::daemon::workspace::WorkspaceMsg;
use crate::manifest::ManifestError;
use crate::protocol::RpcError;

pub(super) use crate::daemon::api::limit;

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> RpcError {
        let kind = e.kind();
        let message = e.to_string();
        match e {
            ApiError::NotReady { state, .. } => {
                RpcError::new(kind, message).with("state", state.as_str())
            }
            ApiError::NotStarted {
                workspace,
                name,
                state,
                ..
            } => RpcError::new(kind, message)
                .with("workspace", workspace)
                .with("name", name)
                .with("state", state.as_str()),
            ApiError::Mcp { error, .. } => RpcError::new(kind, message)
                .with("mcp_code", error.code.0)
                .with("mcp_data", error.data.unwrap_or(Value::Null)),
            ApiError::Install(e) => install_details(RpcError::new(kind, message), e),
            _ => RpcError::new(kind, message),
        }
    }
}

/// What an install refusal says beyond its message: the path, the
/// manifest's problems, the missing host capabilities.
fn install_details(error: RpcError, e: InstallError) -> RpcError {
    match e {
        InstallError::NoSuchPath { path, .. } => error.with("path", path.display().to_string()),
        InstallError::Manifest(ManifestError::Invalid { problems, .. }) => error.with(
            "problems",
            problems
                .iter()
                .map(|p| json!({"path": p.path, "message": p.message}))
                .collect::<Vec<_>>(),
        ),
        InstallError::Gate(g) => error.with("bundle", g.bundle).with("missing", g.missing),
        _ => error,
    }
}

/// Asks `actor` and waits for its answer at most `limit`.
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
    Ok(Api::ask(actor, msg, limit, what).await?)
}

pub(super) fn not_found(workspace: &str, name: &str) -> RpcError {
    ApiError::not_found(workspace, name).into()
}

pub(super) fn bundle_actor(workspace: &str, name: &str) -> Result<ActorRef<BundleMsg>, RpcError> {
    Ok(Api::bundle_actor(workspace, name)?)
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> RpcError {
    ApiError::unavailable(e).into()
}

/// The actor of a workspace (created on first use).
pub(super) async fn workspace(ctx: &Ctx, name: &str) -> Result<ActorRef<WorkspaceMsg>, RpcError> {
    Ok(ctx.api.workspace(name).await?)
}

/// An install, uninstall or workspace refusal of the DaemonActor.
pub(super) fn install_error(e: InstallError) -> RpcError {
    ApiError::Install(e).into()
}
