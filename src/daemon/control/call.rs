//! `bundle.tools` and `bundle.call`: the daemon API's tools and tool
//! calls on the wire, with the bundle's progress forwarded as
//! `call.progress` notifications.

use std::time::Duration;

use rmcp::model::ProgressNotificationParam;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{to_value, Ctx, Outbox};
use crate::bundle::client::Caller;
use crate::daemon::api::CallRequest;
use crate::daemon::gateway::with_progress;
use crate::protocol::{
    method, BundleTools, CallParams, CallProgress, Notification, RpcError, ToolsParams, ToolsResult,
};
use crate::telemetry::Attribute;

pub(super) async fn tools(p: ToolsParams, ctx: &Ctx) -> Result<ToolsResult, RpcError> {
    let bundles = ctx.api.tools(&p.workspace, p.name.as_deref()).await?;
    Ok(ToolsResult {
        bundles: bundles
            .into_iter()
            .map(|b| BundleTools {
                workspace: p.workspace.clone(),
                name: b.name,
                state: b.state,
                tools: b
                    .tools
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect(),
            })
            .collect(),
    })
}

/// `bundle.call` on the control socket, as the operator: the bundle's
/// progress goes out as `call.progress` notifications of request `id`, in
/// order, ahead of the answer.
pub(super) async fn call(
    p: CallParams,
    ctx: &Ctx,
    out: &Outbox,
    id: Value,
    cancel: &CancellationToken,
) -> Result<Value, RpcError> {
    let forward = |n: ProgressNotificationParam| {
        let note = Notification::new(
            method::CALL_PROGRESS,
            CallProgress {
                id: id.clone(),
                progress: n.progress,
                total: n.total,
                message: n.message,
            },
        );
        async move {
            out.send(&note).await;
        }
    };
    // An operator's call is a trace of its own.
    let root = ctx.api.shared().telemetry.root();
    let span = root.span_with(crate::telemetry::Kind::Server, || {
        let attributes = vec![
            Attribute::new("bundlevisor.workspace", p.workspace.clone()),
            Attribute::new("bundlevisor.bundle", p.name.clone()),
            Attribute::new("gen_ai.tool.name", p.tool.clone()),
            Attribute::new("bundlevisor.principal", "operator"),
        ];
        (format!("bundle.call {}", p.tool), attributes)
    });
    let request = CallRequest {
        workspace: p.workspace,
        name: p.name,
        tool: p.tool,
        arguments: p.arguments,
        timeout: p.timeout_ms.map(Duration::from_millis),
        wait_ready: p.wait_ready_ms.map(Duration::from_millis),
        trace: span.trace().clone(),
    };
    let answer = with_progress(
        p.progress,
        |progress| ctx.api.call(&request, progress, cancel, Caller::Operator),
        forward,
    )
    .await;
    match &answer {
        Ok(r) if r.is_error == Some(true) => {
            span.end("tool_error", Some("the tool answered with an error"))
        }
        Ok(_) => span.end("ok", None),
        // The kind only: a transport error's text may carry a URL.
        Err(e) => span.end("error", Some(&format!("{:?}", e.kind()))),
    }
    to_value(answer?)
}
