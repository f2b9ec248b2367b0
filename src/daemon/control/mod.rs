//! ControlServer: JSON-RPC 2.0 over the unix socket, one JSON object per
//! line. Each connection runs in its own task; after `daemon.hello`, each
//! request runs in a task of its own, so a slow install does not hold up a
//! `status` on the same connection. Responses and progress notifications go
//! through one writer task per connection.
//!
//! Every method is a type (`protocol::typed`: name, params, result) that
//! the clients share, made from one list with the `Request` enum and the
//! `Handlers` trait; [`dispatch`] parses the params of that type (unknown
//! params refused, names checked) and runs the method's handler
//! ([`Handling`]: one per method, or it does not compile), each a call of
//! its family's file: `status.rs`, `install.rs`, `call.rs`, `logs.rs`,
//! `files.rs`, `gateway.rs`, `credentials.rs`, `tokens.rs`. Handlers ask
//! the daemon through its API (`daemon::api`); `wire.rs` turns its
//! refusals into this face's errors.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::admission;
use super::api::Api;
use super::board::Event;
use super::supervisor::DaemonMsg;
use super::Shared;
use crate::lines::{Line, LineReader};
use crate::protocol::typed::{self as m, Cancelled, Done, FileRemoved, Method, Subscribed};
use crate::protocol::{
    method, AttachParams, AuthBeginParams, AuthBeginResult, AuthCompleteParams, BundleRef,
    BundleResult, CallParams, CancelParams, Checkpoint, ConfigureParams, ConfigureResult,
    ErrorKind, FileContent, FileRecord, FilesList, FilesParams, FilesPutParams, InstallParams,
    LogsParams, LogsResult, McpParams, MetricsResult, NoParams, Notification, ProfileParams,
    Progress, Request, Response, Rollback, RotateKeyResult, RpcError, StatusParams, StatusResult,
    TokenCreateParams, TokenCreated, TokenInfo, TokenListParams, TokenRevokeParams, Tokens,
    ToolsParams, ToolsResult, UninstallParams, UninstallResult, WorkspaceResourcesParams,
    MAX_REQUEST_BYTES,
};

mod attached;
mod call;
mod credentials;
mod files;
mod gateway;
mod handover;
mod install;
mod logs;
pub(crate) use logs::tail_lines;
mod status;
mod tokens;
mod wire;

#[derive(Clone)]
struct Ctx {
    /// The daemon's one door (handlers ask through it).
    api: Api,
    /// What the daemon was configured with, and its shared state.
    shared: Arc<Shared>,
    /// Who is on the other end of this connection.
    peer: admission::Peer,
}

/// Sends lines to the connection's writer task; `closed` is cancelled when
/// the client has gone, which ends its subscriptions.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::UnboundedSender<String>,
    closed: CancellationToken,
    /// What waits for the client: bytes queued for the writer (not the
    /// line it is writing), held under `[control] max_output_bytes`.
    queue: Arc<Backlog>,
}

/// The output a client has not taken yet, and the cut-off when it grows
/// past the cap.
struct Backlog {
    bytes: std::sync::atomic::AtomicUsize,
    cap: usize,
    /// Cancelled when the client is cut off: the writer and the reader stop.
    cut: CancellationToken,
    peer: String,
}

impl Backlog {
    /// Takes `n` bytes into the queue, or cuts the client off (once, with
    /// the reason logged) when the queue is already at the cap.
    fn take(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        if self.cut.is_cancelled() {
            return false;
        }
        let before = self.bytes.fetch_add(n, Ordering::SeqCst);
        if before < self.cap {
            return true;
        }
        self.bytes.fetch_sub(n, Ordering::SeqCst);
        if !self.cut.is_cancelled() {
            self.cut.cancel();
            tracing::warn!(
                peer = %self.peer,
                queued = before,
                "control client cut off: it does not read its answers ({before} bytes waiting, [control] max_output_bytes = {})",
                self.cap
            );
        }
        false
    }

    fn taken(&self, n: usize) {
        self.bytes.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Outbox {
    /// Returns false once the connection is gone (or cut off).
    async fn send(&self, message: &impl Serialize) -> bool {
        let Ok(line) = serde_json::to_string(message) else {
            return true;
        };
        if !self.queue.take(line.len()) {
            self.closed.cancel();
            return false;
        }
        let n = line.len();
        if self.tx.send(line).is_ok() {
            true
        } else {
            self.queue.taken(n);
            false
        }
    }

    /// Forwards `rx` as notifications (those `keep` selects) until the
    /// client leaves or the stream ends.
    fn stream<T: Clone + Serialize + Send + 'static>(
        &self,
        method: &'static str,
        mut rx: broadcast::Receiver<T>,
        keep: impl Fn(&T) -> bool + Send + 'static,
    ) {
        let out = self.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    _ = out.closed.cancelled() => return,
                    item = rx.recv() => item,
                };
                match item {
                    Ok(item) if keep(&item) => {
                        if !out.send(&Notification::new(method, item)).await {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => tracing::warn!(
                        "a {method} subscriber fell behind; {n} notifications dropped"
                    ),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// Each event of a bundle's start as a progress notification, for
    /// the API's waits.
    fn forwarding(&self) -> impl FnMut(Event) -> futures::future::BoxFuture<'static, ()> {
        let out = self.clone();
        move |event| {
            let out = out.clone();
            Box::pin(async move { out.progress(&event).await })
        }
    }

    async fn progress(&self, event: &Event) {
        let params = Progress {
            workspace: event.workspace.clone(),
            name: event.name.clone(),
            kind: event.kind,
            state: event.state,
            message: event.message.clone(),
        };
        self.send(&Notification::new(method::PROGRESS, params))
            .await;
    }
}

/// Connection slots: `max_connections` in all, of which the last is only
/// for the daemon's own uid (and root), so that other allowed users can
/// never lock the operator out.
struct ConnectionSlots {
    all: Arc<tokio::sync::Semaphore>,
    others: Arc<tokio::sync::Semaphore>,
}

/// A held connection slot (both permits, for a peer that is not the operator).
struct ConnectionSlot(
    #[allow(dead_code)] tokio::sync::OwnedSemaphorePermit,
    #[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>,
);

impl ConnectionSlots {
    fn new(max: usize) -> ConnectionSlots {
        ConnectionSlots {
            all: Arc::new(tokio::sync::Semaphore::new(max)),
            others: Arc::new(tokio::sync::Semaphore::new(max.saturating_sub(1))),
        }
    }

    /// A slot for a peer of uid `uid` (None: unknown), if one is free to it.
    fn take(&self, uid: Option<u32>) -> Option<ConnectionSlot> {
        let me = nix::unistd::geteuid().as_raw();
        let operator = uid.is_some_and(|u| u == me || u == 0);
        let other = if operator {
            None
        } else {
            Some(self.others.clone().try_acquire_owned().ok()?)
        };
        let all = self.all.clone().try_acquire_owned().ok()?;
        Some(ConnectionSlot(all, other))
    }
}

/// Accepts connections until `shutdown` is cancelled.
pub async fn serve(
    listener: UnixListener,
    daemon: ActorRef<DaemonMsg>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let slots = ConnectionSlots::new(shared.config.control.max_connections);
    let ctx = Ctx {
        api: Api::new(daemon, shared.clone()),
        shared,
        peer: admission::Peer::daemon(),
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let uid = stream.peer_cred().ok().map(|c| c.uid());
                    let Some(slot) = slots.take(uid) else {
                        let max = ctx.shared.config.control.max_connections;
                        tracing::warn!(max, "control connection refused: too many connections");
                        tokio::spawn(refuse(
                            stream,
                            RpcError::new(
                                ErrorKind::TooManyConnections,
                                format!("the daemon is serving its maximum of {max} control connections ([control] max_connections); try again"),
                            ),
                        ));
                        continue;
                    };
                    let ctx = ctx.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = connection(stream, ctx) => {}
                            _ = shutdown.cancelled() => {}
                        }
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The peer's credentials (SO_PEERCRED) against the daemon's uid, the
/// configured `allowed_uids` / `allowed_gids`, and the bundles (peer.rs).
fn peer_allowed(
    cred: tokio::net::unix::UCred,
    process: Option<admission::PeerProcess>,
    shared: &Shared,
) -> Result<admission::Peer, String> {
    match admission::refusal(
        cred.uid(),
        cred.gid(),
        process.as_ref(),
        &shared.config.control,
        &shared.config.sandbox,
    ) {
        None => Ok(admission::Peer { uid: cred.uid() }),
        Some(why) => Err(why),
    }
}

/// Answers one error line and closes. What the client sends meanwhile (its
/// hello) is read and dropped for a moment, so its write does not fail
/// before it has read why.
async fn refuse(mut stream: UnixStream, error: RpcError) {
    use tokio::io::AsyncReadExt;
    let refusal = Response::err(Value::Null, error);
    let Ok(line) = serde_json::to_string(&refusal) else {
        return;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(format!("{line}\n").as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// The peer of a new connection, if admitted (admission.rs; the check
/// walks /proc, so it runs off the event loop).
async fn admit(stream: &UnixStream, ctx: &Ctx) -> Result<admission::Peer, String> {
    match stream.peer_cred() {
        Err(e) => Err(format!("cannot read peer credentials: {e}")),
        Ok(cred) => {
            use std::os::fd::AsFd;
            // Pinned now, while the connection is fresh: SO_PEERPIDFD.
            let process = cred
                .pid()
                .map(|pid| admission::PeerProcess::of(stream.as_fd(), pid));
            let shared = ctx.shared.clone();
            tokio::task::spawn_blocking(move || peer_allowed(cred, process, &shared))
                .await
                .unwrap_or_else(|e| Err(format!("the peer check failed: {e}")))
        }
    }
}

/// The connection's writer task: writes what the [`Outbox`] queues, until
/// the client is gone or cut off, or (`handover` cancelled) until the
/// queue is written, then gives the socket back.
fn writer(
    mut write: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<String>,
    queue: Arc<Backlog>,
    handover: CancellationToken,
) -> tokio::task::JoinHandle<tokio::net::unix::OwnedWriteHalf> {
    tokio::spawn(async move {
        loop {
            let mut line = tokio::select! {
                _ = queue.cut.cancelled() => break,
                line = rx.recv() => match line {
                    Some(line) => line,
                    None => break,
                },
                _ = handover.cancelled() => match rx.try_recv() {
                    Ok(line) => line,
                    Err(_) => break,
                },
            };
            queue.taken(line.len());
            line.push('\n');
            let written = tokio::select! {
                _ = queue.cut.cancelled() => false,
                r = write.write_all(line.as_bytes()) => r.is_ok(),
            };
            if !written {
                break;
            }
        }
        write
    })
}

/// What reading the next request gave.
enum Next {
    Request(Request),
    /// Nothing to handle (a blank line; an unparsable one, answered).
    Skip,
    Close,
}

/// Reads and parses the next request; before the hello only until the
/// handshake deadline (then says so and closes).
async fn next_request(
    lines: &mut LineReader<BufReader<tokio::net::unix::OwnedReadHalf>>,
    out: &Outbox,
    greeted: bool,
    deadline: tokio::time::Instant,
    settings: &crate::config::ControlSettings,
) -> Next {
    let next = tokio::select! {
        _ = out.queue.cut.cancelled() => return Next::Close,
        next = async {
            if greeted {
                Some(lines.next_line().await)
            } else {
                tokio::time::timeout_at(deadline, lines.next_line()).await.ok()
            }
        } => next,
    };
    let Some(next) = next else {
        let e = RpcError::new(
            ErrorKind::HelloRequired,
            format!(
                "no {} within {} of connecting; closing the connection",
                method::HELLO,
                humantime::format_duration(settings.handshake_timeout)
            ),
        );
        out.send(&Response::err(Value::Null, e)).await;
        return Next::Close;
    };
    let line = match next {
        Ok(Line::Text(line)) => line,
        Ok(Line::TooLong) => {
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                format!("request is longer than {MAX_REQUEST_BYTES} bytes"),
            );
            out.send(&Response::err(Value::Null, e)).await;
            return Next::Skip;
        }
        Ok(Line::Eof) | Err(_) => return Next::Close,
    };
    if line.trim().is_empty() {
        return Next::Skip;
    }
    let request = match serde_json::from_str::<Value>(&line) {
        Err(e) => Err((
            Value::Null,
            RpcError::new(ErrorKind::ParseError, format!("not valid JSON: {e}")),
        )),
        Ok(value) => Request::from_value(value),
    };
    match request {
        Ok(r) => Next::Request(r),
        Err((id, e)) => {
            out.send(&Response::err(id, e)).await;
            Next::Skip
        }
    }
}

/// Requests in flight on one connection, by id, for `cancel`.
type InFlight = Arc<std::sync::Mutex<HashMap<String, CancellationToken>>>;

/// `cancel`: cancels the request of that id, if it is in flight here.
async fn cancel(params: Value, in_flight: &InFlight) -> Result<Value, RpcError> {
    handle::<m::Cancel, _>(params, |p: CancelParams| async move {
        let token = in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p.id.to_string());
        if let Some(t) = &token {
            t.cancel();
        }
        Ok(Cancelled {
            cancelled: token.is_some(),
        })
    })
    .await
}

/// A gateway session asked for with `gateway.attach`: its params and
/// profile, checked.
type Attach = (AttachParams, gateway::Scope);

/// `gateway.attach`, checked: only on a connection with nothing else in
/// flight (`idle`), as what follows the answer is MCP.
async fn attach(params: Value, idle: bool, ctx: &Ctx) -> Result<Attach, RpcError> {
    let p = self::params::<<m::Attach as Method>::Params>(params)?;
    if !idle {
        return Err(RpcError::new(
            ErrorKind::InvalidRequest,
            format!(
                "{} needs a connection with no request in flight",
                m::Attach::NAME
            ),
        ));
    }
    let scope = gateway::attach_check(&p, ctx).await?;
    Ok((p, scope))
}

/// Runs a dispatched request in a task of its own, its answer queued
/// before the connection may read the next request (`permit`).
fn spawn_request(
    request: Request,
    ctx: &Ctx,
    out: &Outbox,
    in_flight: &InFlight,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let key = request.id.to_string();
    let cancel = out.closed.child_token();
    in_flight
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.clone(), cancel.clone());
    let (ctx, out, in_flight) = (ctx.clone(), out.clone(), in_flight.clone());
    tokio::spawn(async move {
        let id = request.id.clone();
        let result = dispatch(request, &ctx, &out, &cancel).await;
        in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        out.send(&answer(id, result)).await;
        drop(permit);
    });
}

/// Serves the requests of an admitted connection until it closes, or
/// until it asks to become a gateway session (returned).
async fn serve_requests(
    lines: &mut LineReader<BufReader<tokio::net::unix::OwnedReadHalf>>,
    out: &Outbox,
    ctx: &Ctx,
    deadline: tokio::time::Instant,
) -> Option<Attach> {
    let settings = &ctx.shared.config.control;
    let mut greeted = false;
    let in_flight: InFlight = Arc::default();
    // At most `max_in_flight` requests are handled at once: the next line
    // is read only when a permit is free.
    let permits = Arc::new(tokio::sync::Semaphore::new(settings.max_in_flight));
    loop {
        let permit = tokio::select! {
            _ = out.queue.cut.cancelled() => return None,
            p = permits.clone().acquire_owned() => p.ok()?,
        };
        let request = match next_request(lines, out, greeted, deadline, settings).await {
            Next::Request(r) => r,
            Next::Skip => continue,
            Next::Close => return None,
        };
        ctx.shared.metrics.control_request(&request.method);
        if !greeted {
            let response = if request.method == m::Hello::NAME {
                let r = handle::<m::Hello, _>(request.params, |p| async { status::hello(p) }).await;
                greeted = r.is_ok();
                r
            } else {
                Err(RpcError::new(
                    ErrorKind::HelloRequired,
                    format!("the first request must be {}", method::HELLO),
                ))
            };
            out.send(&respond(request.id, response)).await;
        } else if request.method == m::Attach::NAME {
            let idle = permits.available_permits() + 1 == settings.max_in_flight;
            match attach(request.params, idle, ctx).await {
                Ok(session) => {
                    out.send(&respond(request.id, to_value(m::Done {}))).await;
                    return Some(session);
                }
                Err(e) => out.send(&Response::err(request.id, e)).await,
            };
        } else if request.method == m::Cancel::NAME {
            let result = cancel(request.params, &in_flight).await;
            out.send(&respond(request.id, result)).await;
        } else {
            spawn_request(request, ctx, out, &in_flight, permit);
        }
    }
}

async fn connection(stream: UnixStream, mut ctx: Ctx) {
    let settings = ctx.shared.config.control.clone();
    // The handshake deadline runs from the connection, whatever it sends.
    let deadline = tokio::time::Instant::now() + settings.handshake_timeout;
    match admit(&stream, &ctx).await {
        Ok(peer) => ctx.peer = peer,
        Err(why) => {
            tracing::warn!("control connection refused: {why}");
            refuse(stream, RpcError::new(ErrorKind::PermissionDenied, why)).await;
            return;
        }
    }
    let (read, write) = stream.into_split();
    // Unbounded in lines, bounded in bytes (`Backlog`).
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let queue = Arc::new(Backlog {
        bytes: Default::default(),
        cap: settings.max_output_bytes,
        cut: CancellationToken::new(),
        peer: format!("uid {}", ctx.peer.uid),
    });
    // Cancelled when the connection becomes a gateway session: the writer
    // writes what is queued (the answer to `gateway.attach`) and gives the
    // socket back.
    let handover = CancellationToken::new();
    let writer = writer(write, rx, queue.clone(), handover.clone());
    let out = Outbox {
        tx,
        closed: CancellationToken::new(),
        queue,
    };
    let mut lines = LineReader::new(BufReader::new(read), MAX_REQUEST_BYTES);
    let attached = serve_requests(&mut lines, &out, &ctx, deadline).await;
    // Subscriptions of the connection stop writing.
    out.closed.cancel();
    let Some((params, scope)) = attached else {
        drop(out);
        let _ = writer.await;
        return;
    };
    // The writer writes the answer and gives the socket back.
    handover.cancel();
    let Ok(write) = writer.await else {
        return;
    };
    drop(out);
    // Whatever the agent sent after its request is still in the reader.
    let read = lines.into_inner();
    if !params.handover {
        attached::serve_attached(read, write, params, scope, &ctx).await;
        return;
    }
    // The client sends its descriptors after the answer, and nothing else.
    if !read.buffer().is_empty() {
        tracing::debug!("gateway.attach with handover: bytes came before the descriptors");
        return;
    }
    if let Ok(stream) = read.into_inner().reunite(write) {
        handover::serve(stream, params, scope, ctx).await;
    }
}

fn respond(id: Value, result: Result<Value, RpcError>) -> Response {
    match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, e),
    }
}

/// A dispatched request's answer as it goes on the wire, its result
/// already JSON text.
#[derive(serde::Serialize)]
struct Answer {
    jsonrpc: &'static str,
    id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Box<serde_json::value::RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<RpcError>,
}

fn answer(id: Value, result: Result<Box<serde_json::value::RawValue>, RpcError>) -> Answer {
    let (result, error) = match result {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    Answer {
        jsonrpc: crate::protocol::jsonrpc::JSONRPC,
        id,
        result,
        error,
    }
}

/// Every method's params: the names in them checked (one rule for every
/// handler — names become paths and actor names), then deserialized.
fn params<T: DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    serde_json::from_value(checked(value)?)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("invalid params: {e}")))
}

/// Params with their names checked (`null` is `{}`).
fn checked(value: Value) -> Result<Value, RpcError> {
    let value = if value.is_null() { json!({}) } else { value };
    check_names(&value)?;
    Ok(value)
}

/// `workspace` and `name` (a bundle or profile) of any request must be
/// names as `names::check_name` defines them.
fn check_names(params: &Value) -> Result<(), RpcError> {
    for (field, what) in [("workspace", "workspace"), ("name", "bundle")] {
        if let Some(Value::String(value)) = params.get(field) {
            crate::names::check_name(what, value).map_err(|e| {
                RpcError::new(ErrorKind::InvalidName, format!("{field}: {e}")).with("field", field)
            })?;
        }
    }
    Ok(())
}

fn to_value(v: impl Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))
}

/// Runs one typed method: its params deserialized (unknown ones refused,
/// names checked), its handler, its result serialized.
async fn handle<M: Method, F>(
    params: Value,
    run: impl FnOnce(M::Params) -> F,
) -> Result<Value, RpcError>
where
    F: Future<Output = Result<M::Result, RpcError>>,
{
    to_value(run(self::params::<M::Params>(params)?).await?)
}

/// The handlers of one request: every dispatched method of
/// `protocol::typed` has one here (a method without one does not compile),
/// each a call of its family's file.
struct Handling<'a> {
    ctx: &'a Ctx,
    out: &'a Outbox,
    id: Value,
    cancel: &'a CancellationToken,
}

impl m::Handlers for Handling<'_> {
    async fn status(&self, p: StatusParams) -> Result<StatusResult, RpcError> {
        status::status(p, self.ctx).await
    }
    async fn metrics(&self, p: NoParams) -> Result<MetricsResult, RpcError> {
        status::metrics(p, self.ctx).await
    }
    async fn dashboard_login(
        &self,
        p: NoParams,
    ) -> Result<crate::protocol::DashboardLink, RpcError> {
        status::dashboard_login(p, self.ctx)
    }
    async fn events(&self, p: NoParams) -> Result<Subscribed, RpcError> {
        status::events(p, self.ctx, self.out).await
    }
    async fn install(&self, p: InstallParams) -> Result<BundleResult, RpcError> {
        install::install(p, self.ctx, self.out).await
    }
    async fn upgrade(&self, p: InstallParams) -> Result<BundleResult, RpcError> {
        install::upgrade(p, self.ctx, self.out).await
    }
    async fn uninstall(&self, p: UninstallParams) -> Result<UninstallResult, RpcError> {
        install::uninstall(p, self.ctx).await
    }
    async fn restart(&self, p: BundleRef) -> Result<BundleResult, RpcError> {
        install::restart(p, self.ctx, self.out).await
    }
    async fn tools(&self, p: ToolsParams) -> Result<ToolsResult, RpcError> {
        call::tools(p, self.ctx).await
    }
    async fn call(&self, p: CallParams) -> Result<Value, RpcError> {
        call::call(p, self.ctx, self.out, self.id.clone(), self.cancel).await
    }
    async fn logs(&self, p: LogsParams) -> Result<LogsResult, RpcError> {
        logs::logs(p, self.ctx, self.out).await
    }
    async fn configure(&self, p: ConfigureParams) -> Result<ConfigureResult, RpcError> {
        credentials::configure(p, self.ctx, self.out).await
    }
    async fn mcp(&self, p: McpParams) -> Result<Value, RpcError> {
        gateway::mcp(p, self.ctx).await
    }
    async fn workspace_resources(&self, p: WorkspaceResourcesParams) -> Result<Value, RpcError> {
        gateway::workspace_resources(p, self.ctx).await
    }
    async fn profile(&self, p: ProfileParams) -> Result<Value, RpcError> {
        gateway::profile(p, self.ctx).await
    }
    async fn auth_begin(&self, p: AuthBeginParams) -> Result<AuthBeginResult, RpcError> {
        credentials::auth_begin(p, self.ctx).await
    }
    async fn auth_complete(&self, p: AuthCompleteParams) -> Result<BundleResult, RpcError> {
        credentials::auth_complete(p, self.ctx, self.out).await
    }
    async fn files_put(&self, p: FilesPutParams) -> Result<FileRecord, RpcError> {
        files::files_put(p, self.ctx).await
    }
    async fn files_ls(&self, p: FilesParams) -> Result<FilesList, RpcError> {
        files::files_ls(p, self.ctx).await
    }
    async fn files_get(&self, p: FilesParams) -> Result<FileContent, RpcError> {
        files::files_get(p, self.ctx).await
    }
    async fn files_rm(&self, p: FilesParams) -> Result<FileRemoved, RpcError> {
        files::files_rm(p, self.ctx).await
    }
    async fn files_checkpoint(&self, p: FilesParams) -> Result<Checkpoint, RpcError> {
        files::files_checkpoint(p, self.ctx).await
    }
    async fn files_rollback(&self, p: FilesParams) -> Result<Rollback, RpcError> {
        files::files_rollback(p, self.ctx).await
    }
    async fn debug_panic(&self, p: BundleRef) -> Result<Done, RpcError> {
        debug_panic(p)
    }
    async fn rotate_key(&self, p: NoParams) -> Result<RotateKeyResult, RpcError> {
        credentials::rotate_key(p, self.ctx).await
    }

    async fn credentials_list(
        &self,
        p: crate::protocol::CredentialsListParams,
    ) -> Result<crate::protocol::StoredCredentials, RpcError> {
        credentials::list(p, self.ctx).await
    }
    async fn audit(
        &self,
        p: crate::protocol::AuditParams,
    ) -> Result<crate::protocol::AuditEntries, RpcError> {
        tokens::audit(p, self.ctx).await
    }
    async fn token_create(&self, p: TokenCreateParams) -> Result<TokenCreated, RpcError> {
        tokens::create(p, self.ctx).await
    }
    async fn token_list(&self, p: TokenListParams) -> Result<Tokens, RpcError> {
        tokens::list(p, self.ctx).await
    }
    async fn token_revoke(&self, p: TokenRevokeParams) -> Result<TokenInfo, RpcError> {
        tokens::revoke(p, self.ctx).await
    }
}

/// `debug.panic_bundle_actor`: only a daemon built with `fault-injection`
/// serves it; any other answers as for a method it does not know.
fn debug_panic(p: BundleRef) -> Result<Done, RpcError> {
    #[cfg(feature = "fault-injection")]
    {
        Api::bundle_actor(&p.workspace, &p.name)?
            .send_message(crate::daemon::bundle::BundleMsg::Panic)
            .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?;
        Ok(Done {})
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = p;
        Err(unknown_method(method::DEBUG_PANIC))
    }
}

fn unknown_method(name: &str) -> RpcError {
    RpcError::new(
        ErrorKind::MethodNotFound,
        format!("unknown method {name:?}"),
    )
    .with("method", name)
}

/// Every method after `daemon.hello` and `cancel`: its params' names
/// checked, its params parsed (unknown ones refused), its handler run.
async fn dispatch(
    request: Request,
    ctx: &Ctx,
    out: &Outbox,
    cancel: &CancellationToken,
) -> Result<Box<serde_json::value::RawValue>, RpcError> {
    // Served only by a daemon built for fault injection.
    if request.method == method::DEBUG_PANIC && !cfg!(feature = "fault-injection") {
        return Err(unknown_method(&request.method));
    }
    let params = checked(request.params)?;
    let typed = match m::Request::parse(&request.method, params) {
        None => return Err(unknown_method(&request.method)),
        Some(parsed) => parsed
            .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("invalid params: {e}")))?,
    };
    let handling = Handling {
        ctx,
        out,
        id: request.id,
        cancel,
    };
    m::dispatch(&handling, typed).await
}
