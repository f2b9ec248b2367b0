//! `bundlevisor mcp`'s relay: the agent's stdio to a gateway session that
//! the daemon serves (`gateway.attach`), a line at a time, on one thread.
//!
//! The relay reads only what it must of each message (its `id` and
//! `method`): it keeps the agent's `initialize` params and the ids of the
//! agent's requests that have no answer yet. When the daemon goes away
//! (a restart), each of those requests is answered with an error at once
//! (never a hang), requests that arrive meanwhile too, and the relay
//! attaches to the daemon again, resuming the session as initialized — the
//! agent keeps its session across a daemon restart.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::{Client, ClientError};
use crate::protocol::typed::Attach;
use crate::protocol::AttachParams;

/// What the relay reads of a message.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
}

/// The agent's side of the session, kept across daemon connections.
#[derive(Default)]
struct Session {
    /// The `initialize` params, once the agent has sent them.
    init: Option<Value>,
    /// Ids (as JSON text) of the agent's requests without an answer.
    open: HashSet<String>,
}

impl Session {
    /// Notes a message of the agent; true if it is a request.
    fn agent_sent(&mut self, line: &[u8]) -> Option<Value> {
        let envelope: Envelope = serde_json::from_slice(line).ok()?;
        let (Some(id), Some(method)) = (envelope.id, envelope.method) else {
            return None;
        };
        if method == "initialize" {
            let message: Value = serde_json::from_slice(line).ok()?;
            self.init = message.get("params").cloned();
        }
        self.open.insert(id.to_string());
        Some(id)
    }

    /// Notes a message of the daemon: an answer closes its request.
    fn daemon_sent(&mut self, line: &[u8]) {
        if let Ok(Envelope {
            id: Some(id),
            method: None,
        }) = serde_json::from_slice(line)
        {
            self.open.remove(&id.to_string());
        }
    }
}

/// A JSON-RPC error answer to the agent's request `id`.
fn refusal(id: &Value, message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32603, "message": message },
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

const GONE: &str = "the bundlevisor daemon went away during this request (a restart?); the session goes on when it is back, and the request may be sent again";
const AWAY: &str =
    "the bundlevisor daemon is not reachable right now; the session goes on when it is back";

async fn attach(socket: &Path, params: &AttachParams) -> Result<Client, ClientError> {
    let mut client = Client::connect(socket).await?;
    client.call::<Attach>(params.clone(), |_| {}).await?;
    Ok(client)
}

async fn write_line(out: &mut (impl AsyncWrite + Unpin), line: &[u8]) -> std::io::Result<()> {
    out.write_all(line).await?;
    out.flush().await
}

/// Relays the agent's stdio to the daemon's gateway until the agent closes
/// its side. Errors of the first attach (no daemon, an unknown workspace or
/// profile) are returned; later losses are retried.
pub async fn relay(socket: &Path, params: AttachParams) -> Result<(), ClientError> {
    let (stdin, mut stdout) = crate::stdio::stdio();
    let mut agent = BufReader::new(stdin);
    let mut session = Session::default();
    let mut client = attach(socket, &params).await?;
    let mut from_agent = Vec::new();
    loop {
        let (read, mut to_daemon) = client.into_parts();
        let mut from_daemon = read;
        let mut line = Vec::new();
        // Until the agent is done (return) or the daemon is lost (break).
        loop {
            tokio::select! {
                n = agent.read_until(b'\n', &mut from_agent) => {
                    match n {
                        Ok(0) | Err(_) => {
                            // The agent is done: the daemon ends the session.
                            let _ = to_daemon.shutdown().await;
                            return Ok(());
                        }
                        Ok(_) => {}
                    }
                    session.agent_sent(&from_agent);
                    let sent = write_line(&mut to_daemon, &from_agent).await;
                    from_agent.clear();
                    if sent.is_err() {
                        break;
                    }
                }
                n = from_daemon.read_until(b'\n', &mut line) => {
                    if !matches!(n, Ok(n) if n > 0) {
                        break;
                    }
                    session.daemon_sent(&line);
                    if write_line(&mut stdout, &line).await.is_err() {
                        return Ok(());
                    }
                    line.clear();
                }
            }
        }
        // Lost: every open request is answered now.
        for id in std::mem::take(&mut session.open) {
            let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
            if write_line(&mut stdout, &refusal(&id, GONE)).await.is_err() {
                return Ok(());
            }
        }
        // Back when the daemon is: meanwhile each request is refused.
        let resume = AttachParams {
            resume: session.init.clone(),
            ..params.clone()
        };
        let mut backoff = Duration::from_millis(50);
        client = loop {
            let retry = tokio::time::sleep(backoff);
            tokio::pin!(retry);
            loop {
                tokio::select! {
                    _ = &mut retry => break,
                    n = agent.read_until(b'\n', &mut from_agent) => {
                        if matches!(n, Ok(0) | Err(_)) {
                            return Ok(());
                        }
                        if let Some(id) = session.agent_sent(&from_agent) {
                            session.open.remove(&id.to_string());
                            if write_line(&mut stdout, &refusal(&id, AWAY)).await.is_err() {
                                return Ok(());
                            }
                        }
                        from_agent.clear();
                    }
                }
            }
            match attach(socket, &resume).await {
                Ok(client) => break client,
                Err(ClientError::Rpc(e)) => return Err(ClientError::Rpc(e)),
                Err(e) => tracing::debug!("the daemon is not back yet: {e}"),
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        };
    }
}
