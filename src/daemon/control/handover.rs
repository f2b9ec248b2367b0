//! A stdio gateway session served on the agent's own stdin and stdout,
//! which `bundlevisor mcp` sent over its control connection
//! (`gateway.attach` with `handover`): the agent's messages reach the
//! daemon with no process between.
//!
//! The connection stays open beside the session and carries
//! [`HandoverNote`]s to `bundlevisor mcp`: the agent's `initialize` params
//! (to resume after a daemon restart) and the agent's requests that have
//! waited longer than [`ANNOUNCE_AFTER`], so that it can answer those if
//! the daemon dies. The session ends when the agent closes its stdin, or
//! when `bundlevisor mcp` goes (the agent's server, as far as it knows).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientNotification, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify};

use super::{attached, Ctx};
use crate::protocol::{AttachParams, HandoverNote};

/// A request open this long is announced to `bundlevisor mcp`.
pub const ANNOUNCE_AFTER: Duration = Duration::from_millis(50);
/// How long the daemon waits for the descriptors after its answer.
const RECEIVE_WITHIN: Duration = Duration::from_secs(5);

/// The agent's requests without an answer yet.
#[derive(Default)]
struct Ledger {
    open: Mutex<HashMap<RequestId, Open>>,
    /// Told when the first request of an empty ledger arrives.
    arrived: Notify,
}

struct Open {
    since: Instant,
    announced: bool,
}

impl Ledger {
    /// Strikes out an answered (or cancelled) request; one announced is
    /// reported closed on `closed`.
    fn strike(&self, id: &RequestId, closed: &mpsc::UnboundedSender<RequestId>) {
        if self.lock().remove(id).is_some_and(|open| open.announced) {
            let _ = closed.send(id.clone());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The requests open longer than [`ANNOUNCE_AFTER`] and not announced
    /// yet (marked announced now), and when the next one will be due.
    fn due(&self, now: Instant) -> (Vec<RequestId>, Option<Instant>) {
        let mut open = self.lock();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, o) in open.iter_mut().filter(|(_, o)| !o.announced) {
            let at = o.since + ANNOUNCE_AFTER;
            if at <= now {
                o.announced = true;
                due.push(id.clone());
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }
}

/// The session's transport, keeping the ledger: a request of the agent is
/// entered when it arrives and struck out when its answer leaves; an
/// announced one is reported closed on `closed`.
struct Ledgered {
    inner: AsyncRwTransport<RoleServer, crate::stdio::Reader, crate::stdio::Writer>,
    ledger: Arc<Ledger>,
    closed: mpsc::UnboundedSender<RequestId>,
}

impl Transport<RoleServer> for Ledgered {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            TxJsonRpcMessage::<RoleServer>::Response(r) => Some(r.id.clone()),
            TxJsonRpcMessage::<RoleServer>::Error(e) => e.id.clone(),
            _ => None,
        };
        let sent = self.inner.send(item);
        let (ledger, closed) = (self.ledger.clone(), self.closed.clone());
        async move {
            let result = sent.await;
            // Struck out once written: a daemon killed before then still
            // has the request announced.
            if let Some(id) = answered {
                ledger.strike(&id, &closed);
            }
            result
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let message = self.inner.receive().await?;
        match &message {
            RxJsonRpcMessage::<RoleServer>::Request(r) => {
                let mut open = self.ledger.lock();
                if open.is_empty() {
                    self.ledger.arrived.notify_one();
                }
                open.insert(
                    r.id.clone(),
                    Open {
                        since: Instant::now(),
                        announced: false,
                    },
                );
            }
            // A cancelled request gets no answer: it is closed now.
            RxJsonRpcMessage::<RoleServer>::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification {
                    if let Some(id) = &c.params.request_id {
                        self.ledger.strike(id, &self.closed);
                    }
                }
            }
            _ => {}
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

async fn note(to_client: &mut OwnedWriteHalf, note: &HandoverNote) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(note).map_err(std::io::Error::other)?;
    line.push(b'\n');
    to_client.write_all(&line).await
}

/// Receives the agent's descriptors on `stream` (after the answer to
/// `gateway.attach`) and serves the session on them until it ends.
pub(super) fn serve(
    stream: UnixStream,
    p: AttachParams,
    scope: super::gateway::Scope,
    ctx: Ctx,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move { session(stream, p, scope, &ctx).await })
}

async fn session(stream: UnixStream, p: AttachParams, scope: super::gateway::Scope, ctx: &Ctx) {
    let received = tokio::time::timeout(RECEIVE_WITHIN, crate::stdio::receive_stdio(&stream))
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("no descriptors came")));
    // The daemon reopens a pipe with its own rights: only its own user's
    // descriptors are taken, and only as they were opened (a read end for
    // stdin, a write end for stdout, never an O_PATH handle).
    let own = ctx.peer.is_daemon_uid();
    let polled = received
        .as_ref()
        .ok()
        .filter(|_| own)
        .and_then(|[stdin, stdout]| {
            use std::os::fd::AsFd;
            let usable = opened_for(stdin.as_fd(), false) && opened_for(stdout.as_fd(), true);
            usable.then(|| crate::stdio::polled_pair(stdin.as_fd(), stdout.as_fd()))?
        });
    let (from_client, mut to_client) = stream.into_split();
    let Some((reader, writer)) = polled else {
        let why = match received {
            Err(e) => format!("the daemon did not get stdin and stdout: {e}"),
            Ok(_) if !own => "the daemon takes the descriptors of its own user only".to_string(),
            Ok(_) => "the daemon cannot poll this stdin and stdout (a readable and a writable pipe or socket it may open are needed)".to_string(),
        };
        let _ = note(&mut to_client, &HandoverNote::Refused(why)).await;
        return;
    };
    drop(received);
    if note(&mut to_client, &HandoverNote::Taken).await.is_err() {
        return;
    }
    tracing::info!(workspace = %p.workspace, "a stdio gateway session runs on the agent's own stdin and stdout");
    let ledger = Arc::new(Ledger::default());
    let (closed, mut closings) = mpsc::unbounded_channel();
    let transport = Ledgered {
        inner: AsyncRwTransport::new_server(reader, writer),
        ledger: ledger.clone(),
        closed,
    };
    let workspace = p.workspace.clone();
    // `bundlevisor mcp` going away ends the session (the agent sees its
    // server gone), also while the agent has not initialized.
    let gone = client_gone(from_client);
    tokio::pin!(gone);
    let service = tokio::select! {
        s = attached::start(transport, p, scope, ctx) => s,
        _ = &mut gone => return,
    };
    let Some(service) = service else {
        let _ = note(&mut to_client, &HandoverNote::Ended).await;
        return;
    };
    if let Some(init) = service.peer().peer_info() {
        let init = serde_json::to_value(&*init).unwrap_or_default();
        if note(&mut to_client, &HandoverNote::Initialized(init))
            .await
            .is_err()
        {
            return;
        }
    }
    let stop = service.cancellation_token();
    let waiting = service.waiting();
    tokio::pin!(waiting);
    let mut next: Option<Instant> = None;
    loop {
        let (wake, arrived) = (next.map(tokio::time::Instant::from_std), &ledger.arrived);
        let due = async move {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => arrived.notified().await,
            }
        };
        let told = tokio::select! {
            _ = &mut waiting => {
                let _ = note(&mut to_client, &HandoverNote::Ended).await;
                return;
            }
            _ = &mut gone => {
                tracing::debug!(%workspace, "bundlevisor mcp went away: its session ends");
                stop.cancel();
                return;
            }
            Some(id) = closings.recv() => note(&mut to_client, &HandoverNote::Closed(id_value(&id))).await,
            _ = due => {
                let (due, at) = ledger.due(Instant::now());
                // Still open ones are checked again when due; with none
                // left, the next arrival wakes this loop.
                next = at.or_else(|| (!ledger.lock().is_empty()).then(|| Instant::now() + ANNOUNCE_AFTER));
                let mut told = Ok(());
                for id in due {
                    told = note(&mut to_client, &HandoverNote::Open(id_value(&id))).await;
                    if told.is_err() {
                        break;
                    }
                }
                told
            }
        };
        if told.is_err() {
            stop.cancel();
            return;
        }
    }
}

/// Whether `fd` was opened for reading (or writing, `write`), and not as
/// an `O_PATH` handle.
fn opened_for(fd: std::os::fd::BorrowedFd<'_>, write: bool) -> bool {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) else {
        return false;
    };
    let flags = OFlag::from_bits_truncate(flags);
    if flags.contains(OFlag::O_PATH) {
        return false;
    }
    let mode = flags & OFlag::O_ACCMODE;
    mode == OFlag::O_RDWR
        || mode
            == if write {
                OFlag::O_WRONLY
            } else {
                OFlag::O_RDONLY
            }
}

fn id_value(id: &RequestId) -> serde_json::Value {
    serde_json::to_value(id).unwrap_or_default()
}

/// Resolves when the client closes its side of the connection (it sends
/// nothing after the descriptors).
async fn client_gone(mut from_client: OwnedReadHalf) {
    let mut byte = [0u8; 1];
    while matches!(from_client.read(&mut byte).await, Ok(n) if n > 0) {}
}
