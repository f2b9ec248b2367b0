//! The gateway over streamable HTTP (`[http] listen`; docs/gateway.md,
//! "Over HTTP"): `/mcp/WS` and `/mcp/WS/PROFILE` serve a workspace (or one
//! of its profiles) as one MCP server to agents that hold an access token.
//!
//! - One implementation for both transports: each HTTP session is the same
//!   [`Gateway`] that `bundlevisor mcp` serves on stdio, served by rmcp's
//!   streamable HTTP server (both protocol revisions, `Mcp-Session-Id`, the
//!   GET stream, `Host`/`Origin` validation, the body cap).
//! - Admission: `Authorization: Bearer TOKEN` of a token made with
//!   `bundlevisor token create` (looked up by its SHA-256). None, or one
//!   that is unknown, revoked or expired: 401 with `WWW-Authenticate`
//!   naming the RFC 9728 protected-resource metadata. A token of another
//!   workspace or profile: 403, the same answer whether that workspace
//!   exists or not.
//! - Each token may make `[http] rate_per_sec` requests a second (a bucket
//!   of `burst`); beyond, 429 with `Retry-After`.
//! - At most `[http] max_sessions` sessions per endpoint (503 beyond).
//! - Bundles are refused (the `/proc` check of the metrics listener, once
//!   per TCP connection); `TCP_NODELAY` on every connection; HTTPS with
//!   `tls_cert`/`tls_key` (rustls, each handshake in a task of its own).
//! - A token's text never reaches a log line or an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::gateway::{Backend, Gateway, DEFAULT_WAIT_READY};

/// The request body cap when `[http] max_body_bytes` is 0.
const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;

type Endpoint = StreamableHttpService<Gateway, LocalSessionManager>;

/// The client of one TCP connection, and (once looked up, for the whole
/// connection) why it is refused, if it is: a bundle's socket.
#[derive(Clone)]
struct Peer {
    addr: SocketAddr,
    refusal: Arc<tokio::sync::OnceCell<Option<String>>>,
}

impl Peer {
    /// A new connection: not looked up yet.
    fn at(addr: SocketAddr) -> Peer {
        Peer {
            addr,
            refusal: Arc::default(),
        }
    }
}

/// The gateway's listener: every connection without Nagle's delay (small
/// request/answer exchanges; 40 ms a call with it).
struct NoDelay(tokio::net::TcpListener);

impl axum::serve::Listener for NoDelay {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (stream, addr);
                }
                Err(e) => {
                    tracing::warn!("HTTP gateway accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, NoDelay>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, NoDelay>) -> Self {
        Peer::at(*stream.remote_addr())
    }
}
/// (workspace, profile) of an endpoint.
type EndpointKey = (String, Option<String>);
/// An endpoint's rmcp service and the sessions it keeps.
type Served = (Arc<Endpoint>, Arc<LocalSessionManager>);

struct App {
    /// What every gateway session asks of the daemon (in-process).
    backend: Arc<dyn Backend>,
    shared: Arc<Shared>,
    /// `http://LISTEN`: the resource URLs in the metadata and challenges.
    base: String,
    addr: SocketAddr,
    /// One rmcp service (and its sessions) per (workspace, profile).
    endpoints: Mutex<HashMap<EndpointKey, Served>>,
    /// Tokens found, by the digest of their text, while no token is
    /// revoked (the generation of `Shared::tokens_revoked` they were read
    /// at); an expired one is looked up again.
    tokens: Mutex<(u64, HashMap<Vec<u8>, crate::store::AccessToken>)>,
    /// Each token's request bucket, by token id.
    buckets: Mutex<HashMap<String, crate::host_resources::rate::TokenBucket>>,
    shutdown: CancellationToken,
}

/// The TLS settings of `[http] tls_cert` / `tls_key`, or None for plain
/// HTTP; an error says which file is wrong and how.
pub fn tls_config(
    settings: &crate::config::HttpSettings,
) -> Result<Option<Arc<tokio_rustls::rustls::ServerConfig>>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) else {
        return Ok(None);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| {
            format!(
                "http.tls_cert {}: {e} (a PEM certificate chain)",
                cert.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "http.tls_cert {} holds no PEM certificate",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("http.tls_key {}: {e} (a PEM private key)", key.display()))?;
    let config = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| {
            format!(
                "http.tls_cert {} and http.tls_key {} do not make a TLS identity: {e}",
                cert.display(),
                key.display()
            )
        })?;
    Ok(Some(Arc::new(config)))
}

/// HTTPS: each TLS handshake runs in a task of its own (a slow client holds
/// up nobody, and one that stalls is dropped after 10 s); finished streams
/// are handed to axum.
struct Tls {
    ready: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        SocketAddr,
    )>,
    local: SocketAddr,
}

impl Tls {
    fn start(
        listener: tokio::net::TcpListener,
        config: Arc<tokio_rustls::rustls::ServerConfig>,
        shutdown: CancellationToken,
    ) -> Tls {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            let mut plain = NoDelay(listener);
            loop {
                let (stream, addr) = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    accepted = axum::serve::Listener::accept(&mut plain) => accepted,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        acceptor.accept(stream),
                    );
                    match handshake.await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Tls { ready, local }
    }
}

impl axum::serve::Listener for Tls {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The acceptor stopped (shutdown): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Tls>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Tls>) -> Self {
        Peer::at(*stream.remote_addr())
    }
}

/// Serves until `shutdown` (HTTPS when `tls` is given).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    backend: Arc<dyn Backend>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let app = Arc::new(App {
        tokens: Mutex::default(),
        backend,
        shared,
        base: format!("{scheme}://{addr}"),
        addr,
        endpoints: Mutex::default(),
        buckets: Mutex::default(),
        shutdown: shutdown.clone(),
    });
    let ops = ops_router(app.shared.clone(), app.shared.config.http.metrics, addr);
    let router = Router::new()
        .route("/mcp/{workspace}", any(workspace_endpoint))
        .route("/mcp/{workspace}/{profile}", any(profile_endpoint))
        .route(
            "/.well-known/oauth-protected-resource/mcp/{workspace}",
            get(workspace_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp/{workspace}/{profile}",
            get(profile_metadata),
        )
        .with_state(app)
        .merge(ops);
    tracing::info!(%addr, scheme, "MCP gateway listening (/mcp/WORKSPACE)");
    let router = router.into_make_service_with_connect_info::<Peer>();
    let stop = shutdown.clone();
    let served = match tls {
        Some(config) => {
            axum::serve(Tls::start(listener, config, shutdown.clone()), router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        }
        None => {
            axum::serve(NoDelay(listener), router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        }
    };
    if let Err(e) = served {
        tracing::error!("the HTTP gateway stopped: {e}");
    }
}

async fn workspace_endpoint(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(workspace): Path<String>,
    request: Request,
) -> Response {
    endpoint(app, peer, workspace, None, request).await
}

async fn profile_endpoint(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((workspace, profile)): Path<(String, String)>,
    request: Request,
) -> Response {
    endpoint(app, peer, workspace, Some(profile), request).await
}

fn resource_path(workspace: &str, profile: Option<&str>) -> String {
    match profile {
        Some(p) => format!("/mcp/{workspace}/{p}"),
        None => format!("/mcp/{workspace}"),
    }
}

/// RFC 9728: what this resource is and how to present a token for it.
fn metadata(app: &App, workspace: &str, profile: Option<&str>) -> Response {
    if crate::names::check_name("workspace", workspace).is_err()
        || profile.is_some_and(|p| crate::names::check_name("profile", p).is_err())
    {
        return StatusCode::NOT_FOUND.into_response();
    }
    Json(serde_json::json!({
        "resource": format!("{}{}", app.base, resource_path(workspace, profile)),
        "bearer_methods_supported": ["header"],
        "resource_name": "bundlevisor MCP gateway",
    }))
    .into_response()
}

async fn workspace_metadata(
    State(app): State<Arc<App>>,
    Path(workspace): Path<String>,
) -> Response {
    metadata(&app, &workspace, None)
}

async fn profile_metadata(
    State(app): State<Arc<App>>,
    Path((workspace, profile)): Path<(String, String)>,
) -> Response {
    metadata(&app, &workspace, Some(&profile))
}

/// The bearer token of a request, if it sent one.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// 401: no usable token. Says where the resource's metadata is.
fn unauthorized(app: &App, workspace: &str, profile: Option<&str>, sent: bool) -> Response {
    let metadata = format!(
        "{}/.well-known/oauth-protected-resource{}",
        app.base,
        resource_path(workspace, profile)
    );
    let mut challenge = format!("Bearer resource_metadata=\"{metadata}\"");
    if sent {
        challenge.push_str(
            ", error=\"invalid_token\", error_description=\"the token is unknown, revoked or expired\"",
        );
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({
            "error": if sent { "invalid_token" } else { "unauthorized" },
            "error_description": if sent {
                "the token is unknown, revoked or expired; `bundlevisor token create` makes one"
            } else {
                "send an access token as `Authorization: Bearer TOKEN` (`bundlevisor token create`)"
            },
        })),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// 403: the token is valid, but not for this endpoint. The same answer
/// whatever the endpoint is, so it tells nothing about other workspaces.
fn forbidden() -> Response {
    let mut response = (
        StatusCode::FORBIDDEN,
        Json(serde_json::json!({
            "error": "insufficient_scope",
            "error_description": "this token is not valid for this endpoint",
        })),
    )
        .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"insufficient_scope\""),
    );
    response
}

/// Bundles may not use the daemon's listeners: looked up in /proc once
/// per connection (a scan of every process's sockets), off the loop.
async fn refused(peer: &Peer, ours: SocketAddr, shared: &Shared) -> Option<Response> {
    let refused = peer
        .refusal
        .get_or_init(|| {
            let (addr, sandbox) = (peer.addr, shared.config.sandbox.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    super::control::tcp_refusal(addr, ours, &sandbox)
                })
                .await
                .unwrap_or_else(|e| Some(e.to_string()))
            }
        })
        .await;
    let why = refused.as_ref()?;
    tracing::warn!(peer = %peer.addr, "HTTP connection refused: {why}");
    // And the connection closed: nothing more is served on it.
    Some((StatusCode::FORBIDDEN, [(header::CONNECTION, "close")]).into_response())
}

/// `/healthz`, `/readyz` and (when `metrics`) `/metrics`, for the
/// listener at `ours`.
fn ops_router(shared: Arc<Shared>, metrics: bool, ours: SocketAddr) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if metrics {
        router = router.route("/metrics", get(scrape));
    }
    router.with_state(Ops { shared, ours })
}

#[derive(Clone)]
struct Ops {
    shared: Arc<Shared>,
    ours: SocketAddr,
}

/// Ready once the boot reload has settled (every installed bundle ready,
/// failed, or being retried: systemd's `READY=1`).
async fn readyz(State(ops): State<Ops>, ConnectInfo(peer): ConnectInfo<Peer>) -> Response {
    if let Some(no) = refused(&peer, ops.ours, &ops.shared).await {
        return no;
    }
    if ops.shared.settled.is_cancelled() {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "booting\n").into_response()
    }
}

async fn scrape(State(ops): State<Ops>, ConnectInfo(peer): ConnectInfo<Peer>) -> Response {
    if let Some(no) = refused(&peer, ops.ours, &ops.shared).await {
        return no;
    }
    let text = ops.shared.metrics.render();
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response()
}

/// The `metrics_addr` listener: `/metrics`, `/healthz`, `/readyz` on the
/// gateway's stack, until the task is dropped.
pub async fn serve_ops(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let ours = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let router = ops_router(shared, true, ours).into_make_service_with_connect_info::<Peer>();
    if let Err(e) = axum::serve(NoDelay(listener), router).await {
        tracing::error!("the metrics listener stopped: {e}");
    }
}

async fn endpoint(
    app: Arc<App>,
    peer: Peer,
    workspace: String,
    profile: Option<String>,
    request: Request,
) -> Response {
    if let Some(no) = refused(&peer, app.addr, &app.shared).await {
        return no;
    }
    if crate::names::check_name("workspace", &workspace).is_err()
        || profile
            .as_deref()
            .is_some_and(|p| crate::names::check_name("profile", p).is_err())
    {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Some(text) = bearer(request.headers()) else {
        return unauthorized(&app, &workspace, profile.as_deref(), false);
    };
    let token = match app.token(text).await {
        Ok(Some(token)) => token,
        Ok(None) => return unauthorized(&app, &workspace, profile.as_deref(), true),
        Err(e) => {
            tracing::error!("cannot check an access token: {e}");
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    };
    // A token of a profile reaches that profile only; one without, any.
    let allowed =
        token.workspace == workspace && (token.profile.is_none() || token.profile == profile);
    if !allowed {
        tracing::warn!(token = %token.name, "access token refused for an endpoint it is not valid for");
        return forbidden();
    }
    if let Err(wait_ms) = app.take(&token.id) {
        return too_many(&app, wait_ms);
    }
    let the_profile = match &profile {
        None => None,
        Some(name) => match app.shared.config.profiles.iter().find(|p| &p.name == name) {
            Some(p) => Some(p.clone()),
            None => {
                return (
                    StatusCode::NOT_FOUND,
                    Json(serde_json::json!({
                        "error": "not_found",
                        "error_description": format!("there is no profile {name:?} in the daemon's config"),
                    })),
                )
                    .into_response()
            }
        },
    };
    let (service, sessions) = app.endpoint(&workspace, the_profile);
    // A new session (a request without one) only while there is room.
    let opens_session = !request.headers().contains_key("mcp-session-id")
        && request.method() == axum::http::Method::POST;
    let max = app.shared.config.http.max_sessions;
    if opens_session && sessions.sessions.read().await.len() >= max {
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "error": "too_many_sessions",
                "error_description": format!(
                    "this endpoint has its maximum of {max} sessions ([http] max_sessions); an idle one ends after 5 minutes"
                ),
            })),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
        return response;
    }
    service.handle(request).await.into_response()
}

/// 429: the token made more requests than `[http] rate_per_sec` allows.
fn too_many(app: &App, wait_ms: u64) -> Response {
    let secs = wait_ms.div_ceil(1000).max(1);
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        Json(serde_json::json!({
            "error": "rate_limited",
            "error_description": format!(
                "this token may make {} requests a second ([http] rate_per_sec); retry in {secs} s",
                app.shared.config.http.rate_per_sec
            ),
        })),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

/// How many tokens the cache holds before it starts over.
const TOKEN_CACHE: usize = 1024;

impl App {
    /// The live token whose text this is: from the cache, or the store.
    async fn token(
        &self,
        text: String,
    ) -> Result<Option<crate::store::AccessToken>, crate::store::StoreError> {
        use std::sync::atomic::Ordering;
        let now = crate::clock::unix_secs();
        let key = crate::store::tokens::digest(&text);
        let generation = self.shared.tokens_revoked.load(Ordering::SeqCst);
        {
            let mut cache = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            if cache.0 != generation {
                *cache = (generation, HashMap::new());
            }
            if let Some(t) = cache.1.get(&key) {
                if t.expires_at.is_none_or(|at| at > now) {
                    return Ok(Some(t.clone()));
                }
            }
        }
        let found = self
            .shared
            .store
            .call(move |s| s.token_by_text(&text, now))
            .await?;
        if let Some(t) = &found {
            let mut cache = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            // Read before a revoke that has bumped the generation since: not kept.
            if cache.0 == generation {
                if cache.1.len() >= TOKEN_CACHE {
                    cache.1.clear();
                }
                cache.1.insert(key, t.clone());
            }
        }
        Ok(found)
    }

    /// One request of the token `id` from its bucket, or the wait in ms.
    fn take(&self, id: &str) -> Result<(), u64> {
        let settings = &self.shared.config.http;
        let now = tokio::time::Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .entry(id.to_string())
            .or_insert_with(|| {
                crate::host_resources::rate::TokenBucket::new(
                    settings.rate_per_sec,
                    settings.burst,
                    now,
                )
            })
            .take(now)
    }

    /// The rmcp service of a (workspace, profile): each of its sessions is
    /// a [`Gateway`] on the daemon's own control socket.
    fn endpoint(&self, workspace: &str, profile: Option<crate::config::Profile>) -> Served {
        let key = (
            workspace.to_string(),
            profile.as_ref().map(|p| p.name.clone()),
        );
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        endpoints
            .entry(key)
            .or_insert_with(|| {
                let settings = &self.shared.config.http;
                let backend = self.backend.clone();
                let workspace = workspace.to_string();
                let mut config = StreamableHttpServerConfig::default()
                    .with_cancellation_token(self.shutdown.child_token())
                    .with_max_request_body_bytes(match settings.max_body_bytes {
                        0 => DEFAULT_MAX_BODY,
                        n => n,
                    })
                    .with_allowed_origins(settings.allowed_origins.clone())
                    .enforce_origin_validation();
                if settings.listen.is_some_and(|a| !a.ip().is_loopback()) {
                    // Behind a proxy, the Host is the proxy's; tokens guard it.
                    config = config.disable_allowed_hosts();
                }
                let sessions = Arc::new(LocalSessionManager::default());
                let service = Arc::new(StreamableHttpService::new(
                    move || {
                        Ok(Gateway::new(
                            backend.clone(),
                            workspace.clone(),
                            profile.clone(),
                            DEFAULT_WAIT_READY,
                        ))
                    },
                    sessions.clone(),
                    config,
                ));
                (service, sessions)
            })
            .clone()
    }
}
