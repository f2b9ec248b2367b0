//! `discovery = "search"` (docs/gateway.md, "Finding tools"): instead of
//! every tool of the workspace, an agent is listed three meta-tools —
//! [`FIND`] ranks the tools it may call by a natural-language query
//! ([`crate::tool_search`]) and answers each hit with its name, bundle,
//! description and input schema; [`CALL`] calls a found tool by that name;
//! [`PIN`] adds found tools to the session's own tool list (and tells the
//! agent with `notifications/tools/list_changed`). A found or pinned tool
//! is called exactly as a listed one: the profile, the token's rules and
//! the audit apply the same way.

use std::collections::HashMap;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ResultType, Tool,
};
use rmcp::ErrorData;
use serde_json::{json, Value};

use super::audit::Outcome;
use super::facts::Facts;
use super::server::Gateway;
use crate::config::Discovery;
use crate::token_rules::Kind;

/// Finds tools by what the agent wants done.
pub const FIND: &str = "find_tools";
/// Calls a found tool.
pub const CALL: &str = "call_tool";
/// Adds found tools to the session's tool list.
pub const PIN: &str = "pin_tools";

/// The bundle the audit names for the meta-tools themselves.
const GATEWAY: &str = "@gateway";

/// Tool texts a search waits to have embedded (a bundle come up, a few
/// dozen milliseconds each); more are embedded in the background while
/// searches rank them by their words.
const INLINE_EMBEDS: usize = 64;

/// Hits when the agent does not say, and at most.
const DEFAULT_HITS: u64 = 5;
const MAX_HITS: u64 = 25;

fn schema(value: Value) -> std::sync::Arc<serde_json::Map<String, Value>> {
    match value {
        Value::Object(map) => std::sync::Arc::new(map),
        _ => unreachable!("a schema is an object"),
    }
}

/// The meta-tools (without [`PIN`] for an agent without a session).
pub fn meta_tools(pinning: bool) -> Vec<Tool> {
    let mut tools = vec![
        Tool::new(
            FIND,
            "Find the tools for a task among every tool of this workspace, by describing what you want done in plain words (e.g. \"open a pull request\", \"current time in Tokyo\"). Answers the best matches, each with its name, bundle, description and input schema; call one with call_tool.",
            schema(json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you want done, in plain words"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HITS, "description": "How many tools to return (default 5)"}
                },
                "required": ["query"]
            })),
        ),
        Tool::new(
            CALL,
            "Call a tool that find_tools returned, by its name, with arguments that fit its input schema. Answers what the tool answers.",
            schema(json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's name, as find_tools gave it"},
                    "arguments": {"type": "object", "description": "The tool's arguments"}
                },
                "required": ["name"]
            })),
        ),
    ];
    if pinning {
        tools.push(Tool::new(
            PIN,
            "Add tools that find_tools returned to this session's tool list, to call them directly from now on.",
            schema(json!({
                "type": "object",
                "properties": {
                    "names": {"type": "array", "items": {"type": "string"}, "description": "The tools' names, as find_tools gave them"}
                },
                "required": ["names"]
            })),
        ));
    }
    tools
}

fn argument<'a>(request: &'a CallToolRequestParams, key: &str) -> Option<&'a Value> {
    request.arguments.as_ref().and_then(|a| a.get(key))
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

fn bad(message: String) -> ErrorData {
    ErrorData::invalid_params(message, None)
}

fn answered(text: String, structured: Option<Value>) -> CallToolResponse {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = structured;
    result.result_type = Some(ResultType::COMPLETE);
    result.into()
}

impl Gateway {
    /// Whether this gateway's profile finds tools by search.
    pub fn searching(&self) -> bool {
        self.0
            .profile
            .as_ref()
            .is_some_and(|p| p.discovery == Discovery::Search)
    }

    /// What an agent of a searching profile is listed: the meta-tools,
    /// then the tools its session pinned.
    pub async fn search_listing(
        &self,
        context: &Facts<'_>,
        stateless: bool,
    ) -> Result<Vec<Tool>, ErrorData> {
        let mut listed = meta_tools(!stateless);
        let pinned = self
            .0
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if pinned.is_empty() {
            return Ok(listed);
        }
        let tools = self.tools().await?;
        let tools = self
            .granted(context, Kind::Tool, &self.0.routes.tools, tools, |t| {
                &t.name
            })
            .await;
        let routes = self.0.routes.tools.lock().await;
        listed.extend(tools.into_iter().filter(|t| {
            routes
                .get(t.name.as_ref())
                .is_some_and(|e| pinned.contains(&(e.bundle.clone(), e.name.clone())))
        }));
        Ok(listed)
    }

    /// A meta-tool's call, or None when `request` names another tool.
    pub async fn meta_call(
        &self,
        request: &CallToolRequestParams,
        context: &Facts<'_>,
        stateless: bool,
    ) -> Option<Result<CallToolResponse, ErrorData>> {
        // A found tool's call is audited as that tool's; a search or a pin
        // as the meta-tool's (bundle `@gateway`).
        let meta = match request.name.as_ref() {
            CALL => return Some(self.call_found(request, context).await),
            name @ (FIND | PIN) => name,
            _ => return None,
        };
        let audited = self.audit(context, "tools/call", (GATEWAY, meta));
        let answer = match meta {
            FIND => self.find(request, context).await,
            _ => self.pin(request, context, stateless).await,
        };
        let outcome = match &answer {
            Ok(_) => Outcome::Ok,
            Err(_) => Outcome::Error,
        };
        audited.end(outcome, None);
        Some(answer)
    }

    async fn find(
        &self,
        request: &CallToolRequestParams,
        context: &Facts<'_>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(query) = argument(request, "query").and_then(Value::as_str) else {
            return Err(bad(format!(
                "{FIND} needs \"query\": what you want done, in plain words"
            )));
        };
        let limit = match argument(request, "limit") {
            None | Some(Value::Null) => DEFAULT_HITS,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_HITS).contains(n))
                .ok_or_else(|| {
                    bad(format!(
                        "\"limit\" must be a whole number from 1 to {MAX_HITS}"
                    ))
                })?,
        };
        let api = &self.0.api;
        let all = api.tools(&self.0.workspace, None).await?;
        let index = api.tool_index(&self.0.workspace).map_err(internal)?;
        // Indexing is blocking work, the index's lock included: on the
        // blocking pool. Bundles not ready are out of the index.
        let (all, pending) = {
            let index = index.clone();
            tokio::task::spawn_blocking(move || {
                let ready = || {
                    (all.iter())
                        .filter(|b| b.state == crate::protocol::BundleState::Ready)
                        .map(|b| (b.name.as_str(), b.tools.as_slice()))
                };
                let synced = match index.stale(ready()) {
                    true => index.sync(ready()),
                    false => Ok(()),
                };
                let pending = synced.map(|()| index.pending());
                (all, pending)
            })
            .await
            .map_err(internal)?
        };
        let pending = pending.map_err(internal)?;
        if pending > 0 {
            let index = index.clone();
            let embedding = tokio::task::spawn_blocking(move || index.embed_pending());
            if pending <= INLINE_EMBEDS {
                embedding.await.map_err(internal)?;
            }
        }
        // The tools this agent may call, by their own names.
        let (tools, _) = self.catalog_of(all).await?;
        let tools = self
            .granted(context, Kind::Tool, &self.0.routes.tools, tools, |t| {
                &t.name
            })
            .await;
        let visible: HashMap<(String, String), Tool> = {
            let routes = self.0.routes.tools.lock().await;
            tools
                .into_iter()
                .filter_map(|t| {
                    let e = routes.get(t.name.as_ref())?;
                    Some(((e.bundle.clone(), e.name.clone()), t))
                })
                .collect()
        };
        // Ranking embeds the query with a model: blocking work too.
        let owned_query = query.to_string();
        let (hits, visible) = tokio::task::spawn_blocking(move || {
            let hits = index.search(&owned_query, limit as usize, |bundle, tool| {
                visible.contains_key(&(bundle.to_string(), tool.to_string()))
            });
            (hits, visible)
        })
        .await
        .map_err(internal)?;
        let hits = hits.map_err(internal)?;
        let found: Vec<Value> = hits
            .iter()
            .map(|hit| {
                let tool = &visible[&(hit.bundle.clone(), hit.tool.clone())];
                json!({
                    "name": tool.name,
                    "bundle": hit.bundle,
                    "description": tool.description,
                    "inputSchema": tool.input_schema,
                    "score": (f64::from(hit.score) * 1000.0).round() / 1000.0,
                })
            })
            .collect();
        let text = if found.is_empty() {
            format!("no tool matches {query:?}; try other words (what the tool does, or the product it works on)")
        } else {
            serde_json::to_string(&found).unwrap_or_default()
        };
        Ok(answered(text, Some(json!({ "tools": found }))))
    }

    /// [`CALL`]: the found tool's call, as if the agent had called it.
    async fn call_found(
        &self,
        request: &CallToolRequestParams,
        context: &Facts<'_>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(name) = argument(request, "name").and_then(Value::as_str) else {
            return Err(bad(format!(
                "{CALL} needs \"name\": a tool's name as {FIND} gave it"
            )));
        };
        let arguments = match argument(request, "arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map.clone()),
            Some(_) => return Err(bad("\"arguments\" must be an object".to_string())),
        };
        let mut call = request.clone();
        call.name = name.to_string().into();
        call.arguments = arguments;
        self.call_exposed(call, context).await?.typed()
    }

    /// [`PIN`]: found tools joined to this session's list.
    async fn pin(
        &self,
        request: &CallToolRequestParams,
        context: &Facts<'_>,
        stateless: bool,
    ) -> Result<CallToolResponse, ErrorData> {
        if stateless {
            return Err(bad(format!(
                "{PIN} keeps tools in a session, which MCP 2026-07-28 has not: call found tools with {CALL}"
            )));
        }
        let names: Vec<&str> = match argument(request, "names").and_then(Value::as_array) {
            Some(names) => names.iter().filter_map(Value::as_str).collect(),
            None => Vec::new(),
        };
        if names.is_empty() {
            return Err(bad(format!(
                "{PIN} needs \"names\": tools' names as {FIND} gave them"
            )));
        }
        let mut pairs = Vec::new();
        for name in &names {
            let refresh = async { self.tools().await.map(|_| ()) };
            let route = self.route(&self.0.routes.tools, name, refresh).await?;
            self.permit(context, Kind::Tool, (&route.bundle, &route.name), name)?;
            pairs.push((route.bundle, route.name));
        }
        self.0
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(pairs);
        if let Some(peer) = context.peer() {
            super::tell_session(peer, super::List::Tools).await;
        }
        Ok(answered(
            format!(
                "pinned {}: listed in tools/list from now on",
                names.join(", ")
            ),
            None,
        ))
    }
}
