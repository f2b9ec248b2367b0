//! Validation of a manifest's JSON into a [`Manifest`], collecting every
//! problem (with its JSON path) instead of stopping at the first.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::host::{self, HOST_META_KEY};
use super::substitute::{unknown_variable, variables};
use super::{Manifest, Problem, Server, ServerType, Transport, UserConfigEntry, UserConfigType};

const MANIFEST_VERSIONS: &[&str] = &["0.2", "0.3", "0.4"];
const DXT_VERSIONS: &[&str] = &["0.1", "0.2"];

/// Collects problems while reading typed values out of JSON.
pub(super) struct Checker {
    pub(super) problems: Vec<Problem>,
}

impl Checker {
    pub(super) fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn string(
        &mut self,
        obj: &Map<String, Value>,
        key: &str,
        path: &str,
        required: bool,
    ) -> Option<String> {
        let here = format!("{path}.{key}");
        match obj.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            Some(Value::String(_)) => {
                self.problem(here, "must not be empty");
                None
            }
            None | Some(Value::Null) if !required => None,
            None | Some(Value::Null) => {
                self.problem(here, "is required");
                None
            }
            Some(other) => {
                self.problem(
                    here,
                    format!("must be a string, found {}", type_name(other)),
                );
                None
            }
        }
    }

    pub(super) fn object<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        key: &str,
        path: &str,
        required: bool,
    ) -> Option<&'v Map<String, Value>> {
        let here = format!("{path}.{key}");
        match obj.get(key) {
            Some(Value::Object(o)) => Some(o),
            None | Some(Value::Null) if !required => None,
            None | Some(Value::Null) => {
                self.problem(here, "is required");
                None
            }
            Some(other) => {
                self.problem(
                    here,
                    format!("must be an object, found {}", type_name(other)),
                );
                None
            }
        }
    }

    pub(super) fn boolean(
        &mut self,
        obj: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Option<bool> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.problem(
                    format!("{path}.{key}"),
                    format!("must be true or false, found {}", type_name(other)),
                );
                None
            }
        }
    }
}

pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn validate(value: &Value) -> Result<Manifest, Vec<Problem>> {
    let mut c = Checker {
        problems: Vec::new(),
    };
    let Value::Object(root) = value else {
        c.problem(
            "$",
            format!(
                "a manifest must be a JSON object, found {}",
                type_name(value)
            ),
        );
        return Err(c.problems);
    };
    if super::remote::is_remote(root) {
        return super::remote::validate(&mut c, root).ok_or(c.problems);
    }

    let manifest_version = manifest_version(&mut c, root);
    let name = c.string(root, "name", "$", true);
    if let Some(n) = &name {
        if let Err(e) = crate::names::check_name("bundle", n) {
            c.problem("$.name", e);
        }
    }
    let display_name = c.string(root, "display_name", "$", false);
    let version = c.string(root, "version", "$", true);
    let description = c.string(root, "description", "$", true);
    let author_name = c
        .object(root, "author", "$", true)
        .and_then(|author| c.string(author, "name", "$.author", true));
    let user_config = user_config(&mut c, root);
    let server = c
        .object(root, "server", "$", true)
        .and_then(|s| server(&mut c, s, &user_config));
    let host = root
        .get("_meta")
        .and_then(|meta| meta.get(HOST_META_KEY))
        .and_then(|block| host::parse_block(&mut c, block));

    match (
        manifest_version,
        name,
        version,
        description,
        author_name,
        server,
    ) {
        (
            Some(manifest_version),
            Some(name),
            Some(version),
            Some(description),
            Some(author_name),
            Some(server),
        ) if c.problems.is_empty() => Ok(Manifest {
            manifest_version,
            name,
            display_name,
            version,
            description,
            author_name,
            transport: Transport::Stdio(server),
            user_config,
            host,
        }),
        _ => Err(c.problems),
    }
}

fn manifest_version(c: &mut Checker, root: &Map<String, Value>) -> Option<String> {
    if root.contains_key("manifest_version") {
        let v = c.string(root, "manifest_version", "$", true)?;
        if MANIFEST_VERSIONS.contains(&v.as_str()) {
            return Some(v);
        }
        c.problem(
            "$.manifest_version",
            format!(
                "unsupported version {v:?}; supported: {}",
                MANIFEST_VERSIONS.join(", ")
            ),
        );
        None
    } else if root.contains_key("dxt_version") {
        let v = c.string(root, "dxt_version", "$", true)?;
        if DXT_VERSIONS.contains(&v.as_str()) {
            return Some(v);
        }
        c.problem(
            "$.dxt_version",
            format!(
                "unsupported version {v:?}; supported: {}",
                DXT_VERSIONS.join(", ")
            ),
        );
        None
    } else {
        c.problem(
            "$.manifest_version",
            "is required (or the older dxt_version)",
        );
        None
    }
}

fn server(
    c: &mut Checker,
    obj: &Map<String, Value>,
    user_config: &BTreeMap<String, UserConfigEntry>,
) -> Option<Server> {
    let kind = match c.string(obj, "type", "$.server", true).as_deref() {
        Some("node") => Some(ServerType::Node),
        Some("python") => Some(ServerType::Python),
        Some("binary") => Some(ServerType::Binary),
        Some("uv") => Some(ServerType::Uv),
        Some(other) => {
            c.problem(
                "$.server.type",
                format!("unknown server type {other:?}; expected node, python, binary or uv"),
            );
            None
        }
        None => None,
    };
    let entry_point = c.string(obj, "entry_point", "$.server", true);
    let mcp = c.object(obj, "mcp_config", "$.server", true);
    let (command, args, env) = match mcp {
        Some(mcp) => {
            let command = c.string(mcp, "command", "$.server.mcp_config", true);
            let args = string_list(c, mcp, "args", "$.server.mcp_config");
            let env = string_map(c, mcp, "env", "$.server.mcp_config");
            (command, args, env)
        }
        None => (None, Vec::new(), BTreeMap::new()),
    };
    if let Some(cmd) = &command {
        check_variables(c, "$.server.mcp_config.command".into(), cmd, user_config);
    }
    for (i, a) in args.iter().enumerate() {
        check_variables(c, format!("$.server.mcp_config.args[{i}]"), a, user_config);
    }
    for (k, v) in &env {
        check_variables(c, format!("$.server.mcp_config.env.{k}"), v, user_config);
    }
    Some(Server {
        kind: kind?,
        entry_point: entry_point?,
        command: command?,
        args,
        env,
    })
}

/// Reports unknown `${...}` variables (and undeclared user_config keys) in `s`.
pub(super) fn check_variables(
    c: &mut Checker,
    path: String,
    s: &str,
    user_config: &BTreeMap<String, UserConfigEntry>,
) {
    match variables(s) {
        Ok(names) => {
            for name in names {
                let known = matches!(name, "__dirname" | "HOME" | "/")
                    || name
                        .strip_prefix("user_config.")
                        .is_some_and(|k| user_config.contains_key(k));
                if !known {
                    let msg = match name.strip_prefix("user_config.") {
                        Some(k) => format!(
                            "${{user_config.{k}}} refers to a key not declared in user_config"
                        ),
                        None => unknown_variable(name),
                    };
                    c.problem(path.clone(), msg);
                }
            }
        }
        Err(e) => c.problem(path, e),
    }
}

pub(super) fn string_list(
    c: &mut Checker,
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Vec<String> {
    match obj.get(key) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Value::String(s) => Some(s.clone()),
                other => {
                    c.problem(
                        format!("{path}.{key}[{i}]"),
                        format!("must be a string, found {}", type_name(other)),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            c.problem(
                format!("{path}.{key}"),
                format!("must be an array of strings, found {}", type_name(other)),
            );
            Vec::new()
        }
    }
}

pub(super) fn string_map(
    c: &mut Checker,
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> BTreeMap<String, String> {
    match obj.get(key) {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k.clone(), s.clone())),
                other => {
                    c.problem(
                        format!("{path}.{key}.{k}"),
                        format!("must be a string, found {}", type_name(other)),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            c.problem(
                format!("{path}.{key}"),
                format!("must be an object of strings, found {}", type_name(other)),
            );
            BTreeMap::new()
        }
    }
}

pub(super) fn user_config(
    c: &mut Checker,
    root: &Map<String, Value>,
) -> BTreeMap<String, UserConfigEntry> {
    let mut out = BTreeMap::new();
    let Some(entries) = c.object(root, "user_config", "$", false) else {
        return out;
    };
    let mut seen = BTreeSet::new();
    for (key, entry) in entries {
        let path = format!("$.user_config.{key}");
        seen.insert(key.clone());
        let Value::Object(entry) = entry else {
            c.problem(
                path,
                format!("must be an object, found {}", type_name(entry)),
            );
            continue;
        };
        let kind = match c.string(entry, "type", &path, true).as_deref() {
            Some("string") => Some(UserConfigType::String),
            Some("number") => Some(UserConfigType::Number),
            Some("boolean") => Some(UserConfigType::Boolean),
            Some("directory") => Some(UserConfigType::Directory),
            Some("file") => Some(UserConfigType::File),
            Some(other) => {
                c.problem(format!("{path}.type"), format!("unknown type {other:?}; expected string, number, boolean, directory or file"));
                None
            }
            None => None,
        };
        let title = c.string(entry, "title", &path, true);
        let description = c.string(entry, "description", &path, false);
        let required = c.boolean(entry, "required", &path).unwrap_or(false);
        let sensitive = c.boolean(entry, "sensitive", &path).unwrap_or(false);
        let default = entry.get("default").filter(|v| !v.is_null()).cloned();
        if let (Some(kind), Some(default)) = (kind, &default) {
            let fits = match kind {
                UserConfigType::Number => default.is_number(),
                UserConfigType::Boolean => default.is_boolean(),
                _ => default.is_string() || default.is_array(),
            };
            if !fits {
                c.problem(
                    format!("{path}.default"),
                    format!("does not match type {:?}", kind).to_lowercase(),
                );
            }
        }
        if let (Some(kind), Some(title)) = (kind, title) {
            out.insert(
                key.clone(),
                UserConfigEntry {
                    kind,
                    title,
                    description,
                    required,
                    default,
                    sensitive,
                },
            );
        }
    }
    out
}
