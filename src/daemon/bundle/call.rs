//! The one path of a request to a bundle: tool calls and the MCP requests
//! the gateway passes through (prompts, resources) alike run on a clone of
//! the live peer, counted in flight (so a session being replaced is closed
//! once idle), under a timeout, cancellable, with progress forwarded, and a
//! 401 sent back to the actor for one retry on the rebuilt session.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use rmcp::handler::client::progress::{ProgressDispatcher, ProgressSubscriber};
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientRequest, ProgressNotificationParam,
    RequestId, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::RoleClient;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::BundleMsg;
use crate::bundle::client::{Caller, Callers, Subscribers};
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
pub enum Ask {
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
    pub request: Ask,
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
            Ask::Tool { name, .. } => Some(name),
            Ask::Mcp(_) => None,
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

/// Counts the requests in flight on one session, so a session being
/// replaced can be closed once they are done.
#[derive(Clone, Default)]
pub struct InFlight(Arc<(AtomicUsize, tokio::sync::Notify)>);

pub struct InFlightGuard(InFlight);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard {
        self.0 .0.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    pub async fn idle(&self) {
        loop {
            let notified = self.0 .1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0 .0.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let InFlight(inner) = &self.0;
        if inner.0.fetch_sub(1, Ordering::SeqCst) == 1 {
            inner.1.notify_waiters();
        }
    }
}

/// What a request needs of the session it runs on.
pub struct Lane {
    pub peer: Peer<RoleClient>,
    pub in_flight: InFlightGuard,
    pub progress: ProgressDispatcher,
    pub callers: Callers,
    pub subscribers: Subscribers,
    /// The session's generation (a 401 names it).
    pub generation: u64,
    pub timeout: Duration,
}

/// The ready session of each bundle, as its actor last published it: a
/// tool call reads it and runs on the session in its own task, without a
/// round trip through the actor (whose mailbox and task are two thread
/// wake-ups a call; docs/performance.md). Only a session the actor would
/// send to is here; anything else (starting, restarting, a 401 rebuild, a
/// tool the bundle lacks, a transport just closed) takes the actor's path.
#[derive(Default)]
pub struct Lanes(std::sync::RwLock<LaneMap>);

/// workspace → bundle → its ready session (looked up by `&str`, no key
/// is built per call).
type LaneMap = std::collections::HashMap<String, std::collections::HashMap<String, LaneSource>>;

/// What a call needs of a ready session, to make its [`Lane`].
#[derive(Clone)]
pub struct LaneSource {
    pub peer: Peer<RoleClient>,
    pub in_flight: InFlight,
    pub progress: ProgressDispatcher,
    pub callers: Callers,
    pub subscribers: Subscribers,
    pub generation: u64,
    pub timeout: Duration,
    /// The names of the session's tools.
    pub tools: Arc<[String]>,
}

impl LaneSource {
    /// A lane for a call of `tool`, if this session serves it now.
    pub fn lane_for(&self, tool: &str) -> Option<Lane> {
        if self.peer.is_transport_closed() || !self.tools.iter().any(|t| t == tool) {
            return None;
        }
        Some(Lane {
            peer: self.peer.clone(),
            in_flight: self.in_flight.enter(),
            progress: self.progress.clone(),
            callers: self.callers.clone(),
            subscribers: self.subscribers.clone(),
            generation: self.generation,
            timeout: self.timeout,
        })
    }
}

impl Lanes {
    pub fn publish(&self, workspace: &str, name: &str, source: Option<LaneSource>) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        match source {
            Some(source) => {
                map.entry(workspace.to_string())
                    .or_default()
                    .insert(name.to_string(), source);
            }
            None => {
                if let Some(bundles) = map.get_mut(workspace) {
                    bundles.remove(name);
                    if bundles.is_empty() {
                        map.remove(workspace);
                    }
                }
            }
        }
    }

    pub fn get(&self, workspace: &str, name: &str) -> Option<LaneSource> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(workspace)?.get(name).cloned()
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
        let Lane {
            peer,
            in_flight,
            progress: dispatcher,
            callers,
            subscribers,
            generation,
            timeout,
        } = lane;
        // The caller is the bundle's client for as long as the request runs.
        let caller = callers.enter(call.caller.clone());
        let timeout = call.timeout.unwrap_or(timeout);
        let request = match &call.request {
            Ask::Tool { name, arguments } => {
                let mut params = CallToolRequestParams::new(name.clone());
                if let Some(arguments) = arguments.clone() {
                    params = params.with_arguments(arguments);
                }
                ClientRequest::CallToolRequest(rmcp::model::Request::new(params))
            }
            Ask::Mcp(request) => (**request).clone(),
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
            Some(_) => Some(dispatcher.subscribe(handle.progress_token.clone()).await),
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
                drop(in_flight);
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
                if let (Ask::Mcp(request), Caller::Agent(agent)) = (&call.request, &call.caller) {
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
        drop((in_flight, caller));
        let _ = call.reply.send(result);
    }
}

fn answer(request: &Ask, result: ServerResult) -> Result<ServerResult, CallError> {
    match (request, result) {
        (Ask::Tool { .. }, r @ ServerResult::CallToolResult(_)) => Ok(r),
        (Ask::Tool { .. }, other) => Err(CallError::Failed(format!(
            "the bundle answered tools/call with something else: {}",
            serde_json::to_string(&other).unwrap_or_default()
        ))),
        (Ask::Mcp(_), other) => Ok(other),
    }
}

fn answer_error(request: &Ask, e: ServiceError) -> CallError {
    match (request, e) {
        (Ask::Mcp(_), ServiceError::McpError(e)) => CallError::Mcp(e),
        (_, e) => CallError::Failed(e.to_string()),
    }
}
