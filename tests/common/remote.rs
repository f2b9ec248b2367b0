//! Test fixture for remote bundles: a small OAuth 2.1 authorization server
//! and a protected streamable-HTTP MCP server, in-process on loopback (one
//! axum app on one port). It stands in for the external services the daemon
//! talks to; the daemon itself runs for real.
//!
//! The authorization server serves RFC 9728 / RFC 8414 metadata, dynamic
//! registration, `/authorize` (approves at once, redirecting with a code),
//! and `/token` with the authorization-code (PKCE S256 checked),
//! refresh-token (rotating) and client-credentials grants. The MCP server
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
    codes: HashMap<String, (String, String, String)>, // code -> (challenge, redirect_uri, client_id)
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
    /// Every token ever issued, for leak scans.
    pub issued: Vec<String>,
    /// `expires_in` of issued access tokens (seconds; 3600 unless set).
    pub expires_in: Option<i64>,
    /// Every request to `/token`, answered or refused.
    pub token_requests: u32,
    /// Requests of the protected-resource metadata.
    pub resource_metadata_requests: u32,
    /// What the servers say instead of the truth.
    pub lies: Lies,
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
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(resource_metadata),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                get(server_metadata),
            )
            .route("/moved", axum::routing::any(moved))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
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
    if live {
        return next.run(request).await;
    }
    let metadata = app
        .state
        .lock()
        .unwrap()
        .lies
        .challenge_metadata
        .clone()
        .unwrap_or_else(|| format!("{}/.well-known/oauth-protected-resource/mcp", app.base));
    let challenge = format!("Bearer error=\"invalid_token\", resource_metadata=\"{metadata}\"");
    (
        StatusCode::UNAUTHORIZED,
        [("www-authenticate", challenge)],
        "unauthorized",
    )
        .into_response()
}

async fn resource_metadata(State(app): State<App>) -> Json<Value> {
    let mut state = app.state.lock().unwrap();
    state.resource_metadata_requests += 1;
    let resource = state.lies.resource.clone().unwrap_or(app.mcp_url);
    Json(json!({ "resource": resource, "authorization_servers": [app.base] }))
}

async fn server_metadata(State(app): State<App>) -> Json<Value> {
    let b = &app.base;
    let issuer = app.state.lock().unwrap().lies.issuer.clone();
    Json(json!({
        "issuer": issuer.as_ref().unwrap_or(b),
        "authorization_endpoint": format!("{b}/authorize"),
        "token_endpoint": format!("{b}/token"),
        "registration_endpoint": format!("{b}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post"],
    }))
}

async fn register(State(app): State<App>, Json(body): Json<Value>) -> Json<Value> {
    let mut state = app.state.lock().unwrap();
    state.registrations += 1;
    let id = state.mint("client");
    state.clients.insert(id.clone(), None);
    Json(json!({ "client_id": id, "redirect_uris": body["redirect_uris"] }))
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

async fn authorize(State(app): State<App>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut state = app.state.lock().unwrap();
    let client = q.get("client_id").cloned().unwrap_or_default();
    let ok = state.clients.contains_key(&client)
        && q.get("response_type").map(String::as_str) == Some("code")
        && q.get("code_challenge_method").map(String::as_str) == Some("S256")
        && q.get("resource") == Some(&app.mcp_url);
    if !ok {
        return oauth_error("invalid_request");
    }
    let code = state.mint("code");
    let redirect = q["redirect_uri"].clone();
    state.codes.insert(
        code.clone(),
        (q["code_challenge"].clone(), redirect.clone(), client),
    );
    let mut location = url::Url::parse(&redirect).unwrap();
    location
        .query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &q["state"]);
    (StatusCode::FOUND, [("location", location.to_string())]).into_response()
}

async fn token(
    State(app): State<App>,
    _headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let mut state = app.state.lock().unwrap();
    state.token_requests += 1;
    if f.get("resource") != Some(&app.mcp_url) {
        return oauth_error("invalid_target");
    }
    let client = f.get("client_id").cloned().unwrap_or_default();
    let with_refresh = match f.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let Some((challenge, redirect, owner)) =
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
            true
        }
        Some("refresh_token") => {
            let presented = f.get("refresh_token").cloned().unwrap_or_default();
            if !state.refresh.remove(&presented) {
                state.refused_refresh_grants += 1;
                return oauth_error("invalid_grant");
            }
            state.refresh_grants += 1;
            true
        }
        Some("client_credentials") => {
            let expected = state.clients.get(&client).cloned().flatten();
            if expected.is_none() || f.get("client_secret") != expected.as_ref() {
                return oauth_error("invalid_client");
            }
            state.client_credentials_grants += 1;
            false
        }
        _ => return oauth_error("unsupported_grant_type"),
    };
    let access = state.mint("at");
    state.access.insert(access.clone());
    let expires_in = state.expires_in.unwrap_or(3600);
    let mut body =
        json!({ "access_token": access, "token_type": "Bearer", "expires_in": expires_in });
    if with_refresh {
        let refresh = state.mint("rt");
        state.refresh.insert(refresh.clone());
        body["refresh_token"] = json!(refresh);
    }
    Json(body).into_response()
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
