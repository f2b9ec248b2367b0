//! Control methods of the MCP gateway: `gateway.attach` (the connection
//! becomes a gateway session the daemon serves: `bundlevisor mcp` relays
//! its stdio to it), `bundle.mcp` (a read-only MCP request passed to a
//! ready bundle), `workspace.resources` (workspace files as MCP resources,
//! answered by the host-resources resolver) and `gateway.profile`.

use std::time::Duration;

use ractor::rpc::CallResult;
use rmcp::model::ClientRequest;
use serde_json::{json, Value};

use super::ask::{bundle_actor, limit, unavailable};
use super::files::files_call;
use super::Ctx;
use crate::bundle::client::Caller;
use crate::daemon::bundle::{Ask, BundleMsg, CallError, PendingCall};
use crate::daemon::workspace::FilesOp;
use crate::protocol::{
    AttachParams, ErrorKind, McpParams, ProfileParams, RpcError, WorkspaceResourcesParams,
    PASSTHROUGH_METHODS,
};
use tokio_util::sync::CancellationToken;

/// How long a passed-through request may take.
const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) async fn mcp(p: McpParams, caller: Caller) -> Result<Value, RpcError> {
    if !PASSTHROUGH_METHODS.contains(&p.method.as_str()) {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!(
                "{:?} cannot be passed to a bundle; allowed: {}",
                p.method,
                PASSTHROUGH_METHODS.join(", ")
            ),
        ));
    }
    let request: ClientRequest = serde_json::from_value(json!({
        "method": p.method,
        "params": p.params.clone().unwrap_or_else(|| json!({})),
    }))
    .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("{}: {e}", p.method)))?;
    let actor = bundle_actor(&p.workspace, &p.name)?;
    // The one path to a bundle: in-flight guard, timeout, 401 retry.
    let answer = actor
        .call(
            |reply| {
                BundleMsg::Call(PendingCall {
                    request: Ask::Mcp(Box::new(request)),
                    timeout: Some(PASSTHROUGH_TIMEOUT),
                    cancel: CancellationToken::new(),
                    progress: None,
                    caller,
                    reply,
                })
            },
            Some(PASSTHROUGH_TIMEOUT + limit::CALL_SLACK),
        )
        .await
        .map_err(unavailable)?;
    match answer {
        CallResult::Success(Ok(result)) => Ok(result),
        CallResult::Success(Err(CallError::NotReady { state, .. })) => Err(RpcError::new(
            ErrorKind::NotReady,
            format!("bundle {:?} is {}, not ready", p.name, state.as_str()),
        )
        .with("state", state.as_str())),
        CallResult::Success(Err(CallError::Timeout(_))) | CallResult::Timeout => {
            Err(RpcError::new(
                ErrorKind::Timeout,
                format!("bundle {:?} did not answer {} in time", p.name, p.method),
            ))
        }
        CallResult::Success(Err(CallError::Mcp(e))) => Err(RpcError::new(
            ErrorKind::McpError,
            format!("bundle {:?} answered {}: {}", p.name, p.method, e.message),
        )
        .with("mcp_code", e.code.0)
        .with("mcp_data", e.data.unwrap_or(Value::Null))),
        CallResult::Success(Err(e)) => Err(RpcError::new(
            ErrorKind::ToolCallFailed,
            format!("{} to bundle {:?} failed: {e:?}", p.method, p.name),
        )),
        CallResult::SenderError => Err(unavailable("the bundle did not answer")),
    }
}

pub(super) async fn workspace_resources(
    p: WorkspaceResourcesParams,
    ctx: &Ctx,
) -> Result<Value, RpcError> {
    use crate::host_resources::{parse, METHOD_LIST, METHOD_READ};
    let method = match p.method.as_str() {
        "resources/list" => METHOD_LIST,
        "resources/read" => METHOD_READ,
        other => {
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                format!("{other:?}: expected resources/list or resources/read"),
            ))
        }
    };
    let mcp_error = |e: crate::host_resources::HostError| {
        RpcError::new(ErrorKind::McpError, e.message)
            .with("mcp_code", e.code)
            .with("mcp_data", e.data)
    };
    let request = parse(method, p.params.as_ref()).map_err(mcp_error)?;
    let answer = files_call(ctx, &p.workspace, |reply| FilesOp::Resources {
        request,
        reply,
    })
    .await?;
    answer.map_err(mcp_error)
}

pub(super) async fn profile(p: ProfileParams, ctx: &Ctx) -> Result<Value, RpcError> {
    match ctx.shared.config.profiles.iter().find(|x| x.name == p.name) {
        Some(found) => serde_json::to_value(found)
            .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string())),
        None => Err(profile_missing(&p.name, ctx)),
    }
}

fn profile_missing(name: &str, ctx: &Ctx) -> RpcError {
    let profiles = &ctx.shared.config.profiles;
    RpcError::new(
        ErrorKind::InvalidParams,
        format!(
            "no profile {name:?} in the daemon config; configured: {}",
            if profiles.is_empty() {
                "none (add a [[profile]] table)".to_string()
            } else {
                profiles
                    .iter()
                    .map(|x| x.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    )
}

/// What `gateway.attach` asks for, checked: an unknown workspace or
/// profile is refused before the connection changes hands.
pub(super) fn attach_check(
    p: &AttachParams,
    ctx: &Ctx,
) -> Result<Option<crate::config::Profile>, RpcError> {
    if !super::status::known_workspaces(ctx).contains(&p.workspace) {
        return Err(super::status::no_workspace(ctx, &p.workspace));
    }
    if let Some(resume) = &p.resume {
        serde_json::from_value::<rmcp::model::InitializeRequestParams>(resume.clone()).map_err(
            |e| {
                RpcError::new(
                    ErrorKind::InvalidParams,
                    format!("resume: not initialize params: {e}"),
                )
            },
        )?;
    }
    match &p.profile {
        None => Ok(None),
        Some(name) => {
            let found = ctx.shared.config.profiles.iter().find(|x| &x.name == name);
            match found {
                Some(profile) => Ok(Some(profile.clone())),
                None => Err(profile_missing(name, ctx)),
            }
        }
    }
}
