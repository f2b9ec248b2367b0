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
use crate::host_resources::access::push_time;

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

/// The trace a request continues: the context in its `_meta` (SEP-414),
/// else in the HTTP request's `traceparent` and `tracestate` headers.
pub fn trace_of(telemetry: &Telemetry, context: &Facts<'_>) -> Trace {
    if let Some(parent) = context.traceparent() {
        let trace = telemetry.continued(Some(parent), context.tracestate());
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

    /// Its audit line, ended with `outcome` (and why, for a refusal):
    /// `time`, `permitted`, `principal`, `action`, `scope`, `resource`,
    /// `bundle`, `name`, `outcome`, `duration_ms`, and `reason` and
    /// `trace_id` when there are. Written by hand, a call's every line
    /// (serde's map writer cost a gateway call 6,000 instructions).
    pub fn line(self, workspace: &str, outcome: Outcome, reason: Option<&str>) -> Option<String> {
        let reason = reason
            .filter(|_| outcome == Outcome::Refused)
            .map(|r| r.split(['?', '#']).next().unwrap_or_default());
        let duration_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        let mut line = String::with_capacity(256);
        line.push_str(r#"{"time":""#);
        push_time(&mut line, std::time::SystemTime::now());
        line.push_str(match outcome {
            Outcome::Refused => r#"","permitted":false"#,
            _ => r#"","permitted":true"#,
        });
        let fields: [(&str, &[&str]); 7] = [
            ("principal", &[&self.principal]),
            ("action", &[self.action]),
            ("scope", &["workspace:", workspace]),
            ("resource", &[&self.bundle, "/", &self.name]),
            ("bundle", &[&self.bundle]),
            ("name", &[&self.name]),
            ("outcome", &[outcome.as_str()]),
        ];
        for (key, parts) in fields {
            push_key(&mut line, key);
            json_string(&mut line, parts);
        }
        line.push_str(r#","duration_ms":"#);
        line.push_str(&serde_json::to_string(&duration_ms).ok()?);
        for (key, value) in [("reason", reason), ("trace_id", self.trace_id.as_deref())] {
            if let Some(value) = value {
                push_key(&mut line, key);
                json_string(&mut line, &[value]);
            }
        }
        line.push('}');
        let why = match outcome {
            Outcome::Ok | Outcome::InputRequired => None,
            Outcome::Refused => Some(reason.unwrap_or("refused")),
            Outcome::ToolError => Some("the tool answered with an error"),
            Outcome::Error => Some("failed"),
        };
        self.span.end(outcome.as_str(), why);
        Some(line)
    }
}

/// `,"KEY":` at the end of `line` (`key` needs no escaping).
fn push_key(line: &mut String, key: &str) {
    line.push_str(",\"");
    line.push_str(key);
    line.push_str("\":");
}

/// `parts`, one after another, as one JSON string at the end of `line`.
fn json_string(line: &mut String, parts: &[&str]) {
    let plain = |part: &&str| !part.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20);
    if parts.iter().all(plain) {
        line.push('"');
        parts.iter().for_each(|part| line.push_str(part));
        line.push('"');
    } else {
        let whole = parts.concat();
        line.push_str(&serde_json::to_string(&whole).unwrap_or_default());
    }
}

/// A request's audit until it ends ([`Auditing::end`]), its line written
/// by `write`. Dropped before that — its future dropped with the
/// connection of an agent that went away — it is audited as failed, its
/// span ended so.
pub struct Auditing<W: Fn(Audited, Outcome, Option<&str>)> {
    audited: Option<Audited>,
    write: W,
}

impl<W: Fn(Audited, Outcome, Option<&str>)> Auditing<W> {
    pub fn new(audited: Audited, write: W) -> Auditing<W> {
        Auditing {
            audited: Some(audited),
            write,
        }
    }

    /// Where the request's spans further down go.
    pub fn trace(&self) -> &Trace {
        self.audited
            .as_ref()
            .expect("audited until it ends")
            .trace()
    }

    /// Writes its line, with how it ended (and why, for a refusal).
    pub fn end(mut self, outcome: Outcome, reason: Option<&str>) {
        if let Some(audited) = self.audited.take() {
            (self.write)(audited, outcome, reason);
        }
    }
}

impl<W: Fn(Audited, Outcome, Option<&str>)> Drop for Auditing<W> {
    fn drop(&mut self) {
        if let Some(audited) = self.audited.take() {
            (self.write)(audited, Outcome::Error, None);
        }
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
    use super::*;

    /// A request being audited, as [`Audited::start`] makes one.
    fn audited(principal: &str, bundle: &str, name: &str, trace_id: Option<&str>) -> Audited {
        Audited {
            principal: principal.to_string(),
            action: "tools/call",
            bundle: bundle.to_string(),
            name: name.to_string(),
            trace_id: trace_id.map(str::to_string),
            started: Instant::now(),
            span: Trace::default().span_with(Kind::Server, || unreachable!("tracing is off")),
        }
    }

    /// The line written by hand is JSON with every field, its text escaped
    /// where it must be, and only the fields that apply.
    #[test]
    fn an_audit_line_is_json_with_its_fields_escaped() {
        let tricky = "ci \"bot\"\\\n\u{1}é";
        let line = audited(
            tricky,
            "b\"x",
            "echo",
            Some("0af7651916cd43dd8448eb211c80319c"),
        )
        .line("w\\s", Outcome::Refused, Some("not granted?sig=secret"))
        .expect("a line");
        assert!(!line.contains('\n'), "one line: {line}");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 12, "{line}");
        assert_eq!(v["principal"], tricky);
        assert_eq!(v["permitted"], false);
        assert_eq!(v["action"], "tools/call");
        assert_eq!(v["scope"], "workspace:w\\s");
        assert_eq!(v["resource"], "b\"x/echo");
        assert_eq!(v["bundle"], "b\"x");
        assert_eq!(v["name"], "echo");
        assert_eq!(v["outcome"], "refused");
        assert_eq!(v["reason"], "not granted", "a query is never recorded");
        assert_eq!(v["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        assert!(v["duration_ms"].as_f64().is_some_and(|d| d >= 0.0));
        assert!(humantime::parse_rfc3339(v["time"].as_str().unwrap()).is_ok());

        let line = audited("t", "b", "n", None)
            .line("w", Outcome::Ok, Some("ignored when permitted"))
            .expect("a line");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(v["permitted"], true);
        assert_eq!(v["outcome"], "ok");
        assert!(
            v.get("reason").is_none() && v.get("trace_id").is_none(),
            "{line}"
        );
    }

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
