//! `bundlevisor audit [-w WS] [--token NAME] [--bundle B] [--action A]
//! [--outcome O] [--since 1h] [-n N] [--json]`: the audit log — every tool
//! call, prompt get and resource read of agents through the gateway, and
//! every host-resources decision of bundles — oldest first.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use super::{Client, ClientError};
use crate::protocol::{AuditEntries, AuditParams};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One workspace's (every workspace's by default).
    #[arg(short, long)]
    workspace: Option<String>,
    /// Only this token's requests (its name), or a principal: `uid:N`,
    /// `bundle:WS/NAME`.
    #[arg(long, value_name = "NAME")]
    token: Option<String>,
    #[arg(long)]
    bundle: Option<String>,
    /// `tools/call`, `prompts/get`, `resources/read`; `read`, `list` for
    /// bundles' host-resources requests.
    #[arg(long)]
    action: Option<String>,
    /// `ok`, `tool_error`, `error`, `refused`, `input_required`, or
    /// `denied` (anything not permitted).
    #[arg(long)]
    outcome: Option<String>,
    /// Only the last of this long (e.g. 15m, 1h, 7d).
    #[arg(long, value_parser = humantime::parse_duration)]
    since: Option<Duration>,
    /// At most this many lines, the newest.
    #[arg(short = 'n', long, default_value_t = 100)]
    lines: u32,
    /// One JSON object per line, as the log holds them.
    #[arg(long)]
    json: bool,
}

fn text<'a>(line: &'a Value, key: &str) -> &'a str {
    line.get(key).and_then(Value::as_str).unwrap_or("-")
}

/// One line for a terminal.
fn row(line: &Value) -> String {
    let outcome = match line.get("outcome").and_then(Value::as_str) {
        Some(o) => o.to_string(),
        None if line.get("permitted") == Some(&Value::Bool(false)) => "denied".into(),
        None => "permitted".into(),
    };
    let took = line
        .get("duration_ms")
        .and_then(Value::as_f64)
        .map(|ms| format!("{ms:.1}ms"))
        .unwrap_or_else(|| "-".into());
    let reason = match line.get("reason").and_then(Value::as_str) {
        Some(r) if outcome != "ok" && outcome != "permitted" => format!("  {r}"),
        _ => String::new(),
    };
    printable_line(&format!(
        "{}  {:<22} {:<15} {:<40} {:<14} {:>9}{}",
        text(line, "time"),
        text(line, "principal"),
        text(line, "action"),
        text(line, "resource"),
        outcome,
        took,
        reason
    ))
    .into_owned()
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = AuditParams {
        workspace: args.workspace.clone(),
        principal: args.token.clone(),
        bundle: args.bundle.clone(),
        action: args.action.clone(),
        outcome: args.outcome.clone(),
        since_secs: args.since.map(|d| d.as_secs().max(1)),
        limit: Some(args.lines),
    };
    let r: AuditEntries = client
        .call::<crate::protocol::typed::Audit>(params, |_| {})
        .await?;
    if args.json {
        for line in &r.entries {
            outln!("{}", serde_json::to_string(line).unwrap_or_default());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if r.entries.is_empty() {
        eprintln!("no audit lines match");
        return Ok(ExitCode::SUCCESS);
    }
    for line in &r.entries {
        outln!("{}", row(line));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_shows_who_what_and_how_it_ended() {
        let line = serde_json::json!({"time": "2026-11-26T10:00:00.000Z", "principal": "token:ci",
            "action": "tools/call", "resource": "github/delete_repo", "outcome": "refused",
            "duration_ms": 0.2, "reason": "the token's rule --deny tool:*/delete_* refuses it"});
        let shown = super::row(&line);
        assert!(
            shown.contains("token:ci")
                && shown.contains("refused")
                && shown.contains("--deny tool:*/delete_*"),
            "{shown}"
        );
    }
}
