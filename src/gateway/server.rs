//! The workspace MCP server: every ready bundle's tools, prompts and
//! resources under namespaced names (see [`super::names`]), plus the
//! workspace's files as `files://` resources, filtered by a profile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::names::{self, Entry};
use crate::client::{Link, LinkError};
use crate::config::Profile;
use crate::protocol::{
    method, BundleState, CallParams, ErrorKind, McpParams, ToolsParams, ToolsResult,
    WorkspaceResourcesParams,
};

/// How long a call waits for a bundle that is starting or restarting.
pub const DEFAULT_WAIT_READY: Duration = Duration::from_secs(10);

pub struct Inner {
    pub link: Link,
    pub workspace: String,
    pub profile: Option<Profile>,
    pub wait_ready: Duration,
    /// Exposed tool and prompt names of the last listing → their origin.
    tools: Mutex<BTreeMap<String, Entry>>,
    prompts: Mutex<BTreeMap<String, Entry>>,
    /// The control socket whose lifecycle events turn into `list_changed`
    /// notifications once the client has initialized (both transports).
    events: Option<std::path::PathBuf>,
}

#[derive(Clone)]
pub struct Gateway(pub Arc<Inner>);

impl Gateway {
    pub fn new(
        link: Link,
        workspace: String,
        profile: Option<Profile>,
        wait_ready: Duration,
    ) -> Self {
        Gateway(Arc::new(Inner {
            link,
            workspace,
            profile,
            wait_ready,
            tools: Mutex::default(),
            prompts: Mutex::default(),
            events: None,
        }))
    }

    /// Tells the client when its lists change, following the lifecycle
    /// events of the daemon at `socket` for as long as the session lives.
    pub fn notifying_changes(mut self, socket: std::path::PathBuf) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.events = Some(socket);
        }
        self
    }

    fn bundle_allowed(&self, bundle: &str) -> bool {
        self.0
            .profile
            .as_ref()
            .and_then(|p| p.bundles.as_ref())
            .is_none_or(|allowed| allowed.iter().any(|b| b == bundle))
    }

    fn tool_excluded(&self, exposed: &str) -> bool {
        self.0
            .profile
            .as_ref()
            .is_some_and(|p| p.exclude_tools.iter().any(|t| t == exposed))
    }

    /// The workspace's bundles the profile allows: name, state, tools.
    async fn bundles(&self) -> Result<Vec<(String, BundleState, Vec<Value>)>, ErrorData> {
        let result: ToolsResult = self
            .0
            .link
            .call::<crate::protocol::typed::Tools>(ToolsParams {
                workspace: self.0.workspace.clone(),
                name: None,
            })
            .await
            .map_err(to_mcp)?;
        Ok(result
            .bundles
            .into_iter()
            .filter(|b| self.bundle_allowed(&b.name))
            .map(|b| (b.name, b.state, b.tools))
            .collect())
    }

    /// Ready bundles of the workspace the profile allows, with their tools.
    pub async fn ready_bundles(&self) -> Result<Vec<(String, Vec<Value>)>, ErrorData> {
        Ok(self
            .bundles()
            .await?
            .into_iter()
            .filter(|(_, state, _)| *state == BundleState::Ready)
            .map(|(name, _, tools)| (name, tools))
            .collect())
    }

    /// The exposed tools (namespaced, filtered), and the routes to them.
    pub async fn tool_catalog(&self) -> Result<Vec<Value>, ErrorData> {
        self.catalog().await.map(|(tools, _)| tools)
    }

    /// The exposed tools and the names of the ready bundles behind them, from
    /// one listing. Routes to a bundle that is installed but not ready
    /// (restarting) are kept, so a call can wait for it.
    pub async fn catalog(&self) -> Result<(Vec<Value>, Vec<String>), ErrorData> {
        let bundles = self.bundles().await?;
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
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    by_pair.insert((bundle.clone(), name.to_string()), tool.clone());
                }
            }
        }
        let entries: Vec<Entry> = names::namespace(by_pair.keys().cloned())
            .into_iter()
            .filter(|e| !self.tool_excluded(&e.exposed))
            .collect();
        let tools = entries
            .iter()
            .map(|e| {
                let mut tool = by_pair[&(e.bundle.clone(), e.name.clone())].clone();
                tool["name"] = json!(e.exposed);
                tool
            })
            .collect();
        let mut routes = names::index(&entries);
        let mut current = self.0.tools.lock().await;
        for (exposed, entry) in current.iter() {
            if waiting.contains(&entry.bundle) && !routes.contains_key(exposed) {
                routes.insert(exposed.clone(), entry.clone());
            }
        }
        *current = routes;
        Ok((tools, ready))
    }

    async fn route(
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

    async fn bundle_mcp(
        &self,
        bundle: &str,
        method_name: &str,
        params: Value,
    ) -> Result<Value, LinkError> {
        self.0
            .link
            .call::<crate::protocol::typed::Mcp>(McpParams {
                workspace: self.0.workspace.clone(),
                name: bundle.to_string(),
                method: method_name.to_string(),
                params: Some(params),
            })
            .await
    }

    /// Every allowed ready bundle's answer to a list method (bundles that
    /// do not offer it are skipped).
    async fn gather(
        &self,
        list_method: &str,
        field: &str,
    ) -> Result<Vec<(String, Value)>, ErrorData> {
        let bundles = self.ready_bundles().await?;
        let asks = bundles.iter().map(|(bundle, _)| async move {
            let answer = self.bundle_mcp(bundle, list_method, json!({})).await;
            (bundle.clone(), answer)
        });
        let mut out = Vec::new();
        for (bundle, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(v) => {
                    for item in v
                        .get(field)
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                    {
                        out.push((bundle.clone(), item));
                    }
                }
                Err(e) => tracing::debug!(bundle, "{list_method}: {e}"),
            }
        }
        Ok(out)
    }

    pub async fn prompt_catalog(&self) -> Result<Vec<Value>, ErrorData> {
        let items = self.gather("prompts/list", "prompts").await?;
        let mut by_pair = BTreeMap::new();
        for (bundle, prompt) in items {
            if let Some(name) = prompt.get("name").and_then(Value::as_str) {
                by_pair.insert((bundle, name.to_string()), prompt.clone());
            }
        }
        let entries = names::namespace(by_pair.keys().cloned());
        let prompts = entries
            .iter()
            .map(|e| {
                let mut p = by_pair[&(e.bundle.clone(), e.name.clone())].clone();
                p["name"] = json!(e.exposed);
                p
            })
            .collect();
        *self.0.prompts.lock().await = names::index(&entries);
        Ok(prompts)
    }

    pub async fn resource_catalog(&self) -> Result<Vec<Value>, ErrorData> {
        let files: Value = self
            .0
            .link
            .call::<crate::protocol::typed::WorkspaceResources>(WorkspaceResourcesParams {
                workspace: self.0.workspace.clone(),
                method: "resources/list".into(),
                params: None,
            })
            .await
            .map_err(to_mcp)?;
        let mut resources: Vec<Value> = files
            .get("resources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (bundle, mut resource) in self.gather("resources/list", "resources").await? {
            let (Some(uri), Some(name)) = (
                resource
                    .get("uri")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                resource
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            ) else {
                continue;
            };
            resource["uri"] = json!(names::bundle_uri(&bundle, &uri));
            resource["name"] = json!(format!("{bundle}{}{name}", names::SEPARATOR));
            resources.push(resource);
        }
        Ok(resources)
    }
}

/// A daemon error as an MCP error.
fn to_mcp(e: LinkError) -> ErrorData {
    match e {
        LinkError::Rpc(rpc) => {
            let kind = rpc.data.as_ref().map(|d| d.kind);
            let details = rpc
                .data
                .as_ref()
                .map(|d| d.details.clone())
                .unwrap_or_default();
            match kind {
                Some(ErrorKind::McpError) => ErrorData::new(
                    rmcp::model::ErrorCode(
                        details
                            .get("mcp_code")
                            .and_then(Value::as_i64)
                            .unwrap_or(-32603) as i32,
                    ),
                    rpc.message,
                    details.get("mcp_data").cloned().filter(|d| !d.is_null()),
                ),
                Some(
                    ErrorKind::ToolNotFound | ErrorKind::InvalidParams | ErrorKind::BundleNotFound,
                ) => ErrorData::invalid_params(rpc.message, None),
                _ => ErrorData::internal_error(rpc.message, Some(json!({ "kind": kind }))),
            }
        }
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, ErrorData> {
    serde_json::from_value(value).map_err(|e| {
        ErrorData::internal_error(format!("unusable {what} from the bundle: {e}"), None)
    })
}

impl ServerHandler for Gateway {
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        let Some(socket) = self.0.events.clone() else {
            return;
        };
        let (gateway, peer) = (self.clone(), context.peer);
        tokio::spawn(async move {
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
            tokio::select! {
                _ = super::watch_changes(gateway, peer, socket) => {}
                _ = closed => {}
            }
        });
    }

    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .build();
        capabilities.logging = None;
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("bundlevisor", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The bundles of workspace {:?}, supervised by bundlevisor. Tools are named BUNDLE__TOOL; the workspace's files are files:// resources.",
                self.0.workspace
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = decode(Value::Array(self.tool_catalog().await?), "tool list")?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let exposed = request.name.to_string();
        let refresh = async { self.tool_catalog().await.map(|_| ()) };
        let route = self.route(&self.0.tools, &exposed, refresh).await?;
        if self.tool_excluded(&exposed) || !self.bundle_allowed(&route.bundle) {
            return Err(ErrorData::invalid_params(
                format!("tool {exposed:?} is not available in this profile"),
                None,
            ));
        }
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let params = CallParams {
            workspace: self.0.workspace.clone(),
            name: route.bundle.clone(),
            tool: route.name.clone(),
            arguments: request.arguments.clone(),
            timeout_ms: None,
            progress: token.is_some(),
            wait_ready_ms: Some(self.0.wait_ready.as_millis() as u64),
        };
        let mut pending = self
            .0
            .link
            .start(method::CALL, params, token.is_some())
            .await
            .map_err(to_mcp)?;
        let id = pending.id;
        // Progress is forwarded in order, ahead of the answer.
        let mut progress = std::mem::replace(
            &mut pending.progress,
            tokio::sync::mpsc::unbounded_channel().1,
        );
        let notify = |p: crate::protocol::CallProgress| {
            let token = token.clone();
            let peer = context.peer.clone();
            async move {
                if let Some(token) = token {
                    let mut note = ProgressNotificationParam::new(token, p.progress);
                    note.total = p.total;
                    note.message = p.message;
                    let _ = peer.notify_progress(note).await;
                }
            }
        };
        let answer = pending.answer::<Value>();
        tokio::pin!(answer);
        let answer = loop {
            tokio::select! {
                biased;
                Some(p) = progress.recv() => notify(p).await,
                a = &mut answer => break a,
                _ = context.ct.cancelled() => {
                    self.0.link.cancel(id).await;
                    return Err(ErrorData::internal_error("the call was cancelled", None));
                }
            }
        };
        while let Ok(p) = progress.try_recv() {
            notify(p).await;
        }
        let result: CallToolResult = decode(answer.map_err(to_mcp)?, "tool result")?;
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let prompts = decode(Value::Array(self.prompt_catalog().await?), "prompt list")?;
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let refresh = async { self.prompt_catalog().await.map(|_| ()) };
        let route = self.route(&self.0.prompts, &request.name, refresh).await?;
        let mut params = json!({ "name": route.name });
        if let Some(arguments) = &request.arguments {
            params["arguments"] = json!(arguments);
        }
        let answer = self
            .bundle_mcp(&route.bundle, "prompts/get", params)
            .await
            .map_err(to_mcp)?;
        let result: GetPromptResult = decode(answer, "prompt")?;
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let resources = decode(
            Value::Array(self.resource_catalog().await?),
            "resource list",
        )?;
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let answer = if let Some((bundle, original)) = names::parse_bundle_uri(&request.uri) {
            if !self.bundle_allowed(&bundle) {
                return Err(ErrorData::resource_not_found(
                    format!("no resource {}", request.uri),
                    None,
                ));
            }
            let mut answer = self
                .bundle_mcp(&bundle, "resources/read", json!({ "uri": original }))
                .await
                .map_err(to_mcp)?;
            // The contents carry the URI the client asked for.
            if let Some(contents) = answer.get_mut("contents").and_then(Value::as_array_mut) {
                for c in contents {
                    if c.get("uri").and_then(Value::as_str) == Some(original.as_str()) {
                        c["uri"] = json!(request.uri);
                    }
                }
            }
            answer
        } else {
            self.0
                .link
                .call::<crate::protocol::typed::WorkspaceResources>(WorkspaceResourcesParams {
                    workspace: self.0.workspace.clone(),
                    method: "resources/read".into(),
                    params: Some(json!({ "uri": request.uri })),
                })
                .await
                .map_err(to_mcp)?
        };
        let result: ReadResourceResult = decode(answer, "resource")?;
        Ok(result.into())
    }
}
