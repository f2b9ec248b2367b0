//! Validation of a manifest's JSON into a [`Manifest`], collecting every
//! problem (with its JSON path) instead of stopping at the first.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::check::{check_variables, string_list, string_map, type_name, user_config, Checker};
use super::host::{self, HOST_META_KEY};
use super::{Manifest, Problem, Server, ServerType, Transport, UserConfigEntry, UV_PYTHON};

/// Every version the official `mcpb` CLI validates (its schemas v0.1–v0.4
/// take either field, with the same value).
const MANIFEST_VERSIONS: &[&str] = &["0.1", "0.2", "0.3", "0.4"];
const DXT_VERSIONS: &[&str] = MANIFEST_VERSIONS;

/// This host's name in `compatibility.platforms` and `platform_overrides`
/// (Node's `process.platform`, which the MCPB spec uses).
pub(super) fn this_platform() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        "windows" => "win32",
        other => other,
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
    let runtimes = compatibility(&mut c, root);
    let user_config = user_config(&mut c, root);
    let server = c
        .object(root, "server", "$", true)
        .and_then(|s| server(&mut c, s, &user_config));
    if let (Some(version), Some(s)) = (&manifest_version, &server) {
        // uv arrived in 0.4; the official CLI refuses it in older manifests.
        if s.kind == ServerType::Uv && matches!(version.as_str(), "0.1" | "0.2" | "0.3") {
            c.problem(
                "$.server.type",
                format!("\"uv\" needs manifest_version \"0.4\" or later, and this manifest is {version:?}; set \"manifest_version\": \"0.4\""),
            );
        }
    }
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
            runtimes,
        }),
        _ => Err(c.problems),
    }
}

fn manifest_version(c: &mut Checker, root: &Map<String, Value>) -> Option<String> {
    if let (Some(Value::String(m)), Some(Value::String(d))) =
        (root.get("manifest_version"), root.get("dxt_version"))
    {
        if m != d {
            c.problem(
                "$.dxt_version",
                format!("is {d:?} but manifest_version is {m:?}; give one of them (dxt_version is the older name)"),
            );
        }
    }
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

/// `compatibility.platforms`: a bundle made for other platforms is refused
/// here, with what it needs and what this host is. (`runtimes` is read
/// but not checked yet; `claude_desktop` does not apply to this host.)
fn compatibility(
    c: &mut Checker,
    root: &Map<String, Value>,
) -> BTreeMap<String, semver::VersionReq> {
    let mut ranges = BTreeMap::new();
    let Some(compat) = c.object(root, "compatibility", "$", false) else {
        return ranges;
    };
    if compat.contains_key("platforms") {
        let platforms = string_list(c, compat, "platforms", "$.compatibility");
        if !platforms.is_empty() && !platforms.iter().any(|p| p == this_platform()) {
            c.problem(
                "$.compatibility.platforms",
                format!(
                    "the bundle runs on {}; this host is {}",
                    platforms.join(", "),
                    this_platform()
                ),
            );
        }
    }
    if let Some(runtimes) = c.object(compat, "runtimes", "$.compatibility", false) {
        for (key, range) in runtimes {
            let path = format!("$.compatibility.runtimes.{key}");
            if !matches!(key.as_str(), "node" | "python") {
                c.problem(path, "is not a runtime the MCPB spec names (node, python)");
                continue;
            }
            let Value::String(text) = range else {
                c.problem(
                    path,
                    format!("must be a string, found {}", type_name(range)),
                );
                continue;
            };
            match semver::VersionReq::parse(&text.replace(' ', ",").replace(",,", ",")) {
                Ok(req) => {
                    ranges.insert(key.clone(), req);
                }
                Err(e) => c.problem(
                    path,
                    format!(
                        "{text:?} is not a version range ({e}), e.g. \">=18\" or \">=3.10,<4\""
                    ),
                ),
            }
        }
    }
    ranges
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
    // A uv bundle may leave its launch to the host (MCPB 0.4): it then runs
    // `python ENTRY_POINT` in the environment the daemon built for it.
    let host_managed = kind == Some(ServerType::Uv) && !obj.contains_key("mcp_config");
    let mcp = c.object(obj, "mcp_config", "$.server", !host_managed);
    let (command, args, env) = match mcp {
        Some(mcp) => {
            let mut command = c.string(mcp, "command", "$.server.mcp_config", true);
            let mut args = string_list(c, mcp, "args", "$.server.mcp_config");
            let mut env = string_map(c, mcp, "env", "$.server.mcp_config");
            // `platform_overrides.PLATFORM` replaces command, args and env
            // field by field on that platform; every entry is checked.
            if let Some(overrides) =
                c.object(mcp, "platform_overrides", "$.server.mcp_config", false)
            {
                for (platform, entry) in overrides {
                    let path = format!("$.server.mcp_config.platform_overrides.{platform}");
                    let Value::Object(entry) = entry else {
                        c.problem(
                            &path,
                            format!("must be an object, found {}", type_name(entry)),
                        );
                        continue;
                    };
                    for key in entry.keys() {
                        if !matches!(key.as_str(), "command" | "args" | "env") {
                            c.problem(
                                format!("{path}.{key}"),
                                "is not a field of an override (command, args, env)",
                            );
                        }
                    }
                    let o_command = c.string(entry, "command", &path, false);
                    let o_args = entry
                        .contains_key("args")
                        .then(|| string_list(c, entry, "args", &path));
                    let o_env = entry
                        .contains_key("env")
                        .then(|| string_map(c, entry, "env", &path));
                    if platform == this_platform() {
                        command = o_command.or(command);
                        args = o_args.unwrap_or(args);
                        env = o_env.unwrap_or(env);
                    }
                }
            }
            (command, args, env)
        }
        None if host_managed => (
            Some(UV_PYTHON.to_string()),
            entry_point
                .iter()
                .map(|e| format!("${{__dirname}}/{e}"))
                .collect(),
            BTreeMap::new(),
        ),
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
