//! Validation of a manifest's JSON into a [`Manifest`], collecting every
//! problem (with its JSON path) instead of stopping at the first.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::check::{check_variables, string_list, string_map, type_name, user_config, Checker};
use super::host::{self, HOST_META_KEY};
use super::{Manifest, Problem, Server, ServerType, Transport, UserConfigEntry};

const MANIFEST_VERSIONS: &[&str] = &["0.2", "0.3", "0.4"];
const DXT_VERSIONS: &[&str] = &["0.1", "0.2"];

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
