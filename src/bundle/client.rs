//! The MCP client handler of a bundle connection. It advertises the
//! `ai.nimblebrain/host-resources` extension in `initialize` and forwards the
//! bundle's `ai.nimblebrain/resources/*` requests to its WorkspaceActor.
//!
//! It also declares `sampling`, `elicitation` and `roots`, and passes the
//! bundle's requests of those kinds (and its log messages) to the agent
//! whose request the bundle is serving ([`Callers`]). Every request the
//! daemon passes to the bundle — an agent's tool call, prompt or resource
//! read, an operator's `bundlevisor call` — is registered with its
//! [`Caller`] while it runs. A bundle request names the request it serves
//! only on streamable HTTP (it arrives on that request's response stream);
//! over stdio nothing ties it, so it goes to the caller of every request in
//! flight when that is one and the same agent. Otherwise — nothing in
//! flight, only the operator's requests, several callers, a request sent
//! outside any of ours, or a capability the agent did not declare — the
//! bundle gets an MCP error at once.

// Sampling, roots and logging are deprecated by SEP-2577 in the newest
// revision; bundles speak 2025-11-25, where they are the spec.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::DerivedActorRef;
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::ProgressNotificationParam;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequest,
    CreateMessageRequestParams, CreateMessageResult, CustomRequest, CustomResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ErrorCode, Implementation, InputRequest, InputRequests,
    InputResponses, ListRootsRequest, ListRootsResult, LoggingLevel, LoggingMessageNotification,
    LoggingMessageNotificationParam, ProtocolVersion, RequestMetaObject,
    ResourceUpdatedNotificationParam, ServerNotification, ServerRequest,
};
use rmcp::service::{InboundStreamOrigin, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde_json::{json, Map, Value};

use crate::host_resources::{self, Answer, HostError, HostRequest, Requester};

/// Protocol version used with bundles. rmcp's newest revision has no
/// `initialize` and refuses server→client requests, which would silently
/// break host-resources: pin the last revision that has both.
pub const BUNDLE_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// How long a bundle's host-resources request may wait for its workspace.
const HOST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who a connection belongs to and where its host-resources requests go.
/// Made by the BundleActor from the host port its WorkspaceActor handed
/// it (only the WorkspaceActor hands one out; `tests/tidy.rs`); a clone
/// serves a rebuilt connection of the same bundle.
#[derive(Clone)]
pub struct HostContext {
    requester: Requester,
    workspace: DerivedActorRef<HostRequest>,
    /// Where the spans of its requests go.
    telemetry: crate::telemetry::Telemetry,
}

impl HostContext {
    pub fn new(workspace: &str, bundle: &str, port: DerivedActorRef<HostRequest>) -> Self {
        HostContext {
            requester: Requester {
                workspace: workspace.to_string(),
                bundle: bundle.to_string(),
            },
            workspace: port,
            telemetry: Default::default(),
        }
    }

    /// The same, each request a span in `telemetry`.
    pub fn traced(self, telemetry: crate::telemetry::Telemetry) -> Self {
        HostContext { telemetry, ..self }
    }

    pub fn requester(&self) -> &Requester {
        &self.requester
    }

    /// Asks the workspace to answer a host-resources request of the
    /// bundle: the answer, the contract's error, or "workspace
    /// unavailable" (retryable) when the workspace cannot be reached.
    pub(super) async fn ask(
        &self,
        method: String,
        params: Option<Value>,
    ) -> Result<Answer, HostError> {
        let span = self.span(&method, params.as_ref());
        let answer = self.ask_workspace(method, params).await;
        match &answer {
            Ok(_) => span.end("ok", None),
            Err(e) => span.end("error", Some(&e.message)),
        }
        answer
    }

    /// The span of a host-resources request (kind server: the bundle
    /// asks), in the trace the bundle passed in its `_meta` if the daemon
    /// handed it that trace with a request still in flight.
    fn span(&self, method: &str, params: Option<&Value>) -> crate::telemetry::Span {
        use crate::telemetry::{Attribute, Kind};
        // Off: nothing of the request is read or built.
        if !self.telemetry.is_on() {
            return self.telemetry.root().quiet();
        }
        let field = |name: &str| {
            params?
                .get("_meta")?
                .get(name)?
                .as_str()
                .map(str::to_string)
        };
        let (parent, state) = (field("traceparent"), field("tracestate"));
        let trace = self
            .telemetry
            .continued_by_bundle(parent.as_deref(), state.as_deref());
        let mut attributes = vec![
            Attribute::new("mcp.method.name", method.to_string()),
            Attribute::new("bundlevisor.workspace", self.requester.workspace.clone()),
            Attribute::new("bundlevisor.bundle", self.requester.bundle.clone()),
        ];
        let uri = params.and_then(|p| p.get("uri")).and_then(Value::as_str);
        if let Some(uri) = uri {
            // Never a query: it may carry what an argument would.
            let uri = uri.split(['?', '#']).next().unwrap_or_default();
            attributes.push(Attribute::new("mcp.resource.uri", uri.to_string()));
        }
        trace.span(format!("host-resources {method}"), Kind::Server, attributes)
    }

    async fn ask_workspace(
        &self,
        method: String,
        params: Option<Value>,
    ) -> Result<Answer, HostError> {
        let requester = self.requester.clone();
        let answer = self
            .workspace
            .call(
                |reply| HostRequest {
                    requester,
                    method,
                    params,
                    reply,
                },
                Some(HOST_REQUEST_TIMEOUT),
            )
            .await;
        let why = match answer {
            Ok(ractor::rpc::CallResult::Success(result)) => return result,
            Ok(ractor::rpc::CallResult::Timeout) => "timed out".to_string(),
            Ok(_) => "reply dropped".to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(workspace = %self.requester.workspace, bundle = %self.requester.bundle,
            "host-resources request could not reach the workspace: {why}");
        Err(HostError {
            code: ErrorCode::INTERNAL_ERROR.0,
            message: "workspace unavailable".into(),
            data: json!({ "retry": true }),
        })
    }
}

/// The agent a call comes from, as the bundle's own requests reach it: an
/// MCP client of the gateway (either transport).
pub trait Agent: Send + Sync {
    /// What the agent declared at initialize.
    fn capabilities(&self) -> ClientCapabilities;
    /// A request to the agent (sampling, elicitation, roots).
    fn request(
        &self,
        request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
    /// Requests asked together (one round of a bundle's `input_required`,
    /// each under the key the bundle gave it): their answers, in order. At
    /// once, one by one, unless the agent has a way to ask them together
    /// (then under the same keys, when it can).
    fn request_all(
        &self,
        requests: Vec<(Option<String>, ServerRequest)>,
    ) -> BoxFuture<'static, Vec<Result<ClientResult, ErrorData>>> {
        let asks: Vec<_> = requests.into_iter().map(|(_, r)| self.request(r)).collect();
        Box::pin(futures::future::join_all(asks))
    }
    /// A notification to the agent (log messages).
    fn notify(&self, notification: ServerNotification) -> BoxFuture<'static, ()>;
    /// Resource `uri` of `bundle`, to which the agent subscribed, changed.
    fn resource_updated(&self, bundle: &str, uri: &str) -> BoxFuture<'static, ()>;
    /// Whether the agent's session has ended.
    fn gone(&self) -> bool;
    /// Why no request can be sent to the agent at all, if none can.
    fn unreachable(&self) -> Option<String>;
    /// The least severe log message the agent wants, if it wants any (a
    /// bundle on 2026-07-28 sends none unless its request says so).
    fn log_level(&self) -> Option<LoggingLevel> {
        None
    }
}

/// Which agents subscribed to which of the bundle's resources (by the
/// bundle's own URI), for the life of the connection.
#[derive(Clone, Default)]
pub struct Subscribers(Arc<Mutex<Vec<Subscription>>>);

/// A resource (the bundle's URI) and the agent subscribed to it.
type Subscription = (String, Arc<dyn Agent>);

impl Subscribers {
    pub fn add(&self, uri: &str, agent: Arc<dyn Agent>) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !list.iter().any(|(u, a)| u == uri && same(a, &agent)) {
            list.push((uri.to_string(), agent));
        }
    }

    pub fn remove(&self, uri: &str, agent: &Arc<dyn Agent>) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(u, a)| !(u == uri && same(a, agent)));
    }

    /// Whether a live agent other than `agent` follows `uri` (then the
    /// bundle keeps its subscription when `agent` leaves).
    pub fn others(&self, uri: &str, agent: &Arc<dyn Agent>) -> bool {
        !self.of(uri).iter().all(|other| same(other, agent))
    }

    /// The URIs live agents follow.
    pub fn uris(&self) -> std::collections::BTreeSet<String> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(_, a)| !a.gone());
        list.iter().map(|(u, _)| u.clone()).collect()
    }

    /// Tells the agents that follow `uri` of `bundle` that it changed,
    /// each on its own: a slow agent holds up no other, nor the bundle's
    /// stream.
    pub fn tell(&self, bundle: &str, uri: &str) {
        for agent in self.of(uri) {
            tokio::spawn(agent.resource_updated(bundle, uri));
        }
    }

    /// The live agents subscribed to `uri` (ended sessions are dropped).
    fn of(&self, uri: &str) -> Vec<Arc<dyn Agent>> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(_, a)| !a.gone());
        list.iter()
            .filter(|(u, _)| u == uri)
            .map(|(_, a)| a.clone())
            .collect()
    }
}

/// Who a request to a bundle comes from; the bundle's own requests while
/// serving it may go to that caller only.
#[derive(Clone)]
pub enum Caller {
    /// An agent of the gateway (either transport).
    Agent(Arc<dyn Agent>),
    /// The operator over the control socket (`bundlevisor call`,
    /// `bundle.mcp`): nobody a bundle's request could be passed to.
    Operator,
}

impl Caller {
    fn is(&self, other: &Caller) -> bool {
        match (self, other) {
            (Caller::Agent(a), Caller::Agent(b)) => same(a, b),
            (Caller::Operator, Caller::Operator) => true,
            _ => false,
        }
    }
}

/// The requests in flight on one bundle connection and their callers,
/// each entry held by its request ([`CallerGuard`]).
#[derive(Clone, Default)]
pub struct Callers(Arc<Mutex<Vec<InFlightRequest>>>);

/// A request in flight: its key, its caller, and once sent its JSON-RPC id
/// on the bundle connection (a bundle on streamable HTTP names it).
struct InFlightRequest {
    key: u64,
    caller: Caller,
    sent_as: Option<rmcp::model::RequestId>,
    /// Time the request spent waiting for its caller's answers.
    asked: Arc<Asked>,
}

/// How long a request waited for its caller to answer the bundle's
/// requests (a person filling in an elicitation form, say): that time does
/// not count against the request's own timeout ([`Asked::expired`]).
#[derive(Default)]
pub struct Asked {
    /// Asks in flight, since when one is, and the time asked before.
    state: Mutex<(u32, Option<std::time::Instant>, Duration)>,
    changed: tokio::sync::Notify,
}

impl Asked {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u32, Option<std::time::Instant>, Duration)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self) {
        let mut s = self.lock();
        if s.0 == 0 {
            s.1 = Some(std::time::Instant::now());
        }
        s.0 += 1;
    }

    fn end(&self) {
        let mut s = self.lock();
        s.0 = s.0.saturating_sub(1);
        if s.0 == 0 {
            if let Some(since) = s.1.take() {
                s.2 += since.elapsed();
            }
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// The time the caller has been asked so far.
    pub fn so_far(&self) -> Duration {
        self.paused().0
    }

    /// The time asked so far, and whether an ask is in flight now.
    fn paused(&self) -> (Duration, bool) {
        let s = self.lock();
        let now = s.1.map(|since| since.elapsed()).unwrap_or_default();
        (s.2 + now, s.0 > 0)
    }

    /// Resolves once `timeout` has passed since `start`, not counting the
    /// time the caller was being asked, of which at most `max_asked`.
    pub async fn expired(
        &self,
        start: tokio::time::Instant,
        timeout: Duration,
        max_asked: Duration,
    ) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (asked, asking) = self.paused();
            let deadline = start + timeout + asked.min(max_asked);
            if asking && asked < max_asked {
                // Waiting on the agent: the clock stands, up to the bound.
                let bound = start + timeout + max_asked;
                tokio::select! {
                    _ = tokio::time::sleep_until(bound) => {}
                    _ = changed => {}
                }
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = changed => {}
            }
        }
    }
}

/// The agent a bundle's request goes to, and the clocks of the requests
/// whose time it spends answering.
type AskedOf = (Arc<dyn Agent>, Vec<Arc<Asked>>);

/// An ask of the caller in flight, counted in its [`Asked`] until dropped.
pub struct Asking(Arc<Asked>);

impl Asking {
    pub fn new(asked: Arc<Asked>) -> Self {
        asked.begin();
        Asking(asked)
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Removes its request's entry from [`Callers`] when the request ends.
pub struct CallerGuard {
    callers: Callers,
    key: u64,
}

impl CallerGuard {
    /// How long the request has waited for its caller's answers.
    pub fn asked(&self) -> Arc<Asked> {
        let list = self.callers.lock();
        list.iter()
            .find(|e| e.key == self.key)
            .map(|e| e.asked.clone())
            .unwrap_or_default()
    }

    /// Records the id the request was sent with.
    pub fn sent_as(&self, id: rmcp::model::RequestId) {
        let mut list = self.callers.lock();
        if let Some(entry) = list.iter_mut().find(|e| e.key == self.key) {
            entry.sent_as = Some(id);
        }
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        self.callers.lock().retain(|e| e.key != self.key);
    }
}

fn same(a: &Arc<dyn Agent>, b: &Arc<dyn Agent>) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

const NO_CALL: &str = "no agent's call is in flight on this bundle: bundlevisor passes sampling, elicitation and roots requests only to the agent whose request the bundle is serving";
const OPERATOR: &str = "the request the bundle is serving comes from the operator's control socket (bundlevisor call), not from an agent: there is nobody to ask";
const SEVERAL: &str = "requests of several callers (agents, or the operator) are in flight on this bundle, and the request does not say which one it belongs to: bundlevisor does not guess";
const UNASSOCIATED: &str = "the bundle sent this request outside any request of bundlevisor's (on its standalone stream): bundlevisor passes sampling, elicitation and roots requests only to the agent whose request the bundle is serving";

impl Callers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<InFlightRequest>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a request of `caller` until the guard is dropped. Entered
    /// before the request is sent: the bundle may ask at once.
    pub fn enter(&self, caller: Caller) -> CallerGuard {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let key = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().push(InFlightRequest {
            key,
            caller,
            sent_as: None,
            asked: Arc::default(),
        });
        CallerGuard {
            callers: self.clone(),
            key,
        }
    }

    /// The agent a bundle's request (or log message) belongs to, or why
    /// there is none to ask. `origin` is the stream it came on (streamable
    /// HTTP only): the response stream of one of our requests names that
    /// request; the standalone stream names none.
    fn agent_for(&self, origin: Option<&InboundStreamOrigin>) -> Result<Arc<dyn Agent>, String> {
        self.asked_of(origin).map(|(agent, _)| agent)
    }

    /// [`Self::agent_for`], with the clocks of the requests whose time it
    /// would spend answering (the one named, or all of that one caller).
    fn asked_of(&self, origin: Option<&InboundStreamOrigin>) -> Result<AskedOf, String> {
        let list = self.lock();
        let named = match origin {
            Some(InboundStreamOrigin::Unassociated) => return Err(UNASSOCIATED.into()),
            Some(InboundStreamOrigin::OutboundRequest(id)) => {
                list.iter().find(|e| e.sent_as.as_ref() == Some(id))
            }
            None => None,
        };
        let (caller, asked) = match named {
            Some(entry) => (&entry.caller, vec![entry.asked.clone()]),
            // Nothing ties it to a request: only one caller may be meant.
            None => {
                let Some(first) = list.first() else {
                    return Err(NO_CALL.into());
                };
                if list.iter().any(|e| !e.caller.is(&first.caller)) {
                    return Err(SEVERAL.into());
                }
                (
                    &first.caller,
                    list.iter().map(|e| e.asked.clone()).collect(),
                )
            }
        };
        match caller {
            Caller::Agent(agent) => Ok((agent.clone(), asked)),
            Caller::Operator => Err(OPERATOR.into()),
        }
    }

    /// Passes a request of the bundle to the agent whose request it serves,
    /// if it declared the capability (`declared`, named `what`).
    async fn forward(
        &self,
        what: &str,
        declared: impl Fn(&ClientCapabilities) -> bool,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let (agent, asked) = self
            .asked_of(context.extensions.get::<InboundStreamOrigin>())
            .map_err(|why| ErrorData::new(ErrorCode::INVALID_REQUEST, why, None))?;
        if let Some(why) = agent.unreachable() {
            return Err(ErrorData::new(ErrorCode::INVALID_REQUEST, why, None));
        }
        if !declared(&agent.capabilities()) {
            return Err(ErrorData::new(
                ErrorCode::INVALID_REQUEST,
                format!("the agent that made this call did not declare the {what} capability"),
                None,
            ));
        }
        // The caller's time to answer does not count against its request.
        let _asking: Vec<Asking> = asked.into_iter().map(Asking::new).collect();
        agent.request(request).await
    }
}

/// Why a bundle that needs input (`what`) cannot have it from the
/// operator.
pub fn nobody_to_ask(what: &str) -> String {
    format!("the bundle needs input ({what}), and {OPERATOR}")
}

/// Why a bundle's input requests could not be answered.
#[derive(Debug)]
pub enum Unfulfilled {
    /// The caller did not declare the capability (`sampling`,
    /// `elicitation` or `roots`): MCP's MissingRequiredClientCapability.
    Missing(&'static str),
    Why(String),
}

impl Unfulfilled {
    /// As an MCP error: -32021 with `data.requiredCapabilities` for a
    /// missing capability, else an internal error saying why.
    pub fn into_error(self) -> ErrorData {
        match self {
            Unfulfilled::Missing(what) => ErrorData::new(
                ErrorCode(-32021),
                format!("the bundle asked for {what}, and the agent that made this call did not declare the {what} capability"),
                Some(json!({ "requiredCapabilities": { what: {} } })),
            ),
            Unfulfilled::Why(why) => ErrorData::internal_error(why, None),
        }
    }
}

/// The answers of `caller` to a bundle's input requests (a bundle on MCP
/// 2026-07-28 answered `input_required`): each asked of the agent, all at
/// once — on its session, or for an agent on 2026-07-28 as its own
/// `input_required` — or why they cannot be.
pub async fn fulfil(
    caller: &Caller,
    requests: InputRequests,
) -> Result<InputResponses, Unfulfilled> {
    let agent = match caller {
        Caller::Agent(agent) => agent,
        Caller::Operator => {
            let asked: Vec<String> = requests.values().map(describe).collect();
            return Err(Unfulfilled::Why(nobody_to_ask(&asked.join("; "))));
        }
    };
    if let Some(why) = agent.unreachable() {
        return Err(Unfulfilled::Why(why));
    }
    let capabilities = agent.capabilities();
    let mut asks = Vec::new();
    for (key, request) in requests {
        let (what, declared, request) = match request {
            InputRequest::Elicitation(r) => (
                "elicitation",
                capabilities.elicitation.is_some(),
                ServerRequest::ElicitRequest(r),
            ),
            InputRequest::CreateMessage(r) => (
                "sampling",
                capabilities.sampling.is_some(),
                ServerRequest::CreateMessageRequest(r),
            ),
            InputRequest::ListRoots(r) => (
                "roots",
                capabilities.roots.is_some(),
                ServerRequest::ListRootsRequest(r),
            ),
            _ => {
                return Err(Unfulfilled::Why(
                    "the bundle asked for input of a kind bundlevisor does not know".into(),
                ))
            }
        };
        if !declared {
            return Err(Unfulfilled::Missing(what));
        }
        asks.push((key, what, request));
    }
    let requests = asks
        .iter()
        .map(|(key, _, r)| (Some(key.clone()), r.clone()))
        .collect();
    let answers = agent.request_all(requests).await;
    let mut responses = InputResponses::new();
    for ((key, what, _), answer) in asks.into_iter().zip(answers) {
        let answer = answer.map_err(|e| {
            Unfulfilled::Why(format!(
                "the bundle asked for {what}, and the agent answered with an error: {}",
                e.message
            ))
        })?;
        let value = match answer {
            ClientResult::ElicitResult(r) => serde_json::to_value(r),
            ClientResult::CreateMessageResult(r) => serde_json::to_value(r),
            ClientResult::ListRootsResult(r) => serde_json::to_value(r),
            _ => {
                return Err(Unfulfilled::Why(format!(
                    "the agent answered {what} with something else"
                )))
            }
        };
        let value =
            value.map_err(|e| Unfulfilled::Why(format!("the agent's answer to {what}: {e}")))?;
        responses.insert(key, value);
    }
    Ok(responses)
}

/// An input request, for an error message: its method and what it asks.
fn describe(request: &InputRequest) -> String {
    match request {
        InputRequest::Elicitation(r) => {
            let message = serde_json::to_value(&r.params)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_default();
            format!("elicitation/create {message:?}")
        }
        InputRequest::CreateMessage(_) => "sampling/createMessage".into(),
        InputRequest::ListRoots(_) => "roots/list".into(),
        _ => "an input request".into(),
    }
}

/// The answer of an agent that is not the kind asked for.
fn unexpected(what: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("the agent answered {what} with something else"),
        None,
    )
}

/// The rmcp client handler of one bundle connection.
pub(super) struct BundleClient {
    host: HostContext,
    config: ClientConfig,
    /// Routes the bundle's `notifications/progress` to the call that asked.
    progress: ProgressDispatcher,
    /// The agents whose calls the bundle is serving.
    callers: Callers,
    /// The agents subscribed to its resources.
    subscribers: Subscribers,
}

impl BundleClient {
    /// `extensions`: what the daemon declares under
    /// `capabilities.extensions` (host-resources, and others a bundle's
    /// settings call for).
    pub(super) fn new(host: HostContext, extensions: Vec<(String, Map<String, Value>)>) -> Self {
        let mut capabilities = ClientCapabilities::builder()
            .enable_sampling()
            .enable_elicitation()
            .enable_roots()
            .build();
        capabilities.extensions = Some(extensions.into_iter().collect());
        let config = ClientConfig::new(
            capabilities,
            Implementation::new("bundlevisor", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(BUNDLE_PROTOCOL_VERSION);
        BundleClient {
            host,
            config,
            progress: ProgressDispatcher::new(),
            callers: Callers::default(),
            subscribers: Subscribers::default(),
        }
    }

    pub(super) fn progress(&self) -> ProgressDispatcher {
        self.progress.clone()
    }

    pub(super) fn callers(&self) -> Callers {
        self.callers.clone()
    }

    pub(super) fn subscribers(&self) -> Subscribers {
        self.subscribers.clone()
    }
}

impl ClientHandler for BundleClient {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self
            .callers
            .forward("sampling", |c| c.sampling.is_some(), request, &context)
            .await?
        {
            ClientResult::CreateMessageResult(r) => Ok(*r),
            _ => Err(unexpected("sampling/createMessage")),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self
            .callers
            .forward(
                "elicitation",
                |c| c.elicitation.is_some(),
                request,
                &context,
            )
            .await?
        {
            ClientResult::ElicitResult(r) => Ok(r),
            _ => Err(unexpected("elicitation/create")),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        match self
            .callers
            .forward("roots", |c| c.roots.is_some(), request, &context)
            .await?
        {
            ClientResult::ListRootsResult(r) => Ok(r),
            _ => Err(unexpected("roots/list")),
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        // To the agent whose request the bundle serves (no notification
        // names its request: the one caller in flight); otherwise dropped.
        match self.callers.agent_for(None) {
            Ok(agent) => {
                let note = ServerNotification::LoggingMessageNotification(
                    LoggingMessageNotification::new(params),
                );
                agent.notify(note).await;
            }
            // Not written to the daemon's log: it may hold what the bundle
            // knows (its secrets), which only its stderr is redacted for.
            Err(_) => tracing::debug!(
                workspace = %self.host.requester.workspace,
                bundle = %self.host.requester.bundle,
                level = ?params.level,
                "a log message of the bundle outside a single agent's request was dropped"
            ),
        }
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.subscribers
            .tell(&self.host.requester.bundle, &params.uri);
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        let CustomRequest {
            method,
            params,
            extensions,
        } = request;
        // rmcp moves a request's `_meta` out of `params` (into the request's
        // extensions, and from there into the context); the contract carries
        // the list filter there (`_meta.filter`), so put it back before the
        // resolver sees the params.
        let meta = Some(&context.meta)
            .filter(|m| !m.0 .0.is_empty())
            .or(extensions.get::<RequestMetaObject>());
        let params = match meta {
            Some(meta) if !meta.0 .0.is_empty() => {
                let mut object = match params {
                    Some(Value::Object(o)) => o,
                    _ => Map::new(),
                };
                object.insert("_meta".into(), Value::Object(meta.0 .0.clone()));
                Some(Value::Object(object))
            }
            _ => params,
        };
        if method != host_resources::METHOD_READ && method != host_resources::METHOD_LIST {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
                None,
            ));
        }
        match self.host.ask(method, params).await {
            Ok(answer) => Ok(CustomResult::new(answer.to_value())),
            Err(e) => Err(to_error_data(e)),
        }
    }
}

fn to_error_data(e: HostError) -> ErrorData {
    ErrorData::new(ErrorCode(e.code), e.message, Some(e.data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::RequestId;

    /// An agent that is only told apart from others (nothing is sent).
    struct Quiet;

    impl Agent for Quiet {
        fn capabilities(&self) -> ClientCapabilities {
            ClientCapabilities::default()
        }
        fn request(&self, _: ServerRequest) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
            Box::pin(async { Err(ErrorData::internal_error("not asked in this test", None)) })
        }
        fn notify(&self, _: ServerNotification) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
        fn resource_updated(&self, _: &str, _: &str) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
        fn gone(&self) -> bool {
            false
        }
        fn unreachable(&self) -> Option<String> {
            None
        }
    }

    fn on_stream_of(id: i64) -> InboundStreamOrigin {
        InboundStreamOrigin::OutboundRequest(RequestId::Number(id))
    }

    /// Who a bundle's request goes to: the caller of the request its
    /// stream names (streamable HTTP), else the one caller in flight, else
    /// nobody — with the reason.
    #[test]
    fn a_bundles_request_goes_to_the_caller_of_the_request_it_serves_or_to_nobody() {
        let callers = Callers::default();
        let (a, b): (Arc<dyn Agent>, Arc<dyn Agent>) = (Arc::new(Quiet), Arc::new(Quiet));
        let is = |got: Result<Arc<dyn Agent>, String>, want: &Arc<dyn Agent>| {
            same(&got.expect("an agent"), want)
        };
        assert_eq!(callers.agent_for(None).err().as_deref(), Some(NO_CALL));

        let call_a = callers.enter(Caller::Agent(a.clone()));
        call_a.sent_as(RequestId::Number(1));
        let call_b = callers.enter(Caller::Agent(b.clone()));
        call_b.sent_as(RequestId::Number(2));
        let operator = callers.enter(Caller::Operator);
        operator.sent_as(RequestId::Number(3));

        assert!(is(callers.agent_for(Some(&on_stream_of(2))), &b));
        assert!(is(callers.agent_for(Some(&on_stream_of(1))), &a));
        assert_eq!(
            callers.agent_for(Some(&on_stream_of(3))).err().as_deref(),
            Some(OPERATOR)
        );
        let outside = Some(&InboundStreamOrigin::Unassociated);
        assert_eq!(
            callers.agent_for(outside).err().as_deref(),
            Some(UNASSOCIATED)
        );
        // Nothing ties it (stdio), or a stream of a request not noted: no guess.
        assert_eq!(callers.agent_for(None).err().as_deref(), Some(SEVERAL));
        assert_eq!(
            callers.agent_for(Some(&on_stream_of(9))).err().as_deref(),
            Some(SEVERAL)
        );

        drop(call_b);
        assert_eq!(callers.agent_for(None).err().as_deref(), Some(SEVERAL));
        drop(operator);
        let again = callers.enter(Caller::Agent(a.clone()));
        assert!(is(callers.agent_for(None), &a), "one agent, two calls");
        drop((call_a, again));
        let operator = callers.enter(Caller::Operator);
        assert_eq!(callers.agent_for(None).err().as_deref(), Some(OPERATOR));
        drop(operator);
        assert_eq!(callers.agent_for(None).err().as_deref(), Some(NO_CALL));
    }
}
