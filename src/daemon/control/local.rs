//! The gateway inside the daemon: its [`Backend`] runs the handlers of the
//! control methods of the same names directly — no socket, no JSON between
//! — as the daemon's own peer; and the stdio sessions of
//! `gateway.attach` are served here.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::ActorRef;
use rmcp::model::ProgressNotificationParam;
use rmcp::service::RunningService;
use rmcp::RoleServer;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{call, gateway, peer, Ctx};
use crate::bundle::client::{Agent, Caller};
use crate::daemon::supervisor::DaemonMsg;
use crate::daemon::Shared;
use crate::gateway::{Backend, Gateway};
use crate::protocol::{
    AttachParams, CallParams, LifecycleEvent, McpParams, RpcError, ToolsParams, ToolsResult,
    WorkspaceResourcesParams,
};

struct Local(Ctx);

/// The backend of every gateway session the daemon serves.
pub fn backend(daemon: ActorRef<DaemonMsg>, shared: Arc<Shared>) -> Arc<dyn Backend> {
    Arc::new(Local(Ctx {
        daemon,
        shared,
        peer: peer::Peer::daemon(),
    }))
}

impl Backend for Local {
    fn tools(&self, p: ToolsParams) -> BoxFuture<'_, Result<ToolsResult, RpcError>> {
        Box::pin(call::tools(p, &self.0))
    }

    fn mcp(&self, p: McpParams, agent: Arc<dyn Agent>) -> BoxFuture<'_, Result<Value, RpcError>> {
        Box::pin(gateway::mcp(p, Caller::Agent(agent)))
    }

    fn workspace_resources(
        &self,
        p: WorkspaceResourcesParams,
    ) -> BoxFuture<'_, Result<Value, RpcError>> {
        Box::pin(gateway::workspace_resources(p, &self.0))
    }

    fn call(
        &self,
        p: CallParams,
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancel: CancellationToken,
        agent: Arc<dyn Agent>,
    ) -> BoxFuture<'_, Result<Value, RpcError>> {
        let caller = Caller::Agent(agent);
        Box::pin(async move { call::call_bundle(&p, &self.0, progress, &cancel, caller).await })
    }

    fn events(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.0.shared.board.subscribe()
    }
}

/// Serves the gateway on what is left of an attached connection, until
/// the agent (or the daemon) ends it.
pub(super) async fn serve_attached<R, W>(
    read: R,
    write: W,
    p: AttachParams,
    profile: Option<crate::config::Profile>,
    ctx: &Ctx,
) where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(read, write);
    if let Some(service) = start(transport, p, profile, ctx).await {
        let _ = service.waiting().await;
    }
}

/// A stdio gateway session on `transport`: a new one, or one the agent
/// began with a daemon that has since restarted (`p.resume`).
pub(super) async fn start<T>(
    transport: T,
    p: AttachParams,
    profile: Option<crate::config::Profile>,
    ctx: &Ctx,
) -> Option<RunningService<RoleServer, Gateway>>
where
    T: rmcp::transport::Transport<RoleServer> + 'static,
{
    use rmcp::ServiceExt;
    let gateway = Gateway::new(
        backend(ctx.daemon.clone(), ctx.shared.clone()),
        p.workspace.clone(),
        profile,
        p.wait_ready_ms
            .map(Duration::from_millis)
            .unwrap_or(crate::gateway::DEFAULT_WAIT_READY),
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
            gateway.watch(peer);
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
