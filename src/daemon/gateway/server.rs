//! The workspace MCP server: every ready bundle's tools, prompts and
//! resources under namespaced names (see [`super::names`]), plus the
//! workspace's files as `files://` resources, filtered by a profile.

// Logging is deprecated by SEP-2577 in the newest revision; agents of
// 2025-11-25 use it.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientRequest, ClientResult,
    GetPromptRequest, GetPromptRequestParams, GetPromptResponse, Implementation,
    ListPromptsRequest, ListPromptsResult, ListResourcesRequest, ListResourcesResult,
    ListToolsResult, LoggingLevel, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    ProtocolVersion, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse,
    Resource, ResourceContents, ResourceUpdatedNotificationParam, ResultType, ServerCapabilities,
    ServerConfig, ServerNotification, ServerRequest, ServerResult, SetLevelRequestParams,
    SubscribeRequest, SubscribeRequestParams, Tool, UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::model::{
    CompleteRequest, CompleteRequestParams, CompleteResult, InputRequiredResult,
    ListResourceTemplatesRequest, ListResourceTemplatesResult, Reference, ResourceTemplate,
    SubscriptionFilter,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::json;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::audit::Outcome as AuditOutcome;
use super::facts::Facts;
use super::grant::Grant;
use super::names::{Entry, Naming};
use super::rounds::{Origin, Outcome, Rounds, Running, Served, Unaskable};
use crate::bundle::client::{Agent, Caller};
use crate::bundle::spliced::RawToolResult;
use crate::config::Profile;
use crate::daemon::api::call::ToolResult;
use crate::daemon::api::{Api, ApiError, CallRequest};
use crate::daemon::OnDrop;
use crate::protocol::BundleState;
use crate::telemetry::Trace;
use crate::token_rules::Kind;

/// How long a call waits for a bundle that is starting or restarting.
pub const DEFAULT_WAIT_READY: Duration = Duration::from_secs(10);

pub struct Inner {
    pub api: Api,
    pub workspace: String,
    pub profile: Option<Profile>,
    pub wait_ready: Duration,
    /// How the bundles' names and URIs are shown: prefixed, or one bundle
    /// as itself (the per-bundle endpoint).
    pub naming: Arc<Naming>,
    /// Exposed names → their origin, as the last listing found them.
    pub(super) routes: Arc<Routes>,
    /// Whom this connection's requests come from (stdio); an HTTP request
    /// carries its own ([`super::grant`]).
    pub grant: Option<Arc<Grant>>,
    /// Tools this session pinned (`discovery = "search"`): bundle, own name.
    pub(super) pinned: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// The live sessions of this gateway's endpoint, by id.
    pub(super) sessions: Arc<Sessions>,
    /// This session's calls answered below rmcp, by request id: what a
    /// `notifications/cancelled` naming one cancels (rmcp knows only its
    /// own requests).
    below: std::sync::Mutex<HashMap<rmcp::model::RequestId, CancellationToken>>,
    /// The agent of this session, as the bundles' requests reach it (one
    /// per session: the bundles tell agents apart by it).
    agent: std::sync::OnceLock<Arc<dyn Agent>>,
    /// The least severe log level the agent wants (`logging/setLevel`).
    log_level: Arc<std::sync::Mutex<Option<LoggingLevel>>>,
    /// The calls of 2026-07-28 agents waiting for their input: the
    /// endpoint's (HTTP, shared by its requests) or the connection's.
    rounds: Arc<Rounds>,
}

/// Exposed names → their bundle and own name, as the last listing found
/// them; shared by the gateways of one endpoint (over HTTP each
/// 2026-07-28 request has a gateway of its own, and a call must not list
/// every bundle's tools to find its route) or of one connection.
#[derive(Default)]
pub struct Routes {
    /// Exposed tool and prompt names.
    pub(super) tools: Mutex<BTreeMap<String, Entry>>,
    pub(super) prompts: Mutex<BTreeMap<String, Entry>>,
    /// Exposed URI templates → their bundle and own template (`name`).
    pub(super) templates: Mutex<BTreeMap<String, Entry>>,
    /// The lists the endpoint's agents see, as last looked at for them
    /// ([`super::watch_changes`]).
    pub(super) listed: Mutex<Listed>,
}

/// What the lists of an endpoint were at a look: once for every agent
/// watching them after each burst of lifecycle events, not once each (a
/// look lists every tool of the workspace).
#[derive(Default)]
pub struct Listed {
    /// The events published before the look ([`Api::events_emitted`]):
    /// what it has seen the effects of.
    pub(super) after: Option<u64>,
    /// The tools, written; which version of them (counted up when they
    /// change).
    pub(super) tools: (String, u64),
    /// The ready bundles (their prompts and resources), and which version.
    pub(super) ready: (String, u64),
}

/// What the gateways of one endpoint (or one connection) share: the
/// calls waiting for their agents' input, and the routes.
#[derive(Clone)]
pub struct Common {
    pub rounds: Arc<Rounds>,
    pub routes: Arc<Routes>,
    pub sessions: Arc<Sessions>,
}

/// The gateways of an endpoint's live sessions, by session id, each with
/// its agent's end. A session's gateway enters it when its agent says it
/// is initialized (that request names the session; rmcp routed it to this
/// gateway), and leaves with the session. A session request answered
/// below rmcp ([`super::direct`]) runs on its session's gateway; one on a
/// session not (or no longer) here is rmcp's.
#[derive(Default)]
pub struct Sessions {
    live: std::sync::Mutex<HashMap<String, Live>>,
    /// Told whenever a session enters.
    entered: tokio::sync::Notify,
}

/// A live session's gateway (held by its watcher) and its agent's end.
type Live = (std::sync::Weak<Inner>, Peer<RoleServer>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter(&self, id: &str, gateway: &Gateway, peer: &Peer<RoleServer>) {
        let entry = (Arc::downgrade(&gateway.0), peer.clone());
        self.lock().insert(id.to_string(), entry);
        self.entered.notify_waiters();
    }

    /// Whether session `id` is here, or enters within `within`.
    pub async fn entered(&self, id: &str, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        loop {
            // Listening before looking: an entry in between is not missed.
            let told = self.entered.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.lock().contains_key(id) {
                return true;
            }
            if tokio::time::timeout_at(until, told).await.is_err() {
                return false;
            }
        }
    }

    fn leave(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Session `id`'s gateway and its agent's end, while it lives.
    pub fn get(&self, id: &str) -> Option<(Gateway, Peer<RoleServer>)> {
        let (gateway, peer) = {
            let sessions = self.lock();
            let (gateway, peer) = sessions.get(id)?;
            (gateway.upgrade()?, peer.clone())
        };
        (!peer.is_transport_closed()).then_some((Gateway(gateway), peer))
    }
}

impl Common {
    /// Calls waiting for input held to `limits`, no routes yet.
    pub fn new(limits: super::rounds::RoundLimits) -> Common {
        Common {
            rounds: Rounds::new(limits),
            routes: Arc::default(),
            sessions: Arc::default(),
        }
    }
}

#[derive(Clone)]
pub struct Gateway(pub Arc<Inner>);

impl Gateway {
    pub fn new(
        api: Api,
        workspace: String,
        profile: Option<Profile>,
        wait_ready: Duration,
        common: Common,
        naming: Naming,
        grant: Option<Arc<Grant>>,
    ) -> Self {
        Gateway(Arc::new(Inner {
            api,
            workspace,
            profile,
            wait_ready,
            rounds: common.rounds,
            naming: Arc::new(naming),
            grant,
            pinned: Default::default(),
            routes: common.routes,
            sessions: common.sessions,
            below: Default::default(),
            agent: std::sync::OnceLock::new(),
            log_level: Arc::default(),
        }))
    }

    /// A call of this session answered below rmcp, request `id`, that a
    /// `notifications/cancelled` naming it cancels with `ct` until the
    /// returned guard is dropped.
    pub(super) fn below_rmcp(
        &self,
        id: rmcp::model::RequestId,
        ct: CancellationToken,
    ) -> OnDrop<impl FnOnce()> {
        self.below().insert(id.clone(), ct);
        let gateway = self.clone();
        OnDrop::new(move || {
            gateway.below().remove(&id);
        })
    }

    fn below(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<rmcp::model::RequestId, CancellationToken>> {
        self.0.below.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the agent when its lists change, for as long as its session
    /// lives; session `id` (over HTTP) is this gateway's until then.
    pub fn watch(&self, peer: Peer<RoleServer>, id: Option<String>) {
        // Left when the watcher ends, however it ends.
        let entered = id.map(|id| {
            self.0.sessions.enter(&id, self, &peer);
            let sessions = self.0.sessions.clone();
            OnDrop::new(move || sessions.leave(&id))
        });
        let gateway = self.clone();
        tokio::spawn(async move {
            let _entered = entered;
            // Ends with the session: the watcher holds the gateway, so
            // nothing else would stop it.
            let closed = {
                let peer = peer.clone();
                async move {
                    while !peer.is_transport_closed() {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            };
            let tell = |list| {
                let peer = peer.clone();
                async move { super::tell_session(&peer, list).await }
            };
            tokio::select! {
                _ = super::watch_changes(gateway, tell) => {}
                _ = closed => {}
            }
        });
    }

    /// This session's agent, for the bundles its calls reach.
    fn agent(&self, peer: &Peer<RoleServer>) -> Arc<dyn Agent> {
        self.0
            .agent
            .get_or_init(|| {
                Arc::new(PeerAgent {
                    peer: peer.clone(),
                    log_level: self.0.log_level.clone(),
                    naming: self.0.naming.clone(),
                })
            })
            .clone()
    }

    /// The agent of the session a request came on (every session request
    /// has one, whoever parsed it; a stateless one answered below rmcp
    /// never reaches a session's path).
    fn session_agent(&self, context: &Facts<'_>) -> Result<Arc<dyn Agent>, ErrorData> {
        context.peer().map(|peer| self.agent(peer)).ok_or_else(|| {
            ErrorData::internal_error(
                "a stateless request answered below rmcp has no session",
                None,
            )
        })
    }

    fn bundle_allowed(&self, bundle: &str) -> bool {
        if let Naming::Single(only) = &*self.0.naming {
            if only != bundle {
                return false;
            }
        }
        super::names::profile_allows(self.0.profile.as_ref(), bundle)
    }

    /// Whether the profile hides `tool` of `bundle`: decided on the pair,
    /// before exposed names are assigned, so no collision can move an
    /// excluded tool to a name the profile does not know.
    fn tool_excluded(&self, bundle: &str, tool: &str) -> bool {
        self.0
            .profile
            .as_ref()
            .is_some_and(|p| p.exclude_tools.iter().any(|t| t.is(bundle, tool)))
    }

    /// The workspace's bundles the profile allows: name, state, tools.
    async fn bundles(&self) -> Result<Vec<(String, BundleState, Vec<Tool>)>, ErrorData> {
        let all = self.0.api.tools(&self.0.workspace, None).await?;
        Ok(self.allowed(all))
    }

    /// The bundles of `all` the profile allows: name, state, tools.
    fn allowed(
        &self,
        all: Vec<crate::daemon::api::call::BundleTools>,
    ) -> Vec<(String, BundleState, Vec<Tool>)> {
        all.into_iter()
            .filter(|b| self.bundle_allowed(&b.name))
            .map(|b| (b.name, b.state, b.tools))
            .collect()
    }

    /// Ready bundles of the workspace the profile allows, with their tools.
    pub async fn ready_bundles(&self) -> Result<Vec<(String, Vec<Tool>)>, ErrorData> {
        Ok(self
            .bundles()
            .await?
            .into_iter()
            .filter(|(_, state, _)| *state == BundleState::Ready)
            .map(|(name, _, tools)| (name, tools))
            .collect())
    }

    /// The exposed tools (namespaced, filtered).
    pub async fn tools(&self) -> Result<Vec<Tool>, ErrorData> {
        self.catalog().await.map(|(tools, _)| tools)
    }

    /// The exposed tools and the names of the ready bundles behind them, from
    /// one listing. Routes to a bundle that is installed but not ready
    /// (restarting) are kept, so a call can wait for it.
    pub async fn catalog(&self) -> Result<(Vec<Tool>, Vec<String>), ErrorData> {
        let bundles = self.bundles().await?;
        self.catalog_from(bundles).await
    }

    /// [`Gateway::catalog`] of the workspace's bundles `all`, as listed.
    pub async fn catalog_of(
        &self,
        all: Vec<crate::daemon::api::call::BundleTools>,
    ) -> Result<(Vec<Tool>, Vec<String>), ErrorData> {
        self.catalog_from(self.allowed(all)).await
    }

    async fn catalog_from(
        &self,
        bundles: Vec<(String, BundleState, Vec<Tool>)>,
    ) -> Result<(Vec<Tool>, Vec<String>), ErrorData> {
        let mut by_pair = BTreeMap::new();
        let mut waiting = std::collections::HashSet::new();
        let mut ready = Vec::new();
        for (bundle, state, tools) in bundles {
            if state != BundleState::Ready {
                waiting.insert(bundle);
                continue;
            }
            ready.push(bundle.clone());
            for tool in tools {
                if !self.tool_excluded(&bundle, &tool.name) {
                    by_pair.insert((bundle.clone(), tool.name.to_string()), tool);
                }
            }
        }
        let entries: Vec<Entry> = self.0.naming.entries(by_pair.keys().cloned());
        let tools = entries
            .iter()
            .map(|e| {
                let mut tool = by_pair[&(e.bundle.clone(), e.name.clone())].clone();
                tool.name = e.exposed.clone().into();
                self.expose_ui(&e.bundle, &mut tool);
                tool
            })
            .collect();
        let mut routes = super::names::index(&entries);
        let mut current = self.0.routes.tools.lock().await;
        for (exposed, entry) in current.iter() {
            if waiting.contains(&entry.bundle) && !routes.contains_key(exposed) {
                routes.insert(exposed.clone(), entry.clone());
            }
        }
        *current = routes;
        Ok((tools, ready))
    }

    /// A tool's MCP Apps UI (`_meta.ui.resourceUri`, and the older
    /// `_meta["ui/resourceUri"]`) under the URI the gateway lists it by.
    fn expose_ui(&self, bundle: &str, tool: &mut Tool) {
        let Some(meta) = tool.meta.as_mut() else {
            return;
        };
        let naming = &self.0.naming;
        if let Some(uri) = meta.get_mut("ui").and_then(|ui| ui.get_mut("resourceUri")) {
            if let Some(text) = uri.as_str() {
                *uri = naming.uri(bundle, text).into();
            }
        }
        if let Some(uri) = meta.get_mut("ui/resourceUri") {
            if let Some(text) = uri.as_str() {
                *uri = naming.uri(bundle, text).into();
            }
        }
    }

    /// Whether a tool call may become a task: the agent declared the Tasks
    /// extension on this request and the bundle offers it.
    fn takes_tasks(&self, context: &Facts<'_>, bundle: &str) -> bool {
        let agent = context.client_capabilities().is_some_and(|c| {
            c.extensions
                .is_some_and(|e| e.contains_key(rmcp::model::TASKS_EXTENSION_ID))
        });
        agent
            && self
                .0
                .api
                .declared(&self.0.workspace, bundle)
                .is_some_and(|d| d.capabilities.supports_tasks())
    }

    /// A tool call passed to the bundle as it is, so that the bundle may
    /// answer with a task: the agent gets the task under an id of the
    /// gateway's ([`super::tasks`]).
    async fn call_as_task(
        &self,
        request: &CallToolRequestParams,
        context: &Facts<'_>,
        route: Entry,
        trace: &Trace,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut params = CallToolRequestParams::new(route.name.clone());
        params.arguments = request.arguments.clone();
        let ask = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        let origin = Origin {
            method: "tools/call",
            name: request.name.to_string(),
        };
        let (state, responses) = (&request.request_state, &request.input_responses);
        let bundle = route.bundle.clone();
        match self
            .pass_to_bundle(
                origin,
                (state, responses),
                context,
                route.bundle,
                ask,
                trace,
            )
            .await?
        {
            Err(asks) => Ok(CallToolResponse::InputRequired(asks)),
            Ok(ServerResult::CallToolResult(mut result)) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(result.into())
            }
            Ok(ServerResult::CreateTaskResult(mut created)) => {
                let route = super::tasks::TaskRoute {
                    bundle,
                    id: created.task.task_id.clone(),
                };
                let ttl = created.task.ttl_ms.map(Duration::from_millis);
                let owner = super::rounds::agent_key(context);
                created.task.task_id = self.0.rounds.tasks.hand_out(owner, route, ttl);
                Ok(CallToolResponse::Task(created))
            }
            Ok(_) => Err(unusable("tool result")),
        }
    }

    /// The bundle and its own id of a task id the gateway handed to this
    /// request's agent.
    fn task_route(
        &self,
        id: &str,
        context: &Facts<'_>,
    ) -> Result<super::tasks::TaskRoute, ErrorData> {
        let owner = super::rounds::agent_key(context);
        self.0.rounds.tasks.route(id, owner.as_ref()).ok_or_else(|| {
            ErrorData::invalid_params(
                format!("no task {id:?} for this agent (a task id is the one tools/call handed out, to the token it was handed to)"),
                None,
            )
        })
    }

    /// A task request the bundle acknowledges (`tasks/update`,
    /// `tasks/cancel`), sent to the task's bundle under the bundle's own id
    /// (`request` makes it from that id).
    async fn task_ack(
        &self,
        id: &str,
        context: &Facts<'_>,
        request: impl FnOnce(String) -> ClientRequest,
    ) -> Result<(), ErrorData> {
        let route = self.task_route(id, context)?;
        let agent = self.session_agent(context)?;
        match self
            .bundle_mcp(&route.bundle, request(route.id), agent)
            .await?
        {
            ServerResult::TaskAckResult(_) | ServerResult::EmptyResult(_) => Ok(()),
            _ => Err(unusable("task acknowledgement")),
        }
    }

    /// The input schema of the tool exposed as `exposed`, found as a call
    /// finds its route (the endpoint's table, listed once when it has not
    /// the name), while its bundle is ready. Not `get_tool`, which looks
    /// through every ready bundle of the workspace for the name.
    pub(super) async fn routed_schema(
        &self,
        exposed: &str,
    ) -> Option<Arc<rmcp::model::JsonObject>> {
        let refresh = async { self.tools().await.map(|_| ()) };
        let route = self
            .route(&self.0.routes.tools, exposed, refresh)
            .await
            .ok()?;
        self.0
            .api
            .tool_schema(&self.0.workspace, &route.bundle, &route.name)
    }

    pub(super) async fn route(
        &self,
        map: &Mutex<BTreeMap<String, Entry>>,
        exposed: &str,
        refresh: impl std::future::Future<Output = Result<(), ErrorData>>,
    ) -> Result<Entry, ErrorData> {
        if let Some(e) = map.lock().await.get(exposed) {
            return Ok(e.clone());
        }
        refresh.await?;
        map.lock().await.get(exposed).cloned().ok_or_else(|| {
            ErrorData::invalid_params(
                format!(
                    "no {exposed:?} in workspace {:?}{}",
                    self.0.workspace,
                    match &self.0.profile {
                        Some(p) => format!(" (profile {:?})", p.name),
                        None => String::new(),
                    }
                ),
                None,
            )
        })
    }

    /// A request passed to a bundle on behalf of `agent`: the bundle's
    /// requests while serving it go to that agent only, and a
    /// subscription the bundle takes is that agent's.
    async fn bundle_mcp(
        &self,
        bundle: &str,
        request: ClientRequest,
        agent: Arc<dyn Agent>,
    ) -> Result<ServerResult, ApiError> {
        self.traced_mcp(bundle, request, agent, &Trace::default())
            .await
    }

    /// [`Gateway::bundle_mcp`], the bundle's request a span of `trace`.
    async fn traced_mcp(
        &self,
        bundle: &str,
        request: ClientRequest,
        agent: Arc<dyn Agent>,
        trace: &Trace,
    ) -> Result<ServerResult, ApiError> {
        self.0
            .api
            .mcp(
                &self.0.workspace,
                bundle,
                request,
                Caller::Agent(agent),
                Default::default(),
                trace.clone(),
            )
            .await
    }

    /// `resources/subscribe` and `unsubscribe`: a bundle's resource, by the
    /// URI the gateway gave it, passed to that bundle for this agent.
    async fn subscription(
        &self,
        request: impl FnOnce(String) -> ClientRequest,
        uri: &str,
        peer: &Peer<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (bundle, original) = self.followable(uri)?;
        self.bundle_mcp(&bundle, request(original), self.agent(peer))
            .await?;
        Ok(())
    }

    /// The bundle and its own URI of a resource agents may follow, or why
    /// `uri` cannot be followed.
    fn followable(&self, uri: &str) -> Result<(String, String), ErrorData> {
        let why = match self.0.naming.route_uri(uri) {
            Some((bundle, original)) if self.bundle_allowed(&bundle) => {
                return Ok((bundle, original))
            }
            Some((bundle, _)) => format!("this profile has no bundle {bundle:?}"),
            None if uri.starts_with("files://") => {
                "the workspace's files:// resources do not announce changes; read them again to see one".to_string()
            }
            None => "not a resource of this gateway (its resources are bundle://BUNDLE/… and files://…; see resources/list)".to_string(),
        };
        Err(ErrorData::invalid_params(
            format!("{uri} cannot be subscribed to: {why}"),
            None,
        ))
    }

    /// Every allowed ready bundle's answer to a list request, the items
    /// `items` takes from it (bundles that do not offer it are skipped).
    async fn gather<T>(
        &self,
        request: impl Fn() -> ClientRequest,
        items: impl Fn(ServerResult) -> Option<Vec<T>>,
        peer: &Peer<RoleServer>,
    ) -> Result<Vec<(String, T)>, ErrorData> {
        let bundles = self.ready_bundles().await?;
        let agent = self.agent(peer);
        let asks = bundles.iter().map(|(bundle, _)| {
            let (agent, request) = (agent.clone(), request());
            async move {
                let answer = self.bundle_mcp(bundle, request, agent).await;
                (bundle.clone(), answer)
            }
        });
        let mut out = Vec::new();
        for (bundle, answer) in futures::future::join_all(asks).await {
            match answer.map(&items) {
                Ok(Some(list)) => out.extend(list.into_iter().map(|item| (bundle.clone(), item))),
                Ok(None) => tracing::debug!(bundle, "a list request answered with something else"),
                Err(e) => tracing::debug!(bundle, "a list request: {e}"),
            }
        }
        Ok(out)
    }

    pub async fn prompt_catalog(&self, peer: &Peer<RoleServer>) -> Result<Vec<Prompt>, ErrorData> {
        let items = self
            .gather(
                || ClientRequest::ListPromptsRequest(ListPromptsRequest::default()),
                |answer| match answer {
                    ServerResult::ListPromptsResult(r) => Some(r.prompts),
                    _ => None,
                },
                peer,
            )
            .await?;
        let mut by_pair = BTreeMap::new();
        for (bundle, prompt) in items {
            by_pair.insert((bundle, prompt.name.clone()), prompt);
        }
        let entries = self.0.naming.entries(by_pair.keys().cloned());
        let prompts = entries
            .iter()
            .map(|e| {
                let mut p = by_pair[&(e.bundle.clone(), e.name.clone())].clone();
                p.name = e.exposed.clone();
                p
            })
            .collect();
        *self.0.routes.prompts.lock().await = super::names::index(&entries);
        Ok(prompts)
    }

    /// The bundles' resource templates, mapped as their URIs are
    /// ([`Naming::template`]), each routable back for completions.
    pub async fn template_catalog(
        &self,
        peer: &Peer<RoleServer>,
    ) -> Result<Vec<ResourceTemplate>, ErrorData> {
        let listed = self
            .gather(
                || {
                    ClientRequest::ListResourceTemplatesRequest(
                        ListResourceTemplatesRequest::default(),
                    )
                },
                |answer| match answer {
                    ServerResult::ListResourceTemplatesResult(r) => Some(r.resource_templates),
                    _ => None,
                },
                peer,
            )
            .await?;
        let mut routes = BTreeMap::new();
        let mut templates = Vec::new();
        for (bundle, mut template) in listed {
            let own = template.uri_template.clone();
            template.uri_template = self.0.naming.template(&bundle, &own);
            if !matches!(*self.0.naming, Naming::Single(_)) {
                template.name = format!("{bundle}{}{}", super::names::SEPARATOR, template.name);
            }
            routes.insert(
                template.uri_template.clone(),
                Entry {
                    exposed: template.uri_template.clone(),
                    bundle,
                    name: own,
                },
            );
            templates.push(template);
        }
        *self.0.routes.templates.lock().await = routes;
        Ok(templates)
    }

    pub async fn resource_catalog(
        &self,
        peer: &Peer<RoleServer>,
    ) -> Result<Vec<Resource>, ErrorData> {
        // One bundle as itself has its own resources only.
        let mut resources = match &*self.0.naming {
            Naming::Single(_) => Vec::new(),
            Naming::Prefixed | Naming::Bare => {
                let files = self
                    .0
                    .api
                    .files_resources(
                        &self.0.workspace,
                        crate::host_resources::Request::List {
                            mime_type: None,
                            tags: Vec::new(),
                        },
                    )
                    .await?;
                match files {
                    ServerResult::ListResourcesResult(r) => r.resources,
                    _ => Vec::new(),
                }
            }
        };
        let listed = self
            .gather(
                || ClientRequest::ListResourcesRequest(ListResourcesRequest::default()),
                |answer| match answer {
                    ServerResult::ListResourcesResult(r) => Some(r.resources),
                    _ => None,
                },
                peer,
            )
            .await?;
        for (bundle, mut resource) in listed {
            resource.uri = self.0.naming.uri(&bundle, &resource.uri);
            if !matches!(*self.0.naming, Naming::Single(_)) {
                resource.name = format!("{bundle}{}{}", super::names::SEPARATOR, resource.name);
            }
            resources.push(resource);
        }
        Ok(resources)
    }
}

impl Gateway {
    /// A request of a 2026-07-28 agent, served in rounds ([`super::rounds`]):
    /// a new call made by `call`, or the retry that resumes one.
    async fn in_rounds(
        &self,
        origin: Origin,
        state: Option<&str>,
        responses: Option<rmcp::model::InputResponses>,
        context: &Facts<'_>,
        progress_token: Option<rmcp::model::ProgressToken>,
        call: impl FnOnce(
            Arc<dyn Agent>,
            Option<tokio::sync::mpsc::Sender<ProgressNotificationParam>>,
            tokio_util::sync::CancellationToken,
        )
            -> futures::future::BoxFuture<'static, Result<ServerResult, ErrorData>>,
    ) -> Result<Outcome, ErrorData> {
        let wants_progress = progress_token.is_some();
        let served = Served {
            context,
            progress_token,
        };
        self.0
            .rounds
            .serve(origin, state, responses, served, || {
                Running::start(context, wants_progress, call)
            })
            .await
    }

    /// A request passed to `bundle` for this request's agent: directly for
    /// a session's, in rounds for a 2026-07-28 agent's — then the
    /// `input_required` to answer with, when the bundle asked for input.
    async fn pass_to_bundle(
        &self,
        origin: Origin,
        (state, responses): (&Option<String>, &Option<rmcp::model::InputResponses>),
        context: &Facts<'_>,
        bundle: String,
        request: ClientRequest,
        trace: &Trace,
    ) -> Result<Result<ServerResult, InputRequiredResult>, ErrorData> {
        if !stateless(context) {
            let agent = self.session_agent(context)?;
            return Ok(Ok(self.traced_mcp(&bundle, request, agent, trace).await?));
        }
        let (api, workspace) = (self.0.api.clone(), self.0.workspace.clone());
        let trace = trace.clone();
        let call = move |agent, _progress, cancel| -> futures::future::BoxFuture<'static, _> {
            Box::pin(async move {
                api.mcp(
                    &workspace,
                    &bundle,
                    request,
                    Caller::Agent(agent),
                    cancel,
                    trace,
                )
                .await
                .map_err(ErrorData::from)
            })
        };
        let progress = context.progress_token();
        let outcome = self
            .in_rounds(
                origin,
                state.as_deref(),
                responses.clone(),
                context,
                progress,
                call,
            )
            .await?;
        Ok(match outcome {
            Outcome::Complete(answer) => Ok(answer),
            Outcome::InputRequired(asks) => Err(asks),
        })
    }
}

/// A tool call's answer: typed, or (for a request answered below rmcp)
/// the tool's result as the bundle wrote it.
pub enum Called {
    Response(CallToolResponse),
    Raw(RawToolResult),
}

impl Called {
    /// The typed answer (a result as the bundle wrote it, decoded).
    pub fn typed(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            Called::Response(response) => Ok(response),
            Called::Raw(raw) => {
                let mut result = raw.typed().map_err(|_| unusable("tool result"))?;
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(result.into())
            }
        }
    }
}

impl Gateway {
    /// A tool call by the name the agent sees: routed, checked against the
    /// profile and the token's rules, audited, then made.
    pub async fn call_exposed(
        &self,
        request: CallToolRequestParams,
        context: &Facts<'_>,
    ) -> Result<Called, ErrorData> {
        let exposed = request.name.to_string();
        let refresh = async { self.tools().await.map(|_| ()) };
        // A name that routes nowhere is audited too (a probe leaves a line).
        let route = match self.route(&self.0.routes.tools, &exposed, refresh).await {
            Ok(route) => route,
            Err(e) => {
                let audited = self.audit(context, "tools/call", ("-", &exposed));
                audited.end(AuditOutcome::Error, None);
                return Err(e);
            }
        };
        // Audited however it ends: also when its future is dropped (its
        // agent went away from a call answered below rmcp; `Gateway::audit`).
        let audited = self.audit(context, "tools/call", (&route.bundle, &route.name));
        if self.tool_excluded(&route.bundle, &route.name) || !self.bundle_allowed(&route.bundle) {
            audited.end(AuditOutcome::Refused, Some("not in this profile"));
            return Err(ErrorData::invalid_params(
                format!("tool {exposed:?} is not available in this profile"),
                None,
            ));
        }
        if let Err(refusal) =
            self.permit(context, Kind::Tool, (&route.bundle, &route.name), &exposed)
        {
            audited.end(AuditOutcome::Refused, Some(&refusal.message));
            return Err(refusal);
        }
        let answer = self
            .call_routed(route, exposed, request, context, audited.trace())
            .await;
        let outcome = match &answer {
            Ok(Called::Response(CallToolResponse::InputRequired(_))) => AuditOutcome::InputRequired,
            Ok(Called::Response(CallToolResponse::Complete(r))) if r.is_error == Some(true) => {
                AuditOutcome::ToolError
            }
            Ok(Called::Raw(r)) if r.is_error() => AuditOutcome::ToolError,
            Ok(_) => AuditOutcome::Ok,
            Err(_) => AuditOutcome::Error,
        };
        audited.end(outcome, None);
        answer
    }

    async fn prompt_routed(
        &self,
        route: Entry,
        request: &GetPromptRequestParams,
        context: &Facts<'_>,
        trace: &Trace,
    ) -> Result<GetPromptResponse, ErrorData> {
        let mut params = GetPromptRequestParams::new(route.name.clone());
        params.arguments = request.arguments.clone();
        let ask = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        let origin = Origin {
            method: "prompts/get",
            name: request.name.clone(),
        };
        let (state, responses) = (&request.request_state, &request.input_responses);
        let answer = match self
            .pass_to_bundle(
                origin,
                (state, responses),
                context,
                route.bundle,
                ask,
                trace,
            )
            .await?
        {
            Ok(answer) => answer,
            Err(asks) => return Ok(GetPromptResponse::InputRequired(asks)),
        };
        match answer {
            ServerResult::GetPromptResult(mut result) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(result.into())
            }
            _ => Err(unusable("prompt")),
        }
    }

    async fn read_routed(
        &self,
        request: &ReadResourceRequestParams,
        context: &Facts<'_>,
        trace: &Trace,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let answer = if let Some((bundle, original)) = self.0.naming.route_uri(&request.uri) {
            if !self.bundle_allowed(&bundle) {
                return Err(ErrorData::resource_not_found(
                    format!("no resource {}", request.uri),
                    None,
                ));
            }
            let ask = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
                ReadResourceRequestParams::new(original.clone()),
            ));
            let origin = Origin {
                method: "resources/read",
                name: request.uri.clone(),
            };
            let (state, responses) = (&request.request_state, &request.input_responses);
            let mut answer = match self
                .pass_to_bundle(origin, (state, responses), context, bundle, ask, trace)
                .await?
            {
                Ok(answer) => answer,
                Err(asks) => return Ok(ReadResourceResponse::InputRequired(asks)),
            };
            // The contents carry the URI the client asked for.
            if let ServerResult::ReadResourceResult(result) = &mut answer {
                for c in &mut result.contents {
                    let uri = match c {
                        ResourceContents::TextResourceContents { uri, .. }
                        | ResourceContents::BlobResourceContents { uri, .. } => uri,
                        _ => continue,
                    };
                    if *uri == original {
                        *uri = request.uri.clone();
                    }
                }
            }
            answer
        } else {
            use crate::host_resources::{parse, METHOD_READ};
            let read =
                parse(METHOD_READ, Some(&json!({ "uri": request.uri }))).map_err(ApiError::from)?;
            self.0.api.files_resources(&self.0.workspace, read).await?
        };
        match answer {
            ServerResult::ReadResourceResult(mut result) => {
                result.result_type.get_or_insert(ResultType::COMPLETE);
                Ok(result.into())
            }
            _ => Err(unusable("resource")),
        }
    }

    async fn call_routed(
        &self,
        route: Entry,
        exposed: String,
        mut request: CallToolRequestParams,
        context: &Facts<'_>,
        trace: &Trace,
    ) -> Result<Called, ErrorData> {
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.progress_token());
        if stateless(context) && self.takes_tasks(context, &route.bundle) {
            let task = self.call_as_task(&request, context, route, trace).await;
            return task.map(Called::Response);
        }
        let call = CallRequest {
            workspace: self.0.workspace.clone(),
            name: route.bundle,
            tool: route.name,
            arguments: request.arguments.take(),
            timeout: None,
            wait_ready: Some(self.0.wait_ready),
            trace: trace.clone(),
        };
        let retried = request.request_state.is_some() || request.input_responses.is_some();
        let notify = |note| context.notify_progress(token.clone(), note);
        if let Some(agent) = Unaskable::of(context, retried) {
            let caller = Caller::Agent(agent);
            return super::with_progress(
                token.is_some(),
                |progress| self.tool_call(&call, progress, context, caller),
                notify,
            )
            .await;
        }
        if stateless(context) {
            let api = self.0.api.clone();
            let origin = Origin {
                method: "tools/call",
                name: exposed,
            };
            let outcome = self
                .in_rounds(
                    origin,
                    request.request_state.as_deref(),
                    request.input_responses.clone(),
                    context,
                    token.clone(),
                    move |agent, progress, cancel| {
                        Box::pin(async move {
                            api.call(&call, progress, &cancel, Caller::Agent(agent))
                                .await
                                .map(ServerResult::CallToolResult)
                                .map_err(ErrorData::from)
                        })
                    },
                )
                .await?;
            return match outcome {
                Outcome::InputRequired(asks) => {
                    Ok(Called::Response(CallToolResponse::InputRequired(asks)))
                }
                Outcome::Complete(ServerResult::CallToolResult(mut result)) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    Ok(Called::Response(result.into()))
                }
                Outcome::Complete(_) => Err(unusable("tool result")),
            };
        }
        let caller = Caller::Agent(self.session_agent(context)?);
        super::with_progress(
            token.is_some(),
            |progress| self.tool_call(&call, progress, context, caller),
            notify,
        )
        .await
    }

    /// The call made for `caller`: a request answered below rmcp takes the
    /// tool's result as the bundle wrote it, where its session can hand it
    /// over so; any other, typed.
    async fn tool_call(
        &self,
        call: &CallRequest,
        progress: Option<tokio::sync::mpsc::Sender<ProgressNotificationParam>>,
        context: &Facts<'_>,
        caller: Caller,
    ) -> Result<Called, ErrorData> {
        let api = &self.0.api;
        let mut result = match context {
            Facts::Direct(_) => match api
                .call_spliced(call, progress, context.ct(), caller)
                .await?
            {
                ToolResult::Raw(raw) => return Ok(Called::Raw(raw)),
                ToolResult::Typed(result) => result,
            },
            Facts::Rmcp(_) => api.call(call, progress, context.ct(), caller).await?,
        };
        result.result_type.get_or_insert(ResultType::COMPLETE);
        Ok(Called::Response(result.into()))
    }
}

/// How an answer ends in the audit: input asked of the agent, answered,
/// or failed.
fn outcome_of<T>(answer: &Result<T, ErrorData>, asks: impl Fn(&T) -> bool) -> AuditOutcome {
    match answer {
        Ok(a) if asks(a) => AuditOutcome::InputRequired,
        Ok(_) => AuditOutcome::Ok,
        Err(_) => AuditOutcome::Error,
    }
}

/// Whether a request is of MCP 2026-07-28 or newer: stateless, so its agent
/// is asked for input by `input_required` results, never by a request.
fn stateless(context: &Facts<'_>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// A daemon refusal as an MCP error: the gateway's one conversion.
impl From<ApiError> for ErrorData {
    fn from(e: ApiError) -> ErrorData {
        let kind = e.kind();
        match e {
            ApiError::Mcp { message, error } => ErrorData::new(error.code, message, error.data),
            e @ (ApiError::ToolNotFound(_)
            | ApiError::InvalidParams(_)
            | ApiError::BundleNotFound { .. }) => ErrorData::invalid_params(e.to_string(), None),
            e => ErrorData::internal_error(e.to_string(), Some(json!({ "kind": kind }))),
        }
    }
}

/// An agent of the gateway as the bundles' client: their requests go to
/// its session, their log messages too (at the level it asked for).
struct PeerAgent {
    peer: Peer<RoleServer>,
    log_level: Arc<std::sync::Mutex<Option<LoggingLevel>>>,
    naming: Arc<Naming>,
}

impl Agent for PeerAgent {
    fn capabilities(&self) -> ClientCapabilities {
        self.peer
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default()
    }

    fn request(
        &self,
        request: ServerRequest,
    ) -> futures::future::BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let peer = self.peer.clone();
        Box::pin(async move {
            peer.send_request(request).await.map_err(|e| match e {
                rmcp::service::ServiceError::McpError(e) => e,
                other => {
                    ErrorData::internal_error(format!("the agent did not answer: {other}"), None)
                }
            })
        })
    }

    fn notify(&self, notification: ServerNotification) -> futures::future::BoxFuture<'static, ()> {
        if let ServerNotification::LoggingMessageNotification(n) = &notification {
            let wanted = *self.log_level.lock().unwrap_or_else(|e| e.into_inner());
            if wanted.is_some_and(|min| super::severity(n.params.level) < super::severity(min)) {
                return Box::pin(async {});
            }
        }
        let peer = self.peer.clone();
        Box::pin(async move {
            let _ = peer.send_notification(notification).await;
        })
    }

    fn resource_updated(&self, bundle: &str, uri: &str) -> futures::future::BoxFuture<'static, ()> {
        let (peer, uri) = (self.peer.clone(), self.naming.uri(bundle, uri));
        Box::pin(async move {
            let _ = peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await;
        })
    }

    fn gone(&self) -> bool {
        self.peer.is_transport_closed()
    }

    fn log_level(&self) -> Option<LoggingLevel> {
        *self.log_level.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unreachable(&self) -> Option<String> {
        let version = self.peer.peer_info()?.protocol_version.clone();
        (version >= ProtocolVersion::V_2026_07_28).then(|| {
            format!("the agent that made this call speaks MCP {version}, whose stateless requests leave no stream to send it a request on")
        })
    }
}

/// A `subscriptions/listen` stream of a 2026-07-28 agent, as the bundles
/// whose resources it follows see it: their updates go to the stream.
struct Listener {
    sink: SubscriptionSink,
    naming: Arc<Naming>,
    /// Cancelled when its `listen` ends.
    alive: tokio_util::sync::CancellationToken,
}

impl Agent for Listener {
    fn capabilities(&self) -> ClientCapabilities {
        ClientCapabilities::default()
    }

    fn request(
        &self,
        _request: ServerRequest,
    ) -> futures::future::BoxFuture<'static, Result<ClientResult, ErrorData>> {
        Box::pin(async {
            Err(ErrorData::invalid_request(
                "a subscription stream cannot be asked anything",
                None,
            ))
        })
    }

    fn notify(&self, _notification: ServerNotification) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    fn resource_updated(&self, bundle: &str, uri: &str) -> futures::future::BoxFuture<'static, ()> {
        let (sink, uri) = (self.sink.clone(), self.naming.uri(bundle, uri));
        Box::pin(async move {
            let _ = sink.notify_resource_updated(uri).await;
        })
    }

    fn gone(&self) -> bool {
        self.alive.is_cancelled()
    }

    fn unreachable(&self) -> Option<String> {
        Some("the agent's subscription stream carries notifications only".into())
    }
}

impl ServerHandler for Gateway {
    async fn on_cancelled(
        &self,
        notification: rmcp::model::CancelledNotificationParam,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        // rmcp cancels its own requests; one answered below it is here.
        if let Some(id) = &notification.request_id {
            let ct = self.below().remove(id);
            if let Some(ct) = ct {
                ct.cancel();
            }
        }
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        // Over HTTP, the notification names its session.
        let id = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.watch(context.peer, id);
    }

    fn get_info(&self) -> ServerConfig {
        let gateway = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .enable_resources_subscribe()
            .enable_logging()
            .build();
        let ours = Implementation::new("bundlevisor", env!("CARGO_PKG_VERSION"));
        match &*self.0.naming {
            // One bundle as itself: what it declared, of what the gateway
            // forwards (the full set while it is not running).
            Naming::Single(bundle) => {
                let Some(declared) = self.0.api.declared(&self.0.workspace, bundle) else {
                    let mut capabilities = gateway;
                    capabilities.completions = Some(Default::default());
                    return ServerConfig::new(capabilities).with_server_info(ours);
                };
                let mut capabilities = forwarded(&declared.capabilities);
                capabilities.extensions = extensions(
                    declared.capabilities.supports_skills(),
                    declared.capabilities.supports_tasks(),
                );
                // The gateway tells of list changes (restarts) itself.
                if let Some(tools) = capabilities.tools.as_mut() {
                    tools.list_changed = Some(true);
                }
                if let Some(prompts) = capabilities.prompts.as_mut() {
                    prompts.list_changed = Some(true);
                }
                if let Some(resources) = capabilities.resources.as_mut() {
                    resources.list_changed = Some(true);
                }
                let mut info = ServerConfig::new(capabilities)
                    .with_server_info(declared.server_info.clone().unwrap_or(ours));
                info.instructions = declared.instructions.clone();
                info
            }
            Naming::Prefixed | Naming::Bare => {
                let mut capabilities = gateway;
                // Completions when a bundle offers them.
                let declared = self.0.api.declared_all(&self.0.workspace);
                let offered = |has: fn(&ServerCapabilities) -> bool| {
                    declared.iter().any(|(bundle, info)| {
                        self.bundle_allowed(bundle) && has(&info.capabilities)
                    })
                };
                if offered(|c| c.completions.is_some()) {
                    capabilities.completions = Some(Default::default());
                }
                // Skills and tasks when a bundle serves them.
                capabilities.extensions = extensions(
                    offered(ServerCapabilities::supports_skills),
                    offered(ServerCapabilities::supports_tasks),
                );
                ServerConfig::new(capabilities)
                    .with_server_info(ours)
                    .with_instructions(format!(
                        "The bundles of workspace {:?}, supervised by bundlevisor. {} the workspace's files are files:// resources.",
                        self.0.workspace,
                        match &*self.0.naming {
                            Naming::Bare => "Tools have their bundles' own names (one two bundles share is BUNDLE__TOOL);",
                            _ => "Tools are named BUNDLE__TOOL;",
                        }
                    ))
            }
        }
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        // Boxed, as every request's handler here: the future rmcp spawns
        // per request is copied whole when spawned, and stays small.
        Box::pin(async move {
            // Routed by what it completes: a prompt by its name, a resource
            // template by its URI template; the bundle sees its own.
            let (bundle, reference) = match &request.r#ref {
                Reference::Prompt(prompt) => {
                    let refresh = async { self.prompt_catalog(&context.peer).await.map(|_| ()) };
                    let route = self
                        .route(&self.0.routes.prompts, &prompt.name, refresh)
                        .await?;
                    let pair = (route.bundle.as_str(), route.name.as_str());
                    self.permit(&Facts::Rmcp(&context), Kind::Prompt, pair, &prompt.name)?;
                    let mut own = prompt.clone();
                    own.name = route.name;
                    (route.bundle, Reference::Prompt(own))
                }
                Reference::Resource(resource) => {
                    let refresh = async { self.template_catalog(&context.peer).await.map(|_| ()) };
                    let route = self
                        .route(&self.0.routes.templates, &resource.uri, refresh)
                        .await?;
                    let pair = (route.bundle.as_str(), route.name.as_str());
                    self.permit(&Facts::Rmcp(&context), Kind::Resource, pair, &resource.uri)?;
                    let mut own = resource.clone();
                    own.uri = route.name;
                    (route.bundle, Reference::Resource(own))
                }
                _ => {
                    return Err(ErrorData::invalid_params(
                        "completion/complete: ref must be ref/prompt or ref/resource",
                        None,
                    ))
                }
            };
            let mut params = request.clone();
            params.r#ref = reference;
            let ask = ClientRequest::CompleteRequest(CompleteRequest::new(params));
            match self
                .bundle_mcp(&bundle, ask, self.agent(&context.peer))
                .await?
            {
                ServerResult::CompleteResult(mut result) => {
                    result.result_type.get_or_insert(ResultType::COMPLETE);
                    Ok(result)
                }
                _ => Err(unusable("completion")),
            }
        })
        .await
    }

    /// Skills (SEP-2640): every bundle's that serves them, each skill and
    /// file under the URI agents see (`skill://BUNDLE/…`), readable there.
    async fn list_skills(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListSkillsResult, ErrorData> {
        Box::pin(async move {
            let serving: Vec<String> = self
                .0
                .api
                .declared_all(&self.0.workspace)
                .into_iter()
                .filter(|(bundle, info)| {
                    self.bundle_allowed(bundle) && info.capabilities.supports_skills()
                })
                .map(|(bundle, _)| bundle)
                .collect();
            let agent = self.agent(&context.peer);
            let asks = serving.iter().map(|bundle| {
                let request = ClientRequest::ListSkillsRequest(Default::default());
                let agent = agent.clone();
                async move { (bundle, self.bundle_mcp(bundle, request, agent).await) }
            });
            let mut skills = Vec::new();
            for (bundle, answer) in futures::future::join_all(asks).await {
                match answer {
                    Ok(ServerResult::ListSkillsResult(listed)) => {
                        for mut skill in listed.skills {
                            expose_skill(&self.0.naming, bundle, &mut skill);
                            skills.push(skill);
                        }
                    }
                    Ok(_) => tracing::debug!(bundle, "skills/list answered with something else"),
                    Err(e) => tracing::debug!(bundle, "skills/list: {e}"),
                }
            }
            if let Some(grant) = self
                .live_grant(&Facts::Rmcp(&context))
                .filter(|g| !g.rules.is_empty())
            {
                skills.retain(|skill| {
                    let (bundle, own) = self.resource_owner(&skill.uri);
                    grant.rules.allows(Kind::Resource, &bundle, &own)
                });
            }
            skills.sort_by(|a, b| a.uri.cmp(&b.uri));
            Ok(rmcp::model::ListSkillsResult::with_all_items(skills))
        })
        .await
    }

    async fn get_skill(
        &self,
        request: rmcp::model::GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetSkillResult, ErrorData> {
        Box::pin(async move {
            let Some((bundle, own)) = self
                .0
                .naming
                .route_uri(&request.uri)
                .filter(|(bundle, _)| self.bundle_allowed(bundle))
            else {
                return Err(ErrorData::invalid_params(
                    format!("no skill {} (skills/list names them)", request.uri),
                    None,
                ));
            };
            self.permit(
                &Facts::Rmcp(&context),
                Kind::Resource,
                (&bundle, &own),
                &request.uri,
            )?;
            let mut params = request.clone();
            params.uri = own;
            let ask = ClientRequest::GetSkillRequest(rmcp::model::GetSkillRequest::new(params));
            match self
                .bundle_mcp(&bundle, ask, self.agent(&context.peer))
                .await?
            {
                ServerResult::GetSkillResult(mut result) => {
                    expose_skill(&self.0.naming, &bundle, &mut result.skill);
                    Ok(result)
                }
                _ => Err(unusable("skill")),
            }
        })
        .await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        Box::pin(async move {
            let route = self.task_route(&request.task_id, &Facts::Rmcp(&context))?;
            let mut params = request.clone();
            params.task_id = route.id;
            let ask = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(params));
            match self
                .bundle_mcp(&route.bundle, ask, self.agent(&context.peer))
                .await?
            {
                ServerResult::GetTaskResult(mut result) => {
                    result.task.task.task_id = request.task_id;
                    Ok(result)
                }
                _ => Err(unusable("task")),
            }
        })
        .await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            self.task_ack(&request.task_id, &Facts::Rmcp(&context), |id| {
                let mut params = request.clone();
                params.task_id = id;
                ClientRequest::UpdateTaskRequest(rmcp::model::UpdateTaskRequest::new(params))
            })
            .await
        })
        .await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            self.task_ack(&request.task_id, &Facts::Rmcp(&context), |id| {
                let mut params = request.clone();
                params.task_id = id;
                ClientRequest::CancelTaskRequest(rmcp::model::CancelTaskRequest::new(params))
            })
            .await
        })
        .await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Box::pin(async move {
            let templates = self.template_catalog(&context.peer).await?;
            let templates = self
                .granted(
                    &Facts::Rmcp(&context),
                    Kind::Resource,
                    &self.0.routes.templates,
                    templates,
                    |t| &t.uri_template,
                )
                .await;
            Ok(ListResourceTemplatesResult::with_all_items(templates))
        })
        .await
    }

    /// A tool by the name agents call it, for rmcp's SEP-2243 check of
    /// `Mcp-Param-*` headers against the arguments (a missing, malformed or
    /// different header: -32020, HTTP 400, before the bundle sees the
    /// call). Looked up without the async route map, which a stateless
    /// request's new gateway has not filled: one bundle as itself names its
    /// tools as they are; otherwise `BUNDLE__TOOL` names a running bundle
    /// and its tool (a bare name: the one bundle that has it).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        let api = &self.0.api;
        let workspace = &self.0.workspace;
        let schema_of = |bundle: &str, tool: &str| {
            let schema = api.tool_schema(workspace, bundle, tool)?;
            Some(Tool::new_with_raw(name.to_string(), None, schema))
        };
        match &*self.0.naming {
            Naming::Single(bundle) => schema_of(bundle, name),
            Naming::Prefixed | Naming::Bare => {
                let running = api.declared_all(workspace);
                let prefixed = running.iter().find_map(|(bundle, _)| {
                    let tool = name
                        .strip_prefix(bundle.as_str())?
                        .strip_prefix(super::names::SEPARATOR)?;
                    self.bundle_allowed(bundle)
                        .then(|| schema_of(bundle, tool))
                        .flatten()
                });
                prefixed.or_else(|| {
                    if *self.0.naming != Naming::Bare {
                        return None;
                    }
                    running
                        .iter()
                        .filter(|(bundle, _)| self.bundle_allowed(bundle))
                        .find_map(|(bundle, _)| schema_of(bundle, name))
                })
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Box::pin(async move {
            if self.searching() {
                let listed = self
                    .search_listing(&Facts::Rmcp(&context), stateless(&Facts::Rmcp(&context)))
                    .await?;
                return Ok(ListToolsResult::with_all_items(listed));
            }
            let tools = self.tools().await?;
            let tools = self
                .granted(
                    &Facts::Rmcp(&context),
                    Kind::Tool,
                    &self.0.routes.tools,
                    tools,
                    |t| &t.name,
                )
                .await;
            Ok(ListToolsResult::with_all_items(tools))
        })
        .await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Box::pin(async move {
            if self.searching() {
                if let Some(answer) = self
                    .meta_call(
                        &request,
                        &Facts::Rmcp(&context),
                        stateless(&Facts::Rmcp(&context)),
                    )
                    .await
                {
                    return answer;
                }
            }
            let called = self.call_exposed(request, &Facts::Rmcp(&context)).await;
            called?.typed()
        })
        .await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Box::pin(async move {
            let prompts = self.prompt_catalog(&context.peer).await?;
            let prompts = self
                .granted(
                    &Facts::Rmcp(&context),
                    Kind::Prompt,
                    &self.0.routes.prompts,
                    prompts,
                    |p| &p.name,
                )
                .await;
            Ok(ListPromptsResult::with_all_items(prompts))
        })
        .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Box::pin(async move {
            let refresh = async { self.prompt_catalog(&context.peer).await.map(|_| ()) };
            let route = match self
                .route(&self.0.routes.prompts, &request.name, refresh)
                .await
            {
                Ok(route) => route,
                Err(e) => {
                    let audited =
                        self.audit(&Facts::Rmcp(&context), "prompts/get", ("-", &request.name));
                    audited.end(AuditOutcome::Error, None);
                    return Err(e);
                }
            };
            let audited = self.audit(
                &Facts::Rmcp(&context),
                "prompts/get",
                (&route.bundle, &route.name),
            );
            let pair = (route.bundle.as_str(), route.name.as_str());
            if let Err(refusal) =
                self.permit(&Facts::Rmcp(&context), Kind::Prompt, pair, &request.name)
            {
                audited.end(AuditOutcome::Refused, Some(&refusal.message));
                return Err(refusal);
            }
            let answer = self
                .prompt_routed(route, &request, &Facts::Rmcp(&context), audited.trace())
                .await;
            audited.end(
                outcome_of(&answer, |a| {
                    matches!(a, GetPromptResponse::InputRequired(_))
                }),
                None,
            );
            answer
        })
        .await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Box::pin(async move {
            let resources = self.resource_catalog(&context.peer).await?;
            let resources = self.granted_resources(&Facts::Rmcp(&context), resources);
            Ok(ListResourcesResult::with_all_items(resources))
        })
        .await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            let ask = |uri| {
                ClientRequest::SubscribeRequest(SubscribeRequest::new(SubscribeRequestParams::new(
                    uri,
                )))
            };
            self.permit_resource(&Facts::Rmcp(&context), &request.uri)?;
            self.subscription(ask, &request.uri, &context.peer).await
        })
        .await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            let ask = |uri| {
                ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                    UnsubscribeRequestParams::new(uri),
                ))
            };
            self.subscription(ask, &request.uri, &context.peer).await
        })
        .await
    }

    /// `subscriptions/listen` (2026-07-28): list changes, and updates of
    /// the bundles' resources it names, on one stream.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = requested.clone();
        // Only bundles' resources can be followed (files:// cannot), of
        // bundles this profile allows (see `followable`); the rest is left
        // out of the acknowledgement, so the agent knows.
        if let Some(uris) = &mut accepted.resource_subscriptions {
            uris.retain(|uri| self.followable(uri).is_ok());
        }
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        Box::pin(async move {
            let sink = context.sink().clone();
            // The token's rules hold here too: a resource it may not read is
            // not followed (the acknowledgement, made before, could not know).
            let asked = &Facts::Rmcp(context.request_context());
            let uris: Vec<String> = (context.accepted().resource_subscriptions.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|uri| self.permit_resource(asked, uri).is_ok())
                .collect();
            // Ended with this future, however it ends (a dropped stream too):
            // the bundles' subscriber lists then drop the listener.
            let alive = tokio_util::sync::CancellationToken::new();
            let _alive = alive.clone().drop_guard();
            let listener: Arc<dyn Agent> = Arc::new(Listener {
                sink: sink.clone(),
                naming: self.0.naming.clone(),
                alive,
            });
            let follow = |subscribe: bool| {
                let listener = listener.clone();
                let uris = &uris;
                async move {
                    for uri in uris {
                        let Some((bundle, original)) = self.0.naming.route_uri(uri) else {
                            continue;
                        };
                        let request = if subscribe {
                            ClientRequest::SubscribeRequest(SubscribeRequest::new(
                                SubscribeRequestParams::new(original),
                            ))
                        } else {
                            ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(
                                UnsubscribeRequestParams::new(original),
                            ))
                        };
                        if let Err(e) = self.bundle_mcp(&bundle, request, listener.clone()).await {
                            tracing::debug!(bundle, "a listen stream's resource subscription: {e}");
                        }
                    }
                }
            };
            follow(true).await;
            let tell = |list| {
                let sink = sink.clone();
                async move {
                    // The sink sends only what the agent asked for.
                    let _ = match list {
                        super::List::Tools => sink.notify_tool_list_changed().await,
                        super::List::Prompts => sink.notify_prompt_list_changed().await,
                        super::List::Resources => sink.notify_resource_list_changed().await,
                    };
                }
            };
            tokio::select! {
                _ = super::watch_changes(self.clone(), tell) => {}
                _ = context.cancelled() => {}
            }
            follow(false).await;
            Ok(())
        })
        .await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            *self.0.log_level.lock().unwrap_or_else(|e| e.into_inner()) = Some(request.level);
            Ok(())
        })
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Box::pin(async move {
            let (bundle, own) = self.resource_owner(&request.uri);
            let audited = self.audit(&Facts::Rmcp(&context), "resources/read", (&bundle, &own));
            if let Err(refusal) = self.permit_resource(&Facts::Rmcp(&context), &request.uri) {
                audited.end(AuditOutcome::Refused, Some(&refusal.message));
                return Err(refusal);
            }
            let answer = self
                .read_routed(&request, &Facts::Rmcp(&context), audited.trace())
                .await;
            let asks =
                |a: &ReadResourceResponse| matches!(a, ReadResourceResponse::InputRequired(_));
            audited.end(outcome_of(&answer, asks), None);
            answer
        })
        .await
    }
}

// Results handed on from a bundle (or the workspace's files) say
// `resultType: "complete"` unless they say otherwise: MCP 2026-07-28 requires
// the field, and a bundle on 2025-11-25 (or the files resolver) sends none;
// rmcp strips "complete" again for agents on older revisions.

/// The extensions the gateway declares: Skills (SEP-2640; skills and
/// their files, without `resources/directory/read`) and Tasks (SEP-2663),
/// each when a bundle behind it offers them.
fn extensions(skills: bool, tasks: bool) -> Option<rmcp::model::ExtensionCapabilities> {
    let mut declared = rmcp::model::ExtensionCapabilities::default();
    if skills {
        declared.insert(
            rmcp::model::SKILLS_EXTENSION_ID.to_string(),
            Default::default(),
        );
    }
    if tasks {
        declared.insert(
            rmcp::model::TASKS_EXTENSION_ID.to_string(),
            Default::default(),
        );
    }
    (!declared.is_empty()).then_some(declared)
}

/// A bundle's skill under the URIs agents see (its files too).
fn expose_skill(naming: &Naming, bundle: &str, skill: &mut rmcp::model::Skill) {
    skill.uri = naming.uri(bundle, &skill.uri);
    if let rmcp::model::SkillResources::Files(files) = &mut skill.resources {
        for file in files {
            file.uri = naming.uri(bundle, &file.uri);
        }
    }
}

/// Of what a bundle declared, what the gateway forwards to agents.
fn forwarded(declared: &ServerCapabilities) -> ServerCapabilities {
    let mut capabilities = ServerCapabilities::default();
    capabilities.tools = declared.tools.clone();
    capabilities.prompts = declared.prompts.clone();
    capabilities.resources = declared.resources.clone();
    capabilities.logging = declared.logging.clone();
    capabilities.completions = declared.completions.clone();
    capabilities
}

/// A bundle's answer of another kind than the request's.
fn unusable(what: &str) -> ErrorData {
    ErrorData::internal_error(format!("unusable {what} from the bundle"), None)
}
