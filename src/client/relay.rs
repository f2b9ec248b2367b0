//! `bundlevisor mcp`: the agent's stdio to a gateway session that the
//! daemon serves (`gateway.attach`), on one thread.
//!
//! When stdin and stdout are pipes or sockets, they are handed to the
//! daemon (`SCM_RIGHTS`), which serves the session on them: no hop through
//! this process. This process then only follows the daemon's notes on the
//! connection ([`HandoverNote`]): the agent's `initialize` params, and the
//! requests that have waited a while (a tool call of a minute), so that it
//! can answer those itself if the daemon dies. A request younger than
//! that when the daemon is killed gets no answer (the agent's own timeout
//! ends it); a session survives either way. Otherwise (a terminal, or
//! `--relay`) it relays a line at a time:
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
use crate::protocol::{AttachParams, HandoverNote};

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

/// How a connection to the daemon ended.
enum Over {
    /// The agent closed its side: `bundlevisor mcp` is done.
    AgentDone,
    /// The daemon went away (a restart?).
    Lost,
    /// The daemon cannot serve the agent's descriptors (why): relay instead.
    Refused(String),
}

/// Serves the agent until it closes its side: the daemon serves the
/// session on the agent's own stdin and stdout when `params.handover`
/// (this process only waits), else this process relays every line. Errors
/// of the first attach (no daemon, an unknown workspace or profile) are
/// returned; later losses are retried.
pub async fn relay(socket: &Path, mut params: AttachParams) -> Result<(), ClientError> {
    let (stdin, mut stdout) = crate::stdio::stdio();
    let mut agent = BufReader::new(stdin);
    // What was read of the agent's next line: kept across connections.
    let mut from_agent = Vec::new();
    let mut session = Session::default();
    let mut client = attach(socket, &params).await?;
    loop {
        let over = if params.handover {
            handed_over(client, &mut session).await
        } else {
            let agent = (&mut agent, &mut from_agent);
            relayed(client, agent, &mut stdout, &mut session).await
        };
        match over {
            Over::AgentDone => return Ok(()),
            Over::Refused(why) => {
                tracing::info!("relaying this session: {why}");
                params.handover = false;
                match attach(socket, &params).await {
                    Ok(again) => {
                        client = again;
                        continue;
                    }
                    Err(ClientError::Rpc(e)) => return Err(ClientError::Rpc(e)),
                    // Gone meanwhile: waited for like any loss.
                    Err(_) => {}
                }
            }
            Over::Lost => {}
        }
        // Lost: every open request is answered now.
        for id in std::mem::take(&mut session.open) {
            let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
            if write_line(&mut stdout, &refusal(&id, GONE)).await.is_err() {
                return Ok(());
            }
        }
        // Back when the daemon is: meanwhile each request is refused.
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
            // The daemon may take the descriptors again only if this
            // process holds nothing the agent sent.
            let resume = AttachParams {
                resume: session.init.clone(),
                handover: params.handover && agent.buffer().is_empty() && from_agent.is_empty(),
                ..params.clone()
            };
            match attach(socket, &resume).await {
                Ok(client) => {
                    params.handover = resume.handover;
                    break client;
                }
                Err(ClientError::Rpc(e)) => return Err(ClientError::Rpc(e)),
                Err(e) => tracing::debug!("the daemon is not back yet: {e}"),
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        };
    }
}

/// The daemon serves the session on the agent's stdin and stdout, sent to
/// it now; this process follows the daemon's notes until the session or
/// the connection ends.
async fn handed_over(client: Client, session: &mut Session) -> Over {
    // Kept until the end: closing it would tell the daemon this process is gone.
    let (mut notes, to_daemon) = client.into_parts();
    if let Err(e) = crate::stdio::send_stdio(to_daemon.as_ref()).await {
        tracing::debug!("could not hand stdin and stdout to the daemon: {e}");
        return Over::Lost;
    }
    let mut line = String::new();
    loop {
        line.clear();
        if !matches!(notes.read_line(&mut line).await, Ok(n) if n > 0) {
            return Over::Lost;
        }
        match serde_json::from_str::<HandoverNote>(line.trim()) {
            Ok(HandoverNote::Taken) => {}
            Ok(HandoverNote::Refused(why)) => return Over::Refused(why),
            Ok(HandoverNote::Initialized(init)) => session.init = Some(init),
            Ok(HandoverNote::Open(id)) => {
                tracing::debug!("request {id} is open at the daemon");
                session.open.insert(id.to_string());
            }
            Ok(HandoverNote::Closed(id)) => {
                session.open.remove(&id.to_string());
            }
            Ok(HandoverNote::Ended) => return Over::AgentDone,
            Err(e) => tracing::debug!("an unknown note from the daemon: {e}"),
        }
    }
}

/// Relays lines between the agent and the daemon.
async fn relayed(
    client: Client,
    (agent, from_agent): (&mut BufReader<crate::stdio::Reader>, &mut Vec<u8>),
    stdout: &mut crate::stdio::Writer,
    session: &mut Session,
) -> Over {
    let (mut from_daemon, mut to_daemon) = client.into_parts();
    let mut line = Vec::new();
    loop {
        tokio::select! {
            n = agent.read_until(b'\n', from_agent) => {
                if matches!(n, Ok(0) | Err(_)) {
                    // The agent is done: the daemon ends the session.
                    let _ = to_daemon.shutdown().await;
                    return Over::AgentDone;
                }
                session.agent_sent(from_agent);
                let sent = write_line(&mut to_daemon, from_agent).await;
                from_agent.clear();
                if sent.is_err() {
                    return Over::Lost;
                }
            }
            n = from_daemon.read_until(b'\n', &mut line) => {
                if !matches!(n, Ok(n) if n > 0) {
                    return Over::Lost;
                }
                session.daemon_sent(&line);
                if write_line(stdout, &line).await.is_err() {
                    return Over::AgentDone;
                }
                line.clear();
            }
        }
    }
}
