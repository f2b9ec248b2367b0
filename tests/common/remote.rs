//! Test fixture for remote bundles: a small OAuth 2.1 authorization server
//! and a protected streamable-HTTP MCP server, in-process on loopback (one
//! axum app on one port). It stands in for the external services the daemon
//! talks to; the daemon itself runs for real.
//!
//! The authorization server serves RFC 9728 / RFC 8414 metadata, dynamic
//! registration, `/authorize` (approves at once, redirecting with a code),
//! and `/token` with the authorization-code (PKCE S256 checked),
//! refresh-token (rotating), client-credentials and JWT bearer (an ID-JAG
//! from its enterprise IdP, `/idp/token`, which exchanges an ID token for
//! one: Enterprise-Managed Authorization) grants. The MCP server
//! answers 401 with a `resource_metadata` challenge to any request without a
//! live access token; its `read_file` tool reads a workspace file back
//! through the daemon's host-resources handlers.
//!
//! For the attacks of docs/security.md ("Remote bundles") it can also
//! answer `/moved` with a 307 to a second listener, the *decoy* (another
//! origin: same host, another port), which records every request it gets —
//! also as an HTTP proxy, so a daemon run with `http_proxy` pointing at it
//! shows any request it makes to a non-loopback host — and it can serve
//! metadata that lies (see [`Lies`]).
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientResult, ContentBlock,
    CustomRequest, CustomResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, ServerRequest, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use sha2::Digest;
use tokio_util::sync::CancellationToken;

/// What the authorization server has issued and seen.
#[derive(Default)]
pub struct AuthState {
    pub access: HashSet<String>,
    pub refresh: HashSet<String>,
    codes: HashMap<String, (String, String, String, String)>, // code -> (challenge, redirect_uri, client_id, scope)
    /// The scope each refresh token was granted for.
    refresh_scopes: HashMap<String, String>,
    /// client_id -> secret (None: a public client).
    pub clients: HashMap<String, Option<String>>,
    pub refresh_grants: u32,
    pub refused_refresh_grants: u32,
    pub client_credentials_grants: u32,
    pub code_grants: u32,
    pub registrations: u32,
    /// MCP requests answered 401.
    pub unauthorized: u32,
    /// Of those, the ones that presented a token (not live, or never issued).
    pub dead_tokens: u32,
    /// MCP requests answered 403 `insufficient_scope`.
    pub insufficient: u32,
    /// Every token ever issued, for leak scans.
    pub issued: Vec<String>,
    /// The scope each access token was issued for.
    pub scopes: HashMap<String, String>,
    /// Public keys (PEM) of clients that authenticate with `private_key_jwt`.
    pub jwt_keys: Vec<(String, String)>,
    /// `expires_in` of issued access tokens (seconds; 3600 unless set).
    pub expires_in: Option<i64>,
    /// Every request to `/token`, answered or refused.
    pub token_requests: u32,
    /// Requests of the protected-resource metadata.
    pub resource_metadata_requests: u32,
    /// What the servers say instead of the truth.
    pub lies: Lies,
    /// Where and how the servers publish what they publish.
    pub layout: Layout,
    /// Every well-known path asked for, in order.
    pub well_known: Vec<String>,
    /// Every token request: how the client authenticated, and its form.
    pub token_forms: Vec<TokenRequest>,
    /// Client ids seen at `/authorize`.
    pub authorize_clients: Vec<String>,
    /// The `scope` of each request to `/authorize`.
    pub authorize_scopes: Vec<Option<String>>,
    /// The body of each dynamic registration.
    pub registration_bodies: Vec<Value>,
    /// The issuer each dynamically registered client and each refresh
    /// token belongs to: neither is accepted once the issuer has changed.
    issued_by: HashMap<String, String>,
    /// The enterprise IdP's clients: id -> (secret, the client at the
    /// authorization server its ID-JAGs are for).
    pub idp_clients: HashMap<String, (String, String)>,
    /// ID tokens the IdP takes as subject tokens: token -> user.
    pub id_tokens: HashMap<String, String>,
    /// Every token exchange the IdP answered with an ID-JAG.
    pub exchanges: Vec<Exchange>,
    /// Every request to the IdP's token endpoint, answered or refused.
    pub idp_requests: u32,
    /// `jti`s of the ID-JAGs redeemed: a second use is a replay.
    jtis: HashSet<String>,
    /// JWT bearer grants answered with a token.
    pub jwt_bearer_grants: u32,
    /// Why each refused JWT bearer grant was refused.
    pub refused_assertions: Vec<String>,
    /// `/sse-mcp`: the answer held back when the call's stream was closed,
    /// and when that was.
    held: Option<(Value, std::time::Instant)>,
    /// `/sse-mcp`: each resumption's `Last-Event-ID`, and how long after
    /// the close it came.
    pub resumed: Vec<(String, std::time::Duration)>,
    /// Every request the decoy (another origin) received.
    pub decoy: Vec<DecoyRequest>,
    next: u64,
}

/// Metadata the fixture serves instead of its own (all `None`: the truth).
#[derive(Default, Clone)]
pub struct Lies {
    /// `resource_metadata` of the MCP server's 401 challenge.
    pub challenge_metadata: Option<String>,
    /// `resource` of the protected-resource metadata.
    pub resource: Option<String>,
    /// `issuer` of the authorization-server metadata.
    pub issuer: Option<String>,
    /// `aud` of the ID-JAGs the IdP issues (the truth: the audience asked).
    pub id_jag_audience: Option<String>,
}

/// What a token exchange at the IdP asked for.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub audience: String,
    pub resource: Option<String>,
    pub scope: Option<String>,
    /// The ID-JAG issued, for leak scans.
    pub id_jag: String,
}

/// The IdP's ID-JAGs are signed with this key (HS256), which the
/// authorization server trusts: in the fixture both are one process.
const ID_JAG_KEY: &[u8] = b"fixture enterprise idp signing key";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Where the protected-resource metadata is published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Prm {
    /// `/.well-known/oauth-protected-resource/mcp` (path inserted).
    #[default]
    PathInserted,
    /// `/.well-known/oauth-protected-resource` (root).
    Root,
    /// Nowhere (a 2025-03-26 server).
    Absent,
    /// Only at `/prm/mcp`, which no well-known rule leads to: found
    /// through the 401 challenge's `resource_metadata` alone.
    ChallengeOnly,
}

/// Where the authorization-server metadata is published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Asm {
    /// RFC 8414: `/.well-known/oauth-authorization-server[/PATH]`.
    #[default]
    OAuth,
    /// OpenID Connect, path inserted: `/.well-known/openid-configuration[/PATH]`.
    OidcInserted,
    /// OpenID Connect, path appended: `[/PATH]/.well-known/openid-configuration`.
    OidcAppended,
    /// Nowhere: the client falls back to `/authorize`, `/token`, `/register`.
    Absent,
}

/// The servers' layout (all default: PRM path-inserted and named by the
/// challenge, RFC 8414 metadata for an issuer without a path).
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub prm: Prm,
    /// The challenge does not name `resource_metadata`.
    pub no_challenge_metadata: bool,
    /// `scope` of the 401 challenge.
    pub challenge_scope: Option<String>,
    /// `scopes_supported` of the protected-resource metadata.
    pub scopes_supported: Option<Vec<String>>,
    pub asm: Asm,
    /// The issuer's path (`/tenant`), empty for none.
    pub issuer_path: String,
    /// `token_endpoint_auth_methods_supported` (default: none and post).
    pub auth_methods: Option<Vec<String>>,
    /// `client_id_metadata_document_supported`.
    pub cimd: bool,
    /// The scope every token must carry for `whoami` (else 403
    /// `insufficient_scope` naming it).
    pub required_scope: Option<String>,
    /// The client-credentials grant is refused (`unauthorized_client`).
    pub no_client_credentials: bool,
    /// The metadata leaves out `code_challenge_methods_supported`.
    pub no_pkce_advertised: bool,
    /// `GET /mcp` is answered 405 before any token is looked at, with no
    /// challenge: a 2026-07-28 server has no GET stream, and one that
    /// routes by method never gets to its token check. Only the answer to
    /// a real request (a POST) carries the challenge.
    pub no_get: bool,
    /// The metadata names no `registration_endpoint`.
    pub no_registration: bool,
    /// The authorization server takes ID-JAGs (its metadata lists the
    /// `id-jag` grant profile and the JWT bearer grant).
    pub id_jag: bool,
}

/// What a token request carried.
#[derive(Clone, Debug)]
pub struct TokenRequest {
    /// `basic`, `post`, `jwt` or `none`.
    pub auth: &'static str,
    pub grant_type: String,
    pub scope: Option<String>,
    pub resource: Option<String>,
}

/// A request that reached the decoy.
#[derive(Debug, Clone)]
pub struct DecoyRequest {
    pub method: String,
    /// The request target (absolute when it came as a proxy request).
    pub uri: String,
    pub headers: Vec<(String, String)>,
}

impl AuthState {
    fn mint(&mut self, prefix: &str) -> String {
        self.next += 1;
        let token = format!("{prefix}-{}-{:016x}", self.next, fastrand::u64(..));
        self.issued.push(token.clone());
        token
    }
}

#[derive(Clone)]
struct App {
    base: String,
    mcp_url: String,
    decoy_base: String,
    state: Arc<Mutex<AuthState>>,
}

pub struct Fixture {
    pub rt: tokio::runtime::Runtime,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// The MCP endpoint (`/mcp`).
    pub mcp_url: String,
    /// `/moved`: a 307 to the decoy's `/mcp`.
    pub moved_url: String,
    /// `http://127.0.0.1:PORT` of the decoy: another origin.
    pub decoy_base: String,
    pub state: Arc<Mutex<AuthState>>,
    ct: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl Fixture {
    /// Starts both servers. `confidential` registers a client that may use
    /// the client-credentials grant.
    pub fn start(confidential: Option<(&str, &str)>) -> Fixture {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ct = CancellationToken::new();
        let state = Arc::new(Mutex::new(AuthState::default()));
        if let Some((id, secret)) = confidential {
            state
                .lock()
                .unwrap()
                .clients
                .insert(id.to_string(), Some(secret.to_string()));
        }
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let decoy = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let decoy_base = format!("http://127.0.0.1:{}", decoy.local_addr().unwrap().port());
        let app = App {
            mcp_url: format!("{base}/mcp"),
            base: base.clone(),
            decoy_base: decoy_base.clone(),
            state: state.clone(),
        };
        let stop = ct.clone();
        let decoy_app = Router::new().fallback(record_decoy).with_state(app.clone());
        rt.spawn(async move {
            axum::serve(decoy, decoy_app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .unwrap();
        });
        let mcp = StreamableHttpService::new(
            || Ok(RemoteServer),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token()),
        );
        let router = Router::new()
            .nest_service("/mcp", mcp)
            .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
            .route("/.well-known/{*rest}", get(well_known))
            .route("/tenant/.well-known/{*rest}", get(tenant_well_known))
            .route("/moved", axum::routing::any(moved))
            .route("/sse-mcp", axum::routing::any(resumable))
            .route("/prm/mcp", get(challenge_only_metadata))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .route("/tenant/register", post(register))
            .route("/tenant/authorize", get(authorize))
            .route("/tenant/token", post(token))
            .route("/idp/token", post(idp_token))
            .with_state(app.clone());
        let stop = ct.clone();
        rt.spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .unwrap();
        });
        Fixture {
            rt,
            moved_url: format!("{base}/moved"),
            mcp_url: app.mcp_url,
            base,
            decoy_base,
            state,
            ct,
        }
    }

    /// From now on the servers say these things.
    pub fn lie(&self, lies: Lies) {
        self.state.lock().unwrap().lies = lies;
    }

    /// From now on the servers are laid out so.
    pub fn lay_out(&self, layout: Layout) {
        self.state.lock().unwrap().layout = layout;
    }

    /// Every access token stops working (a revocation or an expiry).
    pub fn revoke_access_tokens(&self) {
        self.state.lock().unwrap().access.clear();
    }

    /// Every refresh token stops working.
    pub fn expire_refresh_tokens(&self) {
        self.state.lock().unwrap().refresh.clear();
    }

    pub fn with<T>(&self, f: impl FnOnce(&AuthState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }

    /// Plays the browser: opens `authorization_url`, follows the
    /// authorization server's redirect to the CLI's loopback listener, and
    /// returns what that listener answered.
    pub fn browse(&self, authorization_url: &str) -> (u16, String) {
        self.rt.block_on(async {
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap();
            let approve = http.get(authorization_url).send().await.unwrap();
            assert_eq!(
                approve.status(),
                302,
                "the authorization server did not redirect"
            );
            let location = approve.headers()["location"].to_str().unwrap().to_string();
            let landing = http.get(&location).send().await.unwrap();
            (landing.status().as_u16(), landing.text().await.unwrap())
        })
    }
}

/// 401 with a challenge unless the request carries a live access token.
async fn guard(
    State(app): State<App>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !request.uri().path().starts_with("/mcp") {
        return next.run(request).await;
    }
    if request.method() == axum::http::Method::GET && app.state.lock().unwrap().layout.no_get {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let live = {
        let mut state = app.state.lock().unwrap();
        let live = token.as_ref().is_some_and(|t| state.access.contains(t));
        if !live {
            state.unauthorized += 1;
            state.dead_tokens += u32::from(token.is_some());
        }
        live
    };
    let lacking = {
        let state = app.state.lock().unwrap();
        let granted = token.as_ref().and_then(|t| state.scopes.get(t));
        state.layout.required_scope.clone().filter(|needed| {
            live && !granted.is_some_and(|g| g.split_whitespace().any(|s| s == needed))
        })
    };
    if let Some(needed) = lacking {
        app.state.lock().unwrap().insufficient += 1;
        let challenge = format!(
            "Bearer error=\"insufficient_scope\", scope=\"{needed}\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            app.base
        );
        return (
            StatusCode::FORBIDDEN,
            [("www-authenticate", challenge)],
            "insufficient scope",
        )
            .into_response();
    }
    if live {
        return next.run(request).await;
    }
    let challenge = {
        let state = app.state.lock().unwrap();
        let layout = &state.layout;
        let mut challenge = "Bearer error=\"invalid_token\"".to_string();
        if let Some(scope) = &layout.challenge_scope {
            challenge.push_str(&format!(", scope=\"{scope}\""));
        }
        let truth = match layout.prm {
            Prm::Root => Some(format!("{}/.well-known/oauth-protected-resource", app.base)),
            Prm::PathInserted => Some(format!(
                "{}/.well-known/oauth-protected-resource/mcp",
                app.base
            )),
            Prm::ChallengeOnly => Some(format!("{}/prm/mcp", app.base)),
            Prm::Absent => None,
        }
        .filter(|_| !layout.no_challenge_metadata);
        if let Some(metadata) = state.lies.challenge_metadata.clone().or(truth) {
            challenge.push_str(&format!(", resource_metadata=\"{metadata}\""));
        }
        challenge
    };
    (
        StatusCode::UNAUTHORIZED,
        [("www-authenticate", challenge)],
        "unauthorized",
    )
        .into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such metadata").into_response()
}

/// `/.well-known/...`: the metadata the layout publishes there.
async fn well_known(
    State(app): State<App>,
    axum::extract::Path(rest): axum::extract::Path<String>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    state.well_known.push(format!("/.well-known/{rest}"));
    let layout = state.layout.clone();
    let path = layout.issuer_path.as_str();
    match rest.as_str() {
        "oauth-protected-resource/mcp" if layout.prm == Prm::PathInserted => {
            resource_metadata(&app, &mut state)
        }
        "oauth-protected-resource" if layout.prm == Prm::Root => {
            resource_metadata(&app, &mut state)
        }
        r if layout.asm == Asm::OAuth && r == format!("oauth-authorization-server{path}") => {
            server_metadata(&app, &state)
        }
        r if layout.asm == Asm::OidcInserted && r == format!("openid-configuration{path}") => {
            server_metadata(&app, &state)
        }
        "openid-configuration" if layout.asm == Asm::OidcAppended && path.is_empty() => {
            server_metadata(&app, &state)
        }
        _ => not_found(),
    }
}

/// `/tenant/.well-known/...`: OpenID Connect metadata with the path appended.
async fn tenant_well_known(
    State(app): State<App>,
    axum::extract::Path(rest): axum::extract::Path<String>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    state.well_known.push(format!("/tenant/.well-known/{rest}"));
    let layout = &state.layout;
    if rest == "openid-configuration"
        && layout.asm == Asm::OidcAppended
        && layout.issuer_path == "/tenant"
    {
        return server_metadata(&app, &state);
    }
    not_found()
}

/// `/prm/mcp`: the protected-resource metadata of [`Prm::ChallengeOnly`].
async fn challenge_only_metadata(State(app): State<App>) -> Response {
    let mut state = app.state.lock().unwrap();
    if state.layout.prm != Prm::ChallengeOnly {
        return not_found();
    }
    resource_metadata(&app, &mut state)
}

impl AuthState {
    /// The issuer the authorization server is now.
    fn issuer(&self, app: &App) -> String {
        format!("{}{}", app.base, self.layout.issuer_path)
    }

    /// The authorization server's endpoints live under its issuer's path
    /// (`/tenant/token`); a server that publishes no metadata has them at
    /// the origin (the 2025-03-26 fallback). Elsewhere: 404.
    fn serves(&self, path: &str, endpoint: &str) -> bool {
        let prefix = match self.layout.asm {
            Asm::Absent => "",
            _ => self.layout.issuer_path.as_str(),
        };
        path == format!("{prefix}/{endpoint}")
    }

    /// A client the authorization server knows now: configured ones
    /// always, a registered one only while the issuer that registered it is
    /// the server's.
    fn knows(&self, app: &App, client: &str) -> bool {
        self.clients.contains_key(client)
            && self
                .issued_by
                .get(client)
                .is_none_or(|by| *by == self.issuer(app))
    }
}

fn resource_metadata(app: &App, state: &mut AuthState) -> Response {
    state.resource_metadata_requests += 1;
    let resource = state.lies.resource.clone().unwrap_or(app.mcp_url.clone());
    let issuer = format!("{}{}", app.base, state.layout.issuer_path);
    let mut metadata = json!({ "resource": resource, "authorization_servers": [issuer] });
    if let Some(scopes) = &state.layout.scopes_supported {
        metadata["scopes_supported"] = json!(scopes);
    }
    Json(metadata).into_response()
}

fn server_metadata(app: &App, state: &AuthState) -> Response {
    let b = &format!("{}{}", app.base, state.layout.issuer_path);
    let layout = &state.layout;
    let issuer = state.lies.issuer.clone().unwrap_or_else(|| b.clone());
    let methods = layout
        .auth_methods
        .clone()
        .unwrap_or_else(|| vec!["none".into(), "client_secret_post".into()]);
    let mut metadata = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{b}/authorize"),
        "token_endpoint": format!("{b}/token"),
        "registration_endpoint": format!("{b}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": methods,
        "token_endpoint_auth_signing_alg_values_supported": ["ES256", "RS256"],
        "client_id_metadata_document_supported": layout.cimd,
    });
    if layout.no_pkce_advertised {
        metadata
            .as_object_mut()
            .unwrap()
            .remove("code_challenge_methods_supported");
    }
    if layout.id_jag {
        metadata["authorization_grant_profiles_supported"] =
            json!(["urn:ietf:params:oauth:grant-profile:id-jag"]);
        metadata["grant_types_supported"]
            .as_array_mut()
            .unwrap()
            .push(json!(JWT_BEARER));
    }
    if layout.no_registration {
        metadata
            .as_object_mut()
            .unwrap()
            .remove("registration_endpoint");
    }
    Json(metadata).into_response()
}

async fn register(
    State(app): State<App>,
    uri: axum::http::Uri,
    Json(body): Json<Value>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    if !state.serves(uri.path(), "register") {
        return not_found();
    }
    state.registrations += 1;
    state.registration_bodies.push(body.clone());
    let id = state.mint("client");
    state.clients.insert(id.clone(), None);
    let issuer = state.issuer(&app);
    state.issued_by.insert(id.clone(), issuer);
    Json(json!({ "client_id": id, "redirect_uris": body["redirect_uris"] })).into_response()
}

/// A temporary redirect to the decoy's `/mcp`: another origin.
async fn moved(State(app): State<App>) -> Response {
    (
        StatusCode::TEMPORARY_REDIRECT,
        [("location", format!("{}/mcp", app.decoy_base))],
    )
        .into_response()
}

/// The decoy records whatever reaches it and has nothing to give.
async fn record_decoy(State(app): State<App>, request: axum::extract::Request) -> Response {
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    app.state.lock().unwrap().decoy.push(DecoyRequest {
        method: request.method().to_string(),
        uri: request.uri().to_string(),
        headers,
    });
    (StatusCode::NOT_FOUND, "decoy").into_response()
}

fn oauth_error(error: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response()
}

fn oauth_refusal(error: &str, description: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

/// The client id and secret of an HTTP Basic `Authorization` header, each
/// form-urlencoded (RFC 6749 §2.3.1).
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let basic = headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let unescape = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Some((unescape(id), unescape(secret)))
}

/// `/idp/token`: the enterprise identity provider's token endpoint, which
/// exchanges a user's ID token for an ID-JAG (RFC 8693) for a client that
/// authenticates with HTTP Basic.
async fn idp_token(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    state.idp_requests += 1;
    let Some((id, secret)) = basic_credentials(&headers) else {
        return oauth_error("invalid_client");
    };
    let Some((expected, as_client)) = state.idp_clients.get(&id).cloned() else {
        return oauth_error("invalid_client");
    };
    if secret != expected {
        return oauth_error("invalid_client");
    }
    let field = |k: &str| f.get(k).map(String::as_str);
    if field("grant_type") != Some(TOKEN_EXCHANGE)
        || field("requested_token_type") != Some(ID_JAG)
        || field("subject_token_type") != Some(ID_TOKEN)
    {
        return oauth_error("invalid_request");
    }
    let Some(audience) = f.get("audience").cloned() else {
        return oauth_error("invalid_request");
    };
    let Some(user) = field("subject_token")
        .and_then(|t| state.id_tokens.get(t))
        .cloned()
    else {
        return oauth_refusal("invalid_grant", "the subject token is not a valid ID token");
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut claims = json!({
        "iss": format!("{}/idp", app.base),
        "sub": user,
        "aud": state.lies.id_jag_audience.clone().unwrap_or(audience.clone()),
        "client_id": as_client,
        "jti": state.mint("jti"),
        "iat": now,
        "exp": now + 300,
    });
    if let Some(resource) = f.get("resource") {
        claims["resource"] = json!(resource);
    }
    if let Some(scope) = f.get("scope") {
        claims["scope"] = json!(scope);
    }
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.typ = Some("oauth-id-jag+jwt".into());
    let id_jag = jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(ID_JAG_KEY),
    )
    .unwrap();
    state.issued.push(id_jag.clone());
    state.exchanges.push(Exchange {
        audience,
        resource: f.get("resource").cloned(),
        scope: f.get("scope").cloned(),
        id_jag: id_jag.clone(),
    });
    Json(json!({
        "issued_token_type": ID_JAG,
        "access_token": id_jag,
        "token_type": "N_A",
        "expires_in": 300,
    }))
    .into_response()
}

/// Checks an ID-JAG presented by `client` (RFC 7523 JWT bearer grant): the
/// IdP's signature and `typ`, this server as its audience, the MCP server
/// as its resource, the client it names, and no replay of its `jti`. The
/// scope granted, or why it is refused.
fn redeem_id_jag(
    app: &App,
    state: &mut AuthState,
    client: &str,
    assertion: &str,
) -> Result<String, String> {
    let header = jsonwebtoken::decode_header(assertion).map_err(|e| e.to_string())?;
    if header.typ.as_deref() != Some("oauth-id-jag+jwt") {
        return Err(format!("typ {:?} is not oauth-id-jag+jwt", header.typ));
    }
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_audience(&[state.issuer(app)]);
    validation.set_issuer(&[format!("{}/idp", app.base)]);
    validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
    let claims = jsonwebtoken::decode::<Value>(
        assertion,
        &jsonwebtoken::DecodingKey::from_secret(ID_JAG_KEY),
        &validation,
    )
    .map_err(|e| match e.kind() {
        jsonwebtoken::errors::ErrorKind::InvalidAudience => {
            format!(
                "the ID-JAG's audience is not this authorization server ({})",
                state.issuer(app)
            )
        }
        _ => format!("the ID-JAG is invalid: {e}"),
    })?
    .claims;
    if claims["resource"] != json!(app.mcp_url) {
        return Err(format!(
            "the ID-JAG's resource {} is not this server's",
            claims["resource"]
        ));
    }
    if claims["client_id"] != json!(client) {
        return Err(format!(
            "the ID-JAG is for client {}, not {client}",
            claims["client_id"]
        ));
    }
    let jti = claims["jti"].as_str().unwrap_or_default().to_string();
    if jti.is_empty() || !state.jtis.insert(jti) {
        return Err("the ID-JAG was used before (its jti is replayed)".into());
    }
    Ok(claims["scope"].as_str().unwrap_or_default().to_string())
}

async fn authorize(
    State(app): State<App>,
    uri: axum::http::Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    if !state.serves(uri.path(), "authorize") {
        return not_found();
    }
    let client = q.get("client_id").cloned().unwrap_or_default();
    state.authorize_clients.push(client.clone());
    state.authorize_scopes.push(q.get("scope").cloned());
    // A client ID metadata document names the client by its https URL
    // (the fixture does not fetch it).
    let known = state.knows(&app, &client) || (state.layout.cimd && client.starts_with("https://"));
    let ok = known
        && q.get("response_type").map(String::as_str) == Some("code")
        && q.get("code_challenge_method").map(String::as_str) == Some("S256")
        && q.get("resource") == Some(&app.mcp_url);
    if !ok {
        return oauth_error("invalid_request");
    }
    let code = state.mint("code");
    let redirect = q["redirect_uri"].clone();
    let scope = q.get("scope").cloned().unwrap_or_default();
    state.codes.insert(
        code.clone(),
        (q["code_challenge"].clone(), redirect.clone(), client, scope),
    );
    let mut location = url::Url::parse(&redirect).unwrap();
    location
        .query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &q["state"]);
    (StatusCode::FOUND, [("location", location.to_string())]).into_response()
}

/// The client of a token request and how it authenticated: HTTP Basic,
/// the form's `client_secret`, a `private_key_jwt` assertion (its claims
/// checked, its signature verified with [`AuthState::jwt_keys`]), or none.
fn client_auth(
    app: &App,
    state: &AuthState,
    headers: &HeaderMap,
    f: &HashMap<String, String>,
) -> Result<(&'static str, String, Option<String>), &'static str> {
    let methods = state
        .layout
        .auth_methods
        .clone()
        .unwrap_or_else(|| vec!["none".into(), "client_secret_post".into()]);
    let offered = |m: &str| methods.iter().any(|x| x == m);
    if let Some(basic) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic)
            .map_err(|_| "invalid_client")?;
        let decoded = String::from_utf8(decoded).map_err(|_| "invalid_client")?;
        let (id, secret) = decoded.split_once(':').ok_or("invalid_client")?;
        let unescape = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        if !offered("client_secret_basic") {
            return Err("invalid_client");
        }
        return Ok(("basic", unescape(id), Some(unescape(secret))));
    }
    if let Some(assertion) = f.get("client_assertion") {
        if !offered("private_key_jwt")
            || f.get("client_assertion_type").map(String::as_str)
                != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        {
            return Err("invalid_client");
        }
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_audience(&[format!("{}{}", app.base, state.layout.issuer_path)]);
        validation.set_required_spec_claims(&["exp", "aud", "sub", "iss"]);
        for (client, key) in &state.jwt_keys {
            let key = jsonwebtoken::DecodingKey::from_ec_pem(key.as_bytes()).unwrap();
            if let Ok(data) = jsonwebtoken::decode::<Value>(assertion, &key, &validation) {
                let claims = data.claims;
                if claims["sub"] == json!(client) && claims["iss"] == json!(client) {
                    return Ok(("jwt", client.clone(), None));
                }
            }
        }
        return Err("invalid_client");
    }
    let client = f.get("client_id").cloned().unwrap_or_default();
    match f.get("client_secret") {
        Some(secret) if offered("client_secret_post") => Ok(("post", client, Some(secret.clone()))),
        Some(_) => Err("invalid_client"),
        None => Ok(("none", client, None)),
    }
}

async fn token(
    State(app): State<App>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    if !state.serves(uri.path(), "token") {
        return not_found();
    }
    state.token_requests += 1;
    let (auth, client, secret) = match client_auth(&app, &state, &headers, &f) {
        Ok(who) => who,
        Err(refused) => return oauth_error(refused),
    };
    if state.clients.contains_key(&client) && !state.knows(&app, &client) {
        return oauth_error("invalid_client");
    }
    state.token_forms.push(TokenRequest {
        auth,
        grant_type: f.get("grant_type").cloned().unwrap_or_default(),
        scope: f.get("scope").cloned(),
        resource: f.get("resource").cloned(),
    });
    if f.get("resource") != Some(&app.mcp_url) {
        return oauth_error("invalid_target");
    }
    // The scope granted: asked for at /authorize (a code), within the
    // original grant (a refresh, RFC 6749 §6), or as asked (client credentials).
    let mut granted = f.get("scope").cloned().unwrap_or_default();
    let with_refresh = match f.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let Some((challenge, redirect, owner, scope)) =
                f.get("code").and_then(|c| state.codes.remove(c))
            else {
                return oauth_error("invalid_grant");
            };
            let verifier = f.get("code_verifier").cloned().unwrap_or_default();
            let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(verifier.as_bytes()));
            if computed != challenge || f.get("redirect_uri") != Some(&redirect) || owner != client
            {
                return oauth_error("invalid_grant");
            }
            state.code_grants += 1;
            granted = scope;
            true
        }
        Some("refresh_token") => {
            let presented = f.get("refresh_token").cloned().unwrap_or_default();
            let issuer = state.issuer(&app);
            if !state.refresh.contains(&presented)
                || state
                    .issued_by
                    .get(&presented)
                    .is_some_and(|by| *by != issuer)
            {
                state.refused_refresh_grants += 1;
                return oauth_error("invalid_grant");
            }
            let original = state
                .refresh_scopes
                .get(&presented)
                .cloned()
                .unwrap_or_default();
            match f.get("scope") {
                Some(asked)
                    if !asked
                        .split_whitespace()
                        .all(|s| original.split_whitespace().any(|o| o == s)) =>
                {
                    return oauth_error("invalid_scope");
                }
                Some(_) => {}
                None => granted = original,
            }
            state.refresh.remove(&presented);
            state.refresh_grants += 1;
            true
        }
        Some(JWT_BEARER) => {
            let by_key = auth == "jwt";
            let expected = state.clients.get(&client).cloned().flatten();
            if !by_key && expected.is_some() && secret != expected {
                return oauth_error("invalid_client");
            }
            let assertion = f.get("assertion").cloned().unwrap_or_default();
            match redeem_id_jag(&app, &mut state, &client, &assertion) {
                Ok(scope) => granted = scope,
                Err(why) => {
                    state.refused_assertions.push(why.clone());
                    return oauth_refusal("invalid_grant", &why);
                }
            }
            state.jwt_bearer_grants += 1;
            false
        }
        Some("client_credentials") if state.layout.no_client_credentials => {
            return oauth_error("unauthorized_client");
        }
        Some("client_credentials") => {
            let by_key = auth == "jwt";
            let expected = state.clients.get(&client).cloned().flatten();
            if !by_key && (expected.is_none() || secret != expected) {
                return oauth_error("invalid_client");
            }
            state.client_credentials_grants += 1;
            false
        }
        _ => return oauth_error("unsupported_grant_type"),
    };
    let access = state.mint("at");
    state.access.insert(access.clone());
    state.scopes.insert(access.clone(), granted.clone());
    let expires_in = state.expires_in.unwrap_or(3600);
    let mut body =
        json!({ "access_token": access, "token_type": "Bearer", "expires_in": expires_in });
    if with_refresh {
        let refresh = state.mint("rt");
        state.refresh.insert(refresh.clone());
        let issuer = state.issuer(&app);
        state.issued_by.insert(refresh.clone(), issuer);
        state.refresh_scopes.insert(refresh.clone(), granted);
        body["refresh_token"] = json!(refresh);
    }
    Json(body).into_response()
}

/// The `retry` (ms) `/sse-mcp` sends before it closes a call's stream.
pub const SSE_RETRY_MS: u64 = 2500;

/// `/sse-mcp`: a streamable-HTTP MCP server, unprotected, that ends each
/// `tools/call`'s event stream gracefully after a priming event (an `id`
/// and a `retry`, SEP-1699) and gives the answer only to a `GET` that
/// resumes with that `Last-Event-ID` — written by hand, since the point is
/// exactly what an SDK's server would hide.
async fn resumable(
    State(app): State<App>,
    method: axum::http::Method,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let sse = |events: String| {
        (
            StatusCode::OK,
            [
                ("content-type", "text/event-stream"),
                ("mcp-session-id", "s1"),
            ],
            events,
        )
            .into_response()
    };
    if method == axum::http::Method::GET {
        let Some(last) = headers.get("last-event-id").and_then(|v| v.to_str().ok()) else {
            return StatusCode::METHOD_NOT_ALLOWED.into_response();
        };
        let mut state = app.state.lock().unwrap();
        let Some((answer, closed)) = state.held.take() else {
            return StatusCode::METHOD_NOT_ALLOWED.into_response();
        };
        state.resumed.push((last.to_string(), closed.elapsed()));
        return sse(format!("id: ev-2\ndata: {answer}\n\n"));
    }
    if method != axum::http::Method::POST {
        return StatusCode::OK.into_response();
    }
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Some(id) = message.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let answer = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    let result = match message["method"].as_str().unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "resumable", "version": "1"},
        }),
        "tools/list" => json!({"tools": [{
            "name": "slow", "description": "Answers on a resumed stream",
            "inputSchema": {"type": "object"},
        }]}),
        "tools/call" => {
            let result = answer(json!({"content": [{"type": "text", "text": "resumed answer"}]}));
            app.state.lock().unwrap().held = Some((result, std::time::Instant::now()));
            return sse(format!("id: ev-1\nretry: {SSE_RETRY_MS}\ndata: \n\n"));
        }
        _ => json!({}),
    };
    (
        StatusCode::OK,
        [
            ("content-type", "application/json"),
            ("mcp-session-id", "s1"),
        ],
        answer(result).to_string(),
    )
        .into_response()
}

/// The protected MCP server.
#[derive(Clone)]
struct RemoteServer;

impl ServerHandler for RemoteServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let object = |v: Value| Arc::new(v.as_object().unwrap().clone());
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "whoami",
                "Says which server answered",
                object(json!({"type": "object"})),
            ),
            Tool::new(
                "extensions",
                "The extensions the client declared, by name, one per line",
                object(json!({"type": "object"})),
            ),
            Tool::new(
                "read_file",
                "Reads a workspace file back through host-resources",
                object(json!({
                    "type": "object",
                    "properties": {"id": {"type": "string"}},
                    "required": ["id"]
                })),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "whoami" => {
                Ok(CallToolResult::success(vec![ContentBlock::text("remote fixture")]).into())
            }
            "extensions" => {
                let names: Vec<String> = context
                    .peer
                    .peer_info()
                    .and_then(|i| i.capabilities.extensions.clone())
                    .map(|e| e.keys().cloned().collect())
                    .unwrap_or_default();
                Ok(CallToolResult::success(vec![ContentBlock::text(names.join("\n"))]).into())
            }
            "read_file" => {
                let id = request
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let ask = ServerRequest::CustomRequest(CustomRequest::new(
                    "ai.nimblebrain/resources/read",
                    Some(json!({ "uri": format!("files://{id}") })),
                ));
                let text = match context.peer.send_request(ask).await {
                    Ok(ClientResult::CustomResult(CustomResult(v))) => v["contents"][0]["text"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    Ok(other) => format!("unexpected answer: {other:?}"),
                    Err(e) => format!("host-resources error: {e}"),
                };
                Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
            }
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}
