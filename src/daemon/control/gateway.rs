//! Control methods of the MCP gateway: `gateway.attach` (the connection
//! becomes a gateway session the daemon serves: `bundlevisor mcp` relays
//! its stdio to it), `bundle.mcp` (a read-only MCP request passed to a
//! ready bundle), `workspace.resources` (workspace files as MCP resources,
//! answered by the host-resources resolver) and `gateway.profile`.

use rmcp::model::ClientRequest;
use serde_json::{json, Value};

use super::{to_value, Ctx};
use crate::bundle::client::Caller;
use crate::daemon::api::ApiError;
use crate::protocol::{
    AttachParams, ErrorKind, McpParams, ProfileParams, RpcError, WorkspaceResourcesParams,
    PASSTHROUGH_METHODS,
};

/// `bundle.mcp`, as the operator.
pub(super) async fn mcp(p: McpParams, ctx: &Ctx) -> Result<Value, RpcError> {
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
    let answer = ctx
        .api
        .mcp(
            &p.workspace,
            &p.name,
            request,
            Caller::Operator,
            Default::default(),
            ctx.api.shared().telemetry.root(),
        )
        .await?;
    to_value(answer)
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
    let request = parse(method, p.params.as_ref()).map_err(ApiError::from)?;
    to_value(ctx.api.files_resources(&p.workspace, request).await?)
}

pub(super) async fn profile(p: ProfileParams, ctx: &Ctx) -> Result<Value, RpcError> {
    match ctx.shared.config.profiles.iter().find(|x| x.name == p.name) {
        Some(found) => to_value(found),
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

/// What an attached agent's session serves: its profile, and whom its
/// requests come from (the token it gave, or its uid).
pub(super) struct Scope {
    pub profile: Option<crate::config::Profile>,
    pub grant: std::sync::Arc<crate::daemon::gateway::grant::Grant>,
}

/// The token an attaching agent gave (`BUNDLEVISOR_TOKEN`): live, of this
/// workspace, and of the profile asked for (its own when none is).
async fn attach_token(
    p: &AttachParams,
    text: &str,
    ctx: &Ctx,
) -> Result<crate::store::AccessToken, RpcError> {
    let denied = |why: String| RpcError::new(ErrorKind::PermissionDenied, why);
    let Some(token) = ctx.api.token_by_text(text).await? else {
        return Err(denied(
            "the token in BUNDLEVISOR_TOKEN is unknown, revoked or expired; `bundlevisor token create` makes one".into(),
        ));
    };
    if token.workspace != p.workspace {
        return Err(denied(format!(
            "the token in BUNDLEVISOR_TOKEN is for workspace {:?}, not {:?}",
            token.workspace, p.workspace
        )));
    }
    if token.profile.is_some() && p.profile.is_some() && token.profile != p.profile {
        return Err(denied(format!(
            "the token in BUNDLEVISOR_TOKEN is for profile {:?}; leave --profile out or name that one",
            token.profile.as_deref().unwrap_or_default()
        )));
    }
    Ok(token)
}

/// What `gateway.attach` asks for, checked: an unknown workspace or
/// profile, or a token that does not fit, is refused before the
/// connection changes hands.
pub(super) async fn attach_check(p: &AttachParams, ctx: &Ctx) -> Result<Scope, RpcError> {
    use crate::daemon::gateway::grant::Grant;
    ctx.api.known_workspace(&p.workspace)?;
    let token = match &p.token {
        Some(text) => Some(attach_token(p, &text.0, ctx).await?),
        None => None,
    };
    let asked = p
        .profile
        .clone()
        .or_else(|| token.as_ref().and_then(|t| t.profile.clone()));
    let profile = match &asked {
        None => None,
        Some(name) => {
            let found = ctx.shared.config.profiles.iter().find(|x| &x.name == name);
            Some(found.ok_or_else(|| profile_missing(name, ctx))?.clone())
        }
    };
    let grant = match &token {
        Some(token) => Grant::of_token(token),
        None => Grant::of_uid(ctx.peer.uid),
    };
    if let Some(bundle) = &p.bundle {
        if !crate::daemon::gateway::names::profile_allows(profile.as_ref(), bundle) {
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                format!(
                    "profile {:?} does not show bundle {bundle:?}; name a bundle it lists, or leave --profile out",
                    asked.as_deref().unwrap_or_default()
                ),
            ));
        }
        crate::daemon::api::Api::bundle_actor(&p.workspace, bundle)?;
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
    Ok(Scope {
        profile,
        grant: std::sync::Arc::new(grant),
    })
}
