//! The host-resources channel: `ai.nimblebrain/host-resources` for a bundle
//! that speaks MCP 2026-07-28, where a stdio server must not write requests
//! to stdout (docs/host-resources.md, "On MCP 2026-07-28: the channel").
//!
//! A stdio bundle whose manifest declares host-resources gets one end of a
//! socket pair as its descriptor 3, and `NIMBLEBRAIN_HOST_CHANNEL_FD=3` in
//! its environment. On it the bundle is the client: it writes JSON-RPC
//! requests of the extension's methods, one per line, and reads their
//! answers, one per line, in any order (by `id`). The contract is the one of
//! the in-band methods: same parameters, results and errors, answered by
//! the same resolver through the bundle's WorkspaceActor
//! ([`HostContext::ask`]), so access, audit and rate limits are the same.
//! The channel ends when the bundle closes it or its process ends.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};

use super::client::HostContext;
use crate::host_resources::{METHOD_LIST, METHOD_READ};
use crate::lines::{Line, LineReader};

/// The environment variable that names the channel's descriptor.
pub const CHANNEL_ENV: &str = "NIMBLEBRAIN_HOST_CHANNEL_FD";

/// Requests of one bundle answered at once on its channel; more wait.
const IN_FLIGHT: usize = 16;

/// A socket pair: the daemon's end, and the bundle's (given as fd 3).
pub fn pair() -> std::io::Result<(UnixStream, std::os::fd::OwnedFd)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    Ok((UnixStream::from_std(ours)?, theirs.into()))
}

/// Answers the bundle's requests on `stream` until it closes it. A line
/// longer than `max_line` or that is not a JSON-RPC request is answered
/// with the JSON-RPC error that says so, and the channel goes on.
pub async fn serve(stream: UnixStream, host: HostContext, max_line: usize) {
    let (read, mut write) = stream.into_split();
    let (answers, mut outgoing) = mpsc::channel::<String>(IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some(mut line) = outgoing.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut lines = LineReader::new(BufReader::new(read), max_line);
    loop {
        let text = match lines.next_line().await {
            Ok(Line::Text(text)) => text,
            Ok(Line::TooLong) => {
                let refusal = error(
                    Value::Null,
                    -32600,
                    &format!("a request longer than {max_line} bytes"),
                );
                let _ = answers.send(refusal).await;
                continue;
            }
            Ok(Line::Eof) | Err(_) => break,
        };
        if text.trim().is_empty() {
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (host, answers) = (host.clone(), answers.clone());
        tokio::spawn(async move {
            let answer = answer(&host, &text).await;
            let _ = answers.send(answer).await;
            drop(permit);
        });
    }
    drop(answers);
    let _ = writer.await;
}

/// The answer line to one request line.
async fn answer(host: &HostContext, text: &str) -> String {
    let request: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return error(Value::Null, -32700, &format!("not JSON: {e}")),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        return error(id, -32600, "not a JSON-RPC request: no method");
    };
    if method != METHOD_READ && method != METHOD_LIST {
        return error(
            id,
            -32601,
            &format!(
                "method not found: {method} (the channel serves {METHOD_READ} and {METHOD_LIST})"
            ),
        );
    }
    let params = request.get("params").cloned();
    match host.ask(method.to_string(), params).await {
        Ok(result) => format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
            id,
            result.json()
        ),
        Err(e) => json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": e.code, "message": e.message, "data": e.data },
        })
        .to_string(),
    }
}

fn error(id: Value, code: i32, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}
