//! The operators' web dashboard (docs/operations.md, "The dashboard"):
//! served under `/ui/` on the `[http]` listener with `[http] dashboard =
//! true`, off by default.
//!
//! Who may use it: whoever may use the control socket. `bundlevisor
//! dashboard` (an admitted peer) gets a one-time sign-in link (five
//! minutes, one use); the link sets a session cookie (`HttpOnly`,
//! `SameSite=Strict`, `Secure` over HTTPS, 12 hours from its last use).
//! An agent's access token never opens it: offered as a bearer or pasted
//! into the sign-in form, it is refused with what to do instead.
//!
//! Every change is a POST of a form carrying the session's CSRF token,
//! refused when its `Origin` or `Sec-Fetch-Site` says another site sent
//! it. Pages are rendered on the server and read without JavaScript;
//! with it, `/ui/live` (server-sent events) keeps the bundle table and a
//! bundle's log current without a reload. No secret is rendered: a
//! token's text once, when made; a sensitive setting never.

mod pages;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Multipart, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use super::api::{Api, CallRequest};
use crate::bundle::client::Caller;
use crate::daemon::bundle::Respawn;
use crate::store::Origin;

/// How long a sign-in link works.
const CODE_LIFE: Duration = Duration::from_secs(300);
/// How long a session lasts without being used.
const SESSION_IDLE: Duration = Duration::from_secs(12 * 3600);
/// How long a session lasts at most, however much it is used.
const SESSION_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
/// The session cookie.
const COOKIE: &str = "bv_session";
/// The largest form a page posts (the upload aside).
const FORM_BYTES: usize = 64 * 1024;
/// Live streams open at once (each page holds one or two); beyond: 503.
const STREAMS: usize = 32;
/// How long one live stream lasts before the browser opens a new one
/// (`EventSource` reconnects by itself): a session's end is felt.
const STREAM_LIFE: Duration = Duration::from_secs(600);
/// Codes and sessions kept at once.
const MAX_ENTRIES: usize = 1024;

/// Sign-in codes handed out and sessions made from them (in memory: a
/// daemon restart signs everyone out).
pub struct Logins {
    codes: Mutex<HashMap<String, (String, Instant)>>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Live streams open.
    streams: Arc<tokio::sync::Semaphore>,
}

impl Default for Logins {
    fn default() -> Self {
        Logins {
            codes: Mutex::default(),
            sessions: Mutex::default(),
            streams: Arc::new(tokio::sync::Semaphore::new(STREAMS)),
        }
    }
}

/// One signed-in operator.
#[derive(Clone)]
struct Session {
    /// Who asked for the link (`uid:N`).
    principal: String,
    /// Each form's hidden `csrf` field.
    csrf: String,
    last_used: Instant,
    started: Instant,
}

impl Session {
    fn alive(&self) -> bool {
        self.last_used.elapsed() < SESSION_IDLE && self.started.elapsed() < SESSION_MAX
    }
}

fn random_hex() -> String {
    crate::store::tokens::random_bytes::<24>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Logins {
    /// A one-time sign-in code for `principal`.
    pub fn issue(&self, principal: String) -> String {
        let code = random_hex();
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        codes.retain(|_, (_, at)| now.duration_since(*at) < CODE_LIFE);
        if codes.len() >= MAX_ENTRIES {
            // The oldest goes: a flood of links ends none but its own.
            if let Some(oldest) = codes
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                codes.remove(&oldest);
            }
        }
        codes.insert(code.clone(), (principal, now));
        code
    }

    /// The session a valid, unused code makes (the code is spent).
    fn redeem(&self, code: &str) -> Option<String> {
        let (principal, at) = self
            .codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(code)?;
        if at.elapsed() >= CODE_LIFE {
            return None;
        }
        let id = random_hex();
        let session = Session {
            principal,
            csrf: random_hex(),
            last_used: Instant::now(),
            started: Instant::now(),
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, s| s.alive());
        if sessions.len() >= MAX_ENTRIES {
            if let Some(idle) = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&idle);
            }
        }
        sessions.insert(id.clone(), session);
        Some(id)
    }

    fn session(&self, id: &str) -> Option<Session> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let session = sessions.get_mut(id)?;
        if !session.alive() {
            sessions.remove(id);
            return None;
        }
        session.last_used = Instant::now();
        Some(session.clone())
    }

    /// Whether session `id` is still signed in (its clock not moved).
    fn lives(&self, id: &str) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .is_some_and(Session::alive)
    }

    fn end(&self, id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

#[derive(Clone)]
struct Ui {
    api: Api,
    /// Over HTTPS (here, or at a TLS-terminating proxy with `[http]
    /// insecure`): the cookie is `Secure`.
    tls: bool,
}

/// The dashboard's routes (`/ui/…`).
pub fn router(api: Api, tls: bool) -> Router {
    let upload = api.shared().config.archives.max_archive_bytes as usize + 64 * 1024;
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(overview))
        .route("/ui/login", get(login_page).post(login_form))
        .route("/ui/app.js", get(app_js))
        .route("/ui/logout", post(logout))
        .route("/ui/live", get(live))
        .route(
            "/ui/install",
            post(install).layer(DefaultBodyLimit::max(upload)),
        )
        .route("/ui/tokens", get(tokens).post(token_create))
        .route("/ui/bundle/{workspace}/{name}", get(bundle))
        .route("/ui/bundle/{workspace}/{name}/call", post(call))
        .route("/ui/bundle/{workspace}/{name}/restart", post(restart))
        .route("/ui/bundle/{workspace}/{name}/uninstall", post(uninstall))
        .route("/ui/bundle/{workspace}/{name}/configure", post(configure))
        .route("/ui/files", get(files))
        .route(
            "/ui/files/put",
            post(file_put).layer(DefaultBodyLimit::max(upload)),
        )
        .route("/ui/files/remove", post(file_remove))
        .route("/ui/files/{workspace}/{id}", get(file_get))
        .route(
            "/ui/bundle/{workspace}/{name}/upgrade",
            post(upgrade).layer(DefaultBodyLimit::max(upload)),
        )
        .route("/ui/bundle/{workspace}/{name}/logs", get(logs_live))
        .with_state(Ui {
            tls: tls || api.shared().config.http.insecure,
            api,
        })
}

/// Headers every page carries: no framing, no sniffing, no referrer to
/// another site, nothing from elsewhere.
fn guarded(mut response: Response) -> Response {
    let h = response.headers_mut();
    let set = |h: &mut HeaderMap, k: header::HeaderName, v: &'static str| {
        h.insert(k, header::HeaderValue::from_static(v));
    };
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    // Never to another site (a sign-in link must not leak); `no-referrer`
    // would make the browser send `Origin: null` with this site's forms.
    set(h, header::REFERRER_POLICY, "same-origin");
    set(h, header::CACHE_CONTROL, "no-store");
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    );
    response
}

/// The pages' one script: static, the same for everyone (no session
/// needed, nothing of the daemon's in it).
async fn app_js() -> Response {
    guarded(
        (
            [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
            pages::APP_JS,
        )
            .into_response(),
    )
}

/// A page that says one thing (a refusal, an error) under `title`.
fn said(status: StatusCode, title: &str, text: &str) -> Response {
    page(status, pages::message(title, text))
}

fn page(status: StatusCode, html: String) -> Response {
    guarded((status, Html(html)).into_response())
}

/// Why a request has no session, as the answer to give.
async fn refusal(ui: &Ui, headers: &HeaderMap) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(text) = bearer {
        return page(
            StatusCode::FORBIDDEN,
            pages::refused(is_agent_token(ui, text).await),
        );
    }
    guarded(Redirect::to("/ui/login").into_response())
}

/// Whether `text` is a live agent token (only a string of a token's shape
/// is looked up).
async fn is_agent_token(ui: &Ui, text: &str) -> bool {
    let text = text.trim();
    text.starts_with(crate::store::tokens::PREFIX)
        && text.len() < 200
        && matches!(ui.api.token_by_text(text).await, Ok(Some(_)))
}

fn cookie_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The request's session, or the answer to give instead.
async fn signed_in(ui: &Ui, headers: &HeaderMap) -> Result<Session, Response> {
    match cookie_of(headers).and_then(|id| ui.api.shared().dashboard.session(&id)) {
        Some(session) => Ok(session),
        None => Err(refusal(ui, headers).await),
    }
}

/// Whether the browser says this site's own page sent the request (its
/// `Origin` names this host, `Sec-Fetch-Site` is same-origin), where it
/// says anything.
fn sent_here(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_ok = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => url::Url::parse(origin).ok().is_some_and(|o| {
            let authority = match o.port() {
                Some(port) => format!("{}:{port}", o.host_str().unwrap_or_default()),
                None => o.host_str().unwrap_or_default().to_string(),
            };
            host == Some(authority.as_str())
        }),
    };
    let site_ok = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_none_or(|s| s == "same-origin" || s == "none");
    origin_ok && site_ok
}

fn foreign() -> Response {
    said(
        StatusCode::FORBIDDEN,
        "Refused",
        "This change did not come from a page of this dashboard (its origin or form token is wrong). Reload the page and try again.",
    )
}

/// A posted form's fields, read within `[http] body_timeout` and
/// [`FORM_BYTES`].
async fn read_form(ui: &Ui, body: axum::body::Body) -> Result<HashMap<String, String>, Response> {
    let within = ui.api.shared().config.http.body_timeout;
    match tokio::time::timeout(within, axum::body::to_bytes(body, FORM_BYTES)).await {
        Ok(Ok(bytes)) => Ok(form(&bytes)),
        Ok(Err(_)) => Err(said(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Refused",
            "the form is too large",
        )),
        Err(_) => Err(said(
            StatusCode::REQUEST_TIMEOUT,
            "Refused",
            "the form did not arrive in time",
        )),
    }
}

/// A change: its session and sender checked before its body is read, then
/// its fields, whose CSRF token must be the session's.
async fn posted(ui: &Ui, request: Request) -> Result<(Session, HashMap<String, String>), Response> {
    let (parts, body) = request.into_parts();
    let session = signed_in(ui, &parts.headers).await?;
    if !sent_here(&parts.headers) {
        return Err(foreign());
    }
    let fields = read_form(ui, body).await?;
    if fields.get("csrf") != Some(&session.csrf) {
        return Err(foreign());
    }
    Ok((session, fields))
}

fn form(body: &[u8]) -> HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

/// The sign-in page; a link's code is only filled in (a GET spends
/// nothing: a link preview or scanner cannot use it up).
async fn login_page(RawQuery(query): RawQuery) -> Response {
    let code = form(query.unwrap_or_default().as_bytes()).remove("code");
    page(StatusCode::OK, pages::login(None, code.as_deref()))
}

/// A code posted from the sign-in page itself (another site cannot sign
/// a browser in as someone else).
async fn login_form(State(ui): State<Ui>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if !sent_here(&parts.headers) {
        return foreign();
    }
    let code = match read_form(&ui, body).await {
        Ok(mut fields) => fields.remove("code").unwrap_or_default(),
        Err(r) => return r,
    };
    sign_in(&ui, code.trim()).await
}

/// A code spent for a session cookie; an agent's token refused by name.
async fn sign_in(ui: &Ui, code: &str) -> Response {
    let shared = ui.api.shared();
    match shared.dashboard.redeem(code) {
        Some(id) => {
            let secure = if ui.tls { "; Secure" } else { "" };
            let cookie = format!(
                "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=43200{secure}"
            );
            let mut response = Redirect::to("/ui/").into_response();
            if let Ok(value) = header::HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            guarded(response)
        }
        None => {
            let why = if is_agent_token(ui, code).await {
                pages::AGENT_REFUSED
            } else {
                "That sign-in code is unknown, used or expired (a link works once, for five minutes). Run `bundlevisor dashboard` for a new one."
            };
            page(StatusCode::FORBIDDEN, pages::login(Some(why), None))
        }
    }
}

async fn logout(State(ui): State<Ui>, request: Request) -> Response {
    let headers = request.headers().clone();
    if let Err(refused) = posted(&ui, request).await {
        return refused;
    }
    if let Some(id) = cookie_of(&headers) {
        ui.api.shared().dashboard.end(&id);
    }
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        header::HeaderValue::from_static("bv_session=; Path=/ui; Max-Age=0"),
    );
    guarded(response)
}

async fn overview(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let session = match signed_in(&ui, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match ui.api.status(None, true, false) {
        Ok(status) => page(
            StatusCode::OK,
            pages::overview(&session.csrf, &session.principal, &status),
        ),
        Err(e) => said(StatusCode::INTERNAL_SERVER_ERROR, "Status", &e.to_string()),
    }
}

/// A live stream's right to run: a slot of [`STREAMS`], its session (it
/// ends when the session does) and its end of life.
struct Lease {
    _slot: tokio::sync::OwnedSemaphorePermit,
    api: Api,
    session: String,
    until: Instant,
}

impl Lease {
    fn lives(&self) -> bool {
        Instant::now() < self.until && self.api.shared().dashboard.lives(&self.session)
    }
}

/// A lease for a live stream of a signed-in request, or the answer to give.
async fn lease(ui: &Ui, headers: &HeaderMap) -> Result<Lease, Response> {
    signed_in(ui, headers).await?;
    let session = cookie_of(headers).unwrap_or_default();
    let slot = ui
        .api
        .shared()
        .dashboard
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            said(
                StatusCode::SERVICE_UNAVAILABLE,
                "Busy",
                "too many live views are open; close some pages",
            )
        })?;
    Ok(Lease {
        _slot: slot,
        api: ui.api.clone(),
        session,
        until: Instant::now() + STREAM_LIFE,
    })
}

/// Every bundle's row, as `/ui/` shows it, whenever something changes
/// (at most four times a second) and every two seconds (uptime, memory),
/// for as long as the session lives (at most [`STREAM_LIFE`]).
async fn live(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let lease = match lease(&ui, &headers).await {
        Ok(lease) => lease,
        Err(r) => return r,
    };
    let events = ui.api.events();
    let stream = futures::stream::unfold(
        (lease, events, true),
        |(lease, mut events, first)| async move {
            if !first {
                let tick = tokio::time::sleep(Duration::from_secs(2));
                tokio::select! {
                    _ = tick => {}
                    _ = events.recv() => {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        while events.try_recv().is_ok() {}
                    }
                }
            }
            if !lease.lives() {
                return None;
            }
            let rows = lease
                .api
                .status(None, true, false)
                .map(|s| pages::rows_json(&s))
                .unwrap_or_default();
            let event = SseEvent::default().event("status").data(rows);
            Some((
                Ok::<_, std::convert::Infallible>(event),
                (lease, events, false),
            ))
        },
    );
    guarded(
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

async fn bundle(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
) -> Response {
    let session = match signed_in(&ui, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    bundle_page(&ui, &session, (&workspace, &name), None).await
}

/// A bundle's page, with the answer of a tool call just made.
async fn bundle_page(
    ui: &Ui,
    session: &Session,
    (workspace, name): (&str, &str),
    called: Option<(String, String, bool)>,
) -> Response {
    let Some(status) = ui.api.bundle_status(workspace, name) else {
        return said(
            StatusCode::NOT_FOUND,
            "No such bundle",
            &format!("{workspace}/{name} is not installed."),
        );
    };
    let tools = ui
        .api
        .tools(workspace, Some(name))
        .await
        .ok()
        .and_then(|mut b| b.pop())
        .map(|b| b.tools)
        .unwrap_or_default();
    let path = ui.api.shared().config.log_path(workspace, name);
    let lines = tokio::task::spawn_blocking(move || super::control::tail_lines(&path, 200))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    // The settings its manifest declares: sensitive ones write-only.
    let settings: Vec<(String, String, bool)> = match ui.api.running_manifest(workspace, name).await
    {
        Ok(loaded) => loaded
            .manifest
            .user_config
            .iter()
            .map(|(key, entry)| (key.clone(), entry.title.clone(), entry.sensitive))
            .collect(),
        Err(_) => Vec::new(),
    };
    let events = ui.api.shared().board.recent(workspace, name, 50);
    let view = pages::BundleView {
        status: &status,
        tools: &tools,
        lines: &lines,
        events: &events,
        settings: &settings,
        called,
    };
    page(StatusCode::OK, pages::bundle(&session.csrf, view))
}

/// The settings given in the form (`cfg.KEY`, empty ones left as they
/// are), stored and the bundle respawned with them.
async fn configure(
    State(ui): State<Ui>,
    Path((workspace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (session, fields) = match posted(&ui, request).await {
        Ok(posted) => posted,
        Err(r) => return r,
    };
    let set: std::collections::BTreeMap<String, String> = fields
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("cfg.")?.to_string(), v.clone())))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if set.is_empty() {
        return said(
            StatusCode::BAD_REQUEST,
            "Nothing to set",
            "fill in at least one setting (empty ones are left as they are)",
        );
    }
    // Paths are judged as the signed-in user's own (`uid:N`).
    let uid = session
        .principal
        .strip_prefix("uid:")
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX);
    let params = crate::protocol::ConfigureParams {
        workspace: workspace.clone(),
        name: name.clone(),
        set,
        unset: Vec::new(),
        refs: Default::default(),
    };
    match ui
        .api
        .configure(params, super::admission::Peer { uid }, |_| async {})
        .await
    {
        Ok(_) => guarded(Redirect::to(&pages::bundle_url(&workspace, &name)).into_response()),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not configured", &e.to_string()),
    }
}

/// A workspace's files (`?workspace=`, the default one without).
async fn files(State(ui): State<Ui>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let session = match signed_in(&ui, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let workspace = form(query.unwrap_or_default().as_bytes())
        .remove("workspace")
        .unwrap_or_else(|| crate::protocol::DEFAULT_WORKSPACE.to_string());
    match ui
        .api
        .files(&workspace, super::workspace::FilesOp::List)
        .await
    {
        Ok(list) => page(
            StatusCode::OK,
            pages::files(&session.csrf, &workspace, &ui.api.known_workspaces(), &list),
        ),
        Err(e) => said(StatusCode::NOT_FOUND, "Files", &e.to_string()),
    }
}

async fn call(
    State(ui): State<Ui>,
    Path((workspace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (session, fields) = match posted(&ui, request).await {
        Ok(posted) => posted,
        Err(r) => return r,
    };
    let tool = fields.get("tool").cloned().unwrap_or_default();
    let text = fields
        .get("arguments")
        .map(|a| a.trim())
        .unwrap_or_default();
    let arguments = match text {
        "" => Ok(None),
        text => serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| format!("the arguments are not JSON: {e}"))
            .and_then(|v| match v {
                serde_json::Value::Object(o) => Ok(Some(o)),
                _ => {
                    Err("the arguments must be a JSON object, e.g. {\"text\": \"hi\"}".to_string())
                }
            }),
    };
    let answer = match arguments {
        Err(why) => (why, true),
        Ok(arguments) => {
            let request = CallRequest {
                workspace: workspace.clone(),
                name: name.clone(),
                tool: tool.clone(),
                arguments,
                timeout: None,
                wait_ready: Some(Duration::from_secs(10)),
                trace: ui.api.shared().telemetry.root(),
            };
            let cancel = tokio_util::sync::CancellationToken::new();
            match ui.api.call(&request, None, &cancel, Caller::Operator).await {
                Ok(result) => {
                    let text = result
                        .content
                        .iter()
                        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                        .collect::<Vec<_>>()
                        .join("\n");
                    (text, result.is_error == Some(true))
                }
                Err(e) => (e.to_string(), true),
            }
        }
    };
    bundle_page(
        &ui,
        &session,
        (&workspace, &name),
        Some((tool, answer.0, answer.1)),
    )
    .await
}

/// A POSTed action on one bundle: its form checked, then `act`, then back
/// to `to` (or a page saying why not).
async fn act<F: std::future::Future<Output = Result<(), super::api::ApiError>>>(
    ui: &Ui,
    request: Request,
    to: String,
    act: impl FnOnce() -> F,
) -> Response {
    if let Err(r) = posted(ui, request).await {
        return r;
    }
    match act().await {
        Ok(()) => guarded(Redirect::to(&to).into_response()),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not done", &e.to_string()),
    }
}

async fn restart(
    State(ui): State<Ui>,
    Path((workspace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let to = pages::bundle_url(&workspace, &name);
    act(&ui, request, to, || async {
        ui.api
            .respawn_and_wait(&workspace, &name, Respawn::Operator, |_| async {})
            .await
            .map(|_| ())
    })
    .await
}

async fn uninstall(
    State(ui): State<Ui>,
    Path((workspace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    act(&ui, request, "/ui/".to_string(), || async {
        ui.api.uninstall(&workspace, &name, false).await.map(|_| ())
    })
    .await
}

/// A bundle's new log lines and lifecycle events, as server-sent events
/// (`log`, `lifecycle`), for as long as the session lives (checked at
/// each one and every ten seconds).
async fn logs_live(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
) -> Response {
    let lease = match lease(&ui, &headers).await {
        Ok(lease) => lease,
        Err(r) => return r,
    };
    use tokio::sync::broadcast::error::RecvError;
    let feeds = (ui.api.shared().log_lines.subscribe(), ui.api.events());
    let stream = futures::stream::unfold((lease, feeds), move |(lease, mut feeds)| {
        let (workspace, name) = (workspace.clone(), name.clone());
        async move {
            loop {
                let tick = tokio::time::sleep(Duration::from_secs(10));
                let event = tokio::select! {
                    line = feeds.0.recv() => match line {
                        Ok(l) if l.workspace == workspace && l.name == name => {
                            Some(SseEvent::default().event("log").data(l.line))
                        }
                        Ok(_) | Err(RecvError::Lagged(_)) => None,
                        Err(RecvError::Closed) => return None,
                    },
                    happened = feeds.1.recv() => match happened {
                        Ok(e) if e.workspace == workspace && e.name == name => {
                            Some(SseEvent::default().event("lifecycle").data(pages::event_json(&e)))
                        }
                        Ok(_) | Err(RecvError::Lagged(_)) => None,
                        Err(RecvError::Closed) => return None,
                    },
                    _ = tick => None,
                };
                if !lease.lives() {
                    return None;
                }
                if let Some(event) = event {
                    return Some((Ok::<_, std::convert::Infallible>(event), (lease, feeds)));
                }
            }
        }
    });
    guarded(
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// What a page's upload form carries: its text fields, and its one file
/// (on disk, removed when dropped) with the name the browser gave it.
struct Uploaded {
    fields: HashMap<String, String>,
    file: Option<(Upload, String)>,
}

/// Which file an upload form takes.
#[derive(Clone, Copy, PartialEq)]
enum Takes {
    /// A `.mcpb` archive (part `archive`).
    Archive,
    /// Any file for the workspace's FileStore (part `file`).
    File,
}

/// Reads an upload form (`multipart/form-data`). The sender is checked
/// before any of the body is read, and the form's CSRF token must come
/// first (the pages' forms put it there); its text fields are held to
/// [`FORM_BYTES`] together, and the file is streamed to `STATE_DIR/uploads/`
/// (bounded by `[archives] max_archive_bytes`), each part within `[http]
/// body_timeout`.
async fn uploaded(
    ui: &Ui,
    headers: &HeaderMap,
    mut form: Multipart,
    takes: Takes,
) -> Result<Uploaded, Response> {
    let session = signed_in(ui, headers).await?;
    if !sent_here(headers) {
        return Err(foreign());
    }
    let refused = |why: &str| said(StatusCode::BAD_REQUEST, "Not uploaded", why);
    let within = ui.api.shared().config.http.body_timeout;
    let (mut fields, mut file, mut checked) = (HashMap::new(), None, false);
    // All its text fields together, at most a form's worth.
    let mut text_bytes = 0;
    let wanted = match takes {
        Takes::Archive => "archive",
        Takes::File => "file",
    };
    loop {
        let field = match tokio::time::timeout(within, form.next_field()).await {
            Ok(Ok(Some(field))) => field,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(refused(&format!("the form did not arrive whole: {e}"))),
            Err(_) => return Err(refused("the form stalled")),
        };
        let name = field.name().unwrap_or_default().to_string();
        if name == wanted && checked {
            let sent = plain_name(field.file_name().unwrap_or_default());
            let saved = save_upload(ui, field, &sent, takes).await;
            file = Some((saved.map_err(|w| refused(&w))?, sent));
            continue;
        }
        let text = small_text(field, within).await.map_err(|w| refused(&w))?;
        text_bytes += name.len() + text.len();
        if text_bytes > FORM_BYTES {
            return Err(refused("the form's fields are too large"));
        }
        if !checked {
            if name != "csrf" || text != session.csrf {
                return Err(foreign());
            }
            checked = true;
        }
        fields.insert(name, text);
    }
    if !checked {
        return Err(foreign());
    }
    Ok(Uploaded { fields, file })
}

/// A text part of a form, at most [`FORM_BYTES`].
async fn small_text(
    mut field: axum::extract::multipart::Field<'_>,
    within: Duration,
) -> Result<String, String> {
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout(within, field.chunk()).await {
            Ok(Ok(Some(chunk))) => bytes.extend_from_slice(&chunk),
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(format!("the form did not arrive whole: {e}")),
            Err(_) => return Err("the form stalled".to_string()),
        }
        if bytes.len() > FORM_BYTES {
            return Err("a field of the form is too large".to_string());
        }
    }
    String::from_utf8(bytes).map_err(|_| "a field of the form is not text".to_string())
}

/// An uploaded `.mcpb`, installed into the chosen workspace (it runs
/// from its unpacked copy, as any archive does; the upload is removed,
/// whatever happens).
async fn install(State(ui): State<Ui>, headers: HeaderMap, form: Multipart) -> Response {
    let Uploaded { fields, file } = match uploaded(&ui, &headers, form, Takes::Archive).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let Some((file, _)) = file else {
        return said(
            StatusCode::BAD_REQUEST,
            "Not installed",
            "choose a .mcpb archive to upload",
        );
    };
    let workspace = fields
        .get("workspace")
        .map(|w| w.trim())
        .filter(|w| !w.is_empty())
        .unwrap_or(crate::protocol::DEFAULT_WORKSPACE);
    let installed = ui
        .api
        .install(file.0.clone(), workspace, Origin::Cli, true, |_| async {})
        .await;
    drop(file);
    match installed {
        Ok(status) => guarded(
            Redirect::to(&pages::bundle_url(&status.workspace, &status.name)).into_response(),
        ),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not installed", &e.to_string()),
    }
}

/// An uploaded `.mcpb` of this bundle, run in place of the installed
/// version (`bundlevisor upgrade`); the running version stays when the
/// new one is refused.
async fn upgrade(
    State(ui): State<Ui>,
    Path((workspace, name)): Path<(String, String)>,
    headers: HeaderMap,
    form: Multipart,
) -> Response {
    let file = match uploaded(&ui, &headers, form, Takes::Archive).await {
        Ok(Uploaded {
            file: Some((file, _)),
            ..
        }) => file,
        Ok(_) => {
            return said(
                StatusCode::BAD_REQUEST,
                "Not upgraded",
                "choose a .mcpb archive to upload",
            )
        }
        Err(r) => return r,
    };
    let upgraded = ui
        .api
        .upgrade(file.0.clone(), &workspace, Some(&name), true, |_| async {})
        .await;
    drop(file);
    match upgraded {
        Ok(_) => guarded(Redirect::to(&pages::bundle_url(&workspace, &name)).into_response()),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not upgraded", &e.to_string()),
    }
}

/// An upload on disk, removed when dropped (installed or not, the client
/// gone or not).
struct Upload(std::path::PathBuf);

impl Drop for Upload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The last component of a name the browser sent, without control
/// characters, at most 200 characters (never empty).
fn plain_name(sent: &str) -> String {
    let last = sent.rsplit(['/', '\\']).next().unwrap_or_default();
    let name: String = last.chars().filter(|c| !c.is_control()).take(200).collect();
    match name.trim() {
        "" | "." | ".." => "upload".to_string(),
        name => name.to_string(),
    }
}

/// Streams the file part to `STATE_DIR/uploads/RANDOM-STEM` (a name of
/// its own: never over another file).
async fn save_upload(
    ui: &Ui,
    mut field: axum::extract::multipart::Field<'_>,
    file: &str,
    takes: Takes,
) -> Result<Upload, String> {
    use tokio::io::AsyncWriteExt;
    if takes == Takes::Archive && !file.ends_with(".mcpb") {
        return Err(format!(
            "{file:?} is not a .mcpb archive (pack a bundle folder with `mcpb pack`)"
        ));
    }
    // Only its stem's plain characters name it on disk (an archive's
    // stem names its row while it is unpacked).
    let stem: String = std::path::Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    let stem = if stem.is_empty() {
        "upload".to_string()
    } else {
        stem
    };
    let config = &ui.api.shared().config;
    let dir = config.state_dir.join("uploads");
    let extension = match takes {
        Takes::Archive => "mcpb",
        Takes::File => "upload",
    };
    let kept = Upload(dir.join(format!("{stem}-{}.{extension}", &random_hex()[..8])));
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| format!("cannot keep the upload: {e}"))?;
    let mut out = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&kept.0)
        .await
        .map_err(|e| format!("cannot keep the upload: {e}"))?;
    let (limit, within) = (config.archives.max_archive_bytes, config.http.body_timeout);
    let mut size = 0u64;
    loop {
        let chunk = match tokio::time::timeout(within, field.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(format!("the upload did not arrive whole: {e}")),
            Err(_) => return Err("the upload stalled".to_string()),
        };
        size += chunk.len() as u64;
        if size > limit {
            return Err(format!(
                "the upload is larger than [archives] max_archive_bytes ({limit} bytes)"
            ));
        }
        out.write_all(&chunk)
            .await
            .map_err(|e| format!("cannot keep the upload: {e}"))?;
    }
    out.sync_all()
        .await
        .map_err(|e| format!("cannot keep the upload: {e}"))?;
    Ok(kept)
}

/// Where a workspace's files page is.
fn files_url(workspace: &str) -> String {
    format!("/ui/files?workspace={}", pages::path(workspace))
}

/// An uploaded file put into the chosen workspace's FileStore, under the
/// name it had (tags: the form's, comma-separated).
async fn file_put(State(ui): State<Ui>, headers: HeaderMap, form: Multipart) -> Response {
    let Uploaded { fields, file } = match uploaded(&ui, &headers, form, Takes::File).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let workspace = fields
        .get("workspace")
        .cloned()
        .unwrap_or_else(|| crate::protocol::DEFAULT_WORKSPACE.to_string());
    let Some((file, sent)) = file else {
        return said(
            StatusCode::BAD_REQUEST,
            "Not added",
            "choose a file to upload",
        );
    };
    let tags: Vec<String> = fields
        .get("tags")
        .map(|t| {
            t.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let path = file.0.clone();
    let put = ui
        .api
        .files(&workspace, |reply| super::workspace::FilesOp::Put {
            path,
            filename: Some(sent),
            tags,
            mime: None,
            held: Box::new(file),
            reply,
        })
        .await;
    match put {
        Ok(_) => guarded(Redirect::to(&files_url(&workspace)).into_response()),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not added", &e.to_string()),
    }
}

/// A file removed from a workspace's FileStore.
async fn file_remove(State(ui): State<Ui>, request: Request) -> Response {
    let (_, fields) = match posted(&ui, request).await {
        Ok(posted) => posted,
        Err(r) => return r,
    };
    let (Some(workspace), Some(id)) = (fields.get("workspace"), fields.get("id")) else {
        return said(
            StatusCode::BAD_REQUEST,
            "Not removed",
            "the form names no file",
        );
    };
    let id = id.clone();
    match ui
        .api
        .files(workspace, |reply| super::workspace::FilesOp::Remove {
            id,
            reply,
        })
        .await
    {
        Ok(true) => guarded(Redirect::to(&files_url(workspace)).into_response()),
        Ok(false) => said(
            StatusCode::NOT_FOUND,
            "Not removed",
            "no such file (removed already?)",
        ),
        Err(e) => said(StatusCode::BAD_REQUEST, "Not removed", &e.to_string()),
    }
}

/// A file's bytes, as a download (never shown in the dashboard's own
/// origin: whatever it holds, it is not a page of this site).
async fn file_get(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, id)): Path<(String, String)>,
) -> Response {
    if let Err(r) = signed_in(&ui, &headers).await {
        return r;
    }
    let got = ui
        .api
        .files(&workspace, |reply| super::workspace::FilesOp::Get {
            id,
            reply,
        })
        .await;
    let (record, bytes) = match got {
        Ok(Some(found)) => found,
        Ok(None) => {
            return said(
                StatusCode::NOT_FOUND,
                "No such file",
                "no such file in this workspace",
            )
        }
        Err(e) => return said(StatusCode::BAD_REQUEST, "Files", &e.to_string()),
    };
    let disposition = format!(
        "attachment; filename*=UTF-8''{}",
        pages::path(&record.filename)
    );
    let mut response = guarded(
        (
            [(header::CONTENT_TYPE, "application/octet-stream".to_string())],
            bytes,
        )
            .into_response(),
    );
    if let Ok(value) = header::HeaderValue::from_str(&disposition) {
        response
            .headers_mut()
            .insert(header::CONTENT_DISPOSITION, value);
    }
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("sandbox"),
    );
    response
}

async fn tokens(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let session = match signed_in(&ui, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    tokens_page(&ui, &session, None).await
}

async fn tokens_page(ui: &Ui, session: &Session, made: Option<pages::Made>) -> Response {
    match ui.api.tokens(None).await {
        Ok(list) => page(StatusCode::OK, pages::tokens(&session.csrf, &list, made)),
        Err(e) => said(StatusCode::INTERNAL_SERVER_ERROR, "Tokens", &e.to_string()),
    }
}

async fn token_create(State(ui): State<Ui>, request: Request) -> Response {
    let headers = request.headers().clone();
    let (session, fields) = match posted(&ui, request).await {
        Ok(posted) => posted,
        Err(r) => return r,
    };
    let field = |k: &str| {
        fields
            .get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let workspace =
        field("workspace").unwrap_or_else(|| crate::protocol::DEFAULT_WORKSPACE.to_string());
    match ui
        .api
        .token_create(
            field("name"),
            &workspace,
            field("profile"),
            None,
            (Vec::new(), Vec::new()),
        )
        .await
    {
        Ok(made) => {
            // The entry an agent's MCP client takes (as `bundlevisor
            // connect --http` writes it), at the address this page was
            // reached on.
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("127.0.0.1");
            let scheme = if ui.tls { "https" } else { "http" };
            let mut url = format!(
                "{scheme}://{host}/mcp/{}",
                pages::path(&made.info.workspace)
            );
            if let Some(profile) = &made.info.profile {
                url.push_str(&format!("/{}", pages::path(profile)));
            }
            let entry = serde_json::json!({"mcpServers": {format!("bundlevisor-{}", made.info.workspace): {
                "type": "http",
                "url": url,
                "headers": {"Authorization": format!("Bearer {}", made.token)},
            }}});
            let made = pages::Made {
                name: made.info.name.clone(),
                token: made.token.clone(),
                entry: serde_json::to_string_pretty(&entry).unwrap_or_default(),
            };
            tokens_page(&ui, &session, Some(made)).await
        }
        Err(e) => said(StatusCode::BAD_REQUEST, "No token made", &e.to_string()),
    }
}
