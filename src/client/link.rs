//! The gateway's connection to the daemon: many requests in flight on one
//! control connection, answered by id, with `call.progress` notifications
//! routed to the call that asked. A lost connection fails the requests in
//! flight and is re-established by the next request.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{
    method, CallProgress, CancelParams, HelloParams, Incoming, Request, RpcError, PROTOCOL_VERSION,
};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot reach the bundlevisor daemon at {socket}: {message}")]
    Unreachable { socket: PathBuf, message: String },
    #[error("{}", .0.message)]
    Rpc(RpcError),
    #[error("the connection to the daemon was lost")]
    Lost,
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
}

struct Waiter {
    reply: oneshot::Sender<Result<Value, RpcError>>,
    progress: Option<mpsc::UnboundedSender<CallProgress>>,
}

type Waiters = Arc<Mutex<HashMap<u64, Waiter>>>;

/// One live control connection.
struct Conn {
    tx: mpsc::UnboundedSender<String>,
    waiters: Waiters,
}

impl Conn {
    fn alive(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// A request in flight: its id (for `cancel`) and its progress.
pub struct Pending {
    pub id: u64,
    pub progress: mpsc::UnboundedReceiver<CallProgress>,
    answer: oneshot::Receiver<Result<Value, RpcError>>,
}

impl Pending {
    pub async fn answer<R: DeserializeOwned>(self) -> Result<R, LinkError> {
        let value = self
            .answer
            .await
            .map_err(|_| LinkError::Lost)?
            .map_err(LinkError::Rpc)?;
        serde_json::from_value(value).map_err(|e| LinkError::Protocol(e.to_string()))
    }
}

pub struct Link {
    socket: PathBuf,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
}

impl Link {
    pub fn new(socket: PathBuf) -> Link {
        Link {
            socket,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// The live connection, connecting (and saying hello) if there is none.
    async fn conn(&self) -> Result<Arc<Conn>, LinkError> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| c.alive()) {
            return Ok(conn.clone());
        }
        let unreachable = |message: String| LinkError::Unreachable {
            socket: self.socket.clone(),
            message,
        };
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (read, mut write) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let waiters: Waiters = Arc::default();
        tokio::spawn(async move {
            while let Some(mut line) = rx.recv().await {
                line.push('\n');
                if write.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        let reader_waiters = waiters.clone();
        let reader_tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                route(&line, &reader_waiters);
            }
            // Lost: close the writer and fail everything in flight.
            drop(reader_tx);
            reader_waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        });
        let conn = Arc::new(Conn { tx, waiters });
        *slot = Some(conn.clone());
        drop(slot);
        let hello = HelloParams {
            protocol: PROTOCOL_VERSION,
            client: Some(format!("bundlevisor-mcp/{}", env!("CARGO_PKG_VERSION"))),
        };
        let pending = self.send_on(&conn, method::HELLO, hello, false)?;
        pending
            .answer::<Value>()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        Ok(conn)
    }

    fn send_on<P: Serialize>(
        &self,
        conn: &Conn,
        method: &str,
        params: P,
        progress: bool,
    ) -> Result<Pending, LinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = serde_json::to_string(&Request::new(id, method, params))
            .map_err(|e| LinkError::Protocol(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        let (ptx, prx) = mpsc::unbounded_channel();
        conn.waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                Waiter {
                    reply,
                    progress: progress.then_some(ptx),
                },
            );
        conn.tx.send(line).map_err(|_| LinkError::Lost)?;
        Ok(Pending {
            id,
            progress: prx,
            answer,
        })
    }

    /// Sends a request; `progress` asks for its `call.progress` notifications.
    pub async fn start<P: Serialize>(
        &self,
        method: &str,
        params: P,
        progress: bool,
    ) -> Result<Pending, LinkError> {
        let conn = self.conn().await?;
        self.send_on(&conn, method, params, progress)
    }

    /// Sends one request of method `M` and waits for its answer.
    pub async fn call<M: crate::protocol::Method>(
        &self,
        params: M::Params,
    ) -> Result<M::Result, LinkError> {
        self.request(M::NAME, params).await
    }

    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: P,
    ) -> Result<R, LinkError> {
        self.start(method, params, false).await?.answer().await
    }

    /// Cancels request `id` (best effort).
    pub async fn cancel(&self, id: u64) {
        let _ = self
            .start(
                method::CANCEL,
                CancelParams {
                    id: Value::from(id),
                },
                false,
            )
            .await;
    }
}

fn route(line: &str, waiters: &Waiters) {
    let Ok(incoming) = Incoming::parse(line) else {
        tracing::warn!("unparsable message from the daemon");
        return;
    };
    match incoming {
        Incoming::Response(r) => {
            let Some(id) = r.id.as_u64() else { return };
            let waiter = waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            if let Some(w) = waiter {
                let _ = w.reply.send(match r.error {
                    Some(e) => Err(e),
                    None => Ok(r.result.unwrap_or(Value::Null)),
                });
            }
        }
        Incoming::Notification(n) if n.method == method::CALL_PROGRESS => {
            let Ok(p) = serde_json::from_value::<CallProgress>(n.params) else {
                return;
            };
            let Some(id) = p.id.as_u64() else { return };
            let waiters = waiters.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(tx) = waiters.get(&id).and_then(|w| w.progress.as_ref()) {
                let _ = tx.send(p);
            }
        }
        Incoming::Notification(_) => {}
    }
}
