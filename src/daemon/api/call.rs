//! Reaching bundles: their tools as their actors list them, a tool call
//! (on the ready session in the caller's task, else through the actor;
//! waiting a bounded time for a bundle on its way up), an MCP request
//! passed to a bundle, and the workspace's files as MCP resources.

use std::time::Duration;

use ractor::rpc::CallResult;
use rmcp::model::{
    CallToolResult, ClientRequest, JsonObject, ProgressNotificationParam, ServerResult, Tool,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::outcome::wait_ready;
use super::{limit, Api, ApiError};
use crate::bundle::client::Caller;
use crate::bundle::spliced::RawToolResult;
use crate::daemon::bundle::{run, Answered, BundleMsg, BundleRequest, CallError, PendingCall};
use crate::daemon::workspace::FilesOp;
use crate::protocol::BundleState;
use crate::telemetry::Trace;

/// How long a request passed to a bundle may take.
const PASSTHROUGH_TIMEOUT: Duration = Duration::from_secs(60);

/// One bundle's tools, as its actor lists them (none unless ready).
#[derive(Debug, Clone)]
pub struct BundleTools {
    pub name: String,
    pub state: BundleState,
    pub tools: Vec<Tool>,
}

/// A tool's result: decoded, or as the bundle wrote it.
pub enum ToolResult {
    Typed(CallToolResult),
    Raw(RawToolResult),
}

impl ToolResult {
    /// The tool answered with an error (`isError`).
    pub fn is_error(&self) -> bool {
        match self {
            ToolResult::Typed(r) => r.is_error == Some(true),
            ToolResult::Raw(r) => r.is_error(),
        }
    }

    /// The result decoded.
    pub fn typed(self) -> Result<CallToolResult, ApiError> {
        match self {
            ToolResult::Typed(r) => Ok(r),
            ToolResult::Raw(r) => r
                .typed()
                .map_err(|e| ApiError::Failed(format!("the tool's result: {e}"))),
        }
    }
}

/// A tool call.
#[derive(Debug, Clone)]
pub struct CallRequest {
    pub workspace: String,
    pub name: String,
    pub tool: String,
    pub arguments: Option<JsonObject>,
    /// Overrides `[bundles] call_timeout`.
    pub timeout: Option<Duration>,
    /// A bundle that is starting or restarting is waited for this long
    /// before the call is refused as not ready.
    pub wait_ready: Option<Duration>,
    /// The trace the call's span joins (the gateway request's); its
    /// context goes to the bundle.
    pub trace: Trace,
}

impl Api {
    /// The tools of one bundle (`name`), or of every bundle of `workspace`.
    pub async fn tools(
        &self,
        workspace: &str,
        name: Option<&str>,
    ) -> Result<Vec<BundleTools>, ApiError> {
        let one = name.is_some();
        let names: Vec<String> = match name {
            Some(name) => vec![name.to_string()],
            None => self.shared.board.names_in(workspace),
        };
        let mut bundles = Vec::new();
        for name in names {
            let (state, tools) = match Api::bundle_actor(workspace, &name) {
                Ok(actor) => {
                    Api::ask(
                        &actor,
                        BundleMsg::Tools,
                        limit::ANSWER,
                        "the bundle's actor",
                    )
                    .await?
                }
                // Installed, and its actor not up yet (a moment after a
                // daemon start): listed as the board has it, no tools yet.
                Err(e) => match self.shared.board.get(workspace, &name) {
                    Some(status) => (status.state, Vec::new()),
                    None if one => return Err(e),
                    None => continue,
                },
            };
            bundles.push(BundleTools { name, state, tools });
        }
        Ok(bundles)
    }

    /// A tool call on behalf of `caller` (a gateway's agent, or the
    /// operator), with the bundle's progress sent to `progress`; counted in
    /// the metrics (unless the bundle is not installed).
    pub async fn call(
        &self,
        request: &CallRequest,
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancel: &CancellationToken,
        caller: Caller,
    ) -> Result<CallToolResult, ApiError> {
        let answer = self.call_as(request, progress, cancel, caller, false);
        answer.await?.typed()
    }

    /// [`Self::call`] for a caller that writes the result on as the bundle
    /// wrote it, when its session can hand it over so
    /// ([`crate::bundle::spliced`]): the gateway's answers below rmcp.
    pub async fn call_spliced(
        &self,
        request: &CallRequest,
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancel: &CancellationToken,
        caller: Caller,
    ) -> Result<ToolResult, ApiError> {
        self.call_as(request, progress, cancel, caller, true).await
    }

    async fn call_as(
        &self,
        request: &CallRequest,
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancel: &CancellationToken,
        caller: Caller,
        raw: bool,
    ) -> Result<ToolResult, ApiError> {
        let started = std::time::Instant::now();
        // A call dropped before its answer (its agent went away from a
        // call answered as its connection's own work) is counted as one
        // that failed, as a cancelled one is.
        let mut dropped = crate::daemon::OnDrop::new(|| {
            let (took, metrics) = (started.elapsed(), &self.shared.metrics);
            metrics.tool_call(&request.workspace, &request.name, took, false);
        });
        // Boxed: the call's state machine (the session's request, progress,
        // the wait for ready) is large, and a future that holds it inline is
        // copied whole each time a task is spawned or polled to completion
        // around it (rmcp spawns one per request): 85% more instructions a
        // gateway call (`make bench-callgrind`).
        let answer = Box::pin(self.call_tool(request, progress, cancel, (caller, raw))).await;
        dropped.disarm();
        if !matches!(&answer, Err(ApiError::BundleNotFound { .. })) {
            let ok = matches!(&answer, Ok(r) if !r.is_error());
            self.shared
                .metrics
                .tool_call(&request.workspace, &request.name, started.elapsed(), ok);
        }
        answer
    }

    async fn call_tool(
        &self,
        p: &CallRequest,
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancel: &CancellationToken,
        (caller, raw): (Caller, bool),
    ) -> Result<ToolResult, ApiError> {
        let actor = Api::bundle_actor(&p.workspace, &p.name)?;
        // The call's own clock stands while its agent is asked, for up to
        // `[http] input_timeout`: so long may the answer take.
        let wait = p.timeout.unwrap_or(self.shared.config.bundles.call_timeout)
            + self.shared.config.http.input_timeout
            + limit::CALL_SLACK;
        let mut deadline = None;
        let result = loop {
            // Subscribed before each call that may wait: the bundle's way
            // back to ready cannot be missed.
            let mut events = p.wait_ready.map(|_| self.shared.board.subscribe());
            let pending = |reply| PendingCall {
                request: BundleRequest::Tool {
                    name: p.tool.clone(),
                    arguments: p.arguments.clone(),
                },
                timeout: p.timeout,
                cancel: cancel.clone(),
                progress: progress.clone(),
                caller: caller.clone(),
                trace: p.trace.clone(),
                raw,
                reply,
            };
            // A ready session runs the call in this task; anything else is
            // the actor's to decide.
            let lane = self
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
                    .map_err(ApiError::unavailable)?,
            };
            // A bundle on its way up is waited for (bounded by one
            // deadline), then called again.
            if let (
                Some(wait),
                Some(events),
                CallResult::Success(Err(CallError::NotReady { state, .. })),
            ) = (p.wait_ready, events.as_mut(), &result)
            {
                if state.is_coming_up() {
                    let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + wait);
                    if wait_ready(&self.shared, events, &p.workspace, &p.name, until).await {
                        continue;
                    }
                }
            }
            break result;
        };
        let (name, tool) = (&p.name, &p.tool);
        match result {
            CallResult::Success(Ok(Answered::Typed(ServerResult::CallToolResult(r)))) => {
                Ok(ToolResult::Typed(r))
            }
            CallResult::Success(Ok(Answered::Raw(r))) => Ok(ToolResult::Raw(r)),
            CallResult::Success(Ok(_)) => Err(ApiError::Failed(format!(
                "tool {tool:?} of bundle {name:?} failed: the bundle answered with something else"
            ))),
            CallResult::Success(Err(e)) => Err(refusal(p, e, deadline.is_some())),
            CallResult::Timeout => Err(ApiError::Timeout(format!(
                "bundle {name:?} did not answer in time"
            ))),
            CallResult::SenderError => {
                Err(ApiError::unavailable(format!("bundle {name:?} went away")))
            }
        }
    }

    /// An MCP request passed to a ready bundle on behalf of `caller`, by
    /// the one path to a bundle (in-flight guard, timeout, 401 retry);
    /// `cancel` cancels it at the bundle.
    pub async fn mcp(
        &self,
        workspace: &str,
        name: &str,
        request: ClientRequest,
        caller: Caller,
        cancel: CancellationToken,
        trace: Trace,
    ) -> Result<ServerResult, ApiError> {
        let method = request.method().to_string();
        let actor = Api::bundle_actor(workspace, name)?;
        let answer = actor
            .call(
                |reply| {
                    BundleMsg::Call(PendingCall {
                        request: BundleRequest::Mcp(Box::new(request)),
                        timeout: Some(PASSTHROUGH_TIMEOUT),
                        cancel,
                        progress: None,
                        caller,
                        trace,
                        raw: false,
                        reply,
                    })
                },
                Some(
                    PASSTHROUGH_TIMEOUT + self.shared.config.http.input_timeout + limit::CALL_SLACK,
                ),
            )
            .await
            .map_err(ApiError::unavailable)?;
        match answer {
            CallResult::Success(Ok(Answered::Typed(result))) => Ok(result),
            CallResult::Success(Ok(Answered::Raw(raw))) => raw
                .typed()
                .map(ServerResult::CallToolResult)
                .map_err(|e| ApiError::Failed(format!("{method} to bundle {name:?}: {e}"))),
            CallResult::Success(Err(CallError::NotReady { state, .. })) => {
                Err(ApiError::NotReady {
                    message: format!("bundle {name:?} is {}, not ready", state.as_str()),
                    state,
                })
            }
            CallResult::Success(Err(CallError::Timeout(_))) | CallResult::Timeout => Err(
                ApiError::Timeout(format!("bundle {name:?} did not answer {method} in time")),
            ),
            CallResult::Success(Err(CallError::Mcp(error))) => Err(ApiError::Mcp {
                message: format!("bundle {name:?} answered {method}: {}", error.message),
                error,
            }),
            CallResult::Success(Err(CallError::Failed(why))) => Err(ApiError::Failed(format!(
                "{method} to bundle {name:?} failed: {why}"
            ))),
            CallResult::Success(Err(e)) => Err(ApiError::Failed(format!(
                "{method} to bundle {name:?} failed: {e:?}"
            ))),
            CallResult::SenderError => Err(ApiError::unavailable("the bundle did not answer")),
        }
    }

    /// The workspace's files as MCP resources (`resources/list`,
    /// `resources/read`), answered by the host-resources resolver.
    pub async fn files_resources(
        &self,
        workspace: &str,
        request: crate::host_resources::Request,
    ) -> Result<ServerResult, ApiError> {
        let list = matches!(request, crate::host_resources::Request::List { .. });
        let answer = self
            .files(workspace, |reply| FilesOp::Resources { request, reply })
            .await?;
        let value = answer?;
        let unusable = |e: serde_json::Error| {
            ApiError::Internal(format!("the workspace's files answered: {e}"))
        };
        Ok(match list {
            true => {
                ServerResult::ListResourcesResult(serde_json::from_value(value).map_err(unusable)?)
            }
            false => {
                ServerResult::ReadResourceResult(serde_json::from_value(value).map_err(unusable)?)
            }
        })
    }
}

/// Why a tool call was not answered, in words for the caller; `waited`:
/// the call waited for the bundle to come up, in vain.
fn refusal(p: &CallRequest, e: CallError, waited: bool) -> ApiError {
    let (name, tool) = (&p.name, &p.tool);
    match e {
        CallError::NotReady { state, last_error } if waited => ApiError::NotReady {
            message: format!(
                "bundle {name:?} did not become ready within {} (it is {}{})",
                humantime::format_duration(p.wait_ready.unwrap_or_default()),
                state.as_str(),
                last_error
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default()
            ),
            state,
        },
        CallError::NotReady { state, last_error } => ApiError::NotReady {
            message: match last_error {
                Some(e) if state == BundleState::Failed => format!(
                    "bundle {name:?} is failed ({e}); fix it, then `bundlevisor restart {name}`"
                ),
                Some(e) => format!(
                    "bundle {name:?} is {}, not ready (last error: {e})",
                    state.as_str()
                ),
                None => format!("bundle {name:?} is {}, not ready", state.as_str()),
            },
            state,
        },
        CallError::Timeout(t) => ApiError::Timeout(format!(
            "tool {tool:?} of bundle {name:?} did not answer within {}",
            humantime::format_duration(t)
        )),
        CallError::Failed(e) => {
            ApiError::Failed(format!("tool {tool:?} of bundle {name:?} failed: {e}"))
        }
        CallError::Cancelled => ApiError::Cancelled(format!(
            "the call of tool {tool:?} of bundle {name:?} was cancelled"
        )),
        CallError::NoSuchTool => ApiError::ToolNotFound(format!(
            "bundle {name:?} has no tool {tool:?} (or the daemon config excludes it); `bundlevisor tools {name}` lists them"
        )),
        CallError::Mcp(error) => ApiError::Mcp {
            message: format!("tool {tool:?} of bundle {name:?}: {}", error.message),
            error,
        },
    }
}
