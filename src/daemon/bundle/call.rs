//! The one path of a request to a bundle: tool calls and the MCP requests
//! the gateway passes through (prompts, resources) alike run on a clone of
//! the live peer, counted in flight (so a session being replaced is closed
//! once idle), under a timeout, cancellable, with progress forwarded, and a
//! 401 sent back to the actor for one retry on the rebuilt session.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use rmcp::handler::client::progress::ProgressSubscriber;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientRequest, ProgressNotificationParam,
    RequestId, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::RoleClient;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::Lane;
use super::BundleMsg;
use crate::bundle::client::Caller;
use crate::protocol::BundleState;

/// Why a request could not be answered by the bundle.
#[derive(Debug)]
pub enum CallError {
    NotReady {
        state: BundleState,
        last_error: Option<String>,
    },
    Timeout(Duration),
    Failed(String),
    /// The bundle answered with an MCP error.
    Mcp(rmcp::ErrorData),
    /// The caller cancelled the call.
    Cancelled,
    /// The bundle has no such tool, or `[[exclude_tools]]` removed it.
    NoSuchTool,
}

/// What is asked of the bundle.
#[derive(Debug, Clone)]
pub enum BundleRequest {
    /// `tools/call`.
    Tool {
        name: String,
        arguments: Option<Map<String, Value>>,
    },
    /// A request the gateway passes through unchanged (prompts, resources).
    Mcp(Box<ClientRequest>),
}

/// A request on its way to the bundle.
pub struct PendingCall {
    pub request: BundleRequest,
    /// None: `[bundles] call_timeout`.
    pub timeout: Option<Duration>,
    /// Cancelling it cancels the call (`notifications/cancelled` to the bundle).
    pub cancel: CancellationToken,
    /// Where the bundle's progress notifications for this call go.
    pub progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    /// Who the request comes from: the bundle's sampling, elicitation and
    /// roots requests while it serves this one may go to that agent only.
    pub caller: Caller,
    pub reply: RpcReplyPort<Result<ServerResult, CallError>>,
}

impl PendingCall {
    /// The tool this call names, if it is a tool call.
    pub fn tool(&self) -> Option<&str> {
        match &self.request {
            BundleRequest::Tool { name, .. } => Some(name),
            BundleRequest::Mcp(_) => None,
        }
    }
}

/// How long progress that raced its call's answer is still forwarded.
const PROGRESS_STRAGGLER_WAIT: Duration = Duration::from_millis(20);

/// The next progress notification of a subscription; never, without one.
async fn next_progress(
    subscription: &mut Option<ProgressSubscriber>,
) -> Option<ProgressNotificationParam> {
    match subscription.as_mut() {
        Some(s) => match futures::StreamExt::next(s).await {
            Some(p) => Some(p),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Sends `notifications/cancelled` for a request whose answer nobody waits for.
struct AbandonGuard(Option<(Peer<RoleClient>, RequestId)>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some((peer, id)) = self.0.take() {
            tokio::spawn(async move {
                let note = CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the caller".into()),
                );
                let _ = peer.notify_cancelled(note).await;
            });
        }
    }
}

/// Runs `call` on the session in a task. A 401 from a remote server sends
/// the call back to the actor to be retried once (`retry`) on the rebuilt
/// session.
pub fn spawn(lane: Lane, call: PendingCall, retry: bool, myself: ActorRef<BundleMsg>) {
    tokio::spawn(run(lane, call, retry, myself));
}

/// Runs `call` on the session, in the caller's task (see [`spawn`]).
pub async fn run(lane: Lane, call: PendingCall, retry: bool, myself: ActorRef<BundleMsg>) {
    {
        // Borrowed from a clone: the lane itself is given up early on a 401.
        let live = lane.live.clone();
        let session = &live.session;
        let (peer, callers, subscribers) = (&session.peer, &session.callers, &session.subscribers);
        // The caller is the bundle's client for as long as the request runs.
        let caller = callers.enter(call.caller.clone());
        let timeout = call.timeout.unwrap_or(live.timeout);
        let request = match &call.request {
            BundleRequest::Tool { name, arguments } => {
                let mut params = CallToolRequestParams::new(name.clone());
                if let Some(arguments) = arguments.clone() {
                    params = params.with_arguments(arguments);
                }
                ClientRequest::CallToolRequest(rmcp::model::Request::new(params))
            }
            BundleRequest::Mcp(request) => (**request).clone(),
        };
        let handle = match peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => {
                caller.sent_as(handle.id.clone());
                handle
            }
            Err(e) => {
                let _ = call.reply.send(Err(CallError::Failed(e.to_string())));
                return;
            }
        };
        // Until the answer arrives, dropping this (timeout, cancel) sends
        // notifications/cancelled to the bundle.
        let mut abandon = AbandonGuard(Some((peer.clone(), handle.id.clone())));
        // Progress: the bundle reports against the token rmcp put in the
        // request. Forwarded in order, ahead of the answer.
        let mut subscription = match &call.progress {
            Some(_) => Some(
                session
                    .progress
                    .subscribe(handle.progress_token.clone())
                    .await,
            ),
            None => None,
        };
        let response = tokio::time::timeout(timeout, handle.await_response());
        tokio::pin!(response);
        let mut reported = false;
        let outcome = loop {
            tokio::select! {
                biased;
                Some(p) = next_progress(&mut subscription) => {
                    reported = true;
                    if let Some(tx) = &call.progress {
                        let _ = tx.send(p).await;
                    }
                }
                r = &mut response => break Some(r),
                _ = call.cancel.cancelled() => break None,
            }
        };
        // rmcp hands each notification to a task of its own, so one a
        // reporting bundle sent just before its answer may still be on its
        // way. (Calls that reported nothing do not wait: every MCP client
        // asks for progress, few tools send any.)
        if let (true, Some(sub), Some(tx)) = (reported, subscription.as_mut(), &call.progress) {
            while let Ok(Some(p)) =
                tokio::time::timeout(PROGRESS_STRAGGLER_WAIT, futures::StreamExt::next(sub)).await
            {
                let _ = tx.send(p).await;
            }
        }
        if let Some(Ok(_)) = &outcome {
            abandon.0 = None;
        }
        drop(abandon);
        let result = match outcome {
            None => Err(CallError::Cancelled),
            Some(Err(_)) => Err(CallError::Timeout(timeout)),
            Some(Ok(Err(e)))
                if retry
                    && crate::bundle::connect::wants_token(
                        e.is_authorization_required(),
                        e.auth_challenge(),
                    ) =>
            {
                let generation = lane.leave().generation;
                let _ = myself.send_message(BundleMsg::AuthExpired {
                    generation,
                    call: Some(call),
                    challenge: e.auth_challenge().map(str::to_string),
                });
                return;
            }
            Some(Ok(Err(e))) => Err(answer_error(&call.request, e)),
            Some(Ok(Ok(result))) => {
                // A subscription the bundle took is the agent's.
                if let (BundleRequest::Mcp(request), Caller::Agent(agent)) =
                    (&call.request, &call.caller)
                {
                    match &**request {
                        ClientRequest::SubscribeRequest(r) => {
                            subscribers.add(&r.params.uri, agent.clone())
                        }
                        ClientRequest::UnsubscribeRequest(r) => {
                            subscribers.remove(&r.params.uri, agent)
                        }
                        _ => {}
                    }
                }
                answer(&call.request, result)
            }
        };
        drop((lane, caller));
        let _ = call.reply.send(result);
    }
}

fn answer(request: &BundleRequest, result: ServerResult) -> Result<ServerResult, CallError> {
    match (request, result) {
        (BundleRequest::Tool { .. }, r @ ServerResult::CallToolResult(_)) => Ok(r),
        (BundleRequest::Tool { .. }, other) => Err(CallError::Failed(format!(
            "the bundle answered tools/call with something else: {}",
            serde_json::to_string(&other).unwrap_or_default()
        ))),
        (BundleRequest::Mcp(_), other) => Ok(other),
    }
}

fn answer_error(request: &BundleRequest, e: ServiceError) -> CallError {
    match (request, e) {
        (BundleRequest::Mcp(_), ServiceError::McpError(e)) => CallError::Mcp(e),
        (_, e) => CallError::Failed(e.to_string()),
    }
}
