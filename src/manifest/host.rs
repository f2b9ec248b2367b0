//! The NimbleBrain host block `_meta["ai.nimblebrain/host"]` and the install
//! gate: a bundle that requires a host capability the daemon does not
//! provide is refused before any process is spawned.

use std::collections::BTreeMap;

use serde_json::Value;

use super::check::{type_name, Checker};
use super::Manifest;

pub const HOST_META_KEY: &str = "ai.nimblebrain/host";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostVersion {
    V1_0,
    V1_1,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostBlock {
    pub host_version: HostVersion,
    pub name: Option<String>,
    pub icon: Option<String>,
    pub capabilities: BTreeMap<String, Requirement>,
}

/// The install gate refused a bundle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bundle {bundle:?} requires host capabilit{} {} that this daemon does not provide (provided: {})",
    if missing.len() == 1 { "y" } else { "ies" },
    missing.join(", "),
    provided.join(", "))]
pub struct GateRefusal {
    pub bundle: String,
    pub missing: Vec<String>,
    pub provided: Vec<String>,
}

/// Checks the bundle's required host capabilities against `provided`.
pub fn gate(manifest: &Manifest, provided: &[&str]) -> Result<(), GateRefusal> {
    let Some(host) = &manifest.host else {
        return Ok(());
    };
    let missing: Vec<String> = host
        .capabilities
        .iter()
        .filter(|(key, req)| req.required && !provided.contains(&key.as_str()))
        .map(|(key, _)| key.clone())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(GateRefusal {
            bundle: manifest.name.clone(),
            missing,
            provided: provided.iter().map(|s| s.to_string()).collect(),
        })
    }
}

pub(super) fn parse_block(c: &mut Checker, block: &Value) -> Option<HostBlock> {
    let path = format!("$._meta[\"{HOST_META_KEY}\"]");
    let Value::Object(obj) = block else {
        c.problem(
            path,
            format!("must be an object, found {}", type_name(block)),
        );
        return None;
    };
    for key in obj.keys() {
        if !matches!(
            key.as_str(),
            "host_version" | "name" | "icon" | "host_capabilities"
        ) {
            c.problem(
                format!("{path}.{key}"),
                "unknown field; expected host_version, name, icon, host_capabilities",
            );
        }
    }
    let version = match c.string(obj, "host_version", &path, true).as_deref() {
        Some("1.0") => Some(HostVersion::V1_0),
        Some("1.1") => Some(HostVersion::V1_1),
        Some(other) => {
            c.problem(
                format!("{path}.host_version"),
                format!("unsupported host_version {other:?}; supported: 1.0, 1.1"),
            );
            None
        }
        None => None,
    };
    let name = c.string(obj, "name", &path, false);
    let icon = c.string(obj, "icon", &path, false);
    let mut capabilities = BTreeMap::new();
    if let Some(caps) = c.object(obj, "host_capabilities", &path, false) {
        if version == Some(HostVersion::V1_0) {
            c.problem(
                format!("{path}.host_capabilities"),
                "needs host_version \"1.1\"",
            );
        }
        for (key, req) in caps {
            let here = format!("{path}.host_capabilities[\"{key}\"]");
            let Value::Object(req) = req else {
                c.problem(
                    here,
                    format!(
                        "must be an object like {{\"required\": true}}, found {}",
                        type_name(req)
                    ),
                );
                continue;
            };
            for field in req.keys().filter(|k| k.as_str() != "required") {
                c.problem(
                    format!("{here}.{field}"),
                    "unknown field in a capability requirement; the only field is \"required\"",
                );
            }
            match req.get("required") {
                Some(Value::Bool(required)) => {
                    capabilities.insert(
                        key.clone(),
                        Requirement {
                            required: *required,
                        },
                    );
                }
                None => c.problem(format!("{here}.required"), "is required (true or false)"),
                Some(other) => c.problem(
                    format!("{here}.required"),
                    format!("must be true or false, found {}", type_name(other)),
                ),
            }
        }
    }
    Some(HostBlock {
        host_version: version?,
        name,
        icon,
        capabilities,
    })
}
