//! Multi-round-trip requests (MCP 2026-07-28, SEP-2322) for bundles that
//! ask the old way.
//!
//! An agent on 2026-07-28 cannot be sent a request: it is asked for input
//! by an `input_required` result, and answers by retrying its request with
//! `inputResponses` and the `requestState` it was given. A bundle on
//! 2025-11-25 asks (`elicitation/create`, `sampling/createMessage`,
//! `roots/list`) in the middle of serving the call, and waits for the
//! answer. The bridge:
//!
//! 1. A 2026-07-28 agent's `tools/call`, `prompts/get` or `resources/read`
//!    runs with a [`RoundAgent`] as its caller. While the bundle only
//!    works, the request is served inline, like any other.
//! 2. When the bundle asks, the call is parked (its future moves to a task
//!    of its own and keeps waiting for the answer), and the agent gets
//!    `input_required` with the bundle's requests and a `requestState`: a
//!    random handle to the parked call, nothing else (so nothing in it can
//!    be forged; a state the daemon did not hand out names nothing).
//! 3. The retry names the parked call by that handle. It must come from the
//!    same agent (the access token, over HTTP; the connection, on stdio)
//!    and be the same request (method and name). Its answers go to the
//!    bundle's waiting requests, and the call goes on: to its result, or
//!    to the next `input_required` (a new handle: each is used once).
//!
//! Bounded: a parked call ends when its agent does not retry within
//! [`RoundLimits::timeout`]; one agent has at most
//! [`RoundLimits::per_agent`] parked; a call asks at most
//! [`RoundLimits::rounds`] times. An ended call is cancelled at the bundle
//! and holds no memory.

// Sampling, roots and logging are deprecated by SEP-2577 in 2026-07-28,
// and still there.
#![allow(deprecated)]

use super::facts::Facts;
use super::new_state;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    ClientCapabilities, ClientResult, CreateMessageResult, ElicitResult, InputRequest,
    InputRequests, InputRequiredResult, InputResponses, ListRootsResult, LoggingLevel,
    ProgressNotificationParam, ProgressToken, ServerNotification, ServerRequest, ServerResult,
};
use rmcp::service::Peer;
use rmcp::{ErrorData, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::bundle::client::Agent;

/// How long a parked call waits for its agent's retry, how many one agent
/// may have parked, and how many times one call may ask.
#[derive(Debug, Clone, Copy)]
pub struct RoundLimits {
    pub timeout: Duration,
    pub per_agent: usize,
    pub rounds: u32,
}

impl Default for RoundLimits {
    fn default() -> Self {
        RoundLimits {
            timeout: crate::config::defaults::http_input_timeout(),
            per_agent: crate::config::defaults::http_max_waiting_for_input(),
            rounds: MAX_ROUNDS,
        }
    }
}

/// Times one call may ask its agent for input: a bundle that keeps asking
/// is ended here, not served forever.
pub const MAX_ROUNDS: u32 = 32;

pub use super::AgentKey;

/// The request a parked call serves: its method and name (tool, prompt,
/// or URI). A retry must be the same request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub method: &'static str,
    pub name: String,
}

/// The parked calls of one endpoint (HTTP) or connection (stdio).
pub struct Rounds {
    parked: Mutex<HashMap<String, Parked>>,
    /// The bundles' tasks handed to the agents of this endpoint.
    pub tasks: super::tasks::Tasks,
    limits: RoundLimits,
    me: Weak<Rounds>,
}

/// What a request of a 2026-07-28 agent ends with. Most end complete:
/// boxing that variant would cost every call an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Complete(ServerResult),
    InputRequired(InputRequiredResult),
}

/// A call waiting for its agent's retry.
struct Parked {
    owner: Option<AgentKey>,
    origin: Origin,
    running: Running,
    /// The bundle's requests the agent was asked, by key: what it asked,
    /// and where its answer goes.
    waiting: BTreeMap<String, Waiting>,
    /// Keys are never reused within a call (the spec asks them unique).
    next_key: u64,
    rounds: u32,
    /// Ends the call when its agent does not come back in time; stopped
    /// when the call is taken.
    expiry: Option<tokio::task::AbortHandle>,
}

struct Waiting {
    request: InputRequest,
    reply: oneshot::Sender<Result<ClientResult, ErrorData>>,
}

/// A bundle's request, the key it gave it (a bundle on 2026-07-28), and
/// where its answer goes.
type Ask = (
    Option<String>,
    ServerRequest,
    oneshot::Sender<Result<ClientResult, ErrorData>>,
);

/// What a call asks of the request that is being served for it: requests
/// asked together travel together (one `input_required`).
enum Event {
    Ask(Vec<Ask>),
    Log(ServerNotification),
}

/// A call run for a 2026-07-28 agent: its answer to come, what it asks
/// on the way, and its progress.
pub struct Running {
    answer: BoxFuture<'static, Result<ServerResult, ErrorData>>,
    spawned: bool,
    events: mpsc::Receiver<Event>,
    progress: Option<mpsc::Receiver<ProgressNotificationParam>>,
    level: Arc<Mutex<Option<LoggingLevel>>>,
    /// Cancelled when the call is given up (dropped): the bundle is told.
    cancel: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Where a running call's notifications go now: the request being served.
pub struct Served<'a> {
    pub context: &'a Facts<'a>,
    pub progress_token: Option<ProgressToken>,
}

/// What the call did while a request was served (mostly: answered).
#[allow(clippy::large_enum_variant)]
enum Step {
    Done(Result<ServerResult, ErrorData>),
    Asked(Vec<Ask>),
    Cancelled,
}

/// The agent of a 2026-07-28 request, as the bundle's requests reach it:
/// they become input requests of the request being served.
struct RoundAgent {
    events: mpsc::Sender<Event>,
    capabilities: ClientCapabilities,
    level: Arc<Mutex<Option<LoggingLevel>>>,
}

impl Agent for RoundAgent {
    fn capabilities(&self) -> ClientCapabilities {
        self.capabilities.clone()
    }

    fn request(
        &self,
        request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let asked = self.request_all(vec![(None, request)]);
        Box::pin(async move { asked.await.pop().unwrap_or_else(|| Err(ended())) })
    }

    fn request_all(
        &self,
        requests: Vec<(Option<String>, ServerRequest)>,
    ) -> BoxFuture<'static, Vec<Result<ClientResult, ErrorData>>> {
        let events = self.events.clone();
        Box::pin(async move {
            let (asks, answers): (Vec<Ask>, Vec<_>) = requests
                .into_iter()
                .map(|(key, request)| {
                    let (reply, answer) = oneshot::channel();
                    ((key, request, reply), answer)
                })
                .unzip();
            let count = answers.len();
            if events.send(Event::Ask(asks)).await.is_err() {
                return (0..count).map(|_| Err(ended())).collect();
            }
            let mut out = Vec::with_capacity(count);
            for answer in answers {
                out.push(answer.await.unwrap_or_else(|_| Err(ended())));
            }
            out
        })
    }

    fn notify(&self, notification: ServerNotification) -> BoxFuture<'static, ()> {
        // Log messages only for a request that asked for them, at its level
        // (2026-07-28: "MUST NOT emit notifications/message for a request
        // that does not include" `logLevel`).
        if let ServerNotification::LoggingMessageNotification(n) = &notification {
            let wanted = *self.level.lock().unwrap_or_else(|e| e.into_inner());
            match wanted {
                Some(min) if super::severity(n.params.level) >= super::severity(min) => {}
                _ => return Box::pin(async {}),
            }
        }
        let _ = self.events.try_send(Event::Log(notification));
        Box::pin(async {})
    }

    fn resource_updated(&self, _bundle: &str, _uri: &str) -> BoxFuture<'static, ()> {
        // 2026-07-28 agents hear of updates on `subscriptions/listen`.
        Box::pin(async {})
    }

    fn gone(&self) -> bool {
        self.events.is_closed()
    }

    fn log_level(&self) -> Option<LoggingLevel> {
        *self.level.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unreachable(&self) -> Option<String> {
        None
    }
}

/// The agent of a stateless request answered below rmcp (so no stream to
/// send it anything but its call's progress on) that declared nothing a
/// bundle could ask of it: no sampling, elicitation or roots, no log
/// level, no retry.
/// Its call can never need a round — a bundle that asks anyway is refused
/// by the capability check every request of a bundle passes
/// ([`crate::bundle::client`]), as it would be with a [`RoundAgent`] — so
/// it runs without the rounds' channels, task and boxed call.
pub struct Unaskable(ClientCapabilities);

impl Unaskable {
    /// The agent of `context` when it is such a request; `retried`: the
    /// request carries `requestState` or `inputResponses`.
    pub fn of(context: &Facts<'_>, retried: bool) -> Option<Arc<dyn Agent>> {
        if !matches!(context, Facts::Direct(d) if d.session.is_none())
            || retried
            || context.log_level().is_some()
        {
            return None;
        }
        let declared = context.client_capabilities().unwrap_or_default();
        let askable = declared.sampling.is_some()
            || declared.elicitation.is_some()
            || declared.roots.is_some();
        (!askable).then(|| Arc::new(Unaskable(declared)) as Arc<dyn Agent>)
    }
}

impl Agent for Unaskable {
    fn capabilities(&self) -> ClientCapabilities {
        self.0.clone()
    }

    fn request(
        &self,
        _request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        // Not reached: the capability check refuses first.
        Box::pin(async { Err(ended()) })
    }

    fn notify(&self, _notification: ServerNotification) -> BoxFuture<'static, ()> {
        // No log level asked, and no stream to send anything on.
        Box::pin(async {})
    }

    fn resource_updated(&self, _bundle: &str, _uri: &str) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    fn gone(&self) -> bool {
        false
    }

    fn unreachable(&self) -> Option<String> {
        None
    }
}

impl Running {
    /// Starts a call: `call` gets the agent its bundle's requests go to, a
    /// progress sender (when the request asked for progress) and the
    /// token that cancels it.
    pub fn start(
        context: &Facts<'_>,
        wants_progress: bool,
        call: impl FnOnce(
            Arc<dyn Agent>,
            Option<mpsc::Sender<ProgressNotificationParam>>,
            CancellationToken,
        ) -> BoxFuture<'static, Result<ServerResult, ErrorData>>,
    ) -> Running {
        let (events_tx, events) = mpsc::channel(16);
        let level = Arc::new(Mutex::new(context.log_level()));
        let agent = Arc::new(RoundAgent {
            events: events_tx,
            capabilities: context.client_capabilities().unwrap_or_default(),
            level: level.clone(),
        });
        let (progress_tx, progress) = if wants_progress {
            let (tx, rx) = mpsc::channel(16);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let cancel = CancellationToken::new();
        Running {
            answer: call(agent, progress_tx, cancel.clone()),
            spawned: false,
            events,
            progress,
            level,
            cancel,
        }
    }

    /// Serves the call for one request until it answers, asks, or the
    /// request is cancelled; its progress and log messages go to that
    /// request.
    async fn step(&mut self, served: &Served<'_>) -> Step {
        *self.level.lock().unwrap_or_else(|e| e.into_inner()) = served.context.log_level();
        // A request answered below rmcp has no peer: it asked for no log
        // messages, so none is sent (its progress goes on its answer).
        let peer = served.context.peer();
        loop {
            tokio::select! {
                biased;
                Some(report) = async {
                    match self.progress.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => served.context.notify_progress(served.progress_token.clone(), report).await,
                Some(event) = self.events.recv() => match event {
                    Event::Log(note) => notify(peer, note).await,
                    Event::Ask(mut asked) => {
                        // Whatever else it asked meanwhile, together.
                        while let Ok(event) = self.events.try_recv() {
                            match event {
                                Event::Ask(more) => asked.extend(more),
                                Event::Log(note) => notify(peer, note).await,
                            }
                        }
                        return Step::Asked(asked);
                    }
                },
                answer = &mut self.answer => return Step::Done(answer),
                _ = served.context.ct().cancelled() => return Step::Cancelled,
            }
        }
    }

    /// Moves the call to a task of its own, so it goes on waiting for its
    /// bundle while no request of the agent is being served.
    fn detach(&mut self) {
        if self.spawned {
            return;
        }
        let call = std::mem::replace(&mut self.answer, Box::pin(std::future::pending()));
        let cancel = self.cancel.clone();
        // A call that does not watch its token ends when it is given up.
        let task = tokio::spawn(async move {
            tokio::select! {
                biased;
                answer = call => answer,
                _ = cancel.cancelled() => Err(cancelled()),
            }
        });
        self.answer = Box::pin(async move {
            task.await.unwrap_or_else(|e| {
                Err(ErrorData::internal_error(
                    format!("the call's task ended: {e}"),
                    None,
                ))
            })
        });
        self.spawned = true;
    }
}

async fn notify(peer: Option<&Peer<RoleServer>>, note: ServerNotification) {
    if let Some(peer) = peer {
        let _ = peer.send_notification(note).await;
    }
}

/// The agent that made a request, for resuming: the listener's mark.
pub fn agent_key(context: &Facts<'_>) -> Option<AgentKey> {
    context
        .parts()
        .and_then(|parts| parts.extensions.get::<AgentKey>())
        .cloned()
}

/// `params.requestState` named nothing this agent may resume.
fn no_such_state(timeout: Duration) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "requestState names no request waiting for this agent's input: it was already answered (each state is used once), it expired ({} after it was handed out), or it was not handed to this agent; send the request again without requestState and inputResponses",
            humantime::format_duration(timeout)
        ),
        None,
    )
}

impl Rounds {
    pub fn new(limits: RoundLimits) -> Arc<Rounds> {
        Arc::new_cyclic(|me| Rounds {
            parked: Mutex::default(),
            tasks: Default::default(),
            limits,
            me: me.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Parked>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls parked now (for tests and status).
    pub fn parked(&self) -> usize {
        self.lock().len()
    }

    /// Serves one request of a 2026-07-28 agent: a new call (`start`), or
    /// with `requestState` the retry of a parked one.
    pub async fn serve(
        &self,
        origin: Origin,
        state: Option<&str>,
        responses: Option<InputResponses>,
        served: Served<'_>,
        start: impl FnOnce() -> Running,
    ) -> Result<Outcome, ErrorData> {
        let owner = agent_key(served.context);
        let mut parked = match state {
            None => {
                if responses.as_ref().is_some_and(|r| !r.is_empty()) {
                    return Err(ErrorData::invalid_params(
                        "inputResponses without requestState: send the requestState of the input_required result they answer",
                        None,
                    ));
                }
                let mut running = start();
                match running.step(&served).await {
                    Step::Done(answer) => return answer.map(Outcome::Complete),
                    Step::Cancelled => return Err(cancelled()),
                    Step::Asked(asked) => Parked {
                        owner,
                        origin,
                        running,
                        waiting: BTreeMap::new(),
                        next_key: 1,
                        rounds: 0,
                        expiry: None,
                    }
                    .with(asked),
                }
            }
            Some(state) => {
                let parked = self.take(state, owner.as_ref())?;
                if parked.origin != origin {
                    return Err(ErrorData::invalid_params(
                        format!(
                            "requestState was handed out for {} {:?}, not for {} {:?}; the waiting request was ended",
                            parked.origin.method, parked.origin.name, origin.method, origin.name
                        ),
                        None,
                    ));
                }
                Self::resume(parked, responses.unwrap_or_default())?
            }
        };
        loop {
            // Asked (or answered but the bundle's requests still wait): ask
            // the agent, unless the call has asked its fill.
            if !parked.waiting.is_empty() {
                if parked.rounds >= self.limits.rounds {
                    return Err(ErrorData::internal_error(
                        format!(
                            "the bundle asked for input {} times in one request; bundlevisor ends it there (a bundle that keeps asking is not served forever)",
                            self.limits.rounds
                        ),
                        None,
                    ));
                }
                return self.park(parked).map(Outcome::InputRequired);
            }
            match parked.running.step(&served).await {
                Step::Done(answer) => return answer.map(Outcome::Complete),
                Step::Cancelled => return Err(cancelled()),
                Step::Asked(asked) => parked = parked.with(asked),
            }
        }
    }

    /// Hands the parked call's answers to the bundle's waiting requests.
    fn resume(mut parked: Parked, responses: InputResponses) -> Result<Parked, ErrorData> {
        let mut answers = Vec::new();
        for (key, value) in responses {
            // Answers to keys it was not asked are ignored (the spec's SHOULD).
            let Some(waiting) = parked.waiting.get(&key) else {
                continue;
            };
            let answer = parse_response(&waiting.request, value).map_err(|why| {
                ErrorData::invalid_params(
                    format!("inputResponses[{key:?}]: {why}; the waiting request was ended"),
                    None,
                )
            })?;
            answers.push((key, answer));
        }
        for (key, answer) in answers {
            if let Some(waiting) = parked.waiting.remove(&key) {
                let _ = waiting.reply.send(Ok(answer));
            }
        }
        Ok(parked)
    }

    /// Takes the parked call `state` names, if `owner` made it.
    fn take(&self, state: &str, owner: Option<&AgentKey>) -> Result<Parked, ErrorData> {
        let mut parked = self.lock();
        match parked.get(state) {
            Some(p) if p.owner.as_ref() == owner => {
                let mut taken = parked.remove(state).expect("present");
                if let Some(timer) = taken.expiry.take() {
                    timer.abort();
                }
                Ok(taken)
            }
            Some(_) => {
                tracing::warn!("a requestState handed to another agent was presented; refused");
                Err(no_such_state(self.limits.timeout))
            }
            None => Err(no_such_state(self.limits.timeout)),
        }
    }

    /// Parks the call under a new state, and the result that asks the agent.
    fn park(&self, mut parked: Parked) -> Result<InputRequiredResult, ErrorData> {
        let mut map = self.lock();
        let holds = map.values().filter(|p| p.owner == parked.owner).count();
        if holds >= self.limits.per_agent {
            return Err(ErrorData::invalid_request(
                format!(
                    "this agent already has {holds} requests waiting for its input (at most {}; on HTTP, [http] max_waiting_for_input); answer them, or let them expire ({}), then call again",
                    self.limits.per_agent,
                    humantime::format_duration(self.limits.timeout)
                ),
                None,
            ));
        }
        parked.running.detach();
        parked.rounds += 1;
        let requests: InputRequests = parked
            .waiting
            .iter()
            .map(|(key, w)| (key.clone(), w.request.clone()))
            .collect();
        let state = new_state();
        let (me, timeout, expiring) = (self.me.clone(), self.limits.timeout, state.clone());
        let timer = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(rounds) = me.upgrade() {
                if rounds.lock().remove(&expiring).is_some() {
                    tracing::debug!("a call waiting for its agent's input expired");
                }
            }
        });
        parked.expiry = Some(timer.abort_handle());
        map.insert(state.clone(), parked);
        Ok(InputRequiredResult::new(Some(requests), Some(state)))
    }
}

impl Parked {
    /// Adds the bundle's new requests; one that is not an input request
    /// is answered with an error at once.
    fn with(mut self, asked: Vec<Ask>) -> Parked {
        for (key, request, reply) in asked {
            let request = match request {
                ServerRequest::CreateMessageRequest(r) => InputRequest::CreateMessage(r),
                ServerRequest::ElicitRequest(r) => InputRequest::Elicitation(r),
                ServerRequest::ListRootsRequest(r) => InputRequest::ListRoots(r),
                _ => {
                    let _ = reply.send(Err(ErrorData::invalid_request(
                        "only sampling, elicitation and roots requests can be passed to an agent on MCP 2026-07-28",
                        None,
                    )));
                    continue;
                }
            };
            // The bundle's own key when it gave one (a 2026-07-28 bundle's
            // round passed on as it is), else the next number.
            let key = match key.filter(|k| !self.waiting.contains_key(k)) {
                Some(key) => key,
                None => {
                    let key = self.next_key.to_string();
                    self.next_key += 1;
                    key
                }
            };
            self.waiting.insert(key, Waiting { request, reply });
        }
        self
    }
}

/// The agent's answer to `request`, as the bundle's client gets it.
fn parse_response(
    request: &InputRequest,
    value: serde_json::Value,
) -> Result<ClientResult, String> {
    let fail = |what: &str, e: serde_json::Error| format!("not a valid {what} result: {e}");
    Ok(match request {
        InputRequest::Elicitation(_) => ClientResult::ElicitResult(
            serde_json::from_value::<ElicitResult>(value)
                .map_err(|e| fail("elicitation/create", e))?,
        ),
        InputRequest::CreateMessage(_) => ClientResult::CreateMessageResult(Box::new(
            serde_json::from_value::<CreateMessageResult>(value)
                .map_err(|e| fail("sampling/createMessage", e))?,
        )),
        InputRequest::ListRoots(_) => ClientResult::ListRootsResult(
            serde_json::from_value::<ListRootsResult>(value).map_err(|e| fail("roots/list", e))?,
        ),
        _ => return Err("an answer to a request bundlevisor did not ask".into()),
    })
}

/// The answer a bundle's request gets when the agent's request ended.
fn ended() -> ErrorData {
    ErrorData::internal_error(
        "the agent's request ended before it answered (it did not retry with inputResponses in time, or the call was given up)",
        None,
    )
}

fn cancelled() -> ErrorData {
    ErrorData::internal_error("the request was cancelled", None)
}
