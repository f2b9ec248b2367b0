//! MCPB manifests: read, validate (every problem at once, each with its JSON
//! path), substitute variables into the launch command, and gate on the
//! NimbleBrain host capabilities a bundle requires.
//!
//! The flow is `load` → [`Manifest`] (validated) → [`gate`] → [`Manifest::launch_plan`].

mod host;
mod substitute;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use host::{gate, GateRefusal, HostBlock, HostVersion, Requirement, HOST_META_KEY};
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub kind: ServerType,
    pub entry_point: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
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
    pub server: Server,
    pub user_config: BTreeMap<String, UserConfigEntry>,
    pub host: Option<HostBlock>,
}

/// A manifest together with where it was read from.
#[derive(Debug, Clone)]
pub struct LoadedManifest {
    pub manifest: Manifest,
    /// The manifest file.
    pub file: PathBuf,
    /// The bundle folder (`${__dirname}`, and the bundle's cwd).
    pub dir: PathBuf,
}

/// What the daemon runs: the manifest's command with every variable resolved.
#[derive(Clone, PartialEq)]
pub struct LaunchPlan {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
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
    /// Resolves the launch command for a bundle living in `dir`, with
    /// `user_values` taking precedence over the manifest's defaults.
    pub fn launch_plan(
        &self,
        dir: &Path,
        user_values: &BTreeMap<String, String>,
    ) -> Result<LaunchPlan, PlanError> {
        let mut values = BTreeMap::new();
        let mut missing = Vec::new();
        for (key, entry) in &self.user_config {
            if let Some(v) = user_values.get(key) {
                values.insert(key.clone(), v.clone());
            } else if let Some(default) = &entry.default {
                values.insert(key.clone(), value_to_string(default));
            } else if entry.required {
                missing.push(key.clone());
            } else {
                values.insert(key.clone(), String::new());
            }
        }
        if !missing.is_empty() {
            return Err(PlanError::MissingConfig(missing));
        }
        let vars = SubstitutionVars {
            dirname: dir.to_string_lossy().into_owned(),
            home: std::env::var("HOME").unwrap_or_default(),
            user_config: values,
        };
        let sub = |s: &str| substitute(s, &vars).map_err(PlanError::Substitution);
        let server = &self.server;
        Ok(LaunchPlan {
            command: sub(&server.command)?,
            args: server
                .args
                .iter()
                .map(|a| sub(a))
                .collect::<Result<_, _>>()?,
            env: server
                .env
                .iter()
                .map(|(k, v)| Ok((k.clone(), sub(v)?)))
                .collect::<Result<_, PlanError>>()?,
            cwd: dir.to_path_buf(),
        })
    }
}

fn value_to_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
