//! Remote bundles: a JSON file that names a streamable-HTTP MCP server
//! instead of a command (docs/manifest.md, "Remote bundles").
//!
//! ```json
//! { "name": "notes", "url": "https://mcp.example.com/mcp",
//!   "headers": { "X-Tenant": "${user_config.tenant}" },
//!   "user_config": { "tenant": { "type": "string", "title": "Tenant", "description": "Tenant", "required": true } },
//!   "auth": { "client_id": "bundlevisor", "client_secret": "${user_config.client_secret}",
//!             "scopes": ["files:read"] } }
//! ```
//!
//! A file is remote when it has `url` and no `server`. Unknown top-level
//! keys are errors, so a typo (`"heders"`) is caught, not ignored.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::check::{check_variables, string_list, string_map, user_config, Checker};
use super::{HostBlock, Manifest, Transport, HOST_META_KEY};

/// Version shown for a remote bundle whose file gives none.
pub const DEFAULT_REMOTE_VERSION: &str = "remote";

const KNOWN_KEYS: &[&str] = &[
    "$schema",
    "name",
    "display_name",
    "version",
    "description",
    "url",
    "headers",
    "user_config",
    "auth",
    "_meta",
];

/// Headers the transport sets itself; a file may not override them.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// The remote server of a remote bundle (values still unsubstituted).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteServer {
    pub url: String,
    pub headers: BTreeMap<String, String>,
    pub auth: Option<RemoteAuth>,
}

/// OAuth settings of a remote bundle. Without them a 401 can only be
/// answered by `bundlevisor auth` (authorization code + PKCE, with a
/// dynamically registered client).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemoteAuth {
    pub client_id: Option<String>,
    /// Usually `${user_config.client_secret}`; enables the client-credentials grant.
    pub client_secret: Option<String>,
    pub scopes: Vec<String>,
    /// Authorization server issuer URL; discovered from the MCP server
    /// (RFC 9728 protected-resource metadata) when absent.
    pub authorization_server: Option<String>,
    /// An https URL of the client's metadata document (SEP-991), used as
    /// its client id where the authorization server supports that.
    pub client_metadata_url: Option<String>,
    /// `${user_config.KEY}` of a sensitive entry holding a PEM private key:
    /// the token endpoint is called with `private_key_jwt` (RFC 7523).
    pub private_key: Option<String>,
    /// The JWT's algorithm (RS256 unless said).
    pub signing_alg: Option<String>,
    /// Enterprise-Managed Authorization: tokens from an ID-JAG that the
    /// operator's identity provider issues.
    pub enterprise: Option<Box<EnterpriseAuth>>,
}

/// The identity-provider side of Enterprise-Managed Authorization (the
/// `io.modelcontextprotocol/enterprise-managed-authorization` extension):
/// the user's ID token is exchanged at the IdP's token endpoint for an
/// ID-JAG (RFC 8693), which the MCP server's authorization server takes
/// for an access token (RFC 7523).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnterpriseAuth {
    /// The IdP's token endpoint.
    pub token_endpoint: String,
    /// The daemon's client at the IdP.
    pub client_id: String,
    /// Usually `${user_config.KEY}` of a sensitive entry.
    pub client_secret: String,
    /// `${user_config.KEY}` of a sensitive entry: the ID token itself.
    pub id_token: Option<String>,
    /// `${user_config.KEY}` of a `file` entry: a file holding the ID
    /// token, read again at each exchange.
    pub id_token_file: Option<String>,
}

/// A `signing_alg` value as rmcp's algorithm.
pub fn signing_alg(name: &str) -> Option<rmcp::transport::JwtSigningAlgorithm> {
    use rmcp::transport::JwtSigningAlgorithm as Alg;
    Some(match name {
        "RS256" => Alg::RS256,
        "RS384" => Alg::RS384,
        "RS512" => Alg::RS512,
        "ES256" => Alg::ES256,
        "ES384" => Alg::ES384,
        _ => return None,
    })
}

/// True when `root` describes a remote bundle.
pub(super) fn is_remote(root: &Map<String, Value>) -> bool {
    root.contains_key("url") && !root.contains_key("server")
}

pub(super) fn validate(c: &mut Checker, root: &Map<String, Value>) -> Option<Manifest> {
    for key in root.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            c.problem(
                format!("$.{key}"),
                format!(
                    "unknown key in a remote bundle file; known keys: {}",
                    KNOWN_KEYS[1..].join(", ")
                ),
            );
        }
    }
    let name = c.string(root, "name", "$", true);
    if let Some(n) = &name {
        if let Err(e) = crate::names::check_name("bundle", n) {
            c.problem("$.name", e);
        }
    }
    let display_name = c.string(root, "display_name", "$", false);
    let version = c
        .string(root, "version", "$", false)
        .unwrap_or_else(|| DEFAULT_REMOTE_VERSION.to_string());
    let description = c
        .string(root, "description", "$", false)
        .unwrap_or_default();
    let user_config = user_config(c, root);
    let url = c.string(root, "url", "$", true);
    if let Some(u) = &url {
        check_url(c, "$.url", u);
    }
    let headers = string_map(c, root, "headers", "$");
    for (k, v) in &headers {
        let path = format!("$.headers.{k}");
        if RESERVED_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
            c.problem(
                &path,
                "is set by bundlevisor itself and cannot be given here",
            );
        } else if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            c.problem(&path, "is not a valid HTTP header name");
        }
        check_variables(c, path, v, &user_config);
    }
    let auth = c
        .object(root, "auth", "$", false)
        .map(|a| auth(c, a, &user_config));
    let host: Option<HostBlock> = root
        .get("_meta")
        .and_then(|meta| meta.get(HOST_META_KEY))
        .and_then(|block| super::host::parse_block(c, block));
    if !c.problems.is_empty() {
        return None;
    }
    Some(Manifest {
        manifest_version: "remote".to_string(),
        name: name?,
        display_name,
        version,
        description,
        author_name: String::new(),
        transport: Transport::Remote(RemoteServer {
            url: url?,
            headers,
            auth,
        }),
        user_config,
        host,
        runtimes: Default::default(),
    })
}

fn auth(
    c: &mut Checker,
    obj: &Map<String, Value>,
    user_config: &BTreeMap<String, super::UserConfigEntry>,
) -> RemoteAuth {
    const AUTH_KEYS: &[&str] = &[
        "client_id",
        "client_secret",
        "scopes",
        "authorization_server",
        "client_metadata_url",
        "private_key",
        "signing_alg",
        "enterprise",
    ];
    for key in obj.keys() {
        if !AUTH_KEYS.contains(&key.as_str()) {
            c.problem(
                format!("$.auth.{key}"),
                format!("unknown key; known keys: {}", AUTH_KEYS.join(", ")),
            );
        }
    }
    let client_id = c.string(obj, "client_id", "$.auth", false);
    let client_secret = c.string(obj, "client_secret", "$.auth", false);
    if let Some(s) = &client_secret {
        check_variables(c, "$.auth.client_secret".into(), s, user_config);
        if client_id.is_none() {
            c.problem(
                "$.auth.client_secret",
                "needs auth.client_id (the client-credentials grant names its client)",
            );
        }
    }
    let scopes = string_list(c, obj, "scopes", "$.auth");
    let authorization_server = c.string(obj, "authorization_server", "$.auth", false);
    if let Some(u) = &authorization_server {
        check_url(c, "$.auth.authorization_server", u);
    }
    let client_metadata_url = c.string(obj, "client_metadata_url", "$.auth", false);
    if let Some(u) = &client_metadata_url {
        let path_ok = url::Url::parse(u).is_ok_and(|u| u.scheme() == "https" && u.path() != "/");
        if !path_ok {
            c.problem(
                "$.auth.client_metadata_url",
                "must be an https URL with a path (the client ID metadata document, SEP-991)",
            );
        }
    }
    let private_key = c.string(obj, "private_key", "$.auth", false);
    if let Some(k) = &private_key {
        // Exactly one sensitive entry: stored sealed, masked in errors.
        let sealed = k
            .strip_prefix("${user_config.")
            .and_then(|rest| rest.strip_suffix('}'))
            .and_then(|key| user_config.get(key))
            .is_some_and(|entry| entry.sensitive);
        if !sealed {
            c.problem(
                "$.auth.private_key",
                "must be exactly ${user_config.KEY} of a sensitive user_config entry, so the key is stored encrypted, never in the file",
            );
        }
        if client_id.is_none() {
            c.problem(
                "$.auth.private_key",
                "needs auth.client_id (the client-credentials grant names its client)",
            );
        }
    }
    let alg = c.string(obj, "signing_alg", "$.auth", false);
    if alg.as_deref().is_some_and(|a| signing_alg(a).is_none()) {
        c.problem(
            "$.auth.signing_alg",
            "must be one of RS256, RS384, RS512, ES256, ES384",
        );
    }
    let enterprise = c
        .object(obj, "enterprise", "$.auth", false)
        .and_then(|e| enterprise(c, e, user_config))
        .map(Box::new);
    if enterprise.is_some() && client_id.is_none() {
        c.problem(
            "$.auth.enterprise",
            "needs auth.client_id: the authorization server's ID-JAG names the client it is for, which authenticates with it",
        );
    }
    RemoteAuth {
        client_id,
        client_secret,
        scopes,
        authorization_server,
        client_metadata_url,
        private_key,
        signing_alg: alg,
        enterprise,
    }
}

/// `auth.enterprise`: every problem at once.
fn enterprise(
    c: &mut Checker,
    obj: &Map<String, Value>,
    user_config: &BTreeMap<String, super::UserConfigEntry>,
) -> Option<EnterpriseAuth> {
    const KEYS: &[&str] = &[
        "token_endpoint",
        "client_id",
        "client_secret",
        "id_token",
        "id_token_file",
    ];
    const AT: &str = "$.auth.enterprise";
    for key in obj.keys() {
        if !KEYS.contains(&key.as_str()) {
            c.problem(
                format!("{AT}.{key}"),
                format!("unknown key; known keys: {}", KEYS.join(", ")),
            );
        }
    }
    let token_endpoint = c.string(obj, "token_endpoint", AT, true);
    if let Some(u) = &token_endpoint {
        check_url(c, "$.auth.enterprise.token_endpoint", u);
    }
    let client_id = c.string(obj, "client_id", AT, true);
    let client_secret = c.string(obj, "client_secret", AT, true);
    if let Some(s) = &client_secret {
        check_variables(c, format!("{AT}.client_secret"), s, user_config);
    }
    // Exactly `${user_config.KEY}` of an entry that `kind` accepts.
    let entry = |value: &str, kind: &dyn Fn(&super::UserConfigEntry) -> bool| {
        value
            .strip_prefix("${user_config.")
            .and_then(|rest| rest.strip_suffix('}'))
            .and_then(|key| user_config.get(key))
            .is_some_and(kind)
    };
    let id_token = c.string(obj, "id_token", AT, false);
    if id_token
        .as_deref()
        .is_some_and(|v| !entry(v, &|e| e.sensitive))
    {
        c.problem(
            format!("{AT}.id_token"),
            "must be exactly ${user_config.KEY} of a sensitive user_config entry, so the token is stored encrypted, never in the file",
        );
    }
    let id_token_file = c.string(obj, "id_token_file", AT, false);
    if id_token_file
        .as_deref()
        .is_some_and(|v| !entry(v, &|e| e.kind == super::UserConfigType::File))
    {
        c.problem(
            format!("{AT}.id_token_file"),
            "must be exactly ${user_config.KEY} of a user_config entry of type \"file\", so the path is set with `bundlevisor configure`, which checks it",
        );
    }
    if id_token.is_some() == id_token_file.is_some() {
        c.problem(
            AT,
            "needs exactly one of id_token (the user's ID token, sealed) and id_token_file (a file the identity provider's sign-in keeps it in)",
        );
    }
    Some(EnterpriseAuth {
        token_endpoint: token_endpoint?,
        client_id: client_id?,
        client_secret: client_secret?,
        id_token,
        id_token_file,
    })
}

/// The https-or-loopback rule ([`crate::remote_http::check_url`]): tokens
/// never cross a network in the clear.
fn check_url(c: &mut Checker, path: &str, value: &str) {
    if let Err(why) = crate::remote_http::check_url(value) {
        c.problem(path, why.to_string());
    }
}
