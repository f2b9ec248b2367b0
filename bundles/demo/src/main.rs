//! The demo bundle: a small MCP server over stdio, shipped as an example
//! and used as the fixture of the integration tests.
//!
//! Tools: `echo`, `add`, `sleep` (cancellable), `progress` (reports
//! progress), `fail` (a tool error), `crash` (the process exits), `env`
//! (reads an environment variable), and `host_read` /
//! `host_list`, which call the host's `ai.nimblebrain/resources/*` methods
//! back over the MCP session and return the raw JSON result (or, as a tool
//! error, the JSON-RPC error `{code, message, data}`).
//!
//! `confirm` asks the client (`elicitation/create`) `times` times (0:
//! until it declines), logging each question first (`notifications/message`
//! at `info`), and answers with every reply.
//!
//! Prompt: `ask` (argument `question`) asks the client for an LLM
//! completion (`sampling/createMessage`) while it serves `prompts/get`, and
//! answers with the client's reply, or with why there was none.
//!
//! `DEMO_TOOL_ALIASES` (comma-separated names) adds a tool of each name,
//! answering `tool NAME`: bundles whose tool names collide in a gateway.

// Sampling is deprecated by SEP-2577 in rmcp's newest revision; the
// 2025-11-25 revision the bundle speaks has it.
#![allow(deprecated)]

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRoute;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ClientResult, ContentBlock, CreateMessageRequestParams, CustomRequest,
    CustomResult, ElicitRequest, ElicitRequestParams, ElicitationAction, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, ListPromptsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    PromptArgument, PromptMessage, Role, SamplingMessage, ServerCapabilities, ServerConfig,
    ServerRequest, Tool,
};
use rmcp::service::{RequestContext, ServiceError};
use rmcp::{
    schemars, tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler,
    ServiceExt,
};
use serde::Deserialize;

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: f64,
    b: f64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct SleepArgs {
    /// Milliseconds to wait before answering.
    ms: u64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct ProgressArgs {
    /// Number of progress notifications.
    steps: u32,
    /// Milliseconds between them.
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct FailArgs {
    /// Error message of the tool result.
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct CrashArgs {
    /// Exit code of the process.
    #[serde(default)]
    code: Option<i32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct HogArgs {
    /// Mebibytes to allocate and touch.
    mib: usize,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct EnvArgs {
    /// Name of the environment variable.
    name: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct HostReadArgs {
    /// A `files://fl_...` URI.
    uri: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct HostBenchArgs {
    /// A `files://fl_...` URI to read repeatedly.
    uri: String,
    /// Number of sequential reads.
    count: u32,
    /// Also return every read's round trip (`samples_us`).
    #[serde(default)]
    samples: bool,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct ConfirmArgs {
    /// How many times to ask (0: until the client declines).
    #[serde(default)]
    times: u32,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct HostListArgs {
    /// Sent as `params` as is (e.g. `{"_meta":{"filter":{"tags":["a"]}}}`).
    #[serde(default)]
    params: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The host-resources channel of a bundle on MCP 2026-07-28
/// (docs/host-resources.md): the descriptor the host names in
/// `NIMBLEBRAIN_HOST_CHANNEL_FD`, JSON-RPC requests and answers one per
/// line. One request at a time here (a demo).
struct Channel {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
    next_id: u64,
}

static CHANNEL: tokio::sync::OnceCell<Option<tokio::sync::Mutex<Channel>>> =
    tokio::sync::OnceCell::const_new();

async fn channel() -> Option<&'static tokio::sync::Mutex<Channel>> {
    use std::os::fd::FromRawFd;
    CHANNEL
        .get_or_init(|| async {
            let fd: i32 = std::env::var("NIMBLEBRAIN_HOST_CHANNEL_FD")
                .ok()?
                .parse()
                .ok()?;
            // SAFETY: the host gave this process the descriptor for this use.
            let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
            socket.set_nonblocking(true).ok()?;
            let (read, write) = tokio::net::UnixStream::from_std(socket).ok()?.into_split();
            let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(read));
            Some(tokio::sync::Mutex::new(Channel {
                lines,
                write,
                next_id: 1,
            }))
        })
        .await
        .as_ref()
}

/// A host-resources request on the channel: the answer's `result`, or its
/// `error` as the tool error.
async fn over_channel(
    channel: &tokio::sync::Mutex<Channel>,
    method: &str,
    params: serde_json::Value,
) -> CallToolResult {
    use tokio::io::AsyncWriteExt;
    let mut channel = channel.lock().await;
    let id = channel.next_id;
    channel.next_id += 1;
    let mut line =
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string();
    line.push('\n');
    if let Err(e) = channel.write.write_all(line.as_bytes()).await {
        return CallToolResult::error(vec![ContentBlock::text(format!("channel: {e}"))]);
    }
    let answer = match channel.lines.next_line().await {
        Ok(Some(answer)) => answer,
        Ok(None) => return CallToolResult::error(vec![ContentBlock::text("channel closed")]),
        Err(e) => return CallToolResult::error(vec![ContentBlock::text(format!("channel: {e}"))]),
    };
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    match answer.get("result") {
        Some(result) => CallToolResult::success(vec![ContentBlock::text(result.to_string())]),
        None => CallToolResult::error(vec![ContentBlock::text(answer["error"].to_string())]),
    }
}

/// Sends a host-resources request to the client and renders the outcome:
/// in-band on MCP 2025-11-25, on the host's channel on 2026-07-28 (where a
/// stdio server must not send requests).
async fn ask_host(
    context: &RequestContext<RoleServer>,
    method: &str,
    mut params: serde_json::Value,
) -> CallToolResult {
    // The trace the call came in goes on with the request, as an
    // instrumented server's would (SEP-414): the host's span of it joins.
    if let (Some(parent), Some(object)) = (context.meta.get_traceparent(), params.as_object_mut()) {
        let mut meta = serde_json::json!({ "traceparent": parent });
        if let Some(state) = context.meta.get_tracestate() {
            meta["tracestate"] = state.into();
        }
        object.insert("_meta".into(), meta);
    }
    let modern = context
        .protocol_version()
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
    if modern {
        return match channel().await {
            Some(channel) => over_channel(channel, method, params).await,
            None => CallToolResult::error(vec![ContentBlock::text(
                "on MCP 2026-07-28 and the host gave no host-resources channel",
            )]),
        };
    }
    let peer = &context.peer;
    let request = ServerRequest::CustomRequest(CustomRequest::new(method, Some(params)));
    match peer.send_request(request).await {
        Ok(ClientResult::CustomResult(CustomResult(v))) => {
            CallToolResult::success(vec![ContentBlock::text(v.to_string())])
        }
        Ok(other) => CallToolResult::success(vec![ContentBlock::text(
            serde_json::to_string(&other).unwrap_or_default(),
        )]),
        Err(ServiceError::McpError(e)) => {
            let error =
                serde_json::json!({ "code": e.code.0, "message": e.message, "data": e.data });
            CallToolResult::error(vec![ContentBlock::text(error.to_string())])
        }
        Err(e) => CallToolResult::error(vec![ContentBlock::text(format!("transport: {e}"))]),
    }
}

#[derive(Clone)]
struct Demo {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Demo {
    fn new() -> Self {
        let mut tool_router = Self::tool_router();
        let aliases = std::env::var("DEMO_TOOL_ALIASES").unwrap_or_default();
        for name in aliases.split(',').filter(|n| !n.is_empty()) {
            let schema = serde_json::json!({"type": "object"});
            let tool = Tool::new(
                name.to_string(),
                "Answers with its own name",
                std::sync::Arc::new(schema.as_object().cloned().unwrap_or_default()),
            );
            let answer = format!("tool {name}");
            tool_router.add_route(ToolRoute::new_dyn(tool, move |_| {
                let answer = answer.clone();
                Box::pin(async move {
                    Ok(CallToolResult::success(vec![ContentBlock::text(answer)]).into())
                })
            }));
        }
        Demo { tool_router }
    }

    #[tool(description = "Echo the text back (after DEMO_GREETING, when set)")]
    async fn echo(
        &self,
        Parameters(args): Parameters<EchoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let greeting = std::env::var("DEMO_GREETING").unwrap_or_default();
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "{greeting}{}",
            args.text
        ))]))
    }

    #[tool(description = "Add two numbers")]
    async fn add(
        &self,
        Parameters(args): Parameters<AddArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(
            (args.a + args.b).to_string(),
        )]))
    }

    #[tool(description = "Wait for the given number of milliseconds, then answer")]
    async fn sleep(
        &self,
        Parameters(args): Parameters<SleepArgs>,
        cancelled: tokio_util::sync::CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        eprintln!("demo: sleeping {} ms", args.ms);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(args.ms)) => {}
            _ = cancelled.cancelled() => {
                eprintln!("demo: sleep of {} ms cancelled by the client", args.ms);
                return Err(ErrorData::internal_error("cancelled", None));
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "slept {} ms",
            args.ms
        ))]))
    }

    #[tool(
        description = "Send `steps` progress notifications (if the caller asked for progress), then answer"
    )]
    async fn progress(
        &self,
        Parameters(args): Parameters<ProgressArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let token = context.meta.get_progress_token();
        for step in 1..=args.steps {
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
            if let Some(token) = &token {
                let mut note = ProgressNotificationParam::new(token.clone(), f64::from(step));
                note.total = Some(f64::from(args.steps));
                note.message = Some(format!("step {step} of {}", args.steps));
                let _ = context.peer.notify_progress(note).await;
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "done after {} steps",
            args.steps
        ))]))
    }

    #[tool(description = "Return a tool error")]
    async fn fail(
        &self,
        Parameters(args): Parameters<FailArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let message = args.message.unwrap_or_else(|| "demo failure".into());
        Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
    }

    #[tool(description = "Exit the bundle process with the given code (default 3)")]
    async fn crash(
        &self,
        Parameters(args): Parameters<CrashArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let code = args.code.unwrap_or(3);
        eprintln!("demo: crashing on request with exit code {code}");
        std::process::exit(code);
    }

    #[tool(description = "Allocate and touch MIB mebibytes and keep them (tests memory limits)")]
    async fn hog(
        &self,
        Parameters(args): Parameters<HogArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut held = Vec::with_capacity(args.mib);
        for _ in 0..args.mib {
            held.push(vec![1u8; 1024 * 1024]);
        }
        let total: usize = held.iter().map(Vec::len).sum();
        std::mem::forget(held);
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "holding {total} bytes"
        ))]))
    }

    #[tool(
        description = "Ask the client to confirm (elicitation) TIMES times (0: until it declines); answers with every reply"
    )]
    async fn confirm(
        &self,
        peer: Peer<RoleServer>,
        Parameters(args): Parameters<ConfirmArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut replies = Vec::new();
        let mut round = 0;
        while args.times == 0 || round < args.times {
            round += 1;
            let question = format!("confirm {round}?");
            let _ = peer
                .notify_logging_message(LoggingMessageNotificationParam::new(
                    LoggingLevel::Info,
                    serde_json::json!(format!("demo: asking {question}")),
                ))
                .await;
            let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
                "message": question,
                "requestedSchema": {
                    "type": "object",
                    "properties": { "ok": { "type": "boolean" } },
                },
            }))
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
            match peer.send_request(request).await {
                Ok(ClientResult::ElicitResult(reply)) => {
                    let declined = !matches!(reply.action, ElicitationAction::Accept);
                    replies.push(serde_json::to_value(&reply).unwrap_or_default());
                    if declined {
                        break;
                    }
                }
                Ok(_) => {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                        "round {round}: not an elicitation result"
                    ))]))
                }
                Err(e) => {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                        "round {round}: {e}"
                    ))]))
                }
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            serde_json::Value::Array(replies).to_string(),
        )]))
    }

    #[tool(description = "Read a workspace file through ai.nimblebrain/resources/read")]
    async fn host_read(
        &self,
        context: RequestContext<RoleServer>,
        Parameters(args): Parameters<HostReadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(ask_host(
            &context,
            "ai.nimblebrain/resources/read",
            serde_json::json!({ "uri": args.uri }),
        )
        .await)
    }

    #[tool(
        description = "Read a workspace file COUNT times in a row; returns {count, errors, elapsed_ms, per_sec}"
    )]
    async fn host_bench(
        &self,
        peer: Peer<RoleServer>,
        Parameters(args): Parameters<HostBenchArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let started = std::time::Instant::now();
        let mut errors = 0;
        let mut each = Vec::with_capacity(args.count as usize);
        for _ in 0..args.count {
            let request = ServerRequest::CustomRequest(CustomRequest::new(
                "ai.nimblebrain/resources/read",
                Some(serde_json::json!({ "uri": args.uri })),
            ));
            let sent = std::time::Instant::now();
            if !matches!(
                peer.send_request(request).await,
                Ok(ClientResult::CustomResult(_))
            ) {
                errors += 1;
            }
            each.push(sent.elapsed().as_micros() as u64);
        }
        let elapsed = started.elapsed().as_secs_f64();
        each.sort_unstable();
        let pct = |p: f64| {
            each.get(((each.len().max(1) - 1) as f64 * p).round() as usize)
                .copied()
                .unwrap_or(0)
        };
        let mut out = serde_json::json!({
            "count": args.count,
            "errors": errors,
            // Whole microseconds: a pinned round of 1,000 reads takes ~15 ms.
            "elapsed_ms": (elapsed * 1e6).round() / 1000.0,
            "per_sec": (args.count as f64 / elapsed).round(),
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
        });
        if args.samples {
            out["samples_us"] = serde_json::json!(each);
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            out.to_string(),
        )]))
    }

    #[tool(description = "List workspace files through ai.nimblebrain/resources/list")]
    async fn host_list(
        &self,
        context: RequestContext<RoleServer>,
        Parameters(args): Parameters<HostListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = serde_json::Value::Object(args.params.unwrap_or_default());
        Ok(ask_host(&context, "ai.nimblebrain/resources/list", params).await)
    }

    #[tool(
        description = "Answer with the W3C trace context the request carried in _meta (traceparent, tracestate)"
    )]
    async fn trace(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let seen = serde_json::json!({
            "traceparent": context.meta.get_traceparent(),
            "tracestate": context.meta.get_tracestate(),
        });
        Ok(CallToolResult::success(vec![ContentBlock::text(
            seen.to_string(),
        )]))
    }

    #[tool(description = "Read an environment variable of the bundle process")]
    async fn env(
        &self,
        Parameters(args): Parameters<EnvArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let value = std::env::var(&args.name).unwrap_or_else(|_| "(unset)".into());
        Ok(CallToolResult::success(vec![ContentBlock::text(value)]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Demo {
    /// With `DEMO_ONLY_2026=1` the demo speaks MCP 2026-07-28 only: it
    /// refuses `initialize` (a bundle of the new revision, for the
    /// host-resources channel's test).
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        if std::env::var("DEMO_ONLY_2026").is_ok_and(|v| v == "1") {
            return Err(ErrorData::invalid_request(
                "this server speaks MCP 2026-07-28 only: use server/discover",
                None,
            ));
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// With `DEMO_EXIT_ON_DISCOVER=1` the demo ends at `server/discover`, as
    /// a 2025-11-25 server that dies at an unknown method would.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, ErrorData> {
        if std::env::var("DEMO_EXIT_ON_DISCOVER").is_ok_and(|v| v == "1") {
            eprintln!("demo: unknown method server/discover; exiting");
            std::process::exit(3);
        }
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        let question = PromptArgument::new("question")
            .with_description("What to ask the client's model")
            .with_required(true);
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            "ask",
            Some("Asks the client's model the question (sampling) while serving the prompt"),
            Some(vec![question]),
        )]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != "ask" {
            return Err(ErrorData::invalid_params(
                format!("no prompt {:?}", request.name),
                None,
            ));
        }
        let question = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("question"))
            .and_then(|q| q.as_str())
            .unwrap_or_default()
            .to_string();
        let params =
            CreateMessageRequestParams::new(vec![SamplingMessage::user_text(question)], 100);
        let text = match context.peer.create_message(params).await {
            Ok(reply) => format!(
                "the client's answer: {}",
                serde_json::to_string(&reply.message.content).unwrap_or_default()
            ),
            Err(ServiceError::McpError(e)) => format!("sampling refused: {}", e.message),
            Err(e) => format!("sampling failed: {e}"),
        };
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]).into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("demo: starting (pid {})", std::process::id());
    let service = Demo::new().serve(bundlevisor::stdio::stdio()).await?;
    service.waiting().await?;
    eprintln!("demo: stdin closed, exiting");
    Ok(())
}
