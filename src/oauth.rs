//! The OAuth 2.1 client of remote bundles: discovery (RFC 9728 protected
//! resource metadata, RFC 8414 authorization server metadata), dynamic
//! client registration (RFC 7591), the refresh-token, client-credentials
//! and authorization-code + PKCE (S256) grants, each with the RFC 8707
//! `resource` parameter naming the MCP server, as the MCP authorization
//! spec asks.
//!
//! Nothing here stores or logs a token: callers get [`TokenSet`]s and keep
//! them in the encrypted store. Error texts carry the server's `error` code
//! and description, never a request body, and the secrets a request carried
//! are masked in them.
//!
//! Every URL the client fetches or posts to — the challenge's
//! `resource_metadata`, the advertised authorization servers, the
//! discovered endpoints — passes the https-or-loopback rule of
//! [`crate::remote_http::check_url`] before anything is sent; redirects
//! are never followed. Metadata must belong to the server it was fetched
//! for: the protected-resource metadata's `resource` is the MCP server's
//! URL (RFC 9728 §3.3), the authorization-server metadata's `issuer` is the
//! issuer its URL was built from (RFC 8414 §3.3).

use base64::Engine;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::manifest::{AuthPlan, RemotePlan};
use crate::remote_http::UrlRefused;
use crate::secret::{Redactor, Secret};
use crate::store::TokenSet;

const PRM_PATH: &str = "/.well-known/oauth-protected-resource";
const ASM_PATH: &str = "/.well-known/oauth-authorization-server";
const OIDC_PATH: &str = "/.well-known/openid-configuration";

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// The authorization server answered with an OAuth error (`invalid_grant`, ...).
    #[error("the authorization server refused the request: {error}{}", .description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
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

/// Where to ask for tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub issuer: String,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: String,
    pub registration_endpoint: Option<String>,
}

#[derive(Deserialize)]
struct ResourceMetadata {
    /// Required by RFC 9728 §2; checked against the MCP server's URL.
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    authorization_servers: Vec<String>,
}

#[derive(Deserialize)]
struct ServerMetadata {
    issuer: Option<String>,
    authorization_endpoint: Option<String>,
    token_endpoint: String,
    registration_endpoint: Option<String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    expires_in: Option<i64>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

#[derive(Deserialize)]
struct Registration {
    client_id: String,
    #[serde(default)]
    client_secret: Option<String>,
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

/// A plain HTTP client for OAuth requests: no redirects followed (a token
/// or registration endpoint that redirects is refused, a metadata URL that
/// redirects counts as absent), bounded time.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .expect("a reqwest client with static settings builds")
}

fn http_err(url: &str, e: impl std::fmt::Display) -> OAuthError {
    OAuthError::Http {
        url: url.to_string(),
        message: e.to_string(),
    }
}

/// An error for a redirect answer (the client follows none), naming where
/// it pointed.
fn redirected(url: &str, response: &reqwest::Response) -> OAuthError {
    let to = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .unwrap_or("(no location)");
    http_err(
        url,
        format!(
            "HTTP {} redirect to {to}, which is not followed: OAuth requests go only to the URLs the metadata names",
            response.status()
        ),
    )
}

/// Fetches JSON metadata; `Ok(None)` when the server has none there (any
/// answer but 2xx, including a redirect, which is not followed).
async fn get_json<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    what: &'static str,
    url: &str,
) -> Result<Option<T>, OAuthError> {
    checked(what, url)?;
    let response = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| http_err(url, e))?;
    if !response.status().is_success() {
        return Ok(None);
    }
    response
        .json::<T>()
        .await
        .map(Some)
        .map_err(|e| http_err(url, format!("unusable metadata: {e}")))
}

/// `resource_metadata="URL"` from a `WWW-Authenticate: Bearer` challenge.
pub fn resource_metadata_from_challenge(challenge: &str) -> Option<String> {
    let at = challenge.find("resource_metadata=")?;
    let rest = &challenge[at + "resource_metadata=".len()..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split([',', ' ']).next()?,
    };
    (!value.is_empty()).then(|| value.to_string())
}

/// A well-known URL for `base` (RFC 8414 §3.1: the well-known segment goes
/// between the host and the path).
fn well_known(base: &url::Url, suffix: &str) -> String {
    let path = base.path().trim_end_matches('/');
    format!("{}{suffix}{path}", base.origin().ascii_serialization())
}

/// The same resource or issuer identifier: URLs compared after parsing, so
/// `https://a.example` and `https://a.example/` match but another path,
/// host, port or scheme does not.
fn same_identifier(a: &url::Url, b: &str) -> bool {
    url::Url::parse(b).is_ok_and(|b| &b == a)
}

/// The authorization server named by the MCP server's protected-resource
/// metadata (RFC 9728), or its own origin when it publishes none.
async fn resource_issuer(
    http: &reqwest::Client,
    resource: &url::Url,
    challenge: Option<&str>,
) -> Result<String, OAuthError> {
    let origin = url::Url::parse(&resource.origin().ascii_serialization())
        .map_err(|e| OAuthError::Discovery(format!("{resource}: {e}")))?;
    // Each candidate with the resource identifiers its metadata may name:
    // the one the well-known URL was built from (§3.3), and for the
    // challenge the URL of the request that got the 401 (§3.3, §5).
    let mut candidates: Vec<(&'static str, String, Vec<&url::Url>)> = Vec::new();
    if let Some(url) = challenge.and_then(resource_metadata_from_challenge) {
        candidates.push((
            "the resource_metadata URL of the server's 401 challenge",
            url,
            vec![resource],
        ));
    }
    candidates.push((
        "the protected-resource metadata URL",
        well_known(resource, PRM_PATH),
        vec![resource],
    ));
    candidates.push((
        "the protected-resource metadata URL",
        format!("{}{PRM_PATH}", resource.origin().ascii_serialization()),
        vec![resource, &origin],
    ));
    let mut tried = Vec::new();
    for (what, url, identifiers) in candidates {
        if tried.contains(&url) {
            continue;
        }
        let Some(meta) = get_json::<ResourceMetadata>(http, what, &url).await? else {
            tried.push(url);
            continue;
        };
        let named = meta.resource.as_deref();
        if !named.is_some_and(|n| identifiers.iter().any(|id| same_identifier(id, n))) {
            let named = match named {
                Some(n) => format!("is for resource {n:?}"),
                None => "names no resource (required by RFC 9728 §2)".to_string(),
            };
            return Err(OAuthError::Mismatch(format!(
                "the protected-resource metadata at {url} {named}, not {resource} (RFC 9728 §3.3); refusing it and the authorization servers it names — the MCP server or its metadata is misconfigured, or the metadata is not its own"
            )));
        }
        if meta.authorization_servers.is_empty() {
            tried.push(url);
            continue;
        }
        // Only an authorization server that passes the rule is used.
        let mut refused = Vec::new();
        for server in meta.authorization_servers {
            match checked("the authorization server", &server) {
                Ok(_) => return Ok(server),
                Err(e) => refused.push(e.to_string()),
            }
        }
        return Err(OAuthError::Discovery(format!(
            "the protected-resource metadata at {url} names no usable authorization server: {}",
            refused.join("; ")
        )));
    }
    // Servers without protected-resource metadata: the MCP server's
    // origin is its own authorization server (MCP 2025-03-26).
    Ok(resource.origin().ascii_serialization())
}

/// Finds the authorization server of the MCP server at `resource`.
pub async fn discover(
    http: &reqwest::Client,
    resource: &str,
    configured_issuer: Option<&str>,
    challenge: Option<&str>,
) -> Result<Endpoints, OAuthError> {
    let resource_url = checked("the MCP server URL", resource)?;
    let issuer = match configured_issuer {
        Some(i) => i.to_string(),
        None => resource_issuer(http, &resource_url, challenge).await?,
    };
    let issuer_url = checked("the authorization server", &issuer)?;
    for url in [
        well_known(&issuer_url, ASM_PATH),
        well_known(&issuer_url, OIDC_PATH),
        format!("{}{OIDC_PATH}", issuer.trim_end_matches('/')),
    ] {
        let what = "the authorization server metadata URL";
        if let Some(meta) = get_json::<ServerMetadata>(http, what, &url).await? {
            // RFC 8414 §3.3 (and OpenID Connect Discovery §4.3): the issuer
            // is the one the metadata URL was built from.
            match meta.issuer.as_deref() {
                Some(named) if same_identifier(&issuer_url, named) => {}
                Some(named) => return Err(OAuthError::Mismatch(format!(
                    "the authorization server metadata at {url} names issuer {named:?}, not {issuer} (RFC 8414 §3.3); refusing it, so nothing is sent to its endpoints — if {named:?} is the right authorization server, set auth.authorization_server to it in the bundle file"
                ))),
                None => return Err(OAuthError::Mismatch(format!(
                    "the authorization server metadata at {url} names no issuer (required by RFC 8414 §2); refusing it, so nothing is sent to its endpoints"
                ))),
            }
            checked("the token endpoint", &meta.token_endpoint)?;
            for (what, endpoint) in [
                ("the authorization endpoint", &meta.authorization_endpoint),
                ("the registration endpoint", &meta.registration_endpoint),
            ] {
                if let Some(endpoint) = endpoint {
                    checked(what, endpoint)?;
                }
            }
            return Ok(Endpoints {
                issuer,
                authorization_endpoint: meta.authorization_endpoint,
                token_endpoint: meta.token_endpoint,
                registration_endpoint: meta.registration_endpoint,
            });
        }
    }
    Err(OAuthError::Discovery(format!(
        "no authorization server metadata at {issuer} (tried {ASM_PATH} and {OIDC_PATH})"
    )))
}

/// Form fields of a token request that are secrets.
const SECRET_FIELDS: &[&str] = &["client_secret", "refresh_token", "code", "code_verifier"];

/// Posts a token request; `form` holds the grant's own parameters.
async fn token_request(
    http: &reqwest::Client,
    endpoints: &Endpoints,
    client: &ClientId,
    resource: &str,
    mut form: Vec<(&str, String)>,
) -> Result<TokenSet, OAuthError> {
    if let Some(id) = &client.id {
        form.push(("client_id", id.clone()));
    }
    if let Some(secret) = &client.secret {
        form.push(("client_secret", secret.expose().to_string()));
    }
    form.push(("resource", resource.to_string()));
    let url = &endpoints.token_endpoint;
    checked("the token endpoint", url)?;
    // What the request carried stays out of any error text about it.
    let redactor = Redactor::new(
        form.iter()
            .filter(|(k, _)| SECRET_FIELDS.contains(k))
            .map(|(_, v)| Secret::new(v.clone())),
    );
    let masked = |e: OAuthError| -> OAuthError {
        let mask = |t: String| redactor.redact(&t).into_owned();
        match e {
            OAuthError::Refused { error, description } => OAuthError::Refused {
                error: mask(error),
                description: description.map(mask),
            },
            OAuthError::Http { url, message } => OAuthError::Http {
                url: mask(url),
                message: mask(message),
            },
            other => other,
        }
    };
    let sent = http
        .post(url)
        .header("accept", "application/json")
        .form(&form)
        .send()
        .await;
    for (_, value) in form.iter_mut() {
        zeroize::Zeroize::zeroize(value);
    }
    let response = sent.map_err(|e| masked(http_err(url, e)))?;
    let status = response.status();
    if status.is_redirection() {
        return Err(masked(redirected(url, &response)));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| masked(http_err(url, e)))?;
    if !status.is_success() {
        return Err(masked(
            match serde_json::from_slice::<ErrorResponse>(&body) {
                Ok(e) => OAuthError::Refused {
                    error: e.error,
                    description: e.error_description,
                },
                Err(_) => http_err(url, format!("HTTP {status}")),
            },
        ));
    }
    let token: TokenResponse = serde_json::from_slice(&body)
        .map_err(|e| masked(http_err(url, format!("unusable token response: {e}"))))?;
    Ok(TokenSet {
        access_token: Some(Secret::new(token.access_token)),
        refresh_token: token.refresh_token.map(Secret::new),
        expires_at: token.expires_in.map(|s| crate::clock::unix_secs() + s),
        client_id: None,
        client_secret: None,
    })
}

/// What a silent attempt to get a token came to.
pub enum Silent {
    /// New tokens (store them).
    Tokens(TokenSet),
    /// Only the interactive flow can help; the text says why.
    Interactive(String),
}

/// Tries, in order, the stored refresh token and the client-credentials
/// grant. `Err` is a failure worth retrying (network, discovery); a refused
/// grant moves on to the next one.
pub async fn obtain_silently(
    http: &reqwest::Client,
    plan: &RemotePlan,
    stored: &TokenSet,
    challenge: Option<&str>,
) -> Result<Silent, OAuthError> {
    let auth = plan.auth.as_ref();
    let client = ClientId::of(auth, stored);
    let can_refresh = stored.refresh_token.is_some();
    let can_client_credentials =
        auth.is_some_and(|a| a.client_id.is_some() && a.client_secret.is_some());
    if !can_refresh && !can_client_credentials {
        return Ok(Silent::Interactive(
            "no stored refresh token and no client credentials configured".into(),
        ));
    }
    let endpoints = discover(
        http,
        &plan.url,
        auth.and_then(|a| a.authorization_server.as_deref()),
        challenge,
    )
    .await?;
    let mut why = Vec::new();
    if let Some(refresh) = &stored.refresh_token {
        let form = vec![
            ("grant_type", "refresh_token".to_string()),
            ("refresh_token", refresh.expose().to_string()),
        ];
        match token_request(http, &endpoints, &client, &plan.url, form).await {
            Ok(mut tokens) => {
                if tokens.refresh_token.is_none() {
                    tokens.refresh_token = stored.refresh_token.clone();
                }
                tokens.client_id = stored.client_id.clone();
                tokens.client_secret = stored.client_secret.clone();
                return Ok(Silent::Tokens(tokens));
            }
            Err(e @ OAuthError::Refused { .. }) => why.push(format!("refresh token: {e}")),
            Err(e) => return Err(e),
        }
    }
    if can_client_credentials {
        let mut form = vec![("grant_type", "client_credentials".to_string())];
        let scopes = auth.map(|a| a.scopes.join(" ")).unwrap_or_default();
        if !scopes.is_empty() {
            form.push(("scope", scopes));
        }
        match token_request(http, &endpoints, &client, &plan.url, form).await {
            Ok(mut tokens) => {
                tokens.client_id = stored.client_id.clone();
                tokens.client_secret = stored.client_secret.clone();
                return Ok(Silent::Tokens(tokens));
            }
            Err(e @ OAuthError::Refused { .. }) => why.push(format!("client credentials: {e}")),
            Err(e) => return Err(e),
        }
    }
    Ok(Silent::Interactive(why.join("; ")))
}

/// An authorization-code flow in progress (held by the daemon between
/// `auth.begin` and `auth.complete`).
pub struct Pending {
    pub endpoints: Endpoints,
    pub client: ClientId,
    pub verifier: Secret,
    pub state: String,
    pub redirect_uri: String,
    pub resource: String,
    pub authorization_url: String,
    /// A client registered for this flow, to be stored with the tokens.
    pub registered: Option<(String, Option<Secret>)>,
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The S256 code challenge of a PKCE verifier (RFC 7636 §4.2).
pub fn code_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// Discovers the server, registers a client when the bundle file names
/// none, and builds the authorization URL for `redirect_uri`.
pub async fn begin(
    http: &reqwest::Client,
    plan: &RemotePlan,
    stored: &TokenSet,
    redirect_uri: &str,
) -> Result<Pending, OAuthError> {
    let auth = plan.auth.as_ref();
    let endpoints = discover(
        http,
        &plan.url,
        auth.and_then(|a| a.authorization_server.as_deref()),
        None,
    )
    .await?;
    let authorization_endpoint = endpoints.authorization_endpoint.clone().ok_or_else(|| {
        OAuthError::Unsupported(format!(
            "the authorization server {} has no authorization endpoint",
            endpoints.issuer
        ))
    })?;
    let mut client = ClientId::of(auth, stored);
    let mut registered = None;
    if client.id.is_none() {
        let url = endpoints.registration_endpoint.clone().ok_or_else(|| {
            OAuthError::Unsupported(format!(
                "the authorization server {} does not offer client registration; set auth.client_id in the bundle file",
                endpoints.issuer
            ))
        })?;
        checked("the registration endpoint", &url)?;
        let response = http
            .post(&url)
            .json(&serde_json::json!({
                "client_name": "bundlevisor",
                "redirect_uris": [redirect_uri],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            }))
            .send()
            .await
            .map_err(|e| http_err(&url, e))?;
        if response.status().is_redirection() {
            return Err(redirected(&url, &response));
        }
        if !response.status().is_success() {
            return Err(http_err(
                &url,
                format!("registration refused: HTTP {}", response.status()),
            ));
        }
        let reg: Registration = response
            .json()
            .await
            .map_err(|e| http_err(&url, format!("unusable registration: {e}")))?;
        let secret = reg.client_secret.map(Secret::new);
        client = ClientId {
            id: Some(reg.client_id.clone()),
            secret: secret.clone(),
        };
        registered = Some((reg.client_id, secret));
    }
    let verifier = random_token();
    let state = random_token();
    let mut url = checked("the authorization endpoint", &authorization_endpoint)?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", client.id.as_deref().unwrap_or_default())
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("state", &state)
            .append_pair("code_challenge", &code_challenge(&verifier))
            .append_pair("code_challenge_method", "S256")
            .append_pair("resource", &plan.url);
        let scopes = auth.map(|a| a.scopes.join(" ")).unwrap_or_default();
        if !scopes.is_empty() {
            q.append_pair("scope", &scopes);
        }
    }
    Ok(Pending {
        endpoints,
        client,
        verifier: Secret::new(verifier),
        state,
        redirect_uri: redirect_uri.to_string(),
        resource: plan.url.clone(),
        authorization_url: url.to_string(),
        registered,
    })
}

/// Exchanges the authorization code for tokens.
pub async fn complete(
    http: &reqwest::Client,
    pending: &Pending,
    code: &str,
) -> Result<TokenSet, OAuthError> {
    let form = vec![
        ("grant_type", "authorization_code".to_string()),
        ("code", code.to_string()),
        ("redirect_uri", pending.redirect_uri.clone()),
        ("code_verifier", pending.verifier.expose().to_string()),
    ];
    let mut tokens = token_request(
        http,
        &pending.endpoints,
        &pending.client,
        &pending.resource,
        form,
    )
    .await?;
    if let Some((id, secret)) = &pending.registered {
        tokens.client_id = Some(id.clone());
        tokens.client_secret = secret.clone();
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_s256_matches_the_rfc_7636_example() {
        assert_eq!(
            code_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let a = random_token();
        assert_eq!(a.len(), 43);
        assert_ne!(a, random_token());
    }

    #[test]
    fn resource_metadata_is_read_from_a_challenge() {
        assert_eq!(
            resource_metadata_from_challenge(
                r#"Bearer error="invalid_token", resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp""#
            )
            .as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(resource_metadata_from_challenge("Bearer realm=\"x\""), None);
    }

    #[test]
    fn well_known_urls_keep_the_issuer_path_after_the_segment() {
        let u = url::Url::parse("https://as.example/tenant1/").unwrap();
        assert_eq!(
            well_known(&u, ASM_PATH),
            "https://as.example/.well-known/oauth-authorization-server/tenant1"
        );
        let root = url::Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            well_known(&root, PRM_PATH),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource"
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
    /// metadata are the given documents; returns its base URL.
    async fn metadata_server(prm: serde_json::Value, asm: serde_json::Value) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let fill = |v: serde_json::Value| {
            serde_json::from_str::<serde_json::Value>(&v.to_string().replace("BASE", &base))
                .unwrap()
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

    #[tokio::test]
    async fn discovery_refuses_what_breaks_the_rules_and_accepts_the_rest() {
        use serde_json::json;
        let http = http_client_for_tests();
        let good_asm = json!({ "issuer": "BASE", "token_endpoint": "BASE/token",
            "authorization_endpoint": "https://login.example/authorize" });
        let good_prm = json!({ "resource": "BASE/mcp", "authorization_servers": ["BASE"] });

        let base = metadata_server(good_prm.clone(), good_asm.clone()).await;
        let found = discover(&http, &format!("{base}/mcp"), None, None)
            .await
            .unwrap();
        assert_eq!(
            (found.issuer, found.token_endpoint),
            (base.clone(), format!("{base}/token"))
        );

        // The first advertised server that passes the rule is used.
        let base = metadata_server(
            json!({ "resource": "BASE/mcp",
                    "authorization_servers": ["http://as.example", "BASE"] }),
            good_asm.clone(),
        )
        .await;
        let found = discover(&http, &format!("{base}/mcp"), None, None)
            .await
            .unwrap();
        assert_eq!(found.issuer, base);

        let refused = |prm: serde_json::Value, asm: serde_json::Value, expect: &'static str| async move {
            let base = metadata_server(prm, asm).await;
            let err = discover(&http_client_for_tests(), &format!("{base}/mcp"), None, None)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(expect), "{expect:?} not in {err:?}");
        };
        refused(
            json!({ "resource": "BASE/mcp", "authorization_servers": ["http://as.example"] }),
            good_asm.clone(),
            "names no usable authorization server: refused the authorization server http://as.example: it must use https",
        )
        .await;
        refused(
            json!({ "authorization_servers": ["BASE"] }),
            good_asm.clone(),
            "names no resource (required by RFC 9728 §2)",
        )
        .await;
        refused(
            good_prm.clone(),
            json!({ "issuer": "BASE", "token_endpoint": "http://as.example/token" }),
            "refused the token endpoint http://as.example/token: it must use https",
        )
        .await;
        refused(
            good_prm.clone(),
            json!({ "issuer": "BASE", "token_endpoint": "BASE/token",
                    "registration_endpoint": "ftp://as.example/register" }),
            "refused the registration endpoint ftp://as.example/register: it uses unsupported scheme",
        )
        .await;
        refused(
            good_prm.clone(),
            json!({ "token_endpoint": "BASE/token" }),
            "names no issuer (required by RFC 8414 §2)",
        )
        .await;
    }

    fn http_client_for_tests() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap()
    }
}
