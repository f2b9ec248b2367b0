//! The OAuth client of remote bundles, on rmcp's `AuthorizationManager`
//! (the MCP Rust SDK's implementation of the MCP authorization spec):
//!
//! - discovery in the spec's order: the 401 challenge's
//!   `resource_metadata`, the protected-resource metadata's well-known URLs
//!   (path-inserted, then root), authorization-server metadata by RFC 8414
//!   and OpenID Connect discovery for issuers with and without a path, and
//!   the 2025-03-26 endpoints (`/authorize`, `/token`, `/register` at the
//!   server's origin) when nothing is published;
//! - the client identity in the spec's order: the bundle file's
//!   `auth.client_id`, a client ID metadata document
//!   (`auth.client_metadata_url`) when the server supports them, a client
//!   the same server registered before, dynamic registration (with
//!   `application_type`) when it offers it, else an error saying what to
//!   set; a registered client and tokens are kept with the issuer of the
//!   server that issued them and never used with another;
//! - the token endpoint's authentication from the server's
//!   `token_endpoint_auth_methods_supported` (`client_secret_basic`,
//!   `client_secret_post`, `none`; `private_key_jwt` for the
//!   client-credentials grant), PKCE S256 and the RFC 8707 `resource` on
//!   every request, and the scopes of the challenge, else the server's
//!   `scopes_supported`, else none.
//!
//! What stays ours, and why:
//!
//! - [`Http`], the HTTP client every OAuth request goes through: each URL
//!   passes the https-or-loopback rule of [`crate::remote_http::check_url`]
//!   before anything is sent (rmcp lets plain http reach public hosts), no
//!   redirect is ever followed (rmcp's registration follows them), answers
//!   are bounded, an event stream is not read, and it remembers an OAuth
//!   error answer so a refused grant is told from a network failure
//!   (rmcp's client-credentials and exchange errors are plain strings).
//! - `auth.authorization_server`, an issuer the operator names: rmcp has
//!   no way to take one, so its metadata is fetched here.
//! - `private_key_jwt` for the authorization-code and refresh grants
//!   ([`Jwt`]): rmcp signs assertions only for client credentials.
//! - Which grant is tried when, and what the daemon does about a 401 (one
//!   rebuild for many failed calls, `needs_auth`): the bundle's actor.
//! - Error texts: the secrets a request carried are masked in them.
//!
//! Nothing here stores or logs a token: callers get [`TokenSet`]s and keep
//! them in the encrypted store.

use std::sync::{Arc, Mutex};

use rmcp::transport::auth::{
    AuthorizationMetadata, AuthorizationRequest, AuthorizationSession, ClientCredentialsConfig,
    JwtSigningAlgorithm, OAuthClientConfig, OAuthTokenResponse,
};
use rmcp::transport::StateStore;
use rmcp::transport::{
    AuthError, AuthorizationManager, CredentialStore, InMemoryCredentialStore, InMemoryStateStore,
    OAuthHttpClient, OAuthHttpClientError, OAuthHttpClientFuture, OAuthHttpRequest,
    StoredCredentials,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::manifest::{AuthPlan, RemotePlan};
use crate::remote_http::UrlRefused;
use crate::secret::{Redactor, Secret};
use crate::store::TokenSet;

const ASM_PATH: &str = "/.well-known/oauth-authorization-server";
const OIDC_PATH: &str = "/.well-known/openid-configuration";
/// OAuth answers larger than this are refused.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// The authorization server answered with an OAuth error (`invalid_grant`, ...).
    #[error("the authorization server refused the request: {error}{}", .description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        error: String,
        description: Option<String>,
    },
    /// The enterprise identity provider refused the token exchange.
    #[error("the enterprise identity provider refused the token exchange: {error}{}", .description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    IdpRefused {
        error: String,
        description: Option<String>,
    },
    #[error("OAuth discovery failed: {0}")]
    Discovery(String),
    /// Network trouble or an unusable answer: worth retrying later.
    #[error("OAuth request to {url} failed: {message}")]
    Http { url: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    /// The bundle file asks for what the server does not offer: only a
    /// change of the file or of the server helps.
    #[error("{0}")]
    Config(String),
    /// A URL given or discovered fails the https-or-loopback rule.
    #[error("refused {what} {url}: it {reason}; nothing was sent there")]
    InsecureUrl {
        what: &'static str,
        url: String,
        reason: UrlRefused,
    },
    /// Metadata that does not describe the server it was fetched for
    /// (RFC 8414 §3.3, RFC 9728 §3.3).
    #[error("{0}")]
    Mismatch(String),
}

/// `url` if it passes the https-or-loopback rule; `what` names it in the error.
fn checked(what: &'static str, url: &str) -> Result<url::Url, OAuthError> {
    crate::remote_http::check_url(url).map_err(|reason| OAuthError::InsecureUrl {
        what,
        url: url.to_string(),
        reason,
    })
}

/// The HTTP client of every OAuth request (see the module's text).
#[derive(Clone)]
pub struct Http(Arc<HttpInner>);

struct HttpInner {
    client: reqwest::Client,
    /// The first refusal of the https-or-loopback rule, and the last OAuth
    /// error answer, since [`Http::forget`].
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    insecure: Option<(String, UrlRefused)>,
    refusal: Option<(String, Option<String>)>,
    /// The last URL asked and what went wrong with it.
    failure: Option<(String, String)>,
}

/// A plain HTTP client for OAuth requests: no redirects followed (a token
/// or registration endpoint that redirects is refused, a metadata URL that
/// redirects counts as absent), bounded time.
pub fn http_client() -> Http {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .expect("a reqwest client with static settings builds");
    Http(Arc::new(HttpInner {
        client,
        seen: Mutex::default(),
    }))
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl Http {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self) {
        *self.seen() = Seen::default();
    }

    /// The error to report for what rmcp returned: what this client saw
    /// first (a refused URL, an OAuth error answer, a network failure),
    /// else rmcp's own words.
    fn explain(&self, e: AuthError) -> OAuthError {
        let seen = std::mem::take(&mut *self.seen());
        if let Some((url, reason)) = seen.insecure {
            return OAuthError::InsecureUrl {
                what: "the OAuth URL",
                url,
                reason,
            };
        }
        if let Some((error, description)) = seen.refusal {
            return OAuthError::Refused { error, description };
        }
        match e {
            AuthError::AuthorizationServerMismatch {
                expected_issuer,
                received_issuer,
            } => OAuthError::Mismatch(format!(
                "the authorization server metadata names issuer {received_issuer:?}, not {expected_issuer} (RFC 8414 §3.3); refusing it, so nothing is sent to its endpoints — if {received_issuer:?} is the right authorization server, set auth.authorization_server to it in the bundle file"
            )),
            AuthError::AuthorizationServerMissingIssuer { expected_issuer } => OAuthError::Mismatch(format!(
                "the authorization server metadata of {expected_issuer} names no issuer (required by RFC 8414 §2); refusing it, so nothing is sent to its endpoints"
            )),
            AuthError::ProtectedResourceMetadataInvalid { url, reason } => OAuthError::Mismatch(format!(
                "the protected-resource metadata at {url} is unusable: {reason} (RFC 9728 §3.3); refusing it and the authorization servers it names — the MCP server or its metadata is misconfigured, or the metadata is not its own"
            )),
            AuthError::AuthorizationServersUnavailable { resource_metadata_url, authorization_servers } => OAuthError::Mismatch(format!(
                "the protected-resource metadata at {resource_metadata_url} names the authorization servers {}, and none of them published usable metadata for its issuer (RFC 8414 §3.3); nothing was sent to their endpoints",
                authorization_servers.join(", ")
            )),
            AuthError::PkceUnsupported => OAuthError::Unsupported(
                "the authorization server does not support PKCE with S256, which the MCP authorization spec requires".into(),
            ),
            other => match seen.failure {
                Some((url, message)) => OAuthError::Http { url, message },
                None => OAuthError::Discovery(other.to_string()),
            },
        }
    }
}

impl OAuthHttpClient for Http {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            let url = request.request.uri().to_string();
            // Only a token or registration request's error answer is a refusal.
            let post = request.request.method() == axum::http::Method::POST;
            if let Err(reason) = crate::remote_http::check_url(&url) {
                let mut seen = self.seen();
                if seen.insecure.is_none() {
                    seen.insecure = Some((url.clone(), reason.clone()));
                }
                return Err(Box::new(OAuthError::InsecureUrl {
                    what: "the OAuth URL",
                    url,
                    reason,
                }) as _);
            }
            let failed = |message: String| -> OAuthHttpClientError {
                self.seen().failure = Some((url.clone(), message.clone()));
                Box::new(OAuthError::Http {
                    url: url.clone(),
                    message,
                })
            };
            let request =
                reqwest::Request::try_from(request.request).map_err(|e| failed(e.to_string()))?;
            let mut response = self
                .0
                .client
                .execute(request)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            let mut answer = axum::http::Response::builder().status(status);
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            // An event stream (an MCP server answering a probe) is not read.
            let stream = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let body = if stream {
                Vec::new()
            } else {
                bounded(&mut response).await.map_err(failed)?
            };
            if status.is_redirection() {
                let to = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .unwrap_or("(no location)")
                    .to_string();
                self.seen().failure = Some((url.clone(), format!(
                    "HTTP {status} redirect to {to}, which is not followed: OAuth requests go only to the URLs the metadata names"
                )));
            } else if post && status.is_client_error() {
                if let Ok(e) = serde_json::from_slice::<ErrorResponse>(&body) {
                    self.seen().refusal = Some((e.error, e.error_description));
                }
            } else if !status.is_success() {
                self.seen().failure = Some((url.clone(), format!("HTTP {status}")));
            }
            answer.body(body).map_err(|e| failed(e.to_string()))
        })
    }
}

/// An answer's body, read up to [`MAX_ANSWER_BYTES`].
async fn bounded(response: &mut reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "the answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A parameter of a `WWW-Authenticate: Bearer` challenge, quoted or not;
/// `key` must start a parameter (`scope` is not found in `myscope="…"`,
/// `error` not in `error_description="…"`). Names match in any case
/// (RFC 9110: auth-param names are case-insensitive); values keep theirs.
fn challenge_param<'a>(challenge: &'a str, key: &str) -> Option<&'a str> {
    // ASCII lowercasing keeps every byte offset.
    let (lower, key) = (challenge.to_ascii_lowercase(), key.to_ascii_lowercase());
    let mut from = 0;
    while let Some(at) = lower[from..].find(&key).map(|i| i + from) {
        from = at + key.len();
        let starts = challenge[..at]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let Some(rest) = challenge[from..].strip_prefix('=').filter(|_| starts) else {
            continue;
        };
        let value = match rest.strip_prefix('"') {
            Some(quoted) => quoted.split('"').next()?,
            None => rest.split([',', ' ']).next()?,
        };
        return (!value.is_empty()).then_some(value);
    }
    None
}

/// `resource_metadata="URL"` from a `WWW-Authenticate: Bearer` challenge.
pub fn resource_metadata_from_challenge(challenge: &str) -> Option<String> {
    challenge_param(challenge, "resource_metadata").map(str::to_string)
}

/// The `scope` of a `WWW-Authenticate: Bearer` challenge.
pub fn challenge_scope(challenge: &str) -> Option<Vec<String>> {
    let scopes: Vec<String> = challenge_param(challenge, "scope")?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (!scopes.is_empty()).then_some(scopes)
}

/// A `403 insufficient_scope` challenge (RFC 6750 §3.1).
pub fn insufficient_scope(challenge: &str) -> bool {
    challenge_param(challenge, "error") == Some("insufficient_scope")
}

/// A well-known URL for `base` (RFC 8414 §3.1: the well-known segment goes
/// between the host and the path).
fn well_known(base: &url::Url, suffix: &str) -> String {
    let path = base.path().trim_end_matches('/');
    format!("{}{suffix}{path}", base.origin().ascii_serialization())
}

/// The same issuer: URLs compared after parsing, so `https://a.example`
/// and `https://a.example/` match but another path, host, port or scheme
/// does not.
fn same_identifier(a: &url::Url, b: &str) -> bool {
    url::Url::parse(b).is_ok_and(|b| &b == a)
}

/// The metadata of an issuer the operator named (`auth.authorization_server`).
async fn configured_issuer(http: &Http, issuer: &str) -> Result<AuthorizationMetadata, OAuthError> {
    let issuer_url = checked("the authorization server", issuer)?;
    for url in [
        well_known(&issuer_url, ASM_PATH),
        well_known(&issuer_url, OIDC_PATH),
        format!("{}{OIDC_PATH}", issuer.trim_end_matches('/')),
    ] {
        let response = http
            .0
            .client
            .get(&url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| OAuthError::Http {
                url: url.clone(),
                message: e.to_string(),
            })?;
        if !response.status().is_success() {
            continue;
        }
        let meta: AuthorizationMetadata = bounded(&mut { response })
            .await
            .and_then(|body| serde_json::from_slice(&body).map_err(|e| e.to_string()))
            .map_err(|e| OAuthError::Http {
                url: url.clone(),
                message: format!("unusable metadata: {e}"),
            })?;
        match meta.issuer.as_deref() {
            Some(named) if same_identifier(&issuer_url, named) => return Ok(meta),
            Some(named) => return Err(OAuthError::Mismatch(format!(
                "the authorization server metadata at {url} names issuer {named:?}, not {issuer} (RFC 8414 §3.3); refusing it, so nothing is sent to its endpoints"
            ))),
            None => return Err(OAuthError::Mismatch(format!(
                "the authorization server metadata at {url} names no issuer (required by RFC 8414 §2); refusing it, so nothing is sent to its endpoints"
            ))),
        }
    }
    Err(OAuthError::Discovery(format!(
        "no authorization server metadata at {issuer} (tried {ASM_PATH} and {OIDC_PATH})"
    )))
}

/// A manager for the MCP server of `plan`, its authorization server found.
async fn manager(
    http: &Http,
    plan: &RemotePlan,
    challenge: Option<&str>,
) -> Result<(AuthorizationManager, AuthorizationMetadata, bool), OAuthError> {
    checked("the MCP server URL", &plan.url)?;
    // rmcp skips a challenge's metadata URL it will not fetch and goes on
    // discovering; a challenge pointing at plain http is refused instead.
    if let Some(url) = challenge.and_then(resource_metadata_from_challenge) {
        checked(
            "the resource_metadata URL of the server's 401 challenge",
            &url,
        )?;
    }
    http.forget();
    let mut manager =
        AuthorizationManager::new_with_oauth_http_client(plan.url.as_str(), Arc::new(http.clone()))
            .await
            .map_err(|e| http.explain(e))?;
    // Whether the metadata was published (not the 2025-03-26 fallback).
    let (metadata, published) = match plan
        .auth
        .as_ref()
        .and_then(|a| a.authorization_server.as_deref())
    {
        Some(issuer) => (configured_issuer(http, issuer).await?, true),
        None => {
            let found = manager
                .resolve_metadata_from_challenge(challenge)
                .await
                .map_err(|e| http.explain(e))?;
            (found.metadata, found.source.is_discovered())
        }
    };
    checked("the token endpoint", &metadata.token_endpoint)?;
    checked(
        "the authorization endpoint",
        &metadata.authorization_endpoint,
    )?;
    if let Some(endpoint) = &metadata.registration_endpoint {
        checked("the registration endpoint", endpoint)?;
    }
    manager.set_metadata(metadata.clone());
    Ok((manager, metadata, published))
}

/// The client identity used at the token endpoint: the bundle file's
/// `auth.client_id`/`client_secret`, else a registered client.
#[derive(Clone, Debug, Default)]
pub struct ClientId {
    pub id: Option<String>,
    pub secret: Option<Secret>,
}

impl ClientId {
    pub fn of(auth: Option<&AuthPlan>, tokens: &TokenSet) -> ClientId {
        match auth.and_then(|a| a.client_id.clone()) {
            Some(id) => ClientId {
                id: Some(id),
                secret: auth.and_then(|a| a.client_secret.clone()),
            },
            None => ClientId {
                id: tokens.client_id.clone(),
                secret: tokens.client_secret.clone(),
            },
        }
    }
}

/// The identifier of the authorization server `metadata` describes: its
/// `issuer`; for the 2025-03-26 fallback, which has none, the origin of
/// its authorization endpoint.
fn issuer_of(metadata: &AuthorizationMetadata) -> String {
    metadata.issuer.clone().unwrap_or_else(|| {
        url::Url::parse(&metadata.authorization_endpoint)
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_else(|_| metadata.authorization_endpoint.clone())
    })
}

/// What of `stored` may be used with the authorization server `issuer`:
/// all of it when that server registered the client and issued the tokens
/// (or when the set predates the record of its issuer); else only what
/// the MCP server said (its challenge, the scopes it wants). A client
/// registration or a refresh token never goes to another server.
fn for_issuer(stored: &TokenSet, issuer: &str) -> TokenSet {
    match &stored.issuer {
        Some(was) if was != issuer => {
            tracing::info!(
                was = %was,
                now = %issuer,
                "the MCP server's authorization server changed: its stored client and tokens are not used with the new one"
            );
            TokenSet {
                wanted_scopes: stored.wanted_scopes.clone(),
                challenge: stored.challenge.clone(),
                ..TokenSet::default()
            }
        }
        _ => stored.clone(),
    }
}

/// The `application_type` of a registration (OpenID Connect Dynamic
/// Client Registration, required by the MCP authorization spec):
/// `native` for a redirect to a loopback address, `web` otherwise.
fn application_type(redirect_uri: &str) -> &'static str {
    let loopback = url::Url::parse(redirect_uri).is_ok_and(|u| match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    });
    if loopback {
        "native"
    } else {
        "web"
    }
}

/// Why no client can be had from the authorization server `issuer`, and
/// what the operator can set.
fn no_client(issuer: &str, cimd: bool) -> String {
    if cimd {
        format!(
            "the authorization server {issuer} offers no dynamic client registration; it accepts client ID metadata documents: set auth.client_metadata_url in the bundle file to the https URL of a client metadata document that you host (bundlevisor is a daemon and serves none itself; docs/credentials.md shows one), or set auth.client_id to a client registered with it; nothing was sent to it"
        )
    } else {
        format!(
            "the authorization server {issuer} offers neither dynamic client registration nor client ID metadata documents: register a client with it and set auth.client_id in the bundle file (with auth.client_secret or auth.private_key for a confidential client); nothing was sent to it"
        )
    }
}

/// A token answer as our [`TokenSet`] (the client fields left empty).
fn token_set(answer: &impl serde::Serialize) -> Result<TokenSet, OAuthError> {
    let v = serde_json::to_value(answer).unwrap_or_default();
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let access = text("access_token").ok_or_else(|| OAuthError::Http {
        url: "the token endpoint".into(),
        message: "the token answer has no access_token".into(),
    })?;
    Ok(TokenSet {
        access_token: Some(Secret::new(access)),
        refresh_token: text("refresh_token").map(Secret::new),
        expires_at: v
            .get("expires_in")
            .and_then(Value::as_i64)
            .map(|s| crate::clock::unix_secs() + s),
        ..TokenSet::default()
    })
}

/// The scopes a grant asks for when neither the bundle file nor the server
/// named any: the challenge's, else the protected resource's
/// `scopes_supported`, else none (a token for an application has no use
/// for `offline_access`).
async fn initial_scopes(manager: &AuthorizationManager) -> Vec<String> {
    let mut scopes = manager.select_initial_scopes(&[]).await;
    scopes.retain(|s| s != "offline_access");
    scopes
}

/// The scopes a `403 insufficient_scope` challenge says the token lacks
/// (RFC 6750 §3.1), for a step-up to their union with what was asked.
pub fn step_up(challenge: Option<&str>) -> Option<Vec<String>> {
    challenge
        .filter(|c| insufficient_scope(c))
        .and_then(challenge_scope)
}

/// `a` and then whatever of `b` it lacks.
pub fn union(mut a: Vec<String>, b: Vec<String>) -> Vec<String> {
    for scope in b {
        if !a.contains(&scope) {
            a.push(scope);
        }
    }
    a
}

/// What a silent attempt to get a token came to.
pub enum Silent {
    /// New tokens (store them).
    Tokens(TokenSet),
    /// Only the interactive flow can help; the text says why.
    Interactive(String),
}

/// A redirect URI for grants that use none (rmcp's client needs one).
const NO_REDIRECT: &str = "http://127.0.0.1/unused";

/// Tries, in order, the stored refresh token and the client-credentials
/// grant. `Err` is a failure worth retrying (network, discovery); a refused
/// grant moves on to the next one.
pub async fn obtain_silently(
    http: &Http,
    plan: &RemotePlan,
    stored: &TokenSet,
    challenge: Option<&str>,
) -> Result<Silent, OAuthError> {
    let auth = plan.auth.as_ref();
    let enterprise = auth.and_then(|a| a.enterprise.as_ref());
    // With Enterprise-Managed Authorization the client's secret or key
    // authenticates the ID-JAG grant: a token of the client itself
    // (client credentials) would stand in for the user's.
    let credentials = auth.filter(|_| enterprise.is_none()).and_then(|a| {
        let id = a.client_id.as_ref()?;
        if let Some(key) = &a.private_key {
            return Some(Grant::Jwt(id, key, a.signing_alg));
        }
        a.client_secret.as_ref().map(|s| Grant::Secret(id, s))
    });
    let refreshable = stored.refresh_token.is_some() && ClientId::of(auth, stored).id.is_some();
    if !refreshable && credentials.is_none() && enterprise.is_none() {
        return Ok(Silent::Interactive(
            "no stored refresh token and no client credentials configured".into(),
        ));
    }
    let (mut manager, metadata, _) = manager(http, plan, challenge).await?;
    let issuer = issuer_of(&metadata);
    let mut why = Vec::new();
    if stored.issuer.as_deref().is_some_and(|was| was != issuer) {
        why.push(format!(
            "the stored tokens are from the authorization server {}, and the MCP server's is now {issuer}",
            stored.issuer.as_deref().unwrap_or_default()
        ));
    }
    let stored = &for_issuer(stored, &issuer);
    let client = ClientId::of(auth, stored);
    let refresh = stored.refresh_token.as_ref().zip(client.id.as_ref());
    // What the requests carried stays out of any error text about them.
    let secrets = || {
        Redactor::new(
            [
                stored.refresh_token.clone(),
                client.secret.clone(),
                auth.and_then(|a| a.private_key.clone()),
                enterprise.map(|e| e.client_secret.clone()),
            ]
            .into_iter()
            .flatten(),
        )
    };
    let masked = |e: OAuthError| -> String { secrets().redact(&e.to_string()).into_owned() };
    // Scopes: what a 403 said a token lacks (now or before) is kept with
    // the tokens, and asked for with the bundle file's from then on.
    let required = step_up(challenge);
    let wanted = union(
        stored.wanted_scopes.clone(),
        required.clone().unwrap_or_default(),
    );
    let configured = auth.map(|a| a.scopes.clone()).unwrap_or_default();
    let asked = union(configured, wanted.clone());
    // New tokens keep the registered client and the wanted scopes; a
    // refresh keeps the refresh token when the server sent no new one.
    let kept = |mut tokens: TokenSet, refreshed: bool| {
        if refreshed && tokens.refresh_token.is_none() {
            tokens.refresh_token = stored.refresh_token.clone();
        }
        tokens.client_id = stored.client_id.clone();
        tokens.client_secret = stored.client_secret.clone();
        tokens.wanted_scopes = wanted.clone();
        tokens.challenge = stored.challenge.clone();
        tokens.issuer = Some(issuer.clone());
        Silent::Tokens(tokens)
    };
    if let (Some((refresh, id)), Some(key)) = (refresh, Jwt::of(auth, &metadata)) {
        // private_key_jwt, which rmcp offers for client credentials only.
        let mut form = vec![
            ("grant_type", "refresh_token".to_string()),
            ("refresh_token", refresh.expose().to_string()),
        ];
        if required.is_some() {
            form.push(("scope", asked.join(" ")));
        }
        match key
            .token_request(http, &metadata, id, &plan.url, form)
            .await
        {
            Ok(tokens) => return Ok(kept(tokens, true)),
            Err(e @ OAuthError::Refused { .. }) => {
                why.push(format!("refresh token: {}", masked(e)))
            }
            Err(e) => return Err(mask(e, &secrets())),
        }
    } else if let Some((refresh, id)) = refresh {
        let store = InMemoryCredentialStore::new();
        let answer: OAuthTokenResponse = serde_json::from_value(json!({
            "access_token": stored.access_token.as_ref().map(|t| t.expose().to_string()).unwrap_or_default(),
            "token_type": "Bearer",
            "refresh_token": refresh.expose(),
        }))
        .map_err(|e| OAuthError::Discovery(format!("a stored refresh token: {e}")))?;
        store
            .save(StoredCredentials::new(
                id.clone(),
                Some(answer),
                Vec::new(),
                None,
            ))
            .await
            .map_err(|e| OAuthError::Discovery(e.to_string()))?;
        manager.set_credential_store(store);
        let mut config = OAuthClientConfig::new(id.clone(), NO_REDIRECT);
        if let Some(secret) = &client.secret {
            config = config.with_client_secret(secret.expose());
        }
        // Step-up: the refreshed token is asked for the scope it lacked too.
        if required.is_some() {
            manager.set_refresh_scopes(asked.clone());
        }
        manager
            .configure_client(config)
            .map_err(|e| http.explain(e))?;
        http.forget();
        match manager.refresh_token().await {
            Ok(answer) => return Ok(kept(token_set(&answer)?, true)),
            Err(e) => match http.explain(e) {
                e @ OAuthError::Refused { .. } => why.push(format!("refresh token: {}", masked(e))),
                e => return Err(mask(e, &secrets())),
            },
        }
    }
    if let Some(enterprise) = enterprise {
        let scopes = if asked.is_empty() {
            initial_scopes(&manager).await
        } else {
            asked
        };
        let grant = EnterpriseGrant {
            enterprise,
            auth,
            metadata: &metadata,
            resource: &plan.url,
            scopes,
        };
        match grant.obtain(http).await {
            Ok(tokens) => return Ok(kept(tokens, false)),
            Err(e @ (OAuthError::Refused { .. } | OAuthError::IdpRefused { .. })) => {
                why.push(format!("enterprise-managed authorization: {}", masked(e)))
            }
            Err(e) => return Err(mask(e, &secrets())),
        }
        return Ok(Silent::Interactive(why.join("; ")));
    }
    if let Some(grant) = credentials {
        let scopes = if asked.is_empty() {
            initial_scopes(&manager).await
        } else {
            asked
        };
        let config = grant.config(scopes, &plan.url)?;
        manager
            .validate_client_credentials_metadata(&config)
            .and_then(|()| manager.configure_client_credentials(&config))
            .map_err(|e| OAuthError::Unsupported(format!("client credentials: {e}")))?;
        http.forget();
        match exchange_client_credentials(manager, config).await {
            Ok(answer) => return Ok(kept(token_set(&answer)?, false)),
            Err(e) => match http.explain(e) {
                e @ OAuthError::Refused { .. } => {
                    why.push(format!("client credentials: {}", masked(e)))
                }
                e => return Err(mask(e, &secrets())),
            },
        }
    }
    Ok(Silent::Interactive(why.join("; ")))
}

/// rmcp's client-credentials exchange. Its future is not `Send` (with
/// `auth-client-credentials-jwt`, a form serializer lives across an await
/// in rmcp 3.11), so it runs on a blocking-pool thread, on the daemon's
/// runtime.
async fn exchange_client_credentials(
    manager: AuthorizationManager,
    config: ClientCredentialsConfig,
) -> Result<OAuthTokenResponse, AuthError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        runtime.block_on(async move { manager.exchange_client_credentials(&config).await })
    })
    .await
    .unwrap_or_else(|e| Err(AuthError::InternalError(e.to_string())))
}

/// `e` with the secrets `redactor` knows masked in its text.
fn mask(e: OAuthError, redactor: &Redactor) -> OAuthError {
    let mask = |t: String| redactor.redact(&t).into_owned();
    match e {
        OAuthError::Refused { error, description } => OAuthError::Refused {
            error: mask(error),
            description: description.map(mask),
        },
        OAuthError::IdpRefused { error, description } => OAuthError::IdpRefused {
            error: mask(error),
            description: description.map(mask),
        },
        OAuthError::Http { url, message } => OAuthError::Http {
            url: mask(url),
            message: mask(message),
        },
        OAuthError::Discovery(m) => OAuthError::Discovery(mask(m)),
        OAuthError::Unsupported(m) => OAuthError::Unsupported(mask(m)),
        OAuthError::Config(m) => OAuthError::Config(mask(m)),
        other => other,
    }
}

/// A client that authenticates at the token endpoint with
/// `private_key_jwt` (RFC 7523) for the authorization-code and refresh
/// grants: rmcp signs assertions only for client credentials, so these
/// requests are made here.
pub struct Jwt {
    key: Secret,
    alg: JwtSigningAlgorithm,
}

/// How long an assertion is good for.
const ASSERTION_SECS: i64 = 300;

impl Jwt {
    /// The bundle's key, when it has one and the server takes
    /// `private_key_jwt` (or says nothing of its methods).
    fn of(auth: Option<&AuthPlan>, metadata: &AuthorizationMetadata) -> Option<Jwt> {
        let auth = auth?;
        let key = auth.private_key.clone()?;
        let offered = metadata
            .additional_fields
            .get("token_endpoint_auth_methods_supported")
            .and_then(Value::as_array)
            .is_none_or(|m| m.iter().any(|m| m == "private_key_jwt"));
        offered.then(|| Jwt {
            key,
            alg: auth.signing_alg.unwrap_or(JwtSigningAlgorithm::RS256),
        })
    }

    /// A signed client assertion for `client_id`, its audience the issuer.
    fn assertion(&self, client_id: &str, audience: &str) -> Result<String, OAuthError> {
        use jsonwebtoken::{Algorithm, EncodingKey, Header};
        let pem = self.key.expose().as_bytes();
        let (alg, key) = match self.alg {
            JwtSigningAlgorithm::ES256 => (Algorithm::ES256, EncodingKey::from_ec_pem(pem)),
            JwtSigningAlgorithm::ES384 => (Algorithm::ES384, EncodingKey::from_ec_pem(pem)),
            JwtSigningAlgorithm::RS384 => (Algorithm::RS384, EncodingKey::from_rsa_pem(pem)),
            JwtSigningAlgorithm::RS512 => (Algorithm::RS512, EncodingKey::from_rsa_pem(pem)),
            _ => (Algorithm::RS256, EncodingKey::from_rsa_pem(pem)),
        };
        // The key's own error text is not repeated: it may quote the key.
        let key = key.map_err(|_| {
            OAuthError::Unsupported(format!(
                "auth.private_key is not a PEM private key for {alg:?} (auth.signing_alg)"
            ))
        })?;
        let now = crate::clock::unix_secs();
        let mut jti = [0u8; 16];
        chacha20poly1305::aead::rand_core::RngCore::fill_bytes(
            &mut chacha20poly1305::aead::OsRng,
            &mut jti,
        );
        let claims = json!({
            "iss": client_id, "sub": client_id, "aud": audience,
            "iat": now, "exp": now + ASSERTION_SECS,
            "jti": jti.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        });
        jsonwebtoken::encode(&Header::new(alg), &claims, &key)
            .map_err(|e| OAuthError::Unsupported(format!("cannot sign the client assertion: {e}")))
    }

    /// Posts `form` to the token endpoint with an assertion and the
    /// RFC 8707 `resource`; a refusal is [`OAuthError::Refused`].
    async fn token_request(
        &self,
        http: &Http,
        metadata: &AuthorizationMetadata,
        client_id: &str,
        resource: &str,
        mut form: Vec<(&str, String)>,
    ) -> Result<TokenSet, OAuthError> {
        let url = &metadata.token_endpoint;
        let audience = metadata.issuer.clone().unwrap_or_else(|| url.clone());
        form.push((
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
        ));
        form.push(("client_assertion", self.assertion(client_id, &audience)?));
        form.push(("resource", resource.to_string()));
        let answer = post_form(http, "the token endpoint", url, form, None).await?;
        token_set(&answer)
    }
}

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const ID_JAG_PROFILE: &str = "urn:ietf:params:oauth:grant-profile:id-jag";

/// Enterprise-Managed Authorization (the
/// `io.modelcontextprotocol/enterprise-managed-authorization` extension,
/// SEP-990): the user's ID token is exchanged at the enterprise identity
/// provider for an ID-JAG (RFC 8693), and the ID-JAG at the MCP server's
/// authorization server for an access token (RFC 7523 JWT bearer grant).
struct EnterpriseGrant<'a> {
    enterprise: &'a crate::manifest::EnterprisePlan,
    auth: Option<&'a AuthPlan>,
    metadata: &'a AuthorizationMetadata,
    /// The MCP server's URL: the RFC 8707 resource.
    resource: &'a str,
    scopes: Vec<String>,
}

impl EnterpriseGrant<'_> {
    async fn obtain(&self, http: &Http) -> Result<TokenSet, OAuthError> {
        let issuer = issuer_of(self.metadata);
        let profiles = self
            .metadata
            .additional_fields
            .get("authorization_grant_profiles_supported")
            .and_then(Value::as_array);
        if !profiles.is_some_and(|p| p.iter().any(|p| p == ID_JAG_PROFILE)) {
            return Err(OAuthError::Config(format!(
                "the authorization server {issuer} does not list {ID_JAG_PROFILE} in its authorization_grant_profiles_supported, so it takes no ID-JAG; nothing was sent to the identity provider — remove auth.enterprise from the bundle file, or have the authorization server enable Enterprise-Managed Authorization"
            )));
        }
        let id_token = self.id_token().await?;
        let mut secrets = Redactor::new([id_token.clone(), self.enterprise.client_secret.clone()]);
        let idp = &self.enterprise.token_endpoint;
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE.to_string()),
            ("requested_token_type", ID_JAG.to_string()),
            ("audience", issuer.clone()),
            ("resource", self.resource.to_string()),
            ("subject_token", id_token.expose().to_string()),
            ("subject_token_type", ID_TOKEN.to_string()),
        ];
        if !self.scopes.is_empty() {
            form.push(("scope", self.scopes.join(" ")));
        }
        let basic = (
            self.enterprise.client_id.as_str(),
            &self.enterprise.client_secret,
        );
        let answer = post_form(
            http,
            "the identity provider's token endpoint",
            idp,
            form,
            Some(basic),
        )
        .await
        .map_err(|e| match mask(e, &secrets) {
            OAuthError::Refused { error, description } => {
                OAuthError::IdpRefused { error, description }
            }
            other => other,
        })?;
        let text = |k: &str| answer.get(k).and_then(Value::as_str);
        if text("issued_token_type") != Some(ID_JAG) {
            return Err(OAuthError::Http {
                url: idp.clone(),
                message: format!(
                    "the token exchange answered issued_token_type {:?}, not {ID_JAG}; the identity provider does not issue ID-JAGs to this client",
                    text("issued_token_type").unwrap_or("(none)")
                ),
            });
        }
        let assertion = Secret::new(text("access_token").unwrap_or_default());
        if assertion.expose().is_empty() {
            return Err(OAuthError::Http {
                url: idp.clone(),
                message: "the token exchange's answer has no access_token (the ID-JAG)".into(),
            });
        }
        secrets = Redactor::new([
            id_token,
            self.enterprise.client_secret.clone(),
            assertion.clone(),
        ]);
        let form = vec![
            ("grant_type", JWT_BEARER.to_string()),
            ("assertion", assertion.expose().to_string()),
        ];
        self.redeem(http, form).await.map_err(|e| mask(e, &secrets))
    }

    /// The user's ID token, read now (a file is read at each exchange).
    async fn id_token(&self) -> Result<Secret, OAuthError> {
        use crate::manifest::IdToken;
        let token = match &self.enterprise.id_token {
            IdToken::Value(v) => v.clone(),
            IdToken::File(path) => {
                let read = tokio::fs::read_to_string(path).await.map_err(|e| {
                    OAuthError::Unsupported(format!(
                        "cannot read the ID token from {} (auth.enterprise.id_token_file): {e}; the identity provider's sign-in must keep the user's ID token there",
                        path.display()
                    ))
                })?;
                Secret::new(read.trim())
            }
        };
        if token.expose().is_empty() {
            return Err(OAuthError::Unsupported(
                "the user's ID token (auth.enterprise) is empty; sign in with the identity provider again, or set it with `bundlevisor configure`".into(),
            ));
        }
        Ok(token)
    }

    /// The JWT bearer grant at the authorization server, the client
    /// authenticating as for its other grants.
    async fn redeem(
        &self,
        http: &Http,
        mut form: Vec<(&str, String)>,
    ) -> Result<TokenSet, OAuthError> {
        let auth = self.auth;
        let id = auth.and_then(|a| a.client_id.clone()).unwrap_or_default();
        if let Some(key) = Jwt::of(auth, self.metadata) {
            return key
                .token_request(http, self.metadata, &id, self.resource, form)
                .await;
        }
        form.push(("resource", self.resource.to_string()));
        if !self.scopes.is_empty() {
            form.push(("scope", self.scopes.join(" ")));
        }
        let secret = auth.and_then(|a| a.client_secret.as_ref());
        let methods = self
            .metadata
            .additional_fields
            .get("token_endpoint_auth_methods_supported")
            .and_then(Value::as_array);
        let offers = |m: &str| methods.is_some_and(|a| a.iter().any(|x| x == m));
        // As rmcp does for the other grants: the form when the server
        // offers only that, else HTTP Basic (RFC 6749 §2.3.1).
        let post_only = offers("client_secret_post") && !offers("client_secret_basic");
        let basic = match secret {
            Some(secret) if !post_only => Some((id.as_str(), secret)),
            Some(secret) => {
                form.push(("client_id", id.clone()));
                form.push(("client_secret", secret.expose().to_string()));
                None
            }
            None => {
                form.push(("client_id", id.clone()));
                None
            }
        };
        let endpoint = &self.metadata.token_endpoint;
        let answer = post_form(http, "the token endpoint", endpoint, form, basic).await?;
        token_set(&answer)
    }
}

/// Posts `form` to the OAuth endpoint `url` (`what` names it), with HTTP
/// Basic client authentication when `basic` is given; the answer's JSON,
/// or [`OAuthError::Refused`] for an OAuth error answer. The form's
/// values are wiped once sent.
async fn post_form(
    http: &Http,
    what: &'static str,
    url: &str,
    mut form: Vec<(&str, String)>,
    basic: Option<(&str, &Secret)>,
) -> Result<Value, OAuthError> {
    checked(what, url)?;
    let failed = |message: String| OAuthError::Http {
        url: url.to_string(),
        message,
    };
    let mut request = http
        .0
        .client
        .post(url)
        .header("accept", "application/json")
        .form(&form);
    if let Some((id, secret)) = basic {
        // RFC 6749 §2.3.1: both form-urlencoded before they are joined.
        let encode =
            |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        request = request.basic_auth(encode(id), Some(encode(secret.expose())));
    }
    let sent = request.send().await;
    for (_, value) in form.iter_mut() {
        zeroize::Zeroize::zeroize(value);
    }
    let response = sent.map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let body = bounded(&mut { response }).await.map_err(failed)?;
    if status.is_success() {
        return serde_json::from_slice(&body).map_err(|e| failed(format!("unusable answer: {e}")));
    }
    Err(match serde_json::from_slice::<ErrorResponse>(&body) {
        Ok(e) if status.is_client_error() => OAuthError::Refused {
            error: e.error,
            description: e.error_description,
        },
        _ => failed(format!("HTTP {status}")),
    })
}

/// How the client-credentials grant authenticates.
enum Grant<'a> {
    /// `client_secret_basic` or `client_secret_post`, as the server offers.
    Secret(&'a String, &'a Secret),
    /// `private_key_jwt` (RFC 7523) with the operator's key.
    Jwt(&'a String, &'a Secret, Option<JwtSigningAlgorithm>),
}

impl Grant<'_> {
    fn config(
        &self,
        scopes: Vec<String>,
        resource: &str,
    ) -> Result<ClientCredentialsConfig, OAuthError> {
        Ok(match self {
            Grant::Secret(id, secret) => ClientCredentialsConfig::ClientSecret {
                client_id: id.to_string(),
                client_secret: secret.expose().to_string(),
                scopes,
                resource: Some(resource.to_string()),
            },
            Grant::Jwt(id, key, alg) => ClientCredentialsConfig::PrivateKeyJwt {
                client_id: id.to_string(),
                signing_key: key.expose().as_bytes().to_vec(),
                signing_algorithm: alg.unwrap_or(JwtSigningAlgorithm::RS256),
                token_endpoint_audience: None,
                scopes,
                resource: Some(resource.to_string()),
            },
        })
    }
}

/// An authorization-code flow in progress (held by the daemon between
/// `auth.begin` and `auth.complete`).
pub struct Pending {
    session: AuthorizationSession,
    /// The PKCE verifier of the flow, for a code exchange done here
    /// (private_key_jwt).
    verifiers: InMemoryStateStore,
    /// The client's key, when the token endpoint is called with
    /// private_key_jwt, with the metadata and what it needs.
    jwt: Option<(Jwt, AuthorizationMetadata, String, String)>,
    pub state: String,
    pub authorization_url: String,
    /// The registered client (dynamic registration, now or before), to
    /// be stored with the tokens.
    registered: Option<(String, Option<Secret>)>,
    /// The challenge the flow discovered from, kept with the tokens.
    challenge: Option<String>,
    /// The authorization server's issuer, kept with the tokens.
    issuer: String,
}

/// Discovers the server (from the challenge of its last 401 or 403, kept
/// with `stored`, when there is one), picks the client (the bundle
/// file's, a client ID metadata document, or a registered one) and builds
/// the authorization URL for `redirect_uri`.
pub async fn begin(
    http: &Http,
    plan: &RemotePlan,
    stored: &TokenSet,
    redirect_uri: &str,
) -> Result<Pending, OAuthError> {
    let auth = plan.auth.as_ref();
    let challenge = stored.challenge.as_deref();
    let (mut manager, metadata, published) = manager(http, plan, challenge).await?;
    // The 2025-11-25 spec: no advertised PKCE support, no authorization
    // (rmcp only warns). The 2025-03-26 fallback has nothing to advertise.
    if published && metadata.code_challenge_methods_supported.is_none() {
        return Err(OAuthError::Unsupported(
            "the authorization server's metadata does not list code_challenge_methods_supported, so it may not support PKCE, which the MCP authorization spec requires; nothing was sent to it".into(),
        ));
    }
    let issuer = issuer_of(&metadata);
    let stored = &for_issuer(stored, &issuer);
    let verifiers = InMemoryStateStore::new();
    manager.set_state_store(verifiers.clone());
    // A redirect to the CLI's loopback listener: a native application
    // (the MCP authorization spec's `application_type` for registration).
    // rmcp registers with the application type of the manager's client
    // configuration, set here (the client itself is chosen below).
    manager
        .configure_client(
            OAuthClientConfig::new("bundlevisor", redirect_uri)
                .with_application_type(application_type(redirect_uri)),
        )
        .map_err(|e| http.explain(e))?;
    let mut request = AuthorizationRequest::new(redirect_uri)
        .with_client_name("bundlevisor")
        .with_application_type(application_type(redirect_uri));
    let cimd = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .is_some_and(|v| v == &Value::Bool(true));
    let document = auth
        .and_then(|a| a.client_metadata_url.as_deref())
        .filter(|_| cimd);
    // The client, in the spec's order: pre-registered (the bundle file's),
    // a client ID metadata document, a client this authorization server
    // registered before, a new registration. The client kept with the
    // tokens is any but the bundle file's.
    let mut client = ClientId::default();
    let mut registered = None;
    if let Some(id) = auth.and_then(|a| a.client_id.clone()) {
        client = ClientId {
            id: Some(id),
            secret: auth.and_then(|a| a.client_secret.clone()),
        };
    } else if let Some(url) = document {
        request = request.with_client_metadata_url(url);
        registered = Some((url.to_string(), None));
    } else if let Some(id) = stored
        .client_id
        .clone()
        // A document's URL is no registration.
        .filter(|id| !id.starts_with("https://"))
    {
        registered = Some((id.clone(), stored.client_secret.clone()));
        client = ClientId {
            id: Some(id),
            secret: stored.client_secret.clone(),
        };
    } else if metadata.registration_endpoint.is_some() {
        // Registered here rather than by rmcp, so that a secret the
        // server issues is kept with the tokens.
        http.forget();
        let config = manager
            .register_client("bundlevisor", redirect_uri, &[])
            .await
            .map_err(|e| {
                OAuthError::Unsupported(format!(
                    "dynamic client registration at {issuer} failed: {}; if the authorization server does not offer it, register a client with it and set auth.client_id in the bundle file",
                    http.explain(e)
                ))
            })?;
        let secret = config.client_secret.map(Secret::new);
        registered = Some((config.client_id.clone(), secret.clone()));
        client = ClientId {
            id: Some(config.client_id),
            secret,
        };
    } else {
        return Err(OAuthError::Unsupported(no_client(&issuer, cimd)));
    }
    if let Some(id) = &client.id {
        request = request.with_preregistered_client(id);
        if let Some(secret) = &client.secret {
            request = request.with_client_secret(secret.expose());
        }
    }
    // The bundle file's scopes, with any the server said a token lacked;
    // else the challenge's; else (rmcp's initial selection) the protected
    // resource's `scopes_supported`, else none.
    let configured = auth.map(|a| a.scopes.clone()).unwrap_or_default();
    let mut scopes = union(configured, stored.wanted_scopes.clone());
    if scopes.is_empty() {
        scopes = challenge.and_then(challenge_scope).unwrap_or_default();
    }
    request = if scopes.is_empty() {
        request.with_initial_scope_selection()
    } else {
        request.with_scopes(scopes)
    };
    http.forget();
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, e)| http.explain(e))?;
    let authorization_url = session.get_authorization_url().to_string();
    let state = url::Url::parse(&authorization_url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "state")
                .map(|(_, v)| v.into_owned())
        })
        .ok_or_else(|| OAuthError::Discovery("the authorization URL has no state".into()))?;
    checked("the authorization endpoint", &authorization_url)?;
    let jwt = Jwt::of(auth, &metadata)
        .zip(client.id.clone())
        .map(|(key, id)| (key, metadata.clone(), id, plan.url.clone()));
    Ok(Pending {
        session,
        verifiers,
        jwt,
        state,
        authorization_url,
        registered,
        challenge: stored.challenge.clone(),
        issuer,
    })
}

/// Exchanges the authorization code for tokens; `issuer` is the
/// redirect's `iss` (RFC 9207), checked when the server sends one.
pub async fn complete(
    http: &Http,
    pending: &Pending,
    code: &str,
    issuer: Option<&str>,
) -> Result<TokenSet, OAuthError> {
    let mut tokens = exchange_code(http, pending, code, issuer).await?;
    if let Some((id, secret)) = &pending.registered {
        tokens.client_id = Some(id.clone());
        tokens.client_secret = secret.clone();
    }
    tokens.challenge = pending.challenge.clone();
    tokens.issuer = Some(pending.issuer.clone());
    Ok(tokens)
}

/// The code exchange of [`complete`]: by rmcp, or here with
/// `private_key_jwt`.
async fn exchange_code(
    http: &Http,
    pending: &Pending,
    code: &str,
    issuer: Option<&str>,
) -> Result<TokenSet, OAuthError> {
    if let Some((key, metadata, id, resource)) = &pending.jwt {
        let flow = pending
            .verifiers
            .load(&pending.state)
            .await
            .ok()
            .flatten()
            .ok_or_else(|| OAuthError::Discovery("the flow's PKCE verifier is gone".into()))?;
        // RFC 9207: an `iss` must be the authorization server's, and one
        // that advertises it must send it.
        if flow.require_issuer && issuer.is_none()
            || issuer.is_some_and(|i| flow.expected_issuer.as_deref() != Some(i))
        {
            return Err(OAuthError::Mismatch(format!(
                "the authorization response's issuer {issuer:?} is not the authorization server's ({:?}, RFC 9207); the code was not used",
                flow.expected_issuer
            )));
        }
        let form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code.to_string()),
            ("redirect_uri", pending.session.redirect_uri.clone()),
            ("code_verifier", flow.pkce_verifier.clone()),
        ];
        return key
            .token_request(http, metadata, id, resource, form)
            .await
            .map_err(|e| mask(e, &Redactor::new([Secret::new(code.to_string())])));
    }
    http.forget();
    let answer = pending
        .session
        .handle_callback_with_issuer(code, &pending.state, issuer)
        .await
        .map_err(|e| {
            let code = Redactor::new([Secret::new(code.to_string())]);
            mask(http.explain(e), &code)
        })?;
    token_set(&answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_names_its_metadata_and_scopes() {
        let challenge = r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            resource_metadata_from_challenge(challenge).as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            challenge_scope(challenge),
            Some(vec!["files:read".to_string(), "files:write".to_string()])
        );
        assert_eq!(resource_metadata_from_challenge("Bearer realm=\"x\""), None);
        assert_eq!(challenge_scope("Bearer realm=\"x\""), None);
        assert_eq!(challenge_scope("Bearer myscope=\"x\""), None);
        assert!(insufficient_scope(challenge));
        assert!(!insufficient_scope(
            r#"Bearer error="invalid_token", error_description="not insufficient_scope""#
        ));
        // Parameter names in any case; values as sent.
        let shouted = r#"Bearer ERROR="insufficient_scope", Scope="Files:Read""#;
        assert!(insufficient_scope(shouted));
        assert_eq!(
            challenge_scope(shouted),
            Some(vec!["Files:Read".to_string()])
        );
    }

    #[test]
    fn a_loopback_redirect_registers_a_native_application() {
        for uri in [
            "http://127.0.0.1:4000/callback",
            "http://[::1]:4000/callback",
            "http://localhost:4000/callback",
        ] {
            assert_eq!(application_type(uri), "native", "{uri}");
        }
        assert_eq!(application_type("https://app.example/callback"), "web");
    }

    #[test]
    fn stored_tokens_are_used_with_their_own_authorization_server_only() {
        let stored = TokenSet {
            refresh_token: Some(Secret::new("rt")),
            client_id: Some("client-1".into()),
            wanted_scopes: vec!["notes:write".into()],
            issuer: Some("https://as.example".into()),
            challenge: Some("Bearer scope=\"notes:write\"".into()),
            ..TokenSet::default()
        };
        assert_eq!(for_issuer(&stored, "https://as.example"), stored);
        let elsewhere = for_issuer(&stored, "https://other.example");
        assert_eq!(
            (
                elsewhere.refresh_token,
                elsewhere.client_id,
                elsewhere.issuer
            ),
            (None, None, None)
        );
        assert_eq!(elsewhere.wanted_scopes, stored.wanted_scopes);
        assert_eq!(elsewhere.challenge, stored.challenge);
        // A set stored before the issuer was recorded is used as it is.
        let older = TokenSet {
            issuer: None,
            ..stored.clone()
        };
        assert_eq!(for_issuer(&older, "https://other.example"), older);
    }

    #[test]
    fn well_known_urls_keep_the_issuer_path_after_the_segment() {
        let u = url::Url::parse("https://as.example/tenant1/").unwrap();
        assert_eq!(
            well_known(&u, ASM_PATH),
            "https://as.example/.well-known/oauth-authorization-server/tenant1"
        );
    }

    #[test]
    fn identifiers_match_after_parsing_only() {
        let a = url::Url::parse("https://as.example").unwrap();
        assert!(same_identifier(&a, "https://as.example/"));
        assert!(same_identifier(&a, "HTTPS://AS.example:443"));
        for other in [
            "https://as.example/tenant",
            "http://as.example",
            "https://as.example:8443",
            "https://as.example.evil",
            "",
        ] {
            assert!(!same_identifier(&a, other), "{other}");
        }
    }

    /// A local server whose protected-resource and authorization-server
    /// metadata are the given documents (`BASE` replaced by its URL).
    async fn metadata_server(prm: Value, asm: Value) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let fill = |v: Value| -> Value {
            serde_json::from_str(&v.to_string().replace("BASE", &base)).unwrap()
        };
        let (prm, asm) = (fill(prm), fill(asm));
        let app = axum::Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                axum::routing::get(move || async move { axum::Json(prm) }),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                axum::routing::get(move || async move { axum::Json(asm) }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        base
    }

    fn plan(base: &str) -> RemotePlan {
        RemotePlan {
            url: format!("{base}/mcp"),
            headers: Vec::new(),
            auth: None,
            redactor: Redactor::default(),
        }
    }

    #[tokio::test]
    async fn discovered_endpoints_must_pass_the_https_or_loopback_rule() {
        let prm = json!({ "resource": "BASE/mcp", "authorization_servers": ["BASE"] });
        let good = json!({ "issuer": "BASE", "token_endpoint": "BASE/token",
            "authorization_endpoint": "BASE/authorize", "registration_endpoint": "BASE/register",
            "code_challenge_methods_supported": ["S256"] });
        let base = metadata_server(prm.clone(), good.clone()).await;
        let challenge =
            format!("Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"");
        assert!(manager(&http_client(), &plan(&base), Some(&challenge))
            .await
            .is_ok());
        for (field, value, what) in [
            (
                "token_endpoint",
                "http://as.example/token",
                "the token endpoint",
            ),
            (
                "authorization_endpoint",
                "http://as.example/authorize",
                "the authorization endpoint",
            ),
            (
                "registration_endpoint",
                "ftp://as.example/register",
                "the registration endpoint",
            ),
        ] {
            let mut asm = good.clone();
            asm[field] = json!(value);
            let base = metadata_server(prm.clone(), asm).await;
            let challenge = format!(
                "Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\""
            );
            match manager(&http_client(), &plan(&base), Some(&challenge)).await {
                Err(OAuthError::InsecureUrl { what: w, url, .. }) => {
                    assert_eq!((w, url.as_str()), (what, value));
                }
                Err(e) => panic!("{field}: {e}"),
                Ok(_) => panic!("{field}: {value} was accepted"),
            }
        }
        // A challenge pointing at plain http: refused before any request.
        let e = manager(
            &http_client(),
            &plan(&base),
            Some("Bearer resource_metadata=\"http://as.example/prm\""),
        )
        .await
        .err()
        .unwrap();
        assert!(e.to_string().contains("must use https"), "{e}");
    }
}
