//! The one path of a request to a bundle: tool calls and the MCP requests
//! the gateway passes through (prompts, resources) alike run on a clone of
//! the live peer, counted in flight (so a session being replaced is closed
//! once idle), under a timeout, cancellable, with progress forwarded, and a
//! 401 sent back to the actor for one retry on the rebuilt session.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use rmcp::handler::client::progress::ProgressSubscriber;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientRequest, InputResponses,
    ProgressNotificationParam, RequestId, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::RoleClient;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::session::Lane;
use super::BundleMsg;
use crate::bundle::client::Caller;
use crate::bundle::spliced::{RawToolResult, Spliced};
use crate::protocol::BundleState;
use crate::telemetry::{Attribute, Kind, Trace};

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

impl CallError {
    /// What kind of failure, in words that carry nothing of the request.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::NotReady { .. } => "the bundle is not ready",
            CallError::Timeout(_) => "the bundle did not answer in time",
            CallError::Failed(_) => "the request to the bundle failed",
            CallError::Mcp(_) => "the bundle answered with an MCP error",
            CallError::Cancelled => "cancelled by the caller",
            CallError::NoSuchTool => "no such tool",
        }
    }
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
    /// The trace the request's span joins; its context goes to the bundle
    /// in the request's `_meta`.
    pub trace: Trace,
    /// The caller takes a tool's result as the bundle wrote it, where the
    /// bundle's session can hand it over so ([`crate::bundle::spliced`]).
    pub raw: bool,
    pub reply: RpcReplyPort<Result<Answered, CallError>>,
}

/// A request's answer: decoded, or a tool's result as the bundle wrote it.
// The typed one is what every reply carried before; boxed, each typed
// call would pay an allocation for the raw one's sake.
#[allow(clippy::large_enum_variant)]
pub enum Answered {
    Typed(ServerResult),
    Raw(RawToolResult),
}

/// One exchange's answer from the bundle: [`Answered`], or input it asks for.
type Exchanged = Result<Result<Answered, ServiceError>, CallError>;

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

/// Times one call may ask its caller for input (a bundle on MCP
/// 2026-07-28 answering `input_required`): a bundle that keeps asking is
/// ended here, not served forever.
const MAX_INPUT_ROUNDS: u32 = 32;

/// Runs `call` on the session, in the caller's task (see [`spawn`]). A
/// bundle on MCP 2026-07-28 that answers `input_required` is answered
/// from the caller (its agent is asked) and the request sent again with
/// the answers and the bundle's `requestState`, until it completes.
pub async fn run(lane: Lane, call: PendingCall, retry: bool, myself: ActorRef<BundleMsg>) {
    // Borrowed from a clone: the lane itself is given up early on a 401.
    let live = lane.live.clone();
    let session = &live.session;
    // An agent leaving a resource others still follow: the bundle keeps
    // its subscription (it has one per resource, not one per agent).
    if let (BundleRequest::Mcp(request), Caller::Agent(agent)) = (&call.request, &call.caller) {
        if let ClientRequest::UnsubscribeRequest(r) = &**request {
            if session.subscribers.others(&r.params.uri, agent) {
                session.subscribers.remove(&r.params.uri, agent);
                let _ = call
                    .reply
                    .send(Ok(Answered::Typed(ServerResult::empty(()))));
                return;
            }
        }
    }
    let timeout = call.timeout.unwrap_or(live.timeout);
    // Boxed: 4 KiB that only subscriptions need (and a call would copy).
    let subscription = match &call.request {
        BundleRequest::Mcp(request) => matches!(
            **request,
            ClientRequest::SubscribeRequest(_) | ClientRequest::UnsubscribeRequest(_)
        ),
        BundleRequest::Tool { .. } => false,
    };
    if subscription {
        if let Some(followed) = Box::pin(follow(session, &call, timeout)).await {
            let _ = call
                .reply
                .send(followed.map(|()| Answered::Typed(ServerResult::empty(()))));
            return;
        }
    }
    // The caller is the bundle's client for as long as the request runs.
    let caller = session.callers.enter(call.caller.clone());
    let mut request = first_request(&call.request);
    let span = traced(&call, &mut request, session.revision.as_str());
    // A bundle on 2026-07-28 logs only for a request that asks it to: the
    // level the agent wants goes along.
    if session.revision >= rmcp::model::ProtocolVersion::V_2026_07_28 {
        if let Some(level) = match &call.caller {
            Caller::Agent(agent) => agent.log_level(),
            Caller::Operator => None,
        } {
            use rmcp::model::GetMeta;
            request.get_meta_mut().set_log_level(level);
        }
    }
    let mut rounds = 0;
    // One clock for the whole call, all its rounds: it stands while the
    // caller is asked (up to `answer_time` in all).
    let clock = Clock {
        started: tokio::time::Instant::now(),
        asked: caller.asked(),
        timeout,
        answer_time: live.answer_time,
    };
    let result = loop {
        match exchange_either(session, &call, &request, &caller, &clock).await {
            Err(e) => break Err(e),
            Ok(Err(e))
                if retry
                    && crate::bundle::connect::wants_token(
                        e.is_authorization_required(),
                        e.auth_challenge(),
                    ) =>
            {
                span.end(
                    "unauthorized",
                    Some("401: retried on a session with a new token"),
                );
                let generation = lane.leave().generation;
                let _ = myself.send_message(BundleMsg::AuthExpired {
                    generation,
                    call: Some(call),
                    challenge: e.auth_challenge().map(str::to_string),
                });
                return;
            }
            Ok(Err(ServiceError::TransportClosed)) => {
                break Err(CallError::Failed(closed_reason(session).await))
            }
            Ok(Err(e)) => break Err(answer_error(e, &call.caller)),
            Ok(Ok(Answered::Raw(raw))) => break Ok(Answered::Raw(raw)),
            Ok(Ok(Answered::Typed(ServerResult::InputRequiredResult(asked)))) => {
                rounds += 1;
                if rounds > MAX_INPUT_ROUNDS {
                    break Err(CallError::Failed(format!(
                        "the bundle asked for input {MAX_INPUT_ROUNDS} times in one request; bundlevisor ends it there"
                    )));
                }
                match answers(&call.caller, asked, &clock).await {
                    Ok((responses, state)) => request = with_input(request, responses, state),
                    Err(e) => break Err(e),
                }
            }
            Ok(Ok(Answered::Typed(result))) => {
                // A subscription the bundle took is the agent's.
                if let (BundleRequest::Mcp(request), Caller::Agent(agent)) =
                    (&call.request, &call.caller)
                {
                    match &**request {
                        ClientRequest::SubscribeRequest(r) => {
                            session.subscribers.add(&r.params.uri, agent.clone())
                        }
                        ClientRequest::UnsubscribeRequest(r) => {
                            session.subscribers.remove(&r.params.uri, agent)
                        }
                        _ => {}
                    }
                }
                break answer(&call.request, result).map(Answered::Typed);
            }
        }
    };
    drop((lane, caller));
    end_span(span, &result);
    let _ = call.reply.send(result);
}

/// The request to the bundle as a span of the caller's trace, whose
/// context the bundle is given to continue (`_meta.traceparent`, on any
/// revision).
fn traced(
    call: &PendingCall,
    request: &mut ClientRequest,
    revision: &str,
) -> crate::telemetry::Span {
    let mut span = call
        .trace
        .span_with(Kind::Client, || bundle_span(request, revision));
    span.hand_over();
    if let Some(w3c) = span.trace().w3c() {
        use rmcp::model::GetMeta;
        let meta = request.get_meta_mut();
        meta.set_traceparent(w3c.traceparent);
        if let Some(state) = w3c.tracestate {
            meta.set_tracestate(state);
        }
    }
    span
}

/// Ends a request's span with how the bundle answered.
fn end_span(span: crate::telemetry::Span, result: &Result<Answered, CallError>) {
    let tool_error = match result {
        Ok(Answered::Typed(ServerResult::CallToolResult(r))) => r.is_error == Some(true),
        Ok(Answered::Raw(r)) => r.is_error(),
        _ => false,
    };
    match result {
        Ok(_) if tool_error => span.end("tool_error", Some("the tool answered with an error")),
        Ok(_) => span.end("ok", None),
        // The kind only: a transport error's text may carry a remote
        // bundle's URL, query and all.
        Err(e) => span.end("error", Some(e.kind())),
    }
}

/// The name and attributes of a request's span: the method and the
/// tool's or prompt's name.
fn bundle_span(request: &ClientRequest, revision: &str) -> (String, Vec<Attribute>) {
    let method = request.method();
    let (name, mut attributes) = match request {
        ClientRequest::CallToolRequest(r) => (
            format!("{method} {}", r.params.name),
            vec![Attribute::new(
                "gen_ai.tool.name",
                r.params.name.to_string(),
            )],
        ),
        ClientRequest::GetPromptRequest(r) => (
            format!("{method} {}", r.params.name),
            vec![Attribute::new("gen_ai.prompt.name", r.params.name.clone())],
        ),
        _ => (method.to_string(), Vec::new()),
    };
    attributes.push(Attribute::new("mcp.method.name", method.to_string()));
    attributes.push(Attribute::new("mcp.protocol.version", revision.to_string()));
    (name, attributes)
}

/// An agent's `resources/subscribe` or `unsubscribe` to a bundle on MCP
/// 2026-07-28, which has neither: the resource is followed on the session's
/// `subscriptions/listen` stream instead ([`crate::bundle::follow`]). `None`
/// for any other request, or another revision.
async fn follow(
    session: &crate::bundle::Session,
    call: &PendingCall,
    timeout: Duration,
) -> Option<Result<(), CallError>> {
    if session.revision < rmcp::model::ProtocolVersion::V_2026_07_28 {
        return None;
    }
    let (BundleRequest::Mcp(request), Caller::Agent(agent)) = (&call.request, &call.caller) else {
        return None;
    };
    let followed = match &**request {
        ClientRequest::SubscribeRequest(r) => {
            let subscribe = session.follower.subscribe(&r.params.uri, agent.clone());
            match tokio::time::timeout(timeout, subscribe).await {
                Ok(done) => done.map_err(CallError::Failed),
                Err(_) => {
                    session.subscribers.remove(&r.params.uri, agent);
                    Err(CallError::Timeout(timeout))
                }
            }
        }
        ClientRequest::UnsubscribeRequest(r) => {
            let unsubscribe = session.follower.unsubscribe(&r.params.uri, agent);
            tokio::time::timeout(timeout, unsubscribe)
                .await
                .map_err(|_| CallError::Timeout(timeout))
        }
        _ => return None,
    };
    Some(followed)
}

/// The capabilities a request to a bundle declares for `caller`: the
/// daemon's own extensions (host-resources…), with what the caller can be
/// asked (sampling, elicitation, roots) and the extensions it declared
/// (MCP Apps' UI only then; tasks only when `tasks`, where the gateway
/// maps the bundle's task ids).
fn on_behalf(
    own: &rmcp::model::ClientCapabilities,
    caller: &Caller,
    tasks: bool,
) -> rmcp::model::ClientCapabilities {
    let mut capabilities = own.clone();
    let agent = match caller {
        Caller::Agent(agent) => agent.capabilities(),
        Caller::Operator => Default::default(),
    };
    capabilities.sampling = agent.sampling;
    capabilities.elicitation = agent.elicitation;
    capabilities.roots = agent.roots;
    // The UI only for an agent that renders it.
    if let Some(extensions) = capabilities.extensions.as_mut() {
        extensions.remove(crate::bundle::connect::UI_EXTENSION);
    }
    for (name, settings) in agent.extensions.unwrap_or_default() {
        if tasks || name != rmcp::model::TASKS_EXTENSION_ID {
            capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .entry(name)
                .or_insert(settings);
        }
    }
    capabilities
}

/// The MCP request a call first sends.
fn first_request(request: &BundleRequest) -> ClientRequest {
    match request {
        BundleRequest::Tool { name, arguments } => {
            let mut params = CallToolRequestParams::new(name.clone());
            if let Some(arguments) = arguments.clone() {
                params = params.with_arguments(arguments);
            }
            ClientRequest::CallToolRequest(rmcp::model::Request::new(params))
        }
        BundleRequest::Mcp(request) => (**request).clone(),
    }
}

/// `request` again, carrying the caller's answers and the bundle's state
/// (only `tools/call`, `prompts/get` and `resources/read` can be asked for
/// input).
fn with_input(
    mut request: ClientRequest,
    responses: InputResponses,
    state: Option<String>,
) -> ClientRequest {
    match &mut request {
        ClientRequest::CallToolRequest(r) => {
            r.params.input_responses = Some(responses);
            r.params.request_state = state;
        }
        ClientRequest::GetPromptRequest(r) => {
            r.params.input_responses = Some(responses);
            r.params.request_state = state;
        }
        ClientRequest::ReadResourceRequest(r) => {
            r.params.input_responses = Some(responses);
            r.params.request_state = state;
        }
        _ => {}
    }
    request
}

/// One request to the bundle and its answer: progress forwarded ahead of
/// it, `notifications/cancelled` sent when it is abandoned (timeout,
/// cancel). The outer error is ours (not sent, cancelled, timed out), the
/// inner the bundle's.
async fn exchange(
    session: &crate::bundle::connect::Session,
    call: &PendingCall,
    request: ClientRequest,
    caller: &crate::bundle::client::CallerGuard,
    clock: &Clock,
) -> Exchanged {
    let peer = &session.peer;
    let mut options = PeerRequestOptions::no_options();
    // A 2026-07-28 request declares its client's capabilities: the
    // bundle sees what the caller can answer (an operator's call: none).
    if session.revision >= rmcp::model::ProtocolVersion::V_2026_07_28 {
        let mut meta = rmcp::model::RequestMetaObject::default();
        // Tasks only where the gateway maps them (its requests as they
        // are), never on the typed tool call path, which waits for the
        // tool's result.
        let tasks = matches!(call.request, BundleRequest::Mcp(_));
        meta.set_client_capabilities(on_behalf(&session.declared, &call.caller, tasks));
        options.meta = Some(meta);
    }
    let handle = match peer.send_cancellable_request(request, options).await {
        Ok(handle) => handle,
        Err(ServiceError::TransportClosed) => {
            return Err(CallError::Failed(closed_reason(session).await))
        }
        Err(e) => return Err(CallError::Failed(e.to_string())),
    };
    caller.sent_as(handle.id.clone());
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
    // The call's clock stands while its agent is asked (up to the time an
    // agent gets to answer, `[http] input_timeout`).
    let response = handle.await_response();
    tokio::pin!(response);
    let expired = clock
        .asked
        .expired(clock.started, clock.timeout, clock.answer_time);
    tokio::pin!(expired);
    let outcome = awaited(call, &mut subscription, response, expired).await;
    if let Some(Ok(_)) = &outcome {
        abandon.0 = None;
    }
    drop(abandon);
    match outcome {
        None => Err(CallError::Cancelled),
        Some(Err(_)) => Err(CallError::Timeout(clock.timeout)),
        Some(Ok(answer)) => Ok(answer.map(Answered::Typed)),
    }
}

/// One exchange: below rmcp's client for a tool call whose caller takes
/// the bundle's own bytes, on a session that can hand them over; else
/// through it.
async fn exchange_either(
    session: &crate::bundle::connect::Session,
    call: &PendingCall,
    request: &ClientRequest,
    caller: &crate::bundle::client::CallerGuard,
    clock: &Clock,
) -> Exchanged {
    match (&call.request, &session.spliced) {
        (BundleRequest::Tool { .. }, Some(spliced)) if call.raw => {
            exchange_spliced(session, spliced, call, request, caller, clock).await
        }
        // Boxed: rmcp's request future makes this one 7.6 KiB, which the
        // spliced calls would otherwise carry, and copy, too. rmcp takes
        // the request: a copy (the original is sent again with input).
        _ => Box::pin(exchange(session, call, request.clone(), caller, clock)).await,
    }
}

/// [`exchange`] below rmcp's client: the tool call written with an id of
/// its own, its answer handed over as the bundle wrote it (decoded only
/// when it is not a complete result of the usual shape).
async fn exchange_spliced(
    session: &crate::bundle::connect::Session,
    spliced: &Spliced,
    call: &PendingCall,
    request: &ClientRequest,
    caller: &crate::bundle::client::CallerGuard,
    clock: &Clock,
) -> Exchanged {
    use rmcp::model::GetMeta;
    let ClientRequest::CallToolRequest(tool) = request else {
        return Err(CallError::Failed(
            "only a tool call is made below rmcp's client".into(),
        ));
    };
    // Its `_meta` (the trace context), and what rmcp's client says in
    // every request to a 2026-07-28 bundle, with the capabilities of this
    // caller (as `exchange` declares them).
    let mut meta = request.get_meta().clone();
    if session.revision >= rmcp::model::ProtocolVersion::V_2026_07_28 {
        meta.set_protocol_version(session.revision.clone());
        meta.set_client_info(session.client_info.clone());
        meta.set_client_capabilities(on_behalf(&session.declared, &call.caller, false));
    }
    let id = spliced.next_id();
    // Subscribed before the request goes: no report is missed.
    let mut subscription = match &call.progress {
        Some(_) => Some(
            session
                .progress
                .subscribe(rmcp::model::ProgressToken(id.clone()))
                .await,
        ),
        None => None,
    };
    let progress = call.progress.is_some();
    let response = spliced.expect(&id);
    // Until the answer arrives, dropping this (timeout, cancel) cancels
    // the call at the bundle.
    let mut abandon = SplicedAbandon(Some((spliced.clone(), id.clone())));
    tokio::pin!(response);
    let expired = clock
        .asked
        .expired(clock.started, clock.timeout, clock.answer_time);
    tokio::pin!(expired);
    // A bundle that does not read its stdin fills the writer's queue: the
    // call's clock and its cancellation hold while it waits there too.
    let sent = tokio::select! {
        biased;
        sent = spliced.send(&id, &tool.params, meta, progress) => sent,
        _ = &mut expired => return Err(CallError::Timeout(clock.timeout)),
        _ = call.cancel.cancelled() => return Err(CallError::Cancelled),
    };
    if sent.is_err() {
        abandon.0 = None;
        spliced.forget(&id);
        return Err(CallError::Failed(closed_reason(session).await));
    }
    caller.sent_as(id);
    let outcome = awaited(call, &mut subscription, response, expired).await;
    let reply = match outcome {
        None => return Err(CallError::Cancelled),
        Some(Err(())) => return Err(CallError::Timeout(clock.timeout)),
        // The bundle's stream ended first.
        Some(Ok(Err(_))) => {
            abandon.0 = None;
            return Ok(Err(ServiceError::TransportClosed));
        }
        Some(Ok(Ok(reply))) => reply,
    };
    abandon.0 = None;
    let at = match reply.result {
        Ok(at) => at,
        Err(error) => return Ok(Err(ServiceError::McpError(error))),
    };
    if let Some(raw) = RawToolResult::new(reply.line.clone(), at.clone()) {
        return Ok(Ok(Answered::Raw(raw)));
    }
    // Input asked for, or a result of another shape: decoded.
    match serde_json::from_slice::<ServerResult>(&reply.line[at]) {
        Ok(result) => Ok(Ok(Answered::Typed(result))),
        Err(e) => Err(CallError::Failed(format!(
            "the bundle's answer to tools/call is not a tool result ({:?} at column {})",
            e.classify(),
            e.column()
        ))),
    }
}

/// Waits for a request's `response` with its progress forwarded ahead of
/// it: the answer, `Some(Err(()))` when the call's clock (`expired`) runs
/// out first, None when it is cancelled.
async fn awaited<T>(
    call: &PendingCall,
    subscription: &mut Option<ProgressSubscriber>,
    mut response: std::pin::Pin<&mut impl std::future::Future<Output = T>>,
    mut expired: std::pin::Pin<&mut impl std::future::Future>,
) -> Option<Result<T, ()>> {
    let mut reported = false;
    let outcome = loop {
        tokio::select! {
            biased;
            Some(p) = next_progress(subscription) => {
                reported = true;
                if let Some(tx) = &call.progress {
                    let _ = tx.send(p).await;
                }
            }
            r = &mut response => break Some(Ok(r)),
            _ = &mut expired => break Some(Err(())),
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
    outcome
}

/// Cancels a call made below rmcp's client whose answer nobody waits for.
struct SplicedAbandon(Option<(Spliced, rmcp::model::RequestId)>);

impl Drop for SplicedAbandon {
    fn drop(&mut self) {
        if let Some((spliced, id)) = self.0.take() {
            tokio::spawn(async move { spliced.cancel(&id).await });
        }
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

/// Why a bundle's session closed under a call, for its caller: the rule
/// its output broke, else how its process ended (with its most telling
/// stderr line), rather than rmcp's bare "Transport closed".
async fn closed_reason(session: &crate::bundle::connect::Session) -> String {
    if let Some(broke) = session.violation.get() {
        return format!("the bundle's session was closed: {broke}");
    }
    if session.lifeline.pid().is_none() {
        return "the bundle's remote session ended (Transport closed)".into();
    }
    let ended = tokio::time::timeout(Duration::from_millis(500), session.lifeline.wait()).await;
    match ended {
        Ok(exit) => {
            session.stderr.drained(Duration::from_millis(200)).await;
            match crate::bundle::process::telling_line(&session.stderr.lines()) {
                Some(line) => format!("the bundle's process ended ({exit}): {line}"),
                None => format!("the bundle's process ended ({exit})"),
            }
        }
        Err(_) => "the bundle closed its stdout (Transport closed)".into(),
    }
}

fn answer_error(e: ServiceError, caller: &Caller) -> CallError {
    match e {
        // A bundle that needs what the operator cannot give says so.
        ServiceError::McpError(e) if e.code.0 == -32021 && matches!(caller, Caller::Operator) => {
            let needs = e
                .data
                .as_ref()
                .and_then(|d| d.get("requiredCapabilities"))
                .and_then(|c| c.as_object())
                .map(|c| c.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            CallError::Failed(crate::bundle::client::nobody_to_ask(&format!(
                "the {needs} capability"
            )))
        }
        // The bundle's own MCP error keeps its code and data (a tool
        // call's too: -32021, -32602… mean something to the agent).
        ServiceError::McpError(e) => CallError::Mcp(e),
        e => CallError::Failed(e.to_string()),
    }
}

/// The time a call has: `timeout` from `started`, not counting the time
/// its caller is asked (`asked`), of which at most `answer_time`.
struct Clock {
    started: tokio::time::Instant,
    asked: std::sync::Arc<crate::bundle::client::Asked>,
    timeout: Duration,
    answer_time: Duration,
}

/// The caller's answers to a 2026-07-28 bundle's `input_required`, with
/// the bundle's state to send back, within the time an agent has to
/// answer.
async fn answers(
    caller: &Caller,
    asked: rmcp::model::InputRequiredResult,
    clock: &Clock,
) -> Result<(InputResponses, Option<String>), CallError> {
    use crate::bundle::client::{fulfil, Asking, Unfulfilled};
    let requests = asked.input_requests.unwrap_or_default();
    // What is left of the time the caller has to answer, for this call.
    let answer_time = clock.answer_time;
    let left = answer_time.saturating_sub(clock.asked.so_far());
    let _asking = Asking::new(clock.asked.clone());
    match tokio::time::timeout(left, fulfil(caller, requests)).await {
        Ok(Ok(responses)) => Ok((responses, asked.request_state)),
        Ok(Err(Unfulfilled::Why(why))) => Err(CallError::Failed(why)),
        Ok(Err(missing)) => Err(CallError::Mcp(missing.into_error())),
        Err(_) => Err(CallError::Failed(format!(
            "the agent did not answer the bundle's request for input within {} ([http] input_timeout)",
            humantime::format_duration(answer_time)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ClientCapabilities;

    /// A request to a 2026-07-28 bundle declares what its caller can
    /// answer and which extensions it has: the UI only for an agent that
    /// declared it, never tasks, and the daemon's own always.
    #[test]
    fn a_request_declares_its_callers_capabilities_and_the_daemons_extensions() {
        let own: ClientCapabilities = serde_json::from_value(serde_json::json!({
            "sampling": {}, "elicitation": {}, "roots": {},
            "extensions": {
                "ai.nimblebrain/host-resources": {"version": "1.1"},
                "io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}
            }
        }))
        .unwrap();
        let operator = serde_json::to_value(on_behalf(&own, &Caller::Operator, true)).unwrap();
        assert_eq!(
            operator,
            serde_json::json!({"extensions": {"ai.nimblebrain/host-resources": {"version": "1.1"}}})
        );
        let agent: ClientCapabilities = serde_json::from_value(serde_json::json!({
            "elicitation": {"form": {}},
            "extensions": {
                "io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]},
                "io.modelcontextprotocol/tasks": {}
            }
        }))
        .unwrap();
        let agent = Caller::Agent(std::sync::Arc::new(Declaring(agent)));
        let declared = serde_json::to_value(on_behalf(&own, &agent, false)).unwrap();
        assert_eq!(
            declared,
            serde_json::json!({
                "elicitation": {"form": {}},
                "extensions": {
                    "ai.nimblebrain/host-resources": {"version": "1.1"},
                    "io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}
                }
            })
        );
        let with_tasks = serde_json::to_value(on_behalf(&own, &agent, true)).unwrap();
        assert!(
            with_tasks["extensions"]
                .get("io.modelcontextprotocol/tasks")
                .is_some(),
            "{with_tasks}"
        );
    }

    /// An agent that is only its declared capabilities.
    struct Declaring(ClientCapabilities);

    impl crate::bundle::client::Agent for Declaring {
        fn capabilities(&self) -> ClientCapabilities {
            self.0.clone()
        }
        fn request(
            &self,
            _: rmcp::model::ServerRequest,
        ) -> futures::future::BoxFuture<'static, Result<rmcp::model::ClientResult, rmcp::ErrorData>>
        {
            Box::pin(async { Err(rmcp::ErrorData::internal_error("not asked", None)) })
        }
        fn notify(
            &self,
            _: rmcp::model::ServerNotification,
        ) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async {})
        }
        fn resource_updated(&self, _: &str, _: &str) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async {})
        }
        fn gone(&self) -> bool {
            false
        }
        fn unreachable(&self) -> Option<String> {
            None
        }
    }

    /// The call path's futures are moved whole into their boxes and tasks
    /// (callgrind counted 9,924 bytes copied a call when rmcp's request
    /// future, 7.6 KiB, sat inside every call's): what a spliced call
    /// carries stays small, the rare paths boxed apart.
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    #[test]
    fn a_calls_future_carries_no_rare_paths_inline() {
        fn size<F: std::future::Future>(_: impl FnOnce() -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let run = size(|| {
            super::run(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        let typed = size(|| {
            super::exchange(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        let follow = size(|| super::follow(unreachable!(), unreachable!(), unreachable!()));
        assert!(
            run < typed && run < follow + 1024,
            "run {run} B, exchange {typed} B, follow {follow} B"
        );
        assert!(run <= 6 << 10, "run {run} B");
    }
}
