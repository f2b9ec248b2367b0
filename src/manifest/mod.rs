//! MCPB manifests: read, validate (every problem at once, each with its JSON
//! path), substitute variables into the launch command, and gate on the
//! NimbleBrain host capabilities a bundle requires.
//!
//! The flow is `load` → [`Manifest`] (validated) → [`gate`] → [`Manifest::launch_plan`].

mod check;
mod host;
mod remote;
mod substitute;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::secret::{Redactor, Secret};

pub use host::{gate, GateRefusal, HostBlock, HostVersion, Requirement, HOST_META_KEY};
pub use remote::{RemoteAuth, RemoteServer, DEFAULT_REMOTE_VERSION};
pub use substitute::{substitute, SubstitutionVars};

/// One thing wrong with a manifest, located by JSON path (`$.server.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifest {path} is not valid JSON (line {line}, column {column}): {message}")]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("manifest {path} has {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// Why a launch plan could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("required user_config value(s) not set: {}", .0.join(", "))]
    MissingConfig(Vec<String>),
    #[error("{0}")]
    Substitution(String),
}

/// The command of a uv bundle without `mcp_config`: the Python of the
/// environment the daemon built for it (`python ${__dirname}/ENTRY_POINT`).
pub const UV_PYTHON: &str = "python";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerType {
    Node,
    Python,
    Binary,
    Uv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserConfigType {
    String,
    Number,
    Boolean,
    Directory,
    File,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UserConfigEntry {
    pub kind: UserConfigType,
    pub title: String,
    pub description: Option<String>,
    pub required: bool,
    pub default: Option<Value>,
    pub sensitive: bool,
    /// Takes several values (`configure NAME KEY=a KEY=b`); an argument
    /// that is exactly `${user_config.KEY}` becomes one argument per value.
    pub multiple: bool,
    /// Bounds of a number.
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub kind: ServerType,
    pub entry_point: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// How the daemon reaches a bundle's MCP server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process over stdio (MCPB `server`).
    Stdio(Server),
    /// A streamable-HTTP server (a remote bundle file).
    Remote(RemoteServer),
}

/// A validated manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// `manifest_version`, or `dxt_version` for older bundles.
    pub manifest_version: String,
    pub name: String,
    pub display_name: Option<String>,
    pub version: String,
    pub description: String,
    pub author_name: String,
    pub transport: Transport,
    pub user_config: BTreeMap<String, UserConfigEntry>,
    pub host: Option<HostBlock>,
    /// `compatibility.runtimes`: `node` / `python` and the version range the
    /// one on the daemon's `PATH` must satisfy (checked at install).
    pub runtimes: BTreeMap<String, semver::VersionReq>,
}

/// A manifest together with where it was read from.
#[derive(Debug, Clone)]
pub struct LoadedManifest {
    pub manifest: Manifest,
    /// The manifest file.
    pub file: PathBuf,
    /// The bundle folder (`${__dirname}`, and the bundle's cwd).
    pub dir: PathBuf,
    /// The file's text as validated (kept as the bundle's last good manifest).
    pub text: std::sync::Arc<str>,
}

impl LoadedManifest {
    /// A bundle folder's `server.entry_point` must be in it (a bare
    /// manifest file and a remote bundle have none to check).
    pub fn check_entry_point(&self) -> Result<(), ManifestError> {
        let Transport::Stdio(server) = &self.manifest.transport else {
            return Ok(());
        };
        if self.is_bare() {
            return Ok(());
        }
        let mut problems = Vec::new();
        let entry = self.dir.join(&server.entry_point);
        if !entry.exists() {
            problems.push(Problem {
                path: "$.server.entry_point".into(),
                message: format!(
                    "{} is not in the bundle folder; install the bundle whole (what `mcpb pack` packs)",
                    entry.display()
                ),
            });
        }
        let project = self.dir.join("pyproject.toml");
        if server.kind == ServerType::Uv && !project.is_file() {
            problems.push(Problem {
                path: "$.server.type".into(),
                message: format!(
                    "a uv bundle declares its dependencies in pyproject.toml, and {} is missing; add it (MCPB 0.4, examples/hello-world-uv)",
                    project.display()
                ),
            });
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(ManifestError::Invalid {
            path: self.file.clone(),
            problems,
        })
    }

    /// A bare manifest file (`DIR/NAME.json`), not a bundle folder's
    /// `manifest.json`: its folder is not the bundle's own.
    pub fn is_bare(&self) -> bool {
        self.file.file_name() != Some(std::ffi::OsStr::new("manifest.json"))
    }
}

/// How to bring a bundle up, with every variable resolved.
#[derive(Debug, Clone)]
pub enum Plan {
    Stdio(LaunchPlan),
    Remote(RemotePlan),
}

impl Plan {
    /// Masks the bundle's sensitive values in text about it.
    pub fn redactor(&self) -> &Redactor {
        match self {
            Plan::Stdio(p) => &p.redactor,
            Plan::Remote(p) => &p.redactor,
        }
    }
}

/// A remote bundle's server with its headers and auth settings resolved.
#[derive(Clone)]
pub struct RemotePlan {
    pub url: String,
    pub headers: Vec<(String, Secret)>,
    pub auth: Option<AuthPlan>,
    pub redactor: Redactor,
}

impl fmt::Debug for RemotePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemotePlan")
            .field("url", &self.url)
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("auth", &self.auth)
            .finish()
    }
}

/// Resolved OAuth settings of a remote bundle.
#[derive(Debug, Clone, Default)]
pub struct AuthPlan {
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    pub scopes: Vec<String>,
    pub authorization_server: Option<String>,
    /// A client ID metadata document (SEP-991): the client's id where the
    /// authorization server supports them.
    pub client_metadata_url: Option<String>,
    /// A PEM private key: the token endpoint is called with
    /// `private_key_jwt` (RFC 7523) instead of a secret, for every grant.
    pub private_key: Option<Secret>,
    pub signing_alg: Option<rmcp::transport::JwtSigningAlgorithm>,
    /// Enterprise-Managed Authorization (an ID-JAG from the operator's
    /// identity provider).
    pub enterprise: Option<EnterprisePlan>,
}

/// Resolved `auth.enterprise` of a remote bundle.
#[derive(Clone)]
pub struct EnterprisePlan {
    pub token_endpoint: String,
    pub client_id: String,
    pub client_secret: Secret,
    pub id_token: IdToken,
}

impl fmt::Debug for EnterprisePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnterprisePlan")
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("id_token", &self.id_token)
            .finish()
    }
}

/// Where the user's ID token comes from.
#[derive(Clone)]
pub enum IdToken {
    /// The token (a sensitive user_config value).
    Value(Secret),
    /// A file holding it, read at each exchange.
    File(std::path::PathBuf),
}

impl fmt::Debug for IdToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdToken::Value(_) => f.write_str("Value([redacted])"),
            IdToken::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// What the daemon runs: the manifest's command with every variable resolved.
#[derive(Clone)]
pub struct LaunchPlan {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    /// The `directory` and `file` values the operator configured: the
    /// sandbox grants them read-write (a default grants nothing).
    pub paths: Vec<PathBuf>,
    /// Masks the bundle's sensitive user_config values in its stderr and
    /// in every error message about it.
    pub redactor: Redactor,
}

impl fmt::Debug for LaunchPlan {
    // The env may carry user_config secrets: show only the variable names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchPlan")
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .finish()
    }
}

/// The manifest file for an install path: the path itself when it is a
/// file, `PATH/manifest.json` when it is a folder. A path that no longer
/// exists is taken as a folder unless it ends in `.json`.
pub fn manifest_file(path: &Path) -> PathBuf {
    let is_json = path.extension().is_some_and(|e| e == "json");
    if path.is_file() || (!path.exists() && is_json) {
        path.to_path_buf()
    } else {
        path.join("manifest.json")
    }
}

/// Reads and validates the manifest at `path` (a bundle folder or a manifest file).
pub fn load(path: &Path) -> Result<LoadedManifest, ManifestError> {
    let file = manifest_file(path);
    let text = std::fs::read_to_string(&file).map_err(|source| ManifestError::Io {
        path: file.clone(),
        source,
    })?;
    from_text(file, &text)
}

/// Validates the already-read `text` of the manifest file `file`.
pub fn from_text(file: PathBuf, text: &str) -> Result<LoadedManifest, ManifestError> {
    let manifest = parse(text).map_err(|e| match e {
        ParseFailure::Json {
            line,
            column,
            message,
        } => ManifestError::Json {
            path: file.clone(),
            line,
            column,
            message,
        },
        ParseFailure::Invalid(problems) => ManifestError::Invalid {
            path: file.clone(),
            problems,
        },
    })?;
    let dir = file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let dir = dir.canonicalize().unwrap_or(dir);
    Ok(LoadedManifest {
        manifest,
        file,
        dir,
        text: text.into(),
    })
}

#[derive(Debug)]
pub enum ParseFailure {
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    Invalid(Vec<Problem>),
}

/// Parses and validates manifest text.
pub fn parse(text: &str) -> Result<Manifest, ParseFailure> {
    let value: Value = serde_json::from_str(text).map_err(|e| ParseFailure::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    validate::validate(&value).map_err(ParseFailure::Invalid)
}

impl Manifest {
    /// A `server.type = "uv"` bundle: the daemon builds its environment.
    pub fn is_uv(&self) -> bool {
        matches!(&self.transport, Transport::Stdio(s) if s.kind == ServerType::Uv)
    }

    /// Resolves how to bring up a bundle living in `dir`, with the stored
    /// `user_values` taking precedence over the manifest's defaults. A
    /// required key with neither is [`PlanError::MissingConfig`]: the bundle
    /// is never started with an empty secret.
    pub fn plan(
        &self,
        dir: &Path,
        user_values: &BTreeMap<String, Secret>,
    ) -> Result<Plan, PlanError> {
        self.plan_with_home(dir, user_values, None)
    }

    /// [`plan`](Self::plan) with `${HOME}` (and `${DESKTOP}`, …) set to the
    /// bundle's own home: its sandbox `data/` folder, which is also its
    /// process's `HOME`, so a default like `${HOME}/memory.jsonl` names a
    /// file it may write. None: the daemon's `HOME` (install-time checks).
    pub fn plan_with_home(
        &self,
        dir: &Path,
        user_values: &BTreeMap<String, Secret>,
        home: Option<&Path>,
    ) -> Result<Plan, PlanError> {
        let mut values = BTreeMap::new();
        let mut sensitive = Vec::new();
        let mut missing = Vec::new();
        let home = match home {
            Some(h) => h.to_string_lossy().into_owned(),
            None => std::env::var("HOME").unwrap_or_default(),
        };
        // A default may use the built-in variables (`${HOME}/memory.jsonl`);
        // an operator's value is taken as given.
        let builtins = SubstitutionVars {
            dirname: dir.to_string_lossy().into_owned(),
            home: home.clone(),
            user_config: BTreeMap::new(),
        };
        // The values of `multiple` keys, one per item.
        let mut lists: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut paths = Vec::new();
        for (key, entry) in &self.user_config {
            let expand = |v: &Value| {
                substitute(&value_to_string(v), &builtins)
                    .map_err(|e| PlanError::Substitution(format!("the default of {key}: {e}")))
            };
            let items: Vec<String> = match (user_values.get(key), &entry.default) {
                (Some(v), _) if entry.multiple => stored_items(v.expose()),
                (Some(v), _) => vec![v.expose().to_string()],
                (None, Some(Value::Array(items))) if entry.multiple => {
                    items.iter().map(expand).collect::<Result<_, _>>()?
                }
                (None, Some(default)) => vec![expand(default)?],
                (None, None) if entry.required => {
                    missing.push(key.clone());
                    continue;
                }
                (None, None) if entry.multiple => Vec::new(),
                (None, None) => vec![String::new()],
            };
            if entry.sensitive {
                sensitive.extend(items.iter().cloned().map(Secret::new));
            }
            let is_path = matches!(entry.kind, UserConfigType::Directory | UserConfigType::File);
            if is_path && user_values.contains_key(key) {
                paths.extend(items.iter().filter(|i| !i.is_empty()).map(PathBuf::from));
            }
            // Inside a longer string, several values are joined by commas.
            values.insert(key.clone(), items.join(","));
            if entry.multiple {
                lists.insert(key.clone(), items);
            }
        }
        if !missing.is_empty() {
            return Err(PlanError::MissingConfig(missing));
        }
        let vars = SubstitutionVars {
            dirname: dir.to_string_lossy().into_owned(),
            home,
            user_config: values,
        };
        let redactor = Redactor::new(sensitive);
        let sub = |s: &str| {
            substitute(s, &vars)
                .map_err(|e| PlanError::Substitution(redactor.redact(&e).into_owned()))
        };
        let server = match &self.transport {
            Transport::Stdio(server) => server,
            Transport::Remote(remote) => {
                let auth = match &remote.auth {
                    None => None,
                    Some(a) => Some(AuthPlan {
                        client_id: a.client_id.clone(),
                        client_secret: match &a.client_secret {
                            Some(s) => {
                                Some(Secret::new(sub(s)?)).filter(|s| !s.expose().is_empty())
                            }
                            None => None,
                        },
                        scopes: a.scopes.clone(),
                        authorization_server: a.authorization_server.clone(),
                        client_metadata_url: a.client_metadata_url.clone(),
                        private_key: match &a.private_key {
                            Some(s) => {
                                Some(Secret::new(sub(s)?)).filter(|s| !s.expose().is_empty())
                            }
                            None => None,
                        },
                        signing_alg: a.signing_alg.as_deref().and_then(remote::signing_alg),
                        enterprise: match &a.enterprise {
                            None => None,
                            Some(e) => Some(EnterprisePlan {
                                token_endpoint: e.token_endpoint.clone(),
                                client_id: e.client_id.clone(),
                                client_secret: Secret::new(sub(&e.client_secret)?),
                                id_token: match (&e.id_token, &e.id_token_file) {
                                    (Some(v), _) => IdToken::Value(Secret::new(sub(v)?)),
                                    (None, Some(p)) => IdToken::File(sub(p)?.into()),
                                    (None, None) => unreachable!("checked when the file was read"),
                                },
                            }),
                        },
                    }),
                };
                let headers = remote
                    .headers
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), Secret::new(sub(v)?))))
                    .collect::<Result<_, PlanError>>()?;
                return Ok(Plan::Remote(RemotePlan {
                    url: remote.url.clone(),
                    headers,
                    auth,
                    redactor,
                }));
            }
        };
        let mut args = Vec::with_capacity(server.args.len());
        for a in &server.args {
            // Exactly `${user_config.KEY}` of a multiple key: one argument per value.
            let whole = a
                .strip_prefix("${user_config.")
                .and_then(|k| k.strip_suffix('}'))
                .and_then(|k| lists.get(k));
            match whole {
                Some(items) => args.extend(items.iter().cloned()),
                None => args.push(sub(a)?),
            }
        }
        Ok(Plan::Stdio(LaunchPlan {
            command: sub(&server.command)?,
            args,
            env: server
                .env
                .iter()
                .map(|(k, v)| Ok((k.clone(), sub(v)?)))
                .collect::<Result<_, PlanError>>()?,
            cwd: dir.to_path_buf(),
            paths,
            redactor,
        }))
    }

    /// Checks a value given to `configure` against the key's declaration
    /// and returns it in its stored form (`true`/`false` for booleans).
    pub fn check_user_value(&self, key: &str, raw: &str) -> Result<String, String> {
        let Some(entry) = self.user_config.get(key) else {
            let known: Vec<&str> = self.user_config.keys().map(String::as_str).collect();
            return Err(if known.is_empty() {
                format!(
                    "bundle {:?} declares no user_config keys, so {key:?} cannot be set",
                    self.name
                )
            } else {
                format!(
                    "{key:?} is not a user_config key of bundle {:?}; its keys are: {}",
                    self.name,
                    known.join(", ")
                )
            });
        };
        let shown = |raw: &str| {
            if entry.sensitive {
                crate::secret::MASK.to_string()
            } else {
                format!("{raw:?}")
            }
        };
        let items = stored_items(raw);
        if entry.multiple {
            let checked = items
                .iter()
                .map(|item| self.check_one(key, entry, item, &shown))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(serde_json::to_string(&checked).unwrap_or_default());
        }
        if items.len() > 1 && raw.trim_start().starts_with('[') {
            return Err(format!(
                "{key} takes one value, got {} (only keys declared \"multiple\": true take several)",
                items.len()
            ));
        }
        self.check_one(key, entry, raw, &shown)
    }

    /// Checks one value of `key` (an item of a multiple key, or its value).
    fn check_one(
        &self,
        key: &str,
        entry: &UserConfigEntry,
        raw: &str,
        shown: &dyn Fn(&str) -> String,
    ) -> Result<String, String> {
        match entry.kind {
            UserConfigType::String => Ok(raw.to_string()),
            UserConfigType::Number => match raw.trim().parse::<f64>() {
                Ok(n) if n.is_finite() => {
                    let low = entry.min.filter(|min| n < *min);
                    let high = entry.max.filter(|max| n > *max);
                    match (low, high) {
                        (Some(min), _) => {
                            Err(format!("{key} must be at least {min}, got {}", shown(raw)))
                        }
                        (_, Some(max)) => {
                            Err(format!("{key} must be at most {max}, got {}", shown(raw)))
                        }
                        _ => Ok(raw.trim().to_string()),
                    }
                }
                _ => Err(format!("{key} must be a number, got {}", shown(raw))),
            },
            UserConfigType::Boolean => match raw.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => Ok("true".into()),
                "false" | "no" | "off" | "0" => Ok("false".into()),
                _ => Err(format!("{key} must be true or false, got {}", shown(raw))),
            },
            UserConfigType::Directory | UserConfigType::File => {
                let path = Path::new(raw);
                let want_dir = entry.kind == UserConfigType::Directory;
                let what = if want_dir { "directory" } else { "file" };
                if !path.is_absolute() {
                    return Err(format!(
                        "{key} must be an absolute path to a {what}, got {}",
                        shown(raw)
                    ));
                }
                let ok = if want_dir {
                    path.is_dir()
                } else {
                    path.is_file()
                };
                if !ok && !want_dir && !path.exists() {
                    // Granting its folder instead would give the bundle
                    // every file beside it.
                    return Err(format!(
                        "{key} must name an existing file; {} does not exist. The bundle is granted that one file, not its folder: create it first (as the bundle's [[sandbox.bundle]] user, or chown it to that user)",
                        shown(raw)
                    ));
                }
                if !ok {
                    return Err(format!(
                        "{key} must name an existing {what}; {} is not one",
                        shown(raw)
                    ));
                }
                Ok(raw.to_string())
            }
        }
    }
}

/// The items of a stored `multiple` value: a JSON array of strings (what
/// `configure` stores), or one value.
pub fn stored_items(stored: &str) -> Vec<String> {
    serde_json::from_str::<Vec<String>>(stored).unwrap_or_else(|_| vec![stored.to_string()])
}

fn value_to_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
