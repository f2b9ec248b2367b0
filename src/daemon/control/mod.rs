//! ControlServer: JSON-RPC 2.0 over the unix socket, one JSON object per
//! line. Each connection runs in its own task; after `daemon.hello`, each
//! request runs in a task of its own, so a slow install does not hold up a
//! `status` on the same connection. Responses and progress notifications go
//! through one writer task per connection.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::board::Event;
use super::bundle::{actor_name, Ask, BundleMsg, CallError, PendingCall, Respawn};
use super::supervisor::{DaemonMsg, InstallError};
use super::workspace::{FilesOp, WorkspaceMsg};
use super::Shared;
use crate::lines::{Line, LineReader};
use crate::manifest::ManifestError;
use crate::protocol::EventKind;
use crate::protocol::{
    method, BundleRef, BundleResult, BundleState, BundleStatus, BundleTools, CallParams,
    CallProgress, CancelParams, DaemonInfo, ErrorKind, FileContent, FilesList, FilesParams,
    FilesPutParams, HelloParams, HelloResult, InstallParams, LogsParams, LogsResult, MetricsResult,
    Notification, Progress, Request, Response, RpcError, StatusParams, StatusResult, ToolsParams,
    ToolsResult, UninstallParams, UninstallResult, Usage, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use crate::store::Origin;

mod credentials;
mod gateway;
mod peer;

pub use peer::tcp_refusal;

#[derive(Clone)]
struct Ctx {
    daemon: ActorRef<DaemonMsg>,
    shared: Arc<Shared>,
    /// Who is on the other end of this connection.
    peer: peer::Peer,
}

/// Sends lines to the connection's writer task; `closed` is cancelled when
/// the client has gone, which ends its subscriptions.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<String>,
    closed: CancellationToken,
}

impl Outbox {
    /// Returns false once the connection is gone.
    async fn send(&self, message: &impl Serialize) -> bool {
        match serde_json::to_string(message) {
            Ok(line) => self.tx.send(line).await.is_ok(),
            Err(_) => true,
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

/// Accepts connections until `shutdown` is cancelled.
pub async fn serve(
    listener: UnixListener,
    daemon: ActorRef<DaemonMsg>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(
        shared.config.control.max_connections,
    ));
    let ctx = Ctx {
        daemon,
        shared,
        peer: peer::Peer::daemon(),
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
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
fn peer_allowed(stream: &UnixStream, shared: &Shared) -> Result<peer::Peer, String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read peer credentials: {e}"))?;
    match peer::refusal(
        cred.uid(),
        cred.gid(),
        cred.pid(),
        &shared.config.control,
        &shared.config.sandbox,
    ) {
        None => Ok(peer::Peer { uid: cred.uid() }),
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

async fn connection(stream: UnixStream, mut ctx: Ctx) {
    match peer_allowed(&stream, &ctx.shared) {
        Ok(peer) => ctx.peer = peer,
        Err(why) => {
            tracing::warn!("control connection refused: {why}");
            refuse(stream, RpcError::new(ErrorKind::PermissionDenied, why)).await;
            return;
        }
    }
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(256);
    let writer = tokio::spawn(async move {
        while let Some(mut line) = rx.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let out = Outbox {
        tx,
        closed: CancellationToken::new(),
    };
    let mut lines = LineReader::new(BufReader::new(read), MAX_REQUEST_BYTES);
    let mut greeted = false;
    // Requests in flight on this connection, by id, for `cancel`.
    let in_flight: Arc<std::sync::Mutex<HashMap<String, CancellationToken>>> = Arc::default();
    let handshake = ctx.shared.config.control.handshake_timeout;
    loop {
        let next = if greeted {
            lines.next_line().await
        } else {
            match tokio::time::timeout(handshake, lines.next_line()).await {
                Ok(line) => line,
                Err(_) => {
                    let e = RpcError::new(
                        ErrorKind::HelloRequired,
                        format!(
                            "no {} within {}; closing the connection",
                            method::HELLO,
                            humantime::format_duration(handshake)
                        ),
                    );
                    out.send(&Response::err(Value::Null, e)).await;
                    break;
                }
            }
        };
        let line = match next {
            Ok(Line::Text(line)) => line,
            Ok(Line::TooLong) => {
                let e = RpcError::new(
                    ErrorKind::InvalidRequest,
                    format!("request is longer than {MAX_REQUEST_BYTES} bytes"),
                );
                out.send(&Response::err(Value::Null, e)).await;
                continue;
            }
            Ok(Line::Eof) | Err(_) => break,
        };
        if line.trim().is_empty() {
            continue;
        }
        let request = match serde_json::from_str::<Value>(&line) {
            Err(e) => Err((
                Value::Null,
                RpcError::new(ErrorKind::ParseError, format!("not valid JSON: {e}")),
            )),
            Ok(value) => Request::from_value(value),
        };
        let request = match request {
            Ok(r) => r,
            Err((id, e)) => {
                out.send(&Response::err(id, e)).await;
                continue;
            }
        };
        ctx.shared.metrics.control_request(&request.method);
        if !greeted {
            let response = if request.method == method::HELLO {
                let r = hello(request.params);
                greeted = r.is_ok();
                r
            } else {
                Err(RpcError::new(
                    ErrorKind::HelloRequired,
                    format!("the first request must be {}", method::HELLO),
                ))
            };
            out.send(&respond(request.id, response)).await;
            continue;
        }
        if request.method == method::CANCEL {
            let result = params::<CancelParams>(request.params).map(|p| {
                let token = in_flight
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&p.id.to_string());
                if let Some(t) = &token {
                    t.cancel();
                }
                json!({ "cancelled": token.is_some() })
            });
            out.send(&respond(request.id, result)).await;
            continue;
        }
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
            out.send(&respond(id, result)).await;
        });
    }
    out.closed.cancel();
    drop(out);
    let _ = writer.await;
}

fn respond(id: Value, result: Result<Value, RpcError>) -> Response {
    match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, e),
    }
}

/// Every method's params: the names in them checked (one rule for every
/// handler — names become paths and actor names), then deserialized.
fn params<T: DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    let value = if value.is_null() { json!({}) } else { value };
    check_names(&value)?;
    serde_json::from_value(value)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("invalid params: {e}")))
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

fn hello(p: Value) -> Result<Value, RpcError> {
    let p: HelloParams = params(p)?;
    if p.protocol != PROTOCOL_VERSION {
        return Err(RpcError::new(
            ErrorKind::ProtocolMismatch,
            format!(
                "client speaks control protocol {} but this daemon speaks {PROTOCOL_VERSION}; use the bundlevisor binary of the same release as the daemon",
                p.protocol
            ),
        )
        .with("daemon_protocol", PROTOCOL_VERSION));
    }
    to_value(HelloResult {
        protocol: PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
    })
}

async fn dispatch(
    request: Request,
    ctx: &Ctx,
    out: &Outbox,
    cancel: &CancellationToken,
) -> Result<Value, RpcError> {
    let id = request.id.clone();
    let p = request.params;
    match request.method.as_str() {
        method::HELLO => hello(p),
        method::STATUS => status(params_or_default(p)?, ctx),
        method::METRICS => to_value(MetricsResult {
            text: ctx
                .shared
                .metrics
                .render(&ctx.shared.board, ctx.shared.started_at.elapsed()),
        }),
        method::INSTALL => install(params(p)?, ctx, out).await,
        method::UNINSTALL => uninstall(params(p)?, ctx).await,
        method::RESTART => restart(params(p)?, ctx, out).await,
        method::TOOLS => tools(params(p)?, ctx).await,
        method::CALL => call(params(p)?, ctx, out, id, cancel).await,
        method::MCP => gateway::mcp(params(p)?).await,
        method::WORKSPACE_RESOURCES => gateway::workspace_resources(params(p)?, ctx).await,
        method::PROFILE => gateway::profile(params(p)?, ctx),
        method::LOGS => logs(params(p)?, ctx, out).await,
        method::EVENTS => {
            out.stream(method::EVENT, ctx.shared.board.subscribe(), |_| true);
            Ok(json!({ "subscribed": true }))
        }
        method::CONFIGURE => credentials::configure(params(p)?, ctx, out).await,
        method::AUTH_BEGIN => credentials::auth_begin(params(p)?, ctx).await,
        method::ROTATE_KEY => credentials::rotate_key(ctx).await,
        method::AUTH_COMPLETE => credentials::auth_complete(params(p)?, ctx, out).await,
        method::FILES_PUT => files_put(params(p)?, ctx).await,
        method::FILES_LS => files_ls(params(p)?, ctx).await,
        method::FILES_GET => files_get(params(p)?, ctx).await,
        method::FILES_RM => files_rm(params(p)?, ctx).await,
        method::FILES_CHECKPOINT => {
            let p: FilesParams = params(p)?;
            to_value(files_call(ctx, &p.workspace, FilesOp::Checkpoint).await?)
        }
        method::FILES_ROLLBACK => {
            let p: FilesParams = params(p)?;
            let checkpoint_id = require_id(&p)?;
            let id = checkpoint_id.clone();
            match files_call(ctx, &p.workspace, |reply| FilesOp::Rollback {
                checkpoint_id: id,
                reply,
            })
            .await?
            {
                Some(r) => to_value(r),
                None => Err(RpcError::new(
                    ErrorKind::FileNotFound,
                    format!(
                        "no checkpoint {checkpoint_id:?} in workspace {:?}",
                        p.workspace
                    ),
                )),
            }
        }
        #[cfg(feature = "fault-injection")]
        method::DEBUG_PANIC => {
            let r: BundleRef = params(p)?;
            bundle_actor(&r.workspace, &r.name)?
                .send_message(BundleMsg::Panic)
                .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?;
            Ok(json!({}))
        }
        other => Err(RpcError::new(
            ErrorKind::MethodNotFound,
            format!("unknown method {other:?}"),
        )
        .with("method", other)),
    }
}

/// Params that may be left out (`null`) entirely.
fn params_or_default<T: DeserializeOwned + Default>(value: Value) -> Result<T, RpcError> {
    if value.is_null() {
        return Ok(T::default());
    }
    params(value)
}

fn status(p: StatusParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let (workspaces, mut bundles) = ctx.shared.board.snapshot();
    if p.usage {
        for b in &mut bundles {
            let (calls, errors) = ctx.shared.metrics.calls_of(&b.workspace, &b.name);
            b.usage = Some(Usage {
                rss_bytes: b.pid.and_then(super::metrics::rss_bytes),
                calls,
                errors,
            });
        }
    }
    let config = &ctx.shared.config;
    to_value(StatusResult {
        daemon: DaemonInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            uptime_secs: ctx.shared.started_at.elapsed().as_secs(),
            socket: config.socket.display().to_string(),
            state_dir: config.state_dir.display().to_string(),
            metrics_addr: ctx.shared.metrics_addr.map(|a| a.to_string()),
        },
        workspaces,
        bundles,
    })
}

fn install_error(e: InstallError) -> RpcError {
    let message = e.to_string();
    match e {
        InstallError::InvalidName(_) => RpcError::new(ErrorKind::InvalidName, message),
        InstallError::NoSuchPath { path, .. } => RpcError::new(ErrorKind::InvalidParams, message)
            .with("path", path.display().to_string()),
        InstallError::Manifest(m) => {
            let err = RpcError::new(ErrorKind::ManifestInvalid, message);
            match m {
                ManifestError::Invalid { problems, .. } => err.with(
                    "problems",
                    problems
                        .iter()
                        .map(|p| json!({"path": p.path, "message": p.message}))
                        .collect::<Vec<_>>(),
                ),
                _ => err,
            }
        }
        InstallError::Gate(g) => RpcError::new(ErrorKind::GateRefused, message)
            .with("bundle", g.bundle)
            .with("missing", g.missing),
        InstallError::Sandbox(_) => RpcError::new(ErrorKind::SandboxRefused, message),
        InstallError::AlreadyInstalled { .. } => {
            RpcError::new(ErrorKind::AlreadyInstalled, message)
        }
        InstallError::NotInstalled { .. } => RpcError::new(ErrorKind::BundleNotFound, message),
        InstallError::Watched { .. } => RpcError::new(ErrorKind::WatchedBundle, message),
        InstallError::TimedOut(_) => RpcError::new(ErrorKind::Timeout, message),
        InstallError::Store(_) | InstallError::Internal(_) => {
            RpcError::new(ErrorKind::Internal, message)
        }
    }
}

fn not_found(workspace: &str, name: &str) -> RpcError {
    RpcError::new(
        ErrorKind::BundleNotFound,
        format!("no bundle {name:?} in workspace {workspace:?}; `bundlevisor status` lists the installed bundles"),
    )
}

fn bundle_actor(workspace: &str, name: &str) -> Result<ActorRef<BundleMsg>, RpcError> {
    ActorRef::<BundleMsg>::where_is(actor_name(workspace, name))
        .ok_or_else(|| not_found(workspace, name))
}

fn unavailable(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(
        ErrorKind::ShuttingDown,
        format!("the daemon could not handle the request: {e}"),
    )
}

/// Waits (at most `limit`) until the bundle is ready; false if it is not by then.
async fn wait_ready(ctx: &Ctx, workspace: &str, name: &str, limit: Duration) -> bool {
    let mut events = ctx.shared.board.subscribe();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match ctx.shared.board.get(workspace, name).map(|s| s.state) {
            Some(BundleState::Ready) => return true,
            Some(BundleState::Starting | BundleState::Restarting) => {}
            _ => return false,
        }
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) | Ok(Err(broadcast::error::RecvError::Closed)) => return false,
            Ok(_) => {}
        }
    }
}

/// A start that did not reach ready; the kind says whether the operator
/// must configure or authorize it.
fn not_started(workspace: &str, name: &str, state: BundleState, message: &str) -> RpcError {
    let (kind, what) = match state {
        BundleState::NeedsConfig => (ErrorKind::NeedsConfig, "needs configuration"),
        BundleState::NeedsAuth => (ErrorKind::NeedsAuth, "needs authorization"),
        _ => (ErrorKind::StartFailed, "failed to start"),
    };
    RpcError::new(kind, format!("bundle {name:?} {what}: {message}"))
        .with("workspace", workspace)
        .with("name", name)
        .with("state", state.as_str())
}

/// Waits for the bundle's next start to end in ready or not, forwarding
/// each transition as a progress notification. A start that fails (even one
/// that will be retried after a backoff) is reported as `start_failed`.
async fn wait_outcome(
    mut events: broadcast::Receiver<Event>,
    ctx: &Ctx,
    workspace: &str,
    name: &str,
    out: &Outbox,
) -> Result<BundleStatus, RpcError> {
    let settings = &ctx.shared.config.bundles;
    let limit = settings.start_timeout + settings.stop_grace + Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + limit;
    let mut started = false;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => {
                return Err(RpcError::new(
                    ErrorKind::Timeout,
                    format!(
                        "bundle {name:?} did not become ready within {}; see `bundlevisor status` and `bundlevisor logs {name}`",
                        humantime::format_duration(limit)
                    ),
                ))
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => return Err(unavailable("event stream closed")),
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                // Missed events: the board has the latest state.
                started = true;
                match ctx.shared.board.get(workspace, name) {
                    Some(s) if s.state == BundleState::Ready => return Ok(s),
                    Some(s) if matches!(s.state, BundleState::Failed | BundleState::NeedsConfig | BundleState::NeedsAuth) => {
                        return Err(not_started(workspace, name, s.state, s.last_error.as_deref().unwrap_or("unknown")))
                    }
                    _ => continue,
                }
            }
            Ok(Ok(event)) => event,
        };
        if event.workspace != workspace || event.name != name {
            continue;
        }
        out.progress(&event).await;
        match event.kind {
            EventKind::Starting => started = true,
            EventKind::Ready if started => {
                return ctx
                    .shared
                    .board
                    .get(workspace, name)
                    .ok_or_else(|| not_found(workspace, name));
            }
            EventKind::Failed
            | EventKind::Stopped
            | EventKind::Restarting
            | EventKind::NeedsConfig
            | EventKind::NeedsAuth
                if started =>
            {
                return Err(not_started(workspace, name, event.state, &event.message))
            }
            _ => {}
        }
    }
}

async fn install(p: InstallParams, ctx: &Ctx, out: &Outbox) -> Result<Value, RpcError> {
    let path = PathBuf::from(&p.path);
    let manifest = crate::manifest::manifest_file(&path);
    if !(ctx.peer.may_use(&path) && ctx.peer.may_use(&manifest)) {
        return Err(RpcError::new(
            ErrorKind::PermissionDenied,
            ctx.peer.not_theirs("bundle folder or manifest", &p.path),
        ));
    }
    let events = ctx.shared.board.subscribe();
    let record = ctx
        .daemon
        .call(
            |reply| DaemonMsg::Install {
                path,
                workspace: p.workspace.clone(),
                origin: Origin::Cli,
                reply,
            },
            Some(Duration::from_secs(60)),
        )
        .await
        .map_err(unavailable)?;
    let record = match record {
        CallResult::Success(r) => r.map_err(install_error)?,
        _ => {
            return Err(RpcError::new(
                ErrorKind::Timeout,
                "the daemon did not record the install in time",
            ))
        }
    };
    if p.no_wait {
        // The bundle's actor may not have published its first status yet.
        let bundle = ctx
            .shared
            .board
            .get(&record.workspace, &record.name)
            .unwrap_or_else(|| BundleStatus {
                workspace: record.workspace.clone(),
                name: record.name.clone(),
                version: None,
                state: BundleState::Starting,
                pid: None,
                uptime_secs: None,
                restarts: 0,
                tools: 0,
                last_error: None,
                source: record.source.display().to_string(),
                sandbox: None,
                usage: None,
            });
        return to_value(BundleResult { bundle });
    }
    let bundle = wait_outcome(events, ctx, &record.workspace, &record.name, out).await?;
    to_value(BundleResult { bundle })
}

async fn uninstall(p: UninstallParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let (workspace, name) = (p.workspace.clone(), p.name.clone());
    let result = ctx
        .daemon
        .call(
            |reply| DaemonMsg::Uninstall {
                workspace,
                name,
                reply,
            },
            Some(Duration::from_secs(90)),
        )
        .await
        .map_err(unavailable)?;
    match result {
        CallResult::Success(r) => r.map_err(install_error)?,
        _ => {
            return Err(RpcError::new(
                ErrorKind::Timeout,
                "uninstall did not finish in time",
            ))
        }
    }
    if p.purge {
        ctx.shared
            .credentials_of(&p.workspace, &p.name, |c, w, n| c.purge(w, n))
            .await
            .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?;
        tracing::info!(workspace = %p.workspace, bundle = %p.name, "stored credentials and tokens purged");
    }
    to_value(UninstallResult {
        workspace: p.workspace,
        name: p.name,
    })
}

async fn restart(p: BundleRef, ctx: &Ctx, out: &Outbox) -> Result<Value, RpcError> {
    let actor = bundle_actor(&p.workspace, &p.name)?;
    let events = ctx.shared.board.subscribe();
    actor
        .call(
            |r| BundleMsg::Respawn(Respawn::Operator, r),
            Some(Duration::from_secs(10)),
        )
        .await
        .map_err(unavailable)?;
    let bundle = wait_outcome(events, ctx, &p.workspace, &p.name, out).await?;
    to_value(BundleResult { bundle })
}

async fn tools(p: ToolsParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let names: Vec<String> = match &p.name {
        Some(name) => vec![name.clone()],
        None => ctx
            .shared
            .board
            .snapshot()
            .1
            .into_iter()
            .filter(|b| b.workspace == p.workspace)
            .map(|b| b.name)
            .collect(),
    };
    let mut bundles = Vec::new();
    for name in names {
        let actor = match bundle_actor(&p.workspace, &name) {
            Ok(a) => a,
            Err(e) if p.name.is_some() => return Err(e),
            Err(_) => continue,
        };
        match actor
            .call(BundleMsg::Tools, Some(Duration::from_secs(10)))
            .await
            .map_err(unavailable)?
        {
            CallResult::Success((state, tools)) => bundles.push(BundleTools {
                workspace: p.workspace.clone(),
                name,
                state,
                tools,
            }),
            _ => {
                return Err(RpcError::new(
                    ErrorKind::Timeout,
                    format!("bundle {name:?} did not answer in time"),
                ))
            }
        }
    }
    to_value(ToolsResult { bundles })
}

async fn call(
    p: CallParams,
    ctx: &Ctx,
    out: &Outbox,
    id: Value,
    cancel: &CancellationToken,
) -> Result<Value, RpcError> {
    let started = std::time::Instant::now();
    let answer = call_tool(&p, ctx, out, id, cancel).await;
    // A call of a bundle that is not installed is not a bundle's call.
    let unknown = |e: &RpcError| e.data.as_ref().map(|d| d.kind) == Some(ErrorKind::BundleNotFound);
    if !matches!(&answer, Err(e) if unknown(e)) {
        let ok = matches!(&answer, Ok(v) if v.get("isError") != Some(&Value::Bool(true)));
        ctx.shared
            .metrics
            .tool_call(&p.workspace, &p.name, started.elapsed(), ok);
    }
    answer
}

async fn call_tool(
    p: &CallParams,
    ctx: &Ctx,
    out: &Outbox,
    id: Value,
    cancel: &CancellationToken,
) -> Result<Value, RpcError> {
    let actor = bundle_actor(&p.workspace, &p.name)?;
    let timeout = p.timeout_ms.map(Duration::from_millis);
    let limit = timeout.unwrap_or(ctx.shared.config.bundles.call_timeout) + Duration::from_secs(5);
    let mut waited = false;
    let result = loop {
        // Progress goes out in order, ahead of the answer.
        let (progress, mut progress_rx) = if p.progress {
            let (tx, rx) = mpsc::channel::<rmcp::model::ProgressNotificationParam>(16);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let forward = |n: rmcp::model::ProgressNotificationParam| {
            Notification::new(
                method::CALL_PROGRESS,
                CallProgress {
                    id: id.clone(),
                    progress: n.progress,
                    total: n.total,
                    message: n.message,
                },
            )
        };
        let (tool, arguments, cancel) = (p.tool.clone(), p.arguments.clone(), cancel.clone());
        let answer = actor.call(
            |reply| {
                BundleMsg::Call(PendingCall {
                    request: Ask::Tool {
                        name: tool,
                        arguments,
                    },
                    timeout,
                    cancel,
                    progress,
                    reply,
                })
            },
            Some(limit),
        );
        tokio::pin!(answer);
        let result = loop {
            tokio::select! {
                biased;
                Some(n) = async {
                    match progress_rx.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => out.send(&forward(n)).await,
                r = &mut answer => break r.map_err(unavailable)?,
            };
        };
        if let Some(rx) = progress_rx.as_mut() {
            while let Ok(n) = rx.try_recv() {
                out.send(&forward(n)).await;
            }
        }
        // A bundle on its way up is waited for (bounded), then called once.
        if let (false, Some(wait), CallResult::Success(Err(CallError::NotReady { state, .. }))) =
            (waited, p.wait_ready_ms, &result)
        {
            if matches!(state, BundleState::Starting | BundleState::Restarting) {
                waited = true;
                if wait_ready(ctx, &p.workspace, &p.name, Duration::from_millis(wait)).await {
                    continue;
                }
            }
        }
        break result;
    };
    let name = p.name.clone();
    match result {
        CallResult::Success(Ok(value)) => Ok(value),
        CallResult::Success(Err(CallError::NotReady { state, last_error })) if waited => {
            Err(RpcError::new(
                ErrorKind::NotReady,
                format!(
                    "bundle {name:?} did not become ready within {} (it is {}{})",
                    humantime::format_duration(Duration::from_millis(p.wait_ready_ms.unwrap_or(0))),
                    state.as_str(),
                    last_error.map(|e| format!("; last error: {e}")).unwrap_or_default()
                ),
            )
            .with("state", state.as_str()))
        }
        CallResult::Success(Err(CallError::NotReady { state, last_error })) => Err(RpcError::new(
            ErrorKind::NotReady,
            match last_error {
                Some(e) if state == BundleState::Failed => {
                    format!("bundle {name:?} is failed ({e}); fix it, then `bundlevisor restart {name}`")
                }
                Some(e) => format!("bundle {name:?} is {}, not ready (last error: {e})", state.as_str()),
                None => format!("bundle {name:?} is {}, not ready", state.as_str()),
            },
        )
        .with("state", state.as_str())),
        CallResult::Success(Err(CallError::Timeout(t))) => Err(RpcError::new(
            ErrorKind::Timeout,
            format!(
                "tool {:?} of bundle {name:?} did not answer within {}",
                p.tool,
                humantime::format_duration(t)
            ),
        )),
        CallResult::Success(Err(CallError::Failed(e))) => Err(RpcError::new(
            ErrorKind::ToolCallFailed,
            format!("tool {:?} of bundle {name:?} failed: {e}", p.tool),
        )),
        CallResult::Success(Err(CallError::Cancelled)) => Err(RpcError::new(
            ErrorKind::Cancelled,
            format!("the call of tool {:?} of bundle {name:?} was cancelled", p.tool),
        )),
        CallResult::Success(Err(CallError::NoSuchTool)) => Err(RpcError::new(
            ErrorKind::ToolNotFound,
            format!(
                "bundle {name:?} has no tool {:?} (or the daemon config excludes it); `bundlevisor tools {name}` lists them",
                p.tool
            ),
        )),
        _ => Err(RpcError::new(
            ErrorKind::Timeout,
            format!("bundle {name:?} did not answer in time"),
        )),
    }
}

async fn logs(p: LogsParams, ctx: &Ctx, out: &Outbox) -> Result<Value, RpcError> {
    let path = ctx.shared.config.log_path(&p.workspace, &p.name);
    if !path.exists() && ctx.shared.board.get(&p.workspace, &p.name).is_none() {
        return Err(not_found(&p.workspace, &p.name));
    }
    if p.follow {
        // Subscribed before the tail is read: a line may show twice, none is lost.
        let (ws, name) = (p.workspace.clone(), p.name.clone());
        out.stream(
            method::LOG,
            ctx.shared.log_lines.subscribe(),
            move |l: &crate::protocol::LogLine| l.workspace == ws && l.name == name,
        );
    }
    let (file, n) = (path.clone(), p.lines);
    let lines = tokio::task::spawn_blocking(move || tail_lines(&file, n))
        .await
        .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|e| {
            RpcError::new(
                ErrorKind::Internal,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
    to_value(LogsResult {
        path: path.display().to_string(),
        lines,
    })
}

/// The actor of a workspace (created on first use).
async fn workspace(ctx: &Ctx, name: &str) -> Result<ActorRef<WorkspaceMsg>, RpcError> {
    let name = name.to_string();
    match ctx
        .daemon
        .call(
            |reply| DaemonMsg::Workspace { name, reply },
            Some(Duration::from_secs(10)),
        )
        .await
        .map_err(unavailable)?
    {
        CallResult::Success(r) => r.map_err(install_error),
        _ => Err(RpcError::new(
            ErrorKind::Timeout,
            "the daemon did not answer in time",
        )),
    }
}

/// Runs one FileStore operation in a workspace.
async fn files_call<T: Send + 'static>(
    ctx: &Ctx,
    ws: &str,
    op: impl FnOnce(RpcReplyPort<Result<T, String>>) -> FilesOp,
) -> Result<T, RpcError> {
    let actor = workspace(ctx, ws).await?;
    match actor
        .call(
            |reply| WorkspaceMsg::Files(op(reply)),
            Some(Duration::from_secs(120)),
        )
        .await
        .map_err(unavailable)?
    {
        CallResult::Success(r) => r.map_err(|e| RpcError::new(ErrorKind::FileError, e)),
        _ => Err(RpcError::new(
            ErrorKind::Timeout,
            "the file operation did not finish in time",
        )),
    }
}

fn file_not_found(ws: &str, id: &str) -> RpcError {
    RpcError::new(
        ErrorKind::FileNotFound,
        format!("no file {id:?} in workspace {ws:?}; `bundlevisor files ls -w {ws}` lists them"),
    )
}

fn require_id(p: &FilesParams) -> Result<String, RpcError> {
    p.id.clone()
        .ok_or_else(|| RpcError::new(ErrorKind::InvalidParams, "\"id\" is required"))
}

async fn files_put(p: FilesPutParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let refused = |message: String| {
        Err(RpcError::new(ErrorKind::InvalidParams, message).with("path", p.path.clone()))
    };
    // Opened here, checked against the peer, and read by the store through
    // this very descriptor: a path swapped after the check changes nothing.
    let file = std::fs::File::open(&p.path)
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
    let file = match file {
        Some(f) if ctx.peer.may_read(&f) => f,
        Some(_) => return refused(ctx.peer.not_theirs("file", &p.path)),
        None if !ctx.peer.is_daemon_uid() => return refused(ctx.peer.not_theirs("file", &p.path)),
        None => return refused(format!("{} is not a readable file", p.path)),
    };
    use std::os::fd::AsRawFd;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let filename = Path::new(&p.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let (tags, mime) = (p.tags, p.mime);
    let record = files_call(ctx, &p.workspace, |reply| FilesOp::Put {
        path,
        filename,
        tags,
        mime,
        reply,
    })
    .await?;
    drop(file);
    to_value(record)
}

async fn files_ls(p: FilesParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let files = files_call(ctx, &p.workspace, FilesOp::List).await?;
    to_value(FilesList {
        workspace: p.workspace,
        files,
    })
}

async fn files_get(p: FilesParams, ctx: &Ctx) -> Result<Value, RpcError> {
    use base64::Engine;
    let id = require_id(&p)?;
    let found = files_call(ctx, &p.workspace, |reply| FilesOp::Get {
        id: id.clone(),
        reply,
    })
    .await?;
    let (file, bytes) = found.ok_or_else(|| file_not_found(&p.workspace, &id))?;
    to_value(FileContent {
        file,
        base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

async fn files_rm(p: FilesParams, ctx: &Ctx) -> Result<Value, RpcError> {
    let id = require_id(&p)?;
    if !files_call(ctx, &p.workspace, |reply| FilesOp::Remove {
        id: id.clone(),
        reply,
    })
    .await?
    {
        return Err(file_not_found(&p.workspace, &id));
    }
    Ok(json!({ "workspace": p.workspace, "id": id, "removed": true }))
}

/// The last `n` lines of a file, read backwards in chunks.
fn tail_lines(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.seek(SeekFrom::End(0))?;
    let mut pos = len;
    let mut buf: Vec<u8> = Vec::new();
    const CHUNK: u64 = 64 * 1024;
    while pos > 0 && buf.iter().filter(|&&b| b == b'\n').count() <= n {
        let step = CHUNK.min(pos);
        pos -= step;
        file.seek(SeekFrom::Start(pos))?;
        let mut chunk = vec![0; step as usize];
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    Ok(lines[start..].iter().map(|s| s.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::tail_lines;

    #[test]
    fn tail_reads_the_last_lines_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.log");
        let text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            tail_lines(&path, 3).unwrap(),
            vec!["line 19997", "line 19998", "line 19999"]
        );
        assert_eq!(tail_lines(&path, 0).unwrap(), Vec::<String>::new());
        assert_eq!(
            tail_lines(&dir.path().join("none"), 5).unwrap(),
            Vec::<String>::new()
        );
    }
}
