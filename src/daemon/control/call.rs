//! `bundle.tools` and `bundle.call`: a bundle's tools as its actor lists
//! them, and a tool call through the actor's one request path, with
//! progress forwarded, cancellation, and a bounded wait for a bundle that
//! is on its way up.

use std::time::Duration;

use ractor::rpc::CallResult;
use rmcp::model::ProgressNotificationParam;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ask::{ask, bundle_actor, limit, unavailable};
use super::outcome::wait_ready;
use super::{Ctx, Outbox};
use crate::bundle::client::Caller;
use crate::daemon::bundle::{run, Ask, BundleMsg, CallError, PendingCall};
use crate::gateway::with_progress;
use crate::protocol::{
    method, BundleState, BundleTools, CallParams, CallProgress, ErrorKind, Notification, RpcError,
    ToolsParams, ToolsResult,
};

pub(super) async fn tools(p: ToolsParams, ctx: &Ctx) -> Result<ToolsResult, RpcError> {
    let names: Vec<String> = match &p.name {
        Some(name) => vec![name.clone()],
        None => ctx.shared.board.names_in(&p.workspace),
    };
    let mut bundles = Vec::new();
    for name in names {
        let (state, tools) = match bundle_actor(&p.workspace, &name) {
            Ok(actor) => {
                ask(
                    &actor,
                    BundleMsg::Tools,
                    limit::ANSWER,
                    "the bundle's actor",
                )
                .await?
            }
            // Installed, and its actor not up yet (a moment after a daemon
            // start): listed as the board has it, with no tools yet.
            Err(e) => match ctx.shared.board.get(&p.workspace, &name) {
                Some(status) => (status.state, Vec::new()),
                None if p.name.is_some() => return Err(e),
                None => continue,
            },
        };
        bundles.push(BundleTools {
            workspace: p.workspace.clone(),
            name,
            state,
            tools,
        });
    }
    Ok(ToolsResult { bundles })
}

/// `bundle.call` on the control socket: the bundle's progress goes out as
/// `call.progress` notifications of request `id`, in order, ahead of the
/// answer.
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
    with_progress(
        p.progress,
        |progress| call_bundle(&p, ctx, progress, cancel, Caller::Operator),
        forward,
    )
    .await
}

/// A tool call through the bundle's actor, counted in the metrics: on
/// behalf of `caller` (a gateway's agent, or the operator), with the
/// bundle's progress sent to `progress`.
pub(super) async fn call_bundle(
    p: &CallParams,
    ctx: &Ctx,
    progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    cancel: &CancellationToken,
    caller: Caller,
) -> Result<Value, RpcError> {
    let started = std::time::Instant::now();
    let answer = call_tool(p, ctx, progress, cancel, caller).await;
    // A call of a bundle that is not installed is not a bundle's call.
    let unknown = |e: &RpcError| e.data.as_ref().map(|d| d.kind) == Some(ErrorKind::BundleNotFound);
    if !matches!(&answer, Err(e) if unknown(e)) {
        let ok = matches!(&answer, Ok(v) if v.get("isError") != Some(&Value::Bool(true)));
        ctx.shared
            .metrics
            .tool_call(&p.workspace, &p.name, started.elapsed(), ok);
    }
    answer
}

async fn call_tool(
    p: &CallParams,
    ctx: &Ctx,
    progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    cancel: &CancellationToken,
    caller: Caller,
) -> Result<Value, RpcError> {
    let actor = bundle_actor(&p.workspace, &p.name)?;
    let timeout = p.timeout_ms.map(Duration::from_millis);
    let wait = timeout.unwrap_or(ctx.shared.config.bundles.call_timeout) + limit::CALL_SLACK;
    // Subscribed before each call that may wait: the bundle's way back to
    // ready cannot be missed.
    let wait_ready_for = p.wait_ready_ms.map(Duration::from_millis);
    let mut deadline = None;
    let result = loop {
        let mut events = wait_ready_for.map(|_| ctx.shared.board.subscribe());
        let (tool, arguments) = (p.tool.clone(), p.arguments.clone());
        let (cancel, progress, caller) = (cancel.clone(), progress.clone(), caller.clone());
        let pending = |reply| PendingCall {
            request: Ask::Tool {
                name: tool,
                arguments,
            },
            timeout,
            cancel,
            progress,
            caller,
            reply,
        };
        // A ready session runs the call in this task; anything else is
        // the actor's to decide.
        let lane = ctx
            .shared
            .lanes
            .get(&p.workspace, &p.name)
            .and_then(|source| source.lane_for(&p.tool));
        let result = match lane {
            Some(lane) => {
                let (tx, rx) = ractor::concurrency::oneshot();
                run(lane, pending(tx.into()), true, actor.clone()).await;
                match tokio::time::timeout(wait, rx).await {
                    Ok(Ok(answer)) => CallResult::Success(answer),
                    Ok(Err(_)) => CallResult::SenderError,
                    Err(_) => CallResult::Timeout,
                }
            }
            None => actor
                .call(|reply| BundleMsg::Call(pending(reply)), Some(wait))
                .await
                .map_err(unavailable)?,
        };
        // A bundle on its way up is waited for (bounded by one deadline),
        // then called again.
        if let (
            Some(wait),
            Some(events),
            CallResult::Success(Err(CallError::NotReady { state, .. })),
        ) = (wait_ready_for, events.as_mut(), &result)
        {
            if state.is_coming_up() {
                let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + wait);
                if wait_ready(ctx, events, &p.workspace, &p.name, until).await {
                    continue;
                }
            }
        }
        break result;
    };
    let name = p.name.clone();
    match result {
        CallResult::Success(Ok(value)) => Ok(value),
        CallResult::Success(Err(CallError::NotReady { state, last_error })) if deadline.is_some() => {
            Err(RpcError::new(
                ErrorKind::NotReady,
                format!(
                    "bundle {name:?} did not become ready within {} (it is {}{})",
                    humantime::format_duration(Duration::from_millis(p.wait_ready_ms.unwrap_or(0))),
                    state.as_str(),
                    last_error.map(|e| format!("; last error: {e}")).unwrap_or_default()
                ),
            )
            .with("state", state.as_str()))
        }
        CallResult::Success(Err(CallError::NotReady { state, last_error })) => Err(RpcError::new(
            ErrorKind::NotReady,
            match last_error {
                Some(e) if state == BundleState::Failed => {
                    format!("bundle {name:?} is failed ({e}); fix it, then `bundlevisor restart {name}`")
                }
                Some(e) => format!("bundle {name:?} is {}, not ready (last error: {e})", state.as_str()),
                None => format!("bundle {name:?} is {}, not ready", state.as_str()),
            },
        )
        .with("state", state.as_str())),
        CallResult::Success(Err(CallError::Timeout(t))) => Err(RpcError::new(
            ErrorKind::Timeout,
            format!(
                "tool {:?} of bundle {name:?} did not answer within {}",
                p.tool,
                humantime::format_duration(t)
            ),
        )),
        CallResult::Success(Err(CallError::Failed(e))) => Err(RpcError::new(
            ErrorKind::ToolCallFailed,
            format!("tool {:?} of bundle {name:?} failed: {e}", p.tool),
        )),
        CallResult::Success(Err(CallError::Cancelled)) => Err(RpcError::new(
            ErrorKind::Cancelled,
            format!("the call of tool {:?} of bundle {name:?} was cancelled", p.tool),
        )),
        CallResult::Success(Err(CallError::NoSuchTool)) => Err(RpcError::new(
            ErrorKind::ToolNotFound,
            format!(
                "bundle {name:?} has no tool {:?} (or the daemon config excludes it); `bundlevisor tools {name}` lists them",
                p.tool
            ),
        )),
        CallResult::Success(Err(CallError::Mcp(e))) => Err(RpcError::new(
            ErrorKind::McpError,
            format!("tool {:?} of bundle {name:?}: {}", p.tool, e.message),
        )
        .with("mcp_code", e.code.0)
        .with("mcp_data", e.data.unwrap_or(Value::Null))),
        CallResult::Timeout => Err(RpcError::new(
            ErrorKind::Timeout,
            format!("bundle {name:?} did not answer in time"),
        )),
        CallResult::SenderError => Err(unavailable(format!("bundle {name:?} went away"))),
    }
}
