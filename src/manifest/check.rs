//! The shared checker of manifest JSON: [`Checker`] collects every problem
//! with its JSON path while typed values are read out, and the readers that
//! the MCPB manifest (`validate.rs`), the NimbleBrain host block (`host.rs`)
//! and remote bundle files (`remote.rs`) share. It imports none of them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::substitute::{unknown_variable, variables};
use super::{Problem, UserConfigEntry, UserConfigType};

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
                let known = super::substitute::BUILTIN.contains(&name)
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
        // Required, as `mcpb validate` (the official schema) requires it.
        let description = c.string(entry, "description", &path, true);
        let required = c.boolean(entry, "required", &path).unwrap_or(false);
        let sensitive = c.boolean(entry, "sensitive", &path).unwrap_or(false);
        let multiple = c.boolean(entry, "multiple", &path).unwrap_or(false);
        let bound = |c: &mut Checker, name: &str| match entry.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                c.problem(
                    format!("{path}.{name}"),
                    format!("must be a number, found {}", type_name(other)),
                );
                None
            }
        };
        let (min, max) = (bound(c, "min"), bound(c, "max"));
        let default = entry.get("default").filter(|v| !v.is_null()).cloned();
        if let (Some(kind), Some(default)) = (kind, &default) {
            let one = |v: &Value| match kind {
                UserConfigType::Number => v.is_number(),
                UserConfigType::Boolean => v.is_boolean(),
                _ => v.is_string(),
            };
            let fits = match default {
                Value::Array(items) if multiple => items.iter().all(one),
                Value::Array(items) => kind == UserConfigType::String && items.iter().all(one),
                other => one(other),
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
                    multiple,
                    min,
                    max,
                },
            );
        }
    }
    out
}
