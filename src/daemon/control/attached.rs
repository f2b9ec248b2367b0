//! The stdio sessions of `gateway.attach`: what is left of an attached
//! control connection becomes an MCP session of the workspace's gateway,
//! which asks the daemon through its API.

use std::time::Duration;

use rmcp::service::RunningService;
use rmcp::RoleServer;

use super::Ctx;
use crate::daemon::gateway::Gateway;
use crate::protocol::AttachParams;

/// Serves the gateway on what is left of an attached connection, until
/// the agent (or the daemon) ends it.
pub(super) async fn serve_attached<R, W>(
    read: R,
    write: W,
    p: AttachParams,
    scope: super::gateway::Scope,
    ctx: &Ctx,
) where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(read, write);
    if let Some(service) = start(transport, p, scope, ctx).await {
        let _ = service.waiting().await;
    }
}

/// A stdio gateway session on `transport`: a new one, or one the agent
/// began with a daemon that has since restarted (`p.resume`).
pub(super) async fn start<T>(
    transport: T,
    p: AttachParams,
    scope: super::gateway::Scope,
    ctx: &Ctx,
) -> Option<RunningService<RoleServer, Gateway>>
where
    T: rmcp::transport::Transport<RoleServer> + 'static,
{
    use rmcp::ServiceExt;
    let naming =
        crate::daemon::gateway::names::Naming::of(p.bundle.clone(), scope.profile.as_ref());
    let gateway = Gateway::new(
        ctx.api.clone(),
        p.workspace.clone(),
        scope.profile,
        p.wait_ready_ms
            .map(Duration::from_millis)
            .unwrap_or(crate::daemon::gateway::DEFAULT_WAIT_READY),
        // One agent on this connection: its own waiting calls and routes.
        crate::daemon::gateway::Common::new(Default::default()),
        naming,
        Some(scope.grant),
    );
    match p.resume {
        Some(resume) => {
            let init =
                serde_json::from_value::<rmcp::model::InitializeRequestParams>(resume).ok()?;
            let service = rmcp::service::serve_directly(gateway.clone(), transport, Some(init));
            // Its lists may have changed while no daemon served it.
            let peer = service.peer().clone();
            let _ = peer.notify_tool_list_changed().await;
            let _ = peer.notify_prompt_list_changed().await;
            let _ = peer.notify_resource_list_changed().await;
            gateway.watch(peer, None);
            Some(service)
        }
        None => match gateway.serve(transport).await {
            Ok(service) => Some(service),
            Err(e) => {
                tracing::debug!(workspace = %p.workspace, "a stdio gateway session did not start: {e}");
                None
            }
        },
    }
}
