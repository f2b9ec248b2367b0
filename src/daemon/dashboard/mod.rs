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
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Multipart, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;

use super::api::{Api, CallRequest};
use crate::bundle::client::Caller;
use crate::daemon::bundle::Respawn;
use crate::store::Origin;

/// How long a sign-in link works.
const CODE_LIFE: Duration = Duration::from_secs(300);
/// How long a session lasts without being used.
const SESSION_IDLE: Duration = Duration::from_secs(12 * 3600);
/// The session cookie.
const COOKIE: &str = "bv_session";

/// Sign-in codes handed out and sessions made from them (in memory: a
/// daemon restart signs everyone out).
#[derive(Default)]
pub struct Logins {
    codes: Mutex<HashMap<String, (String, Instant)>>,
    sessions: Mutex<HashMap<String, Session>>,
}

/// One signed-in operator.
#[derive(Clone)]
struct Session {
    /// Who asked for the link (`uid:N`).
    principal: String,
    /// Each form's hidden `csrf` field.
    csrf: String,
    last_used: Instant,
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
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, s| s.last_used.elapsed() < SESSION_IDLE);
        sessions.insert(id.clone(), session);
        Some(id)
    }

    fn session(&self, id: &str) -> Option<Session> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let session = sessions.get_mut(id)?;
        if session.last_used.elapsed() >= SESSION_IDLE {
            sessions.remove(id);
            return None;
        }
        session.last_used = Instant::now();
        Some(session.clone())
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
    /// Over HTTPS: the cookie is `Secure`.
    tls: bool,
}

/// The dashboard's routes (`/ui/…`).
pub fn router(api: Api, tls: bool) -> Router {
    let upload = api.shared().config.archives.max_archive_bytes as usize + 64 * 1024;
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(overview))
        .route("/ui/login", get(login_page).post(login_form))
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
        .route("/ui/bundle/{workspace}/{name}/logs", get(logs_live))
        .with_state(Ui { api, tls })
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
        "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'",
    );
    response
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
        let agent = matches!(ui.api.token_by_text(text.trim()).await, Ok(Some(_)));
        return page(StatusCode::FORBIDDEN, pages::refused(agent));
    }
    guarded(Redirect::to("/ui/login").into_response())
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

/// A change's session: signed in, sent by this site's own page (its
/// `Origin` and `Sec-Fetch-Site`), carrying the session's CSRF token.
async fn change(ui: &Ui, headers: &HeaderMap, csrf: Option<&str>) -> Result<Session, Response> {
    let session = signed_in(ui, headers).await?;
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
    if !origin_ok || !site_ok || csrf != Some(session.csrf.as_str()) {
        return Err(page(
            StatusCode::FORBIDDEN,
            pages::message(
                "Refused",
                "This change did not come from a page of this dashboard (its origin or form token is wrong). Reload the page and try again.",
            ),
        ));
    }
    Ok(session)
}

fn form(body: &[u8]) -> HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

async fn login_page(State(ui): State<Ui>, RawQuery(query): RawQuery) -> Response {
    match form(query.unwrap_or_default().as_bytes()).get("code") {
        Some(code) => sign_in(&ui, code).await,
        None => page(StatusCode::OK, pages::login(None)),
    }
}

async fn login_form(State(ui): State<Ui>, body: axum::body::Bytes) -> Response {
    let code = form(&body).remove("code").unwrap_or_default();
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
            let agent = matches!(ui.api.token_by_text(code).await, Ok(Some(_)));
            let why = if agent {
                "That is an agent's access token. Agents' tokens never open the dashboard: run `bundlevisor dashboard` on the daemon's host for a sign-in link."
            } else {
                "That sign-in code is unknown, used or expired (a link works once, for five minutes). Run `bundlevisor dashboard` for a new one."
            };
            page(StatusCode::FORBIDDEN, pages::login(Some(why)))
        }
    }
}

async fn logout(State(ui): State<Ui>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let fields = form(&body);
    if let Err(refused) = change(&ui, &headers, fields.get("csrf").map(String::as_str)).await {
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
    match ui.api.status(None, true) {
        Ok(status) => page(
            StatusCode::OK,
            pages::overview(&session.csrf, &session.principal, &status),
        ),
        Err(e) => page(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::message("Status", &e.to_string()),
        ),
    }
}

/// Every bundle's row, as `/ui/` shows it, whenever something changes
/// (at most four times a second) and every two seconds (uptime, memory).
async fn live(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    if let Err(r) = signed_in(&ui, &headers).await {
        return r;
    }
    let events = ui.api.events();
    let stream = futures::stream::unfold(
        (ui.api.clone(), events, true),
        |(api, mut events, first)| async move {
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
            let rows = api
                .status(None, true)
                .map(|s| pages::rows_json(&s))
                .unwrap_or_default();
            let event = SseEvent::default().event("status").data(rows);
            Some((
                Ok::<_, std::convert::Infallible>(event),
                (api, events, false),
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
        return page(
            StatusCode::NOT_FOUND,
            pages::message(
                "No such bundle",
                &format!("{workspace}/{name} is not installed."),
            ),
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
    let view = pages::BundleView {
        status: &status,
        tools: &tools,
        lines: &lines,
        settings: &settings,
        called,
    };
    page(StatusCode::OK, pages::bundle(&session.csrf, view))
}

/// The settings given in the form (`cfg.KEY`, empty ones left as they
/// are), stored and the bundle respawned with them.
async fn configure(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let fields = form(&body);
    let session = match change(&ui, &headers, fields.get("csrf").map(String::as_str)).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let set: std::collections::BTreeMap<String, String> = fields
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("cfg.")?.to_string(), v.clone())))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if set.is_empty() {
        return page(
            StatusCode::BAD_REQUEST,
            pages::message(
                "Nothing to set",
                "fill in at least one setting (empty ones are left as they are)",
            ),
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
    };
    match ui
        .api
        .configure(params, super::admission::Peer { uid }, |_| async {})
        .await
    {
        Ok(_) => guarded(
            Redirect::to(&format!(
                "/ui/bundle/{}/{}",
                pages::path(&workspace),
                pages::path(&name)
            ))
            .into_response(),
        ),
        Err(e) => page(
            StatusCode::BAD_REQUEST,
            pages::message("Not configured", &e.to_string()),
        ),
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
        Err(e) => page(
            StatusCode::NOT_FOUND,
            pages::message("Files", &e.to_string()),
        ),
    }
}

async fn call(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let fields = form(&body);
    let session = match change(&ui, &headers, fields.get("csrf").map(String::as_str)).await {
        Ok(s) => s,
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
    headers: &HeaderMap,
    body: &[u8],
    to: String,
    act: impl FnOnce() -> F,
) -> Response {
    let fields = form(body);
    if let Err(r) = change(ui, headers, fields.get("csrf").map(String::as_str)).await {
        return r;
    }
    match act().await {
        Ok(()) => guarded(Redirect::to(&to).into_response()),
        Err(e) => page(
            StatusCode::BAD_REQUEST,
            pages::message("Not done", &e.to_string()),
        ),
    }
}

async fn restart(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let to = format!(
        "/ui/bundle/{}/{}",
        pages::path(&workspace),
        pages::path(&name)
    );
    act(&ui, &headers, &body, to, || async {
        ui.api
            .respawn_and_wait(&workspace, &name, Respawn::Operator, |_| async {})
            .await
            .map(|_| ())
    })
    .await
}

async fn uninstall(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    act(&ui, &headers, &body, "/ui/".to_string(), || async {
        ui.api.uninstall(&workspace, &name, false).await.map(|_| ())
    })
    .await
}

/// A bundle's new log lines, as server-sent events.
async fn logs_live(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = signed_in(&ui, &headers).await {
        return r;
    }
    let lines = tokio_stream_of(ui.api.shared().log_lines.subscribe());
    let stream = lines
        .filter(move |l| std::future::ready(l.workspace == workspace && l.name == name))
        .map(|l| Ok::<_, std::convert::Infallible>(SseEvent::default().event("log").data(l.line)));
    guarded(
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// A broadcast receiver as a stream (lagged lines skipped).
fn tokio_stream_of<T: Clone + Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(item) => return Some((item, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// An uploaded `.mcpb`, written under `STATE_DIR/uploads/` and installed
/// into the chosen workspace (it runs from its unpacked copy, as any
/// archive does); the upload is removed after.
async fn install(State(ui): State<Ui>, headers: HeaderMap, mut upload: Multipart) -> Response {
    let (mut csrf, mut workspace, mut archive) = (None, String::new(), None);
    while let Ok(Some(field)) = upload.next_field().await {
        match field.name().unwrap_or_default() {
            "csrf" => csrf = field.text().await.ok(),
            "workspace" => workspace = field.text().await.unwrap_or_default(),
            "archive" => {
                let file = field.file_name().unwrap_or("upload.mcpb").to_string();
                match field.bytes().await {
                    Ok(bytes) => archive = Some((file, bytes)),
                    Err(e) => {
                        return page(
                            StatusCode::BAD_REQUEST,
                            pages::message(
                                "Not installed",
                                &format!("the upload did not arrive whole: {e}"),
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    if let Err(r) = change(&ui, &headers, csrf.as_deref()).await {
        return r;
    }
    let Some((file, bytes)) = archive else {
        return page(
            StatusCode::BAD_REQUEST,
            pages::message("Not installed", "choose a .mcpb archive to upload"),
        );
    };
    let workspace = if workspace.trim().is_empty() {
        crate::protocol::DEFAULT_WORKSPACE.to_string()
    } else {
        workspace.trim().to_string()
    };
    match save_upload(&ui, &file, bytes).await {
        Ok(path) => {
            let installed = ui
                .api
                .install(path.clone(), &workspace, Origin::Cli, true, |_| async {})
                .await;
            // Installed, it runs from its unpacked copy in the state dir.
            let _ = tokio::fs::remove_file(&path).await;
            match installed {
                Ok(status) => guarded(
                    Redirect::to(&format!(
                        "/ui/bundle/{}/{}",
                        pages::path(&status.workspace),
                        pages::path(&status.name)
                    ))
                    .into_response(),
                ),
                Err(e) => page(
                    StatusCode::BAD_REQUEST,
                    pages::message("Not installed", &e.to_string()),
                ),
            }
        }
        Err(why) => page(
            StatusCode::BAD_REQUEST,
            pages::message("Not installed", &why),
        ),
    }
}

/// Writes an upload as `STATE_DIR/uploads/STEM-RANDOM.mcpb` (a name of its
/// own: never over another file); its path.
async fn save_upload(
    ui: &Ui,
    file: &str,
    bytes: axum::body::Bytes,
) -> Result<std::path::PathBuf, String> {
    let stem: String = std::path::Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    if !file.ends_with(".mcpb") {
        return Err(format!(
            "{file:?} is not a .mcpb archive (pack a bundle folder with `mcpb pack`)"
        ));
    }
    let stem = if stem.is_empty() {
        "upload".to_string()
    } else {
        stem
    };
    let dir = ui.api.shared().config.state_dir.join("uploads");
    let path = dir.join(format!("{stem}-{}.mcpb", &random_hex()[..8]));
    let target = path.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&dir)?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)?;
        out.write_all(&bytes)?;
        out.sync_all()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot keep the upload: {e}"))?;
    Ok(path)
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
        Err(e) => page(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::message("Tokens", &e.to_string()),
        ),
    }
}

async fn token_create(
    State(ui): State<Ui>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let fields = form(&body);
    let session = match change(&ui, &headers, fields.get("csrf").map(String::as_str)).await {
        Ok(s) => s,
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
        Err(e) => page(
            StatusCode::BAD_REQUEST,
            pages::message("No token made", &e.to_string()),
        ),
    }
}
