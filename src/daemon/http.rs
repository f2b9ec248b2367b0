//! The gateway over streamable HTTP (`[http] listen`; docs/gateway.md,
//! "Over HTTP"): `/mcp/WS` and `/mcp/WS/PROFILE` serve a workspace (or one
//! of its profiles) as one MCP server to agents that hold an access token;
//! `/mcp/WS/bundle/NAME` serves one bundle exactly as itself (its names and
//! URIs, under the token's profile if it has one).
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
//! - At most `[http] max_sessions` sessions on the listener, and
//!   `max_sessions_per_token` per token, counted over all its endpoints
//!   (503 beyond); the endpoint of a bundle that is gone is dropped with
//!   its sessions.
//! - Bundles are refused (the `/proc` check of the metrics listener, once
//!   per TCP connection); `TCP_NODELAY` on every connection; HTTPS with
//!   `tls_cert`/`tls_key` (rustls, each handshake in a task of its own).
//! - A token's text never reaches a log line or an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::{resumed, Shared};
use crate::daemon::api::Api;
use crate::daemon::gateway::names::Naming;
use crate::daemon::gateway::rounds::{AgentKey, RoundLimits};
use crate::daemon::gateway::{Common, Gateway, DEFAULT_WAIT_READY};

type Endpoint = StreamableHttpService<Gateway, LocalSessionManager>;

/// (workspace, profile, bundle) of an endpoint.
type EndpointKey = (String, Option<String>, Option<String>);

/// What an endpoint's path names: the workspace, one of its profiles, or
/// one of its bundles as itself.
#[derive(Debug, Clone, Copy)]
enum Face<'a> {
    Workspace,
    Profile(&'a str),
    Bundle(&'a str),
}

impl Face<'_> {
    fn path(&self, workspace: &str) -> String {
        match self {
            Face::Workspace => format!("/mcp/{workspace}"),
            Face::Profile(p) => format!("/mcp/{workspace}/{p}"),
            Face::Bundle(b) => format!("/mcp/{workspace}/bundle/{b}"),
        }
    }

    /// Whether the names in the path are names at all.
    fn well_formed(&self, workspace: &str) -> bool {
        crate::names::check_name("workspace", workspace).is_ok()
            && match self {
                Face::Workspace => true,
                Face::Profile(p) => crate::names::check_name("profile", p).is_ok(),
                Face::Bundle(b) => crate::names::check_name("bundle", b).is_ok(),
            }
    }
}
/// An endpoint's rmcp service, the sessions it keeps, and the gateway each of its
/// stateless requests gets (rmcp's, or [`direct`](crate::daemon::gateway::direct)'s).
type Served = (Arc<Endpoint>, Arc<LocalSessionManager>, MakeGateway);

/// How an endpoint makes the gateway of a request rmcp serves (or a
/// stateless one answered below it), and its live sessions' gateways.
#[derive(Clone)]
struct MakeGateway {
    new: Arc<dyn Fn() -> Gateway + Send + Sync>,
    live: Arc<crate::daemon::gateway::server::Sessions>,
}

struct App {
    /// What every gateway session asks of the daemon (in-process).
    api: Api,
    shared: Arc<Shared>,
    /// `http://LISTEN`: the resource URLs in the metadata and challenges.
    base: String,
    /// One rmcp service (and its sessions) per (workspace, profile).
    endpoints: Mutex<HashMap<EndpointKey, Served>>,
    /// Which token opened each session, over every endpoint.
    owners: Arc<Mutex<Owners>>,
    /// Tokens found, by the digest of their text, while no token is
    /// revoked (the generation of `Shared::tokens_revoked` they were read
    /// at); an expired one is looked up again.
    tokens: Mutex<(u64, HashMap<Vec<u8>, Admitted>)>,
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

/// Serves until `shutdown` (HTTPS when `tls` is given).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    api: Api,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let dashboard = shared
        .config
        .http
        .dashboard
        .then(|| super::dashboard::router(api.clone(), tls.is_some()));
    let app = Arc::new(App {
        tokens: Mutex::default(),
        api,
        shared,
        base: format!("{scheme}://{addr}"),
        endpoints: Mutex::default(),
        owners: Arc::default(),
        buckets: Mutex::default(),
        shutdown: shutdown.clone(),
    });
    let ops = ops_router(app.api.clone(), app.shared.config.http.metrics);
    let limits = super::conns::ConnLimits::of(&app.shared.config.http);
    let sandbox = app.shared.config.sandbox.clone();
    let router = Router::new()
        .route("/mcp/{workspace}", any(workspace_endpoint))
        .route("/mcp/{workspace}/{profile}", any(profile_endpoint))
        .route("/mcp/{workspace}/bundle/{bundle}", any(bundle_endpoint))
        .route(
            "/.well-known/oauth-protected-resource/mcp/{workspace}",
            get(workspace_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp/{workspace}/{profile}",
            get(profile_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp/{workspace}/bundle/{bundle}",
            get(bundle_metadata),
        )
        .with_state(app)
        .merge(ops);
    let router = match dashboard {
        Some(ui) => {
            tracing::info!(%addr, "the dashboard is served at /ui/ (sign in: `bundlevisor dashboard`)");
            router.merge(ui)
        }
        None => router,
    };
    tracing::info!(%addr, scheme, "MCP gateway listening (/mcp/WORKSPACE)");
    super::conns::serve(listener, tls, router, limits, sandbox, shutdown).await;
}

async fn workspace_endpoint(
    State(app): State<Arc<App>>,
    Path(workspace): Path<String>,
    request: Request,
) -> Response {
    endpoint(app, workspace, Face::Workspace, request).await
}

async fn profile_endpoint(
    State(app): State<Arc<App>>,
    Path((workspace, profile)): Path<(String, String)>,
    request: Request,
) -> Response {
    endpoint(app, workspace, Face::Profile(&profile), request).await
}

async fn bundle_endpoint(
    State(app): State<Arc<App>>,
    Path((workspace, bundle)): Path<(String, String)>,
    request: Request,
) -> Response {
    endpoint(app, workspace, Face::Bundle(&bundle), request).await
}

/// RFC 9728: what this resource is and how to present a token for it.
fn metadata(app: &App, workspace: &str, face: Face) -> Response {
    if !face.well_formed(workspace) {
        return StatusCode::NOT_FOUND.into_response();
    }
    Json(serde_json::json!({
        "resource": format!("{}{}", app.base, face.path(workspace)),
        "bearer_methods_supported": ["header"],
        "resource_name": "bundlevisor MCP gateway",
    }))
    .into_response()
}

async fn workspace_metadata(
    State(app): State<Arc<App>>,
    Path(workspace): Path<String>,
) -> Response {
    metadata(&app, &workspace, Face::Workspace)
}

async fn profile_metadata(
    State(app): State<Arc<App>>,
    Path((workspace, profile)): Path<(String, String)>,
) -> Response {
    metadata(&app, &workspace, Face::Profile(&profile))
}

async fn bundle_metadata(
    State(app): State<Arc<App>>,
    Path((workspace, bundle)): Path<(String, String)>,
) -> Response {
    metadata(&app, &workspace, Face::Bundle(&bundle))
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
fn unauthorized(app: &App, workspace: &str, face: Face, sent: bool) -> Response {
    let metadata = format!(
        "{}/.well-known/oauth-protected-resource{}",
        app.base,
        face.path(workspace)
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

/// `/healthz`, `/readyz` and (when `metrics`) `/metrics`: adapters of the
/// daemon's API.
fn ops_router(api: Api, metrics: bool) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if metrics {
        router = router.route("/metrics", get(scrape));
    }
    router.with_state(api)
}

/// Alive: the daemon answers (to anyone but a bundle).
async fn healthz() -> Response {
    "ok\n".into_response()
}

/// Ready once the boot reload has settled (every installed bundle ready,
/// failed, or being retried: systemd's `READY=1`).
async fn readyz(State(api): State<Api>) -> Response {
    if api.ready() {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "booting\n").into_response()
    }
}

async fn scrape(State(api): State<Api>) -> Response {
    let text = api.metrics_text();
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response()
}

/// The `metrics_addr` listener: `/metrics`, `/healthz`, `/readyz` on the
/// gateway's stack, until the task is dropped.
pub async fn serve_ops(listener: tokio::net::TcpListener, api: Api) {
    let limits = super::conns::ConnLimits::of(&api.shared().config.http);
    let sandbox = api.shared().config.sandbox.clone();
    let router = ops_router(api, true);
    // Until the task is dropped (which drops its connections).
    let never = CancellationToken::new();
    super::conns::serve(listener, None, router, limits, sandbox, never).await;
}

async fn endpoint(app: Arc<App>, workspace: String, face: Face<'_>, request: Request) -> Response {
    if !face.well_formed(&workspace) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Some(text) = bearer(request.headers()) else {
        return unauthorized(&app, &workspace, face, false);
    };
    let (token, grant) = match app.token(text).await {
        Ok(Some(admitted)) => admitted,
        Ok(None) => return unauthorized(&app, &workspace, face, true),
        Err(e) => {
            tracing::error!("cannot check an access token: {e}");
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    };
    // A token of a profile reaches that profile only (and the bundles it
    // allows, through it); one without, any.
    let (profile, bundle) = match face {
        Face::Workspace => (None, None),
        Face::Profile(p) => (Some(p.to_string()), None),
        Face::Bundle(b) => (token.profile.clone(), Some(b.to_string())),
    };
    let allowed =
        token.workspace == workspace && (token.profile.is_none() || token.profile == profile);
    if !allowed {
        tracing::warn!(token = %token.name, "access token refused for an endpoint it is not valid for");
        return forbidden();
    }
    if let Err(wait_ms) = app.take(&token.id) {
        return too_many(&app, wait_ms);
    }
    let the_profile = match profile_named(&app, profile.as_deref()) {
        Ok(p) => p,
        Err(response) => return *response,
    };
    if let Some(bundle) = &bundle {
        if let Err(response) = bundle_served(&workspace, bundle, the_profile.as_ref()) {
            return *response;
        }
    }
    let (service, sessions, make) = app.endpoint(&workspace, the_profile, bundle);
    let owners = &app.owners;
    let (named, busy) = match session_named(owners, &token, &request) {
        Ok(named) => named,
        Err(response) => return *response,
    };
    // A new session (a request without one) only while there is room, in
    // the endpoint and for this token. A 2026-07-28 request opens none
    // (that revision has no sessions), so it is not counted.
    let stateless = request
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= "2026-07-28");
    let opens_session =
        named.is_none() && !stateless && request.method() == axum::http::Method::POST;
    let settings = &app.shared.config.http;
    let cap = match settings.max_body_bytes {
        0 => crate::config::defaults::http_max_body_bytes(),
        n => n,
    };
    let unsupported = unsupported_version(request.headers());
    let (mut request, body) = match within_deadline(request, cap, settings.body_timeout).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    // A session's request stream: its event ids carry the request's id.
    let tag = match (request.method(), &busy) {
        (&axum::http::Method::POST, Some(_)) => resumed::tag_of_request(&body),
        (&axum::http::Method::GET, _) if named.is_some() => match resumed::resume(&mut request) {
            Ok(tag) => tag,
            Err(unkept) => return *unkept,
        },
        _ => None,
    };
    if let Some(requested) = unsupported {
        return refuse_version(request, &requested).await;
    }
    // Room is made (an idle session ended) only for an `initialize` that
    // is read whole and of a revision spoken here.
    let _opening = if opens_session && method_is(&body, "initialize") {
        match room_for_a_session(&app, &token).await {
            Ok(opening) => Some(opening),
            Err(response) => return response,
        }
    } else {
        None
    };
    // Whose request it is, for resuming a call that waits for its input,
    // and what its token's rules let it reach.
    request.extensions_mut().insert(AgentKey(token.id.clone()));
    request.extensions_mut().insert(grant);
    let plain = (named.as_deref(), stateless);
    let request = match direct(&app, (&make, &sessions), request, &body, plain).await {
        Ok(response) => return resumed::sent(response, busy, tag),
        Err(back) => back,
    };
    let ends_session = request.method() == axum::http::Method::DELETE;
    let mut response = service.handle(request).await.into_response();
    // ending a session is done, not accepted for later: 200 (clients such
    // as the Python SDK's take 200, 204 or 405, and log 202 as a failure).
    if ends_session && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    if opens_session {
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            Owners::own(owners, id, &token.id, sessions);
        }
    }
    session_ready(&make, named.as_deref(), &body, response.status()).await;
    if busy.is_some() || tag.is_some() {
        return resumed::sent(response, busy, tag);
    }
    response
}

/// After an agent's `notifications/initialized` on session `named` (rmcp
/// answers it 202 before the session's gateway has handled it): held until
/// the gateway knows the session — a moment, at most a second — so the
/// agent's first call is answered below rmcp as the ones after it are.
async fn session_ready(make: &MakeGateway, named: Option<&str>, body: &[u8], status: StatusCode) {
    let Some(id) = named else {
        return;
    };
    if status != StatusCode::ACCEPTED || !method_is(body, "notifications/initialized") {
        return;
    }
    if !make
        .live
        .entered(id, std::time::Duration::from_secs(1))
        .await
    {
        tracing::debug!("a session's gateway did not know it a second after its initialized");
    }
}

/// A plain tool call answered below rmcp's service, on the same call path
/// ([`gateway::direct`]): one that is `stateless` with no session, or one
/// on its token's session (`named`, checked, and still one of the
/// endpoint's `sessions`: one just ended is rmcp's to refuse); any other
/// request is given back for rmcp. Counted either way.
///
/// [`gateway::direct`]: crate::daemon::gateway::direct
async fn direct(
    app: &App,
    (make, sessions): (&MakeGateway, &LocalSessionManager),
    request: Request,
    body: &axum::body::Bytes,
    (named, stateless): (Option<&str>, bool),
) -> Result<Response, Request> {
    let mut plain = named.is_some() != stateless && request.method() == axum::http::Method::POST;
    if let (true, Some(id)) = (plain, named) {
        plain = sessions.sessions.read().await.contains_key(id);
    }
    let answered = if plain {
        // rmcp checks the Host on a loopback listener only.
        let settings = &app.shared.config.http;
        let hosts_checked = settings.listen.is_none_or(|a| a.ip().is_loopback());
        let gateways = (&*make.new, &*make.live);
        let answered =
            crate::daemon::gateway::direct::answer(gateways, request, body, hosts_checked, named)
                .await;
        match (answered, named) {
            (Ok(response), Some(id)) => {
                Owners::keep_alive(&app.owners, id, settings.session_idle);
                Ok(kept_alive(response, &app.owners, id, settings.session_idle))
            }
            (answered, _) => answered,
        }
    } else {
        Err(request)
    };
    app.shared.metrics.gateway_request(answered.is_ok());
    answered
}

/// A session's answer below rmcp as sent: a stream of a call's progress
/// tells the session it is in use at each event, as rmcp's own streams do
/// (its worker ends a session it has not heard from for `idle`).
fn kept_alive(
    response: Response,
    owners: &Arc<Mutex<Owners>>,
    id: &str,
    idle: std::time::Duration,
) -> Response {
    use futures::StreamExt;
    let streamed = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let (owners, id) = (owners.clone(), id.to_string());
    let events = body.into_data_stream().inspect(move |_| {
        Owners::keep_alive(&owners, &id, idle);
    });
    Response::from_parts(parts, axum::body::Body::from_stream(events))
}

/// The session a request names, if any, and (a request on it) its busy
/// mark. A session is its token's: another token naming it is told it does
/// not exist (the same answer as for an unknown session).
fn session_named(
    owners: &Arc<Mutex<Owners>>,
    token: &crate::store::AccessToken,
    request: &Request,
) -> Result<(Option<String>, Option<Busy>), Box<Response>> {
    let Some(id) = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return Ok((None, None));
    };
    // A request, or the resume of one's stream, is in progress until it is
    // answered.
    let busy = request.method() == axum::http::Method::POST
        || request.headers().contains_key("last-event-id");
    match Owners::claim(owners, &id, &token.id, busy) {
        Some(busy) => Ok((Some(id), busy)),
        None => {
            // A stream of a session that is not (or no longer) this
            // token's, resumed: its request's error, rather than a wait
            // for an answer that cannot come (the same whoever's it was).
            if let Some(lost) = resumed::lost_request(request) {
                return Err(Box::new(lost));
            }
            tracing::warn!(token = %token.name, "a session this token does not hold was named (another token's, or ended); 404");
            Err(Box::new(no_such_session()))
        }
    }
}

/// Room for a new session of `token`: counted over the whole listener (a
/// token reaching a workspace through its bundles' endpoints too holds no
/// more sessions). At a cap, the oldest idle session (no request in
/// progress) of the token, or of the listener, is ended to make room;
/// 503 when every one is busy.
async fn room_for_a_session(
    app: &App,
    token: &crate::store::AccessToken,
) -> Result<Opening, Response> {
    let settings = &app.shared.config.http;
    // Sessions recorded while the live ones are gathered are kept.
    let since = std::time::Instant::now();
    let live = app.live_sessions().await;
    let (max, per_token) = (settings.max_sessions, settings.max_sessions_per_token);
    let gone = |id: &str, h: &Held| !live.contains(id) && h.last < since;
    match Owners::open(&app.owners, &token.id, (max, per_token), gone) {
        Ok((opening, ended)) => {
            if let Some((id, sessions, whose)) = ended {
                use rmcp::transport::streamable_http_server::SessionManager;
                tracing::info!(token = %token.name, "ended the least recently used idle session ({whose}) to make room for a new one");
                let _ = sessions.close_session(&std::sync::Arc::from(id.as_str())).await;
            }
            Ok(opening)
        }
        Err(Full::Listener) => Err(too_many_sessions(format!(
            "the gateway holds its maximum of {max} sessions ([http] max_sessions) and each has a request in progress; retry when one is answered"
        ))),
        Err(Full::Token) => Err(too_many_sessions(format!(
            "this token holds its maximum of {per_token} sessions, over all its endpoints ([http] max_sessions_per_token), and each has a request in progress; retry when one is answered"
        ))),
    }
}

/// The request with its body read within `limit` of its head (a client
/// that trickles its body holds a connection no longer), and at most `cap`
/// bytes of it (the endpoint's body cap), or the answer that says why not.
async fn within_deadline(
    request: Request,
    cap: usize,
    limit: std::time::Duration,
) -> Result<(Request, axum::body::Bytes), Response> {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(limit, axum::body::to_bytes(body, cap)).await {
        Ok(Ok(bytes)) => Ok((
            Request::from_parts(parts, axum::body::Body::from(bytes.clone())),
            bytes,
        )),
        Ok(Err(_)) => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            Json(serde_json::json!({
                "error": "body_too_large",
                "error_description": "the request body is too large or was cut off",
            })),
        )
            .into_response()),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONNECTION, "close")],
            Json(serde_json::json!({
                "error": "body_timeout",
                "error_description": format!(
                    "the request body did not arrive within {} of its head ([http] body_timeout)",
                    humantime::format_duration(limit)
                ),
            })),
        )
            .into_response()),
    }
}

/// Whether a per-bundle endpoint has a bundle to serve: installed in the
/// workspace (404 otherwise), and allowed by the token's profile (403).
fn bundle_served(
    workspace: &str,
    bundle: &str,
    profile: Option<&crate::config::Profile>,
) -> Result<(), Box<Response>> {
    // The profile first: a token learns nothing of bundles it may not use
    // (403 whether they exist or not).
    if !crate::daemon::gateway::names::profile_allows(profile, bundle) {
        tracing::warn!(
            workspace,
            bundle,
            "a token's profile does not allow the bundle its request named; 403"
        );
        return Err(Box::new(forbidden()));
    }
    if Api::bundle_actor(workspace, bundle).is_err() {
        return Err(Box::new(
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({
                    "error": "not_found",
                    "error_description": format!("there is no bundle {bundle:?} in workspace {workspace:?}; `bundlevisor status` lists them"),
                })),
            )
                .into_response(),
        ));
    }
    Ok(())
}

/// The profile an endpoint names, or the 404 that says there is none.
fn profile_named(
    app: &App,
    name: Option<&str>,
) -> Result<Option<crate::config::Profile>, Box<Response>> {
    let Some(name) = name else {
        return Ok(None);
    };
    match app.shared.config.profiles.iter().find(|p| p.name == name) {
        Some(p) => Ok(Some(p.clone())),
        None => Err(Box::new(
            (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({
                "error": "not_found",
                "error_description": format!("there is no profile {name:?} in the daemon's config"),
            })),
        )
            .into_response(),
        )),
    }
}

/// The `MCP-Protocol-Version` of a request, when the gateway does not
/// speak it.
fn unsupported_version(headers: &axum::http::HeaderMap) -> Option<String> {
    let requested = headers.get("mcp-protocol-version")?;
    let known = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .any(|v| v.as_str().as_bytes() == requested.as_bytes());
    (!known).then(|| String::from_utf8_lossy(requested.as_bytes()).into_owned())
}

/// The revision's answer to a version the gateway does not speak (400,
/// JSON-RPC -32022 naming the versions it does), whatever revision the
/// request is of. rmcp answers so only when the request's `_meta` names a
/// version too; a request of an older revision (the header alone) would
/// get plain text.
async fn refuse_version(request: Request, requested: &str) -> Response {
    let body = axum::body::to_bytes(request.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let id = serde_json::from_slice::<serde_json::Value>(&body)
        .map(|v| v["id"].clone())
        .unwrap_or(serde_json::Value::Null);
    let supported: Vec<&str> = rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(|v| v.as_str())
        .collect();
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32022,
                "message": format!("Unsupported protocol version {requested:?}: this gateway speaks {}", supported.join(", ")),
                "data": { "supported": supported, "requested": requested },
            },
        })),
    )
        .into_response()
}

/// 404 for a session this token may not use: what rmcp answers for one
/// that does not exist.
fn no_such_session() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "session_not_found",
            "error_description": "no such session for this token; start a new one (a POST without Mcp-Session-Id)",
        })),
    )
        .into_response()
}

/// 503 with `Retry-After`: no room for another session.
fn too_many_sessions(description: String) -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({
            "error": "too_many_sessions",
            "error_description": description,
        })),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
    response
}

/// Sessions by their owners: which token opened each session, when it
/// was last used and how many requests it has in progress, and how many
/// sessions each token is opening right now (counted before rmcp has
/// named them).
#[derive(Default)]
struct Owners {
    by_session: HashMap<String, Held>,
    opening: HashMap<String, usize>,
}

/// One session, as its owner holds it.
struct Held {
    token: String,
    /// The endpoint's sessions, which end it.
    sessions: Arc<LocalSessionManager>,
    last: std::time::Instant,
    busy: usize,
    /// When rmcp's session worker last heard of the session from us (its
    /// idle timer, `[http] session_idle`, runs on what it hears).
    told: std::time::Instant,
}

/// A session ended to make room: its id, its endpoint's sessions and whose.
type Ended = (String, Arc<LocalSessionManager>, &'static str);

impl Owners {
    /// Session `id`, if it is `token`'s (None otherwise): it is used now,
    /// and with `busy` it has a request in progress until the returned
    /// guard is dropped (checked and marked at once, so it is not ended to
    /// make room in between).
    fn claim(
        owners: &Arc<Mutex<Owners>>,
        id: &str,
        token: &str,
        busy: bool,
    ) -> Option<Option<Busy>> {
        let mut held = owners.lock().unwrap_or_else(|e| e.into_inner());
        let session = held.by_session.get_mut(id).filter(|h| h.token == token)?;
        session.last = std::time::Instant::now();
        if !busy {
            return Some(None);
        }
        session.busy += 1;
        Some(Some(Busy {
            owners: owners.clone(),
            id: id.to_string(),
        }))
    }

    /// Room for one more session of `token`: at most `max.0` in all and
    /// `max.1` of this token, counting the ones being opened; sessions that
    /// are `gone` are forgotten. At a cap, the least recently
    /// used idle session (of the token at its own cap, else of anyone) is
    /// taken out and returned, for the caller to end.
    fn open(
        owners: &Arc<Mutex<Owners>>,
        token: &str,
        max: (usize, usize),
        gone: impl Fn(&str, &Held) -> bool,
    ) -> Result<(Opening, Option<Ended>), Full> {
        let mut held = owners.lock().unwrap_or_else(|e| e.into_inner());
        held.by_session.retain(|id, h| !gone(id, h));
        let opening: usize = held.opening.values().sum();
        let count = held
            .by_session
            .values()
            .filter(|h| h.token == token)
            .count()
            + held.opening.get(token).copied().unwrap_or(0);
        let full = if count >= max.1 {
            Some(Full::Token)
        } else if held.by_session.len() + opening >= max.0 {
            Some(Full::Listener)
        } else {
            None
        };
        let ended = match full {
            None => None,
            Some(full) => {
                let own = matches!(full, Full::Token);
                let oldest = held
                    .by_session
                    .iter()
                    .filter(|(_, h)| h.busy == 0 && (!own || h.token == token))
                    .min_by_key(|(_, h)| h.last)
                    .map(|(id, _)| id.clone());
                let Some(id) = oldest else {
                    return Err(full);
                };
                let gone = held.by_session.remove(&id).expect("found above");
                let whose = if gone.token == token {
                    "this token's"
                } else {
                    "another token's"
                };
                Some((id, gone.sessions, whose))
            }
        };
        *held.opening.entry(token.to_string()).or_default() += 1;
        Ok((
            Opening {
                owners: owners.clone(),
                token: token.to_string(),
            },
            ended,
        ))
    }

    /// Session `id`, just opened on the endpoint of `sessions`, is
    /// `token`'s.
    fn own(owners: &Mutex<Owners>, id: &str, token: &str, sessions: Arc<LocalSessionManager>) {
        let mut owners = owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.by_session.insert(
            id.to_string(),
            Held {
                token: token.to_string(),
                sessions,
                last: std::time::Instant::now(),
                busy: 0,
                told: std::time::Instant::now(),
            },
        );
    }

    /// After a request of session `id` answered below rmcp: rmcp's session
    /// worker, which ends a session it has not heard of for 5/4 of `idle`,
    /// is told it is in use — at most every quarter of `idle`, so a session
    /// whose agent only calls tools lives as long as one whose calls rmcp
    /// answers.
    fn keep_alive(owners: &Mutex<Owners>, id: &str, idle: std::time::Duration) {
        let sessions = {
            let mut owners = owners.lock().unwrap_or_else(|e| e.into_inner());
            let Some(held) = owners.by_session.get_mut(id) else {
                return;
            };
            if held.told.elapsed() < idle / 4 {
                return;
            }
            held.told = std::time::Instant::now();
            held.sessions.clone()
        };
        let id = id.to_string();
        tokio::spawn(async move {
            let handle = sessions.sessions.read().await.get(id.as_str()).cloned();
            if let Some(handle) = handle {
                // The worker restarts its idle timer at every event it
                // gets. This one closes a request stream it never hands
                // out (it numbers them up from 0): it changes nothing else.
                let _ = handle.close_request_wise_channel(u64::MAX).await;
            }
        });
    }
}

/// A request in progress on a session: it is not idle (not ended to make
/// room) until this is dropped, when its answer was sent.
struct Busy {
    owners: Arc<Mutex<Owners>>,
    id: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(session) = owners.by_session.get_mut(&self.id) {
            session.busy = session.busy.saturating_sub(1);
            session.last = std::time::Instant::now();
        }
    }
}

/// Whether a body is one message of `method`.
fn method_is(body: &[u8], method: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Head {
        method: Option<String>,
    }
    serde_json::from_slice::<Head>(body).is_ok_and(|h| h.method.as_deref() == Some(method))
}

/// Drops the endpoints of bundles that are no longer installed, ending
/// their sessions (an agent still holding one is told it is gone: 404).
fn drop_gone(endpoints: &mut HashMap<EndpointKey, Served>) {
    endpoints.retain(|(workspace, _, bundle), (_, sessions, _)| {
        let gone = bundle
            .as_deref()
            .is_some_and(|b| Api::bundle_actor(workspace, b).is_err());
        if gone {
            let sessions = sessions.clone();
            tokio::spawn(async move {
                use rmcp::transport::streamable_http_server::SessionManager;
                let ids: Vec<_> = sessions.sessions.read().await.keys().cloned().collect();
                for id in ids {
                    let _ = sessions.close_session(&id).await;
                }
            });
        }
        !gone
    });
}

/// Which cap a new session would exceed.
enum Full {
    Listener,
    Token,
}

/// One session being opened by a token: counts against its cap until the
/// answer has named it (or failed).
struct Opening {
    owners: Arc<Mutex<Owners>>,
    token: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = owners.opening.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                owners.opening.remove(&self.token);
            }
        }
    }
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

/// A live token, and its grant (its rules parsed once, not per request);
/// shared with the cache, not copied for each request.
type Admitted = (
    Arc<crate::store::AccessToken>,
    Arc<crate::daemon::gateway::grant::Grant>,
);

/// How many tokens the cache holds before it starts over.
const TOKEN_CACHE: usize = 1024;

impl App {
    /// The live token whose text this is, and its grant: from the cache,
    /// or the store.
    async fn token(&self, text: String) -> Result<Option<Admitted>, crate::store::StoreError> {
        use std::sync::atomic::Ordering;
        let now = crate::clock::unix_secs();
        let key = crate::store::tokens::digest(&text);
        let generation = self.shared.tokens_revoked.load(Ordering::SeqCst);
        {
            let mut cache = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            if cache.0 != generation {
                *cache = (generation, HashMap::new());
            }
            if let Some(found) = cache.1.get(&key) {
                if found.0.expires_at.is_none_or(|at| at > now) {
                    return Ok(Some(found.clone()));
                }
            }
        }
        let found = self
            .shared
            .store
            .call(move |s| s.token_by_text(&text, now))
            .await?
            .map(|t| {
                let grant = Arc::new(crate::daemon::gateway::grant::Grant::of_token(&t));
                (Arc::new(t), grant)
            });
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

    /// The origins a browser request may come from: the configured ones
    /// and the listener's own (same-origin; on loopback also as
    /// `localhost`), which no DNS rebinding can take.
    fn allowed_origins(&self) -> Vec<String> {
        let mut origins = self.shared.config.http.allowed_origins.clone();
        origins.push(self.base.clone());
        if let Some((scheme, addr)) = self.base.split_once("://") {
            if let Ok(addr) = addr.parse::<SocketAddr>() {
                if addr.ip().is_loopback() {
                    origins.push(format!("{scheme}://localhost:{}", addr.port()));
                }
            }
        }
        origins
    }

    /// The ids of every session the listener holds, over all endpoints
    /// (those of bundles that are gone are ended first).
    async fn live_sessions(&self) -> std::collections::HashSet<String> {
        let managers: Vec<Arc<LocalSessionManager>> = {
            let mut endpoints = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
            drop_gone(&mut endpoints);
            endpoints.values().map(|(_, m, _)| m.clone()).collect()
        };
        let mut live = std::collections::HashSet::new();
        for manager in managers {
            live.extend(
                manager
                    .sessions
                    .read()
                    .await
                    .keys()
                    .map(|id| id.to_string()),
            );
        }
        live
    }

    /// The rmcp service of a (workspace, profile): each of its sessions is
    /// a [`Gateway`] on the daemon's own control socket.
    fn endpoint(
        &self,
        workspace: &str,
        profile: Option<crate::config::Profile>,
        bundle: Option<String>,
    ) -> Served {
        let key = (
            workspace.to_string(),
            profile.as_ref().map(|p| p.name.clone()),
            bundle.clone(),
        );
        let naming = Naming::of(bundle, profile.as_ref());
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        if !endpoints.contains_key(&key) {
            drop_gone(&mut endpoints);
        }
        endpoints
            .entry(key)
            .or_insert_with(|| {
                let settings = &self.shared.config.http;
                let api = self.api.clone();
                let workspace = workspace.to_string();
                let mut config = StreamableHttpServerConfig::default()
                    .with_cancellation_token(self.shutdown.child_token())
                    .with_max_request_body_bytes(match settings.max_body_bytes {
                        0 => crate::config::defaults::http_max_body_bytes(),
                        n => n,
                    })
                    .with_allowed_origins(self.allowed_origins())
                    .enforce_origin_validation()
                    // A 2026-07-28 answer that is the whole reply goes as
                    // one JSON body, not a stream of one event (nothing is
                    // sent before the first message either way; one that
                    // notifies first still streams).
                    .with_json_response(true);
                if settings.listen.is_some_and(|a| !a.ip().is_loopback()) {
                    // Behind a proxy, the Host is the proxy's; tokens guard it.
                    config = config.disable_allowed_hosts();
                }
                // rmcp's idle timer runs a quarter longer than the setting:
                // a session whose calls it does not see is told it is alive
                // at most every quarter of it (`Owners::keep_alive`), so no
                // session ends sooner than `session_idle` after its last.
                let mut manager = LocalSessionManager::default();
                manager.session_config.keep_alive = Some(settings.session_idle * 5 / 4);
                let sessions = Arc::new(manager);
                // A 2026-07-28 request gets a gateway of its own; the calls
                // waiting for their agents' input, and the routes, are the
                // endpoint's.
                let common = Common::new(RoundLimits {
                    timeout: settings.input_timeout,
                    per_agent: settings.max_waiting_for_input,
                    ..RoundLimits::default()
                });
                let live = common.sessions.clone();
                // Each request carries its token's grant; one that does
                // not reaches nothing.
                let unmarked = Arc::new(crate::daemon::gateway::grant::Grant::unmarked());
                let new: Arc<dyn Fn() -> Gateway + Send + Sync> = Arc::new(move || {
                    Gateway::new(
                        api.clone(),
                        workspace.clone(),
                        profile.clone(),
                        DEFAULT_WAIT_READY,
                        common.clone(),
                        naming.clone(),
                        Some(unmarked.clone()),
                    )
                });
                let make = MakeGateway {
                    new: new.clone(),
                    live,
                };
                let service = Arc::new(StreamableHttpService::new(
                    move || Ok(new()),
                    sessions.clone(),
                    config,
                ));
                (service, sessions, make)
            })
            .clone()
    }
}
