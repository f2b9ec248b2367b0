//! `bundlevisor call NAME TOOL [JSON_ARGS] [-w WS] [--wait-ready D]`: prints the text of the
//! result (or the whole `CallToolResult` with --json); a tool error exits 1.

use std::process::ExitCode;

use serde_json::Value;

use super::{print_json, Client, ClientError};
use crate::protocol::{CallParams, DEFAULT_WORKSPACE};
use crate::text::printable;

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    tool: String,
    /// Tool arguments as a JSON object, e.g. '{"text":"hi"}'.
    arguments: Option<String>,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Per-call timeout, e.g. 30s (default: the daemon's bundles.call_timeout).
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<std::time::Duration>,
    /// Print the MCP CallToolResult JSON.
    #[arg(long)]
    json: bool,
    /// Wait up to this long for a bundle that is starting or restarting,
    /// then call it (as the gateway does), e.g. 10s.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait_ready: Option<std::time::Duration>,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let arguments = match &args.arguments {
        None => None,
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Some(map),
            Ok(other) => {
                return Err(usage(format!(
                    "tool arguments must be a JSON object, got {other}"
                )))
            }
            Err(e) => return Err(usage(format!("tool arguments are not valid JSON: {e}"))),
        },
    };
    let params = CallParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
        tool: args.tool.clone(),
        arguments,
        timeout_ms: args.timeout.map(|t| t.as_millis() as u64),
        progress: false,
        wait_ready_ms: args.wait_ready.map(|t| t.as_millis() as u64),
    };
    let result: Value = client
        .call::<crate::protocol::typed::Call>(params, |_| {})
        .await?;
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if args.json {
        print_json(&result)?;
    } else {
        // What the bundle returned, escaped (--json has the exact text).
        let text = render(&result);
        let text = printable(&text);
        if is_error {
            eprintln!("{text}");
        } else {
            outln!("{text}");
        }
    }
    Ok(if is_error {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn usage(message: String) -> ClientError {
    ClientError::Protocol(message)
}

/// Text blocks as they are; other content (and structuredContent) as JSON.
fn render(result: &Value) -> String {
    let mut parts = Vec::new();
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match (
            block.get("type").and_then(Value::as_str),
            block.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(text)) => parts.push(text.to_string()),
            _ => parts.push(block.to_string()),
        }
    }
    if parts.is_empty() {
        if let Some(s) = result.get("structuredContent") {
            parts.push(s.to_string());
        }
    }
    parts.join("\n")
}
