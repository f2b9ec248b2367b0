//! The audit of agents' calls (docs/gateway.md, "Audit"): every tool
//! call, prompt get and resource read through the gateway is a line of the
//! workspace's audit log (`STATE_DIR/audit/WS.jsonl`, beside the
//! host-resources decisions, rotated with `[logs]`): who (the token's
//! name, never its text; or the local uid), what (bundle and own name),
//! the outcome, how long it took, and the W3C trace id when the request
//! carried one (`_meta.traceparent`, or the HTTP `traceparent` header).
//! Never the arguments or the answer.

use std::time::Instant;

use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::Serialize;

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

/// The trace id of a W3C `traceparent` (`00-TRACEID-SPANID-FLAGS`), if
/// well formed.
fn trace_id(traceparent: &str) -> Option<String> {
    let id = traceparent.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id != "0".repeat(32))
        .then(|| id.to_ascii_lowercase())
}

/// The trace id a request carries: in its `_meta` (SEP-414), else in the
/// HTTP request's `traceparent` header.
fn trace_of(context: &RequestContext<RoleServer>) -> Option<String> {
    if let Some(id) = context.meta.get_traceparent().and_then(trace_id) {
        return Some(id);
    }
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    let header = parts.headers.get("traceparent")?.to_str().ok()?;
    trace_id(header)
}

impl Audited {
    /// A request of `principal` for `name` of `bundle`, from now.
    pub fn start(
        principal: String,
        action: &'static str,
        (bundle, name): (&str, &str),
        context: &RequestContext<RoleServer>,
    ) -> Audited {
        // A URI's query and fragment may carry what an argument would (a
        // signed URL's signature): never recorded, as arguments are not.
        let name = name.split(['?', '#']).next().unwrap_or_default();
        Audited {
            principal,
            action,
            bundle: bundle.to_string(),
            name: name.to_string(),
            trace_id: trace_of(context),
            started: Instant::now(),
        }
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
        serde_json::to_string(&line).ok()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_trace_id_is_taken_from_a_well_formed_traceparent_only() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            super::trace_id(&format!("00-{id}-00f067aa0ba902b7-01")).as_deref(),
            Some(id)
        );
        assert_eq!(super::trace_id("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(
            super::trace_id(&format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32))),
            None
        );
        assert_eq!(super::trace_id("garbage"), None);
    }
}
