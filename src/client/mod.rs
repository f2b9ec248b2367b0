//! The control-socket client of the CLI: [`Client`] connects, says hello,
//! sends one request at a time and reads the notifications that arrive
//! before its response; [`relay`] is `bundlevisor mcp`, the agent's stdio
//! relayed to a gateway session the daemon serves.

pub mod relay;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::protocol::typed::Hello;
use crate::protocol::{
    HelloParams, Incoming, Method, Notification, Request, RpcError, PROTOCOL_VERSION,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the daemon at {socket}: {source}; is `bundlevisor daemon` running? (set --socket or BUNDLEVISOR_SOCKET)")]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Rpc(RpcError),
    #[error("control protocol error: {0}")]
    Protocol(String),
    /// The command line itself is wrong (checked before anything is sent).
    #[error("{0}")]
    Usage(String),
}

pub struct Client {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
    next_id: u64,
}

impl Client {
    /// Connects and completes `daemon.hello`.
    pub async fn connect(socket: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|source| ClientError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        let (read, write) = stream.into_split();
        let mut client = Client {
            lines: BufReader::new(read).lines(),
            write,
            next_id: 1,
        };
        let hello = HelloParams {
            protocol: PROTOCOL_VERSION,
            client: Some(format!("bundlevisor-cli/{}", env!("CARGO_PKG_VERSION"))),
        };
        client.call::<Hello>(hello, |_| {}).await?;
        Ok(client)
    }

    /// The connection, once it carries something else (`gateway.attach`),
    /// with what was read ahead.
    pub fn into_parts(self) -> (BufReader<OwnedReadHalf>, OwnedWriteHalf) {
        (self.lines.into_inner(), self.write)
    }

    /// The next notification (responses are skipped); None when the daemon
    /// closed the connection.
    pub async fn next_notification(&mut self) -> Result<Option<Notification>, ClientError> {
        loop {
            let Some(line) = self
                .lines
                .next_line()
                .await
                .map_err(|e| ClientError::Protocol(format!("read: {e}")))?
            else {
                return Ok(None);
            };
            if let Incoming::Notification(n) = Incoming::parse(&line)
                .map_err(|e| ClientError::Protocol(format!("bad message from daemon: {e}")))?
            {
                return Ok(Some(n));
            }
        }
    }

    /// Sends one request of method `M` (its params and result types are the
    /// daemon's, `protocol::typed`); `on_note` sees every notification that
    /// arrives before the response.
    pub async fn call<M: Method>(
        &mut self,
        params: M::Params,
        on_note: impl FnMut(&Notification),
    ) -> Result<M::Result, ClientError> {
        self.request(M::NAME, params, on_note).await
    }

    /// Sends one request; `on_note` sees every notification that arrives
    /// before the response.
    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &mut self,
        method: &str,
        params: P,
        mut on_note: impl FnMut(&Notification),
    ) -> Result<R, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_string(&Request::new(id, method, params))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        if let Err(e) = self.write.write_all(line.as_bytes()).await {
            // The daemon may have refused the connection (and said why) first.
            let said = tokio::time::timeout(
                std::time::Duration::from_millis(500),
                self.lines.next_line(),
            )
            .await;
            if let Ok(Ok(Some(text))) = said {
                if let Ok(Incoming::Response(r)) = Incoming::parse(&text) {
                    if let Some(err) = r.error {
                        return Err(ClientError::Rpc(err));
                    }
                }
            }
            return Err(ClientError::Protocol(format!("write: {e}")));
        }
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .map_err(|e| ClientError::Protocol(format!("read: {e}")))?
                .ok_or_else(|| ClientError::Protocol("the daemon closed the connection".into()))?;
            match Incoming::parse(&line)
                .map_err(|e| ClientError::Protocol(format!("bad message from daemon: {e}")))?
            {
                Incoming::Notification(n) => on_note(&n),
                Incoming::Response(r) if r.id == id || r.id.is_null() => {
                    if let Some(err) = r.error {
                        return Err(ClientError::Rpc(err));
                    }
                    let result = r.result.unwrap_or(serde_json::Value::Null);
                    return serde_json::from_value(result)
                        .map_err(|e| ClientError::Protocol(format!("unexpected result: {e}")));
                }
                Incoming::Response(_) => {}
            }
        }
    }
}
