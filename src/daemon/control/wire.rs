//! The control socket's side of the daemon's API: its refusals as the
//! wire's `RpcError` (the one `From<ApiError>` of this face, keeping each
//! kind's details: a state, an MCP code, a manifest's problems), and the
//! shortcuts the handlers share.

use serde_json::{json, Value};

use crate::daemon::api::ApiError;
use crate::daemon::supervisor::InstallError;
use crate::manifest::ManifestError;
use crate::protocol::RpcError;

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
            ApiError::WorkspaceNotFound { workspace, .. } => {
                RpcError::new(kind, message).with("workspace", workspace)
            }
            ApiError::NoSuchProfile { profile, .. } => {
                RpcError::new(kind, message).with("profile", profile)
            }
            ApiError::TokenExists(name) | ApiError::TokenNotFound(name) => {
                RpcError::new(kind, message).with("name", name)
            }
            ApiError::InvalidConfigValue { problems, .. } => {
                RpcError::new(kind, message).with("problems", problems)
            }
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

pub(super) fn not_found(workspace: &str, name: &str) -> RpcError {
    ApiError::not_found(workspace, name).into()
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> RpcError {
    ApiError::unavailable(e).into()
}
