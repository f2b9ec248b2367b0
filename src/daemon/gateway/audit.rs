//! The audit of agents' calls (docs/gateway.md, "Audit"): every tool
//! call, prompt get and resource read through the gateway is a line of the
//! workspace's audit log (`STATE_DIR/audit/WS.jsonl`, beside the
//! host-resources decisions, rotated with `[logs]`): who (the token's
//! name, never its text; or the local uid), what (bundle and own name),
//! the outcome, how long it took, and the W3C trace id when the request
//! carried one (`_meta.traceparent`, or the HTTP `traceparent` header) or
//! the daemon traced it (`[telemetry]`). Never the arguments or the answer.
//!
//! The same start and end make the request's span (the gateway's, kind
//! server): the audit and the trace never disagree on what was asked and
//! how it ended.

use std::time::Instant;

use super::facts::Facts;
use serde::Serialize;

use crate::telemetry::{Attribute, Kind, Span, Telemetry, Trace};

/// How a request through the gateway ended, for the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered.
    Ok,
    /// A tool answered with `isError: true`.
    ToolError,
    /// Failed (the bundle, the daemon or the request).
    Error,
    /// Refused by the token's rules (or the profile).
    Refused,
    /// The bundle asked the agent for input first (2026-07-28 rounds).
    InputRequired,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::Error => "error",
            Outcome::Refused => "refused",
            Outcome::InputRequired => "input_required",
        }
    }
}

/// One request being audited, from its start.
pub struct Audited {
    principal: String,
    action: &'static str,
    bundle: String,
    name: String,
    trace_id: Option<String>,
    started: Instant,
    span: Span,
}

#[derive(Serialize)]
struct Line<'a> {
    time: String,
    permitted: bool,
    principal: &'a str,
    action: &'a str,
    scope: String,
    resource: String,
    bundle: &'a str,
    name: &'a str,
    outcome: &'a str,
    duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
}

/// The trace a request continues: the context in its `_meta` (SEP-414),
/// else in the HTTP request's `traceparent` and `tracestate` headers.
pub fn trace_of(telemetry: &Telemetry, context: &Facts<'_>) -> Trace {
    if let Some(parent) = context.meta().get_traceparent() {
        let trace = telemetry.continued(Some(parent), context.meta().get_tracestate());
        if trace.has_context() {
            return trace;
        }
    }
    let header = |name| {
        let parts = context.parts()?;
        parts.headers.get(name)?.to_str().ok()
    };
    telemetry.continued(header("traceparent"), header("tracestate"))
}

/// Who, where and what a request is, for its span.
pub struct Request<'a> {
    pub principal: String,
    pub workspace: &'a str,
    pub action: &'static str,
    pub bundle: &'a str,
    pub name: &'a str,
}

impl Audited {
    /// `request`, from now, in the trace it continues.
    pub fn start(request: Request, trace: &Trace, context: &Facts<'_>) -> Audited {
        let Request {
            principal,
            workspace,
            action,
            bundle,
            name,
        } = request;
        // A URI's query and fragment may carry what an argument would (a
        // signed URL's signature): never recorded, as arguments are not.
        let name = name.split(['?', '#']).next().unwrap_or_default();
        let span = trace.span_with(Kind::Server, || {
            (
                span_name(action, name),
                attributes(action, (workspace, bundle, name), &principal, context),
            )
        });
        Audited {
            principal,
            action,
            bundle: bundle.to_string(),
            name: name.to_string(),
            trace_id: span.trace().trace_id(),
            started: Instant::now(),
            span,
        }
    }

    /// Where the request's spans further down go (its request to the
    /// bundle), and what the bundle is given.
    pub fn trace(&self) -> &Trace {
        self.span.trace()
    }

    /// Its audit line, ended with `outcome` (and why, for a refusal).
    pub fn line(self, workspace: &str, outcome: Outcome, reason: Option<&str>) -> Option<String> {
        let line = Line {
            time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            permitted: outcome != Outcome::Refused,
            principal: &self.principal,
            action: self.action,
            scope: format!("workspace:{workspace}"),
            resource: format!("{}/{}", self.bundle, self.name),
            bundle: &self.bundle,
            name: &self.name,
            outcome: outcome.as_str(),
            duration_ms: (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
            reason: reason
                .filter(|_| outcome == Outcome::Refused)
                .map(|r| r.split(['?', '#']).next().unwrap_or_default()),
            trace_id: self.trace_id.as_deref(),
        };
        let text = serde_json::to_string(&line).ok();
        let why = match outcome {
            Outcome::Ok | Outcome::InputRequired => None,
            Outcome::Refused => Some(line.reason.unwrap_or("refused")),
            Outcome::ToolError => Some("the tool answered with an error"),
            Outcome::Error => Some("failed"),
        };
        self.span.end(outcome.as_str(), why);
        text
    }
}

/// A span's name (OpenTelemetry's MCP conventions): the method, and the
/// tool's or prompt's name (a URI is an attribute, not a name).
fn span_name(action: &'static str, name: &str) -> String {
    match action {
        "resources/read" => action.to_string(),
        _ => format!("{action} {name}"),
    }
}

/// A request span's attributes: OpenTelemetry's MCP conventions, and the
/// workspace, bundle and token name (never its text).
fn attributes(
    action: &'static str,
    (workspace, bundle, name): (&str, &str, &str),
    principal: &str,
    context: &Facts<'_>,
) -> Vec<Attribute> {
    let mut attributes = vec![
        Attribute::new("mcp.method.name", action),
        Attribute::new("bundlevisor.workspace", workspace.to_string()),
        Attribute::new("bundlevisor.bundle", bundle.to_string()),
        Attribute::new("bundlevisor.principal", principal.to_string()),
        Attribute::new("jsonrpc.request.id", context.id().to_string()),
    ];
    if let Some(version) = context.protocol_version() {
        attributes.push(Attribute::new("mcp.protocol.version", version.to_string()));
    }
    attributes.push(match action {
        "tools/call" => Attribute::new("gen_ai.tool.name", name.to_string()),
        "prompts/get" => Attribute::new("gen_ai.prompt.name", name.to_string()),
        _ => Attribute::new("mcp.resource.uri", name.to_string()),
    });
    if action == "tools/call" {
        attributes.push(Attribute::new("gen_ai.operation.name", "execute_tool"));
    }
    attributes
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_span_is_named_by_its_method_and_target_but_never_by_a_uri() {
        assert_eq!(super::span_name("tools/call", "add"), "tools/call add");
        assert_eq!(
            super::span_name("prompts/get", "greet"),
            "prompts/get greet"
        );
        assert_eq!(
            super::span_name("resources/read", "bundle://x/secret-path"),
            "resources/read"
        );
    }
}
