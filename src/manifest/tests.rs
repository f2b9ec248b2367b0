use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use super::*;
use crate::secret::Secret;

fn stdio(plan: Plan) -> LaunchPlan {
    match plan {
        Plan::Stdio(p) => p,
        Plan::Remote(p) => panic!("expected a stdio plan, got {p:?}"),
    }
}

fn minimal() -> serde_json::Value {
    json!({
        "manifest_version": "0.3",
        "name": "m",
        "version": "1.0.0",
        "description": "d",
        "author": {"name": "a"},
        "server": {
            "type": "binary",
            "entry_point": "bin/m",
            "mcp_config": {"command": "${__dirname}/bin/m", "args": ["--x"], "env": {}}
        }
    })
}

fn problems(value: serde_json::Value) -> Vec<Problem> {
    match parse(&value.to_string()) {
        Err(ParseFailure::Invalid(p)) => p,
        other => panic!("expected validation problems, got {other:?}"),
    }
}

#[test]
fn shipped_demo_manifest_is_valid_and_passes_the_gate() {
    let m = parse(include_str!("../../bundles/demo/manifest.json")).unwrap();
    assert_eq!(m.name, "demo");
    assert!(matches!(&m.transport, Transport::Stdio(s) if s.kind == ServerType::Binary));
    let host = m.host.as_ref().unwrap();
    assert_eq!(host.host_version, HostVersion::V1_1);
    gate(&m, &[crate::host_resources::EXTENSION]).unwrap();
    let plan = stdio(m.plan(Path::new("/b/demo"), &BTreeMap::new()).unwrap());
    assert_eq!(plan.command, "/b/demo/server/bundlevisor-demo");
    assert_eq!(plan.env["DEMO_GREETING"], "");
}

#[test]
fn legacy_dxt_version_is_accepted() {
    let mut v = minimal();
    let obj = v.as_object_mut().unwrap();
    obj.remove("manifest_version");
    obj.insert("dxt_version".into(), json!("0.1"));
    assert_eq!(parse(&v.to_string()).unwrap().manifest_version, "0.1");
}

#[test]
fn reports_every_problem_at_once_with_json_paths() {
    let v = json!({
        "manifest_version": "9.9",
        "version": 3,
        "author": {},
        "server": {"type": "rocket", "mcp_config": {"args": [1], "env": {"K": "${nope}"}}},
        "user_config": {"k": {"type": "colour", "title": "T", "description": "T"}, "d": {"type": "string", "title": "D"}}
    });
    let found: Vec<String> = problems(v).iter().map(|p| p.path.clone()).collect();
    for expected in [
        "$.manifest_version",
        "$.name",
        "$.version",
        "$.description",
        "$.author.name",
        "$.server.type",
        "$.server.entry_point",
        "$.server.mcp_config.command",
        "$.server.mcp_config.args[0]",
        "$.server.mcp_config.env.K",
        "$.user_config.k.type",
        // Issue 34, point 11: required by the official schema (`mcpb
        // validate` refuses an entry without one).
        "$.user_config.d.description",
    ] {
        assert!(
            found.iter().any(|p| p == expected),
            "missing {expected} in {found:?}"
        );
    }
}

#[test]
fn invalid_json_reports_line_and_column() {
    match parse("{\n  \"name\": }") {
        Err(ParseFailure::Json { line, .. }) => assert_eq!(line, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn undeclared_user_config_reference_is_a_problem() {
    let mut v = minimal();
    v["server"]["mcp_config"]["args"] = json!(["${user_config.token}"]);
    let p = problems(v);
    assert_eq!(p.len(), 1);
    assert!(p[0].message.contains("not declared"), "{}", p[0]);
}

#[test]
fn host_block_misspelled_requirement_field_is_rejected() {
    let mut v = minimal();
    v["_meta"] = json!({"ai.nimblebrain/host": {
        "host_version": "1.1",
        "host_capabilities": {"ai.nimblebrain/host-resources": {"requierd": true}}
    }});
    let paths: Vec<String> = problems(v).iter().map(|p| p.to_string()).collect();
    assert!(
        paths
            .iter()
            .any(|p| p.contains(".requierd") && p.contains("unknown field")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p.contains(".required") && p.contains("is required")),
        "{paths:?}"
    );
}

#[test]
fn host_capabilities_need_version_1_1() {
    let mut v = minimal();
    v["_meta"] = json!({"ai.nimblebrain/host": {
        "host_version": "1.0",
        "host_capabilities": {"x": {"required": false}}
    }});
    assert!(problems(v)[0].message.contains("1.1"));
}

#[test]
fn gate_names_the_bundle_and_the_missing_capability() {
    let mut v = minimal();
    v["_meta"] = json!({"ai.nimblebrain/host": {
        "host_version": "1.1",
        "host_capabilities": {
            "ai.nimblebrain/host-resources": {"required": true},
            "ai.nimblebrain/teleport": {"required": true},
            "ai.nimblebrain/optional": {"required": false}
        }
    }});
    let m = parse(&v.to_string()).unwrap();
    let refusal = gate(&m, &[crate::host_resources::EXTENSION]).unwrap_err();
    assert_eq!(refusal.missing, vec!["ai.nimblebrain/teleport".to_string()]);
    let text = refusal.to_string();
    assert!(
        text.contains("\"m\"") && text.contains("ai.nimblebrain/teleport"),
        "{text}"
    );
}

#[test]
fn launch_plan_prefers_set_values_then_defaults_and_requires_required() {
    let mut v = minimal();
    v["user_config"] = json!({
        "token": {"type": "string", "title": "Token", "description": "Token", "required": true, "sensitive": true},
        "depth": {"type": "number", "title": "Depth", "description": "Depth", "default": 3}
    });
    v["server"]["mcp_config"]["args"] = json!(["--depth=${user_config.depth}"]);
    v["server"]["mcp_config"]["env"] = json!({"TOKEN": "${user_config.token}"});
    let m = parse(&v.to_string()).unwrap();
    let err = m.plan(Path::new("/b"), &BTreeMap::new()).unwrap_err();
    assert_eq!(err, PlanError::MissingConfig(vec!["token".into()]));
    let values = BTreeMap::from([("token".to_string(), Secret::new("s3cret-canary"))]);
    let plan = stdio(m.plan(Path::new("/b"), &values).unwrap());
    assert_eq!(plan.args, vec!["--depth=3"]);
    assert_eq!(plan.env["TOKEN"], "s3cret-canary");
    assert!(
        !format!("{plan:?}").contains("s3cret-canary"),
        "Debug must not show env values"
    );
    // The sensitive value (not the plain one) is what the plan redacts.
    assert_eq!(
        plan.redactor.redact("token=s3cret-canary depth=3"),
        format!("token={} depth=3", crate::secret::MASK)
    );
}

#[test]
fn configure_values_are_checked_against_their_declaration() {
    let mut v = minimal();
    v["user_config"] = json!({
        "token": {"type": "string", "title": "Token", "description": "Token", "sensitive": true},
        "depth": {"type": "number", "title": "Depth", "description": "Depth"},
        "verbose": {"type": "boolean", "title": "Verbose", "description": "Verbose"},
        "root": {"type": "directory", "title": "Root", "description": "Root"},
        "pin": {"type": "number", "title": "PIN", "description": "PIN", "sensitive": true}
    });
    let m = parse(&v.to_string()).unwrap();
    assert_eq!(m.check_user_value("depth", " 2.5 ").unwrap(), "2.5");
    assert!(m
        .check_user_value("depth", "deep")
        .unwrap_err()
        .contains("must be a number"));
    assert_eq!(m.check_user_value("verbose", "Yes").unwrap(), "true");
    assert!(m.check_user_value("verbose", "maybe").is_err());
    let tmp = std::env::temp_dir();
    assert!(m.check_user_value("root", tmp.to_str().unwrap()).is_ok());
    assert!(m
        .check_user_value("root", "relative/dir")
        .unwrap_err()
        .contains("absolute"));
    let err = m.check_user_value("tokn", "x").unwrap_err();
    assert!(err.contains("depth, pin, root, token, verbose"), "{err}");
    // A bad sensitive value is not echoed back.
    let err = m.check_user_value("pin", "hunter2-canary").unwrap_err();
    assert!(!err.contains("hunter2-canary"), "{err}");
}

#[test]
fn remote_bundle_files_are_validated_and_resolved() {
    let text = json!({
        "name": "notes",
        "url": "https://mcp.example.com/mcp",
        "headers": {"X-Tenant": "${user_config.tenant}"},
        "user_config": {
            "tenant": {"type": "string", "title": "Tenant", "description": "Tenant", "required": true},
            "client_secret": {"type": "string", "title": "Secret", "description": "Secret", "sensitive": true, "required": true}
        },
        "auth": {"client_id": "bv", "client_secret": "${user_config.client_secret}", "scopes": ["files:read"]}
    })
    .to_string();
    let m = parse(&text).unwrap();
    assert_eq!(m.version, DEFAULT_REMOTE_VERSION);
    let values = BTreeMap::from([
        ("tenant".to_string(), Secret::new("acme")),
        ("client_secret".to_string(), Secret::new("cs-canary-123")),
    ]);
    let Plan::Remote(plan) = m.plan(Path::new("/b"), &values).unwrap() else {
        panic!("a remote file makes a remote plan");
    };
    assert_eq!(plan.url, "https://mcp.example.com/mcp");
    assert_eq!(plan.headers[0].1.expose(), "acme");
    let auth = plan.auth.as_ref().unwrap();
    assert_eq!(
        auth.client_secret.as_ref().unwrap().expose(),
        "cs-canary-123"
    );
    assert_eq!(auth.scopes, ["files:read"]);
    assert!(!format!("{plan:?}").contains("canary"));
    assert!(!format!("{plan:?}").contains("acme"));
    assert_eq!(
        m.plan(Path::new("/b"), &BTreeMap::new()).unwrap_err(),
        PlanError::MissingConfig(vec!["client_secret".into(), "tenant".into()])
    );
}

#[test]
fn remote_bundle_problems_are_all_reported() {
    let text = json!({
        "name": "Bad Name",
        "url": "http://mcp.example.com/mcp",
        "heders": {},
        "headers": {"Authorization": "x", "X-Ok": "${user_config.nope}"},
        "auth": {"client_secret": "s", "scope": ["a"]}
    })
    .to_string();
    let Err(ParseFailure::Invalid(problems)) = parse(&text) else {
        panic!("expected problems");
    };
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    for expected in [
        "$.heders",
        "$.name",
        "$.url",
        "$.headers.Authorization",
        "$.headers.X-Ok",
        "$.auth.client_secret",
        "$.auth.scope",
    ] {
        assert!(
            paths.contains(&expected),
            "{expected} missing from {problems:#?}"
        );
    }
    let url = problems.iter().find(|p| p.path == "$.url").unwrap();
    assert!(url.message.contains("https"), "{url}");
    // Plain http is fine on loopback.
    let ok = json!({"name": "local", "url": "http://127.0.0.1:9/mcp"}).to_string();
    assert!(parse(&ok).is_ok());
}

#[test]
fn enterprise_auth_needs_its_idp_client_and_one_sealed_or_configured_id_token() {
    let file = |enterprise: Value| {
        json!({
            "name": "notes",
            "url": "https://mcp.example.com/mcp",
            "user_config": {
                "idp_secret": {"type": "string", "title": "IdP secret", "description": "IdP secret", "sensitive": true, "required": true},
                "plain": {"type": "string", "title": "Not sensitive", "description": "Not sensitive"},
                "token": {"type": "string", "title": "ID token", "description": "ID token", "sensitive": true},
                "token_file": {"type": "file", "title": "ID token file", "description": "ID token file"}
            },
            "auth": {"client_id": "bv", "enterprise": enterprise}
        })
        .to_string()
    };
    let good = json!({
        "token_endpoint": "https://idp.example.com/token",
        "client_id": "bv-idp",
        "client_secret": "${user_config.idp_secret}",
        "id_token": "${user_config.token}"
    });
    let m = parse(&file(good.clone())).unwrap();
    let values = BTreeMap::from([
        ("idp_secret".to_string(), Secret::new("idp-canary-1")),
        ("token".to_string(), Secret::new("idt-canary-1")),
    ]);
    let Plan::Remote(plan) = m.plan(Path::new("/b"), &values).unwrap() else {
        panic!("a remote file makes a remote plan");
    };
    let e = plan.auth.as_ref().unwrap().enterprise.as_ref().unwrap();
    assert_eq!(e.client_secret.expose(), "idp-canary-1");
    assert!(!format!("{plan:?}").contains("canary"), "{plan:?}");

    for (enterprise, path, says) in [
        (
            json!({"token_endpoint": "http://idp.example.com/token", "client_id": "x", "client_secret": "s", "id_token": "${user_config.token}"}),
            "$.auth.enterprise.token_endpoint",
            "https",
        ),
        (
            json!({"token_endpoint": "https://idp.example.com/token", "client_secret": "s", "id_token": "${user_config.token}"}),
            "$.auth.enterprise.client_id",
            "",
        ),
        (
            json!({"token_endpoint": "https://idp.example.com/token", "client_id": "x", "client_secret": "s", "id_token": "${user_config.plain}"}),
            "$.auth.enterprise.id_token",
            "sensitive",
        ),
        (
            json!({"token_endpoint": "https://idp.example.com/token", "client_id": "x", "client_secret": "s", "id_token_file": "/tmp/t"}),
            "$.auth.enterprise.id_token_file",
            "type \"file\"",
        ),
        (
            json!({"token_endpoint": "https://idp.example.com/token", "client_id": "x", "client_secret": "s"}),
            "$.auth.enterprise",
            "exactly one of id_token",
        ),
        (
            json!({"token_endpoint": "https://idp.example.com/token", "client_id": "x", "client_secret": "s",
                   "id_token": "${user_config.token}", "id_token_file": "${user_config.token_file}"}),
            "$.auth.enterprise",
            "exactly one of id_token",
        ),
    ] {
        let Err(ParseFailure::Invalid(problems)) = parse(&file(enterprise)) else {
            panic!("{path}: expected problems");
        };
        assert!(
            problems
                .iter()
                .any(|p| p.path == path && p.message.contains(says)),
            "{path}: {problems:#?}"
        );
    }
    // The ID-JAG names the authorization server's client: auth.client_id.
    let mut no_client: Value = serde_json::from_str(&file(good)).unwrap();
    no_client["auth"]
        .as_object_mut()
        .unwrap()
        .remove("client_id");
    let Err(ParseFailure::Invalid(problems)) = parse(&no_client.to_string()) else {
        panic!("expected problems");
    };
    assert!(
        problems.iter().any(|p| p.path == "$.auth.enterprise"),
        "{problems:#?}"
    );
}

/// Issue 18, point 1: every version the official CLI validates.
#[test]
fn every_version_the_mcpb_cli_validates_is_accepted() {
    for field in ["manifest_version", "dxt_version"] {
        for version in ["0.1", "0.2", "0.3", "0.4"] {
            let mut v = minimal();
            let obj = v.as_object_mut().unwrap();
            obj.remove("manifest_version");
            obj.insert(field.into(), json!(version));
            assert_eq!(
                parse(&v.to_string()).unwrap().manifest_version,
                version,
                "{field} {version}"
            );
        }
    }
    let mut v = minimal();
    v["dxt_version"] = json!("0.2");
    let p = problems(v);
    assert_eq!(p[0].path, "$.dxt_version");
    assert!(
        p[0].message.contains("manifest_version is \"0.3\""),
        "{p:?}"
    );
}

/// Issue 18, point 1: this platform's override replaces command, args and
/// env field by field; another platform's is checked and not applied.
#[test]
fn the_platform_override_of_this_host_is_applied_field_by_field() {
    let mut v = minimal();
    v["server"]["mcp_config"]["env"] = json!({"K": "base"});
    v["server"]["mcp_config"]["platform_overrides"] = json!({
        "linux": {"args": ["--linux"]},
        "win32": {"command": "m.exe", "env": {"K": "win"}}
    });
    let m = parse(&v.to_string()).unwrap();
    let plan = stdio(m.plan(Path::new("/b"), &BTreeMap::new()).unwrap());
    assert_eq!(plan.command, "/b/bin/m", "not overridden on linux");
    assert_eq!(plan.args, vec!["--linux".to_string()]);
    assert_eq!(plan.env["K"], "base");
    v["server"]["mcp_config"]["platform_overrides"]["darwin"] = json!({"cmd": "x"});
    let p = problems(v);
    assert_eq!(
        p[0].path,
        "$.server.mcp_config.platform_overrides.darwin.cmd"
    );
}

/// Issue 18, point 1: a bundle for other platforms is refused, saying what
/// it needs and what this host is.
#[test]
fn a_bundle_for_other_platforms_is_refused() {
    let mut v = minimal();
    v["compatibility"] = json!({"platforms": ["darwin", "win32"], "runtimes": {"node": ">=18"}});
    let p = problems(v.clone());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "$.compatibility.platforms");
    assert_eq!(
        p[0].message,
        "the bundle runs on darwin, win32; this host is linux"
    );
    v["compatibility"]["platforms"] = json!(["darwin", "linux"]);
    parse(&v.to_string()).unwrap();
    v["compatibility"]["runtimes"] = json!({"ruby": "3"});
    assert_eq!(problems(v)[0].path, "$.compatibility.runtimes.ruby");
}

/// Issue 18, point 2: every substitution variable of the spec, also inside
/// a user_config default.
#[test]
fn every_spec_variable_is_substituted_also_in_defaults() {
    let mut v = minimal();
    v["user_config"] = json!({
        "memory": {"type": "string", "title": "Memory file", "description": "Memory file", "default": "${HOME}/memory.jsonl"}
    });
    v["server"]["mcp_config"]["args"] = json!([
        "${DOCUMENTS}${pathSeparator}x",
        "${DESKTOP}",
        "${DOWNLOADS}",
        "--memory=${user_config.memory}"
    ]);
    let m = parse(&v.to_string()).unwrap();
    let plan = stdio(m.plan(Path::new("/b"), &BTreeMap::new()).unwrap());
    let home = std::env::var("HOME").unwrap_or_default();
    let home = home.trim_end_matches('/');
    assert_eq!(
        plan.args,
        vec![
            format!("{home}/Documents/x"),
            format!("{home}/Desktop"),
            format!("{home}/Downloads"),
            format!("--memory={home}/memory.jsonl"),
        ]
    );
    // An operator's value is taken as given.
    let values = BTreeMap::from([("memory".to_string(), Secret::new("${HOME}".to_string()))]);
    let plan = stdio(m.plan(Path::new("/b"), &values).unwrap());
    assert_eq!(plan.args[3], "--memory=${HOME}");
}

/// Issue 18, point 3: `multiple` values, array defaults, `min`/`max`.
#[test]
fn multiple_values_expand_into_arguments_and_numbers_keep_their_bounds() {
    let mut v = minimal();
    v["user_config"] = json!({
        "dirs": {"type": "directory", "title": "Dirs", "description": "Dirs", "multiple": true, "default": ["${HOME}/a", "/b"]},
        "n": {"type": "number", "title": "N", "description": "N", "min": 1, "max": 10, "default": 5}
    });
    v["server"]["mcp_config"]["args"] = json!([
        "${user_config.dirs}",
        "--all=${user_config.dirs}",
        "-n",
        "${user_config.n}"
    ]);
    let m = parse(&v.to_string()).unwrap();
    let home = std::env::var("HOME").unwrap_or_default();
    let plan = stdio(m.plan(Path::new("/b"), &BTreeMap::new()).unwrap());
    let a = format!("{}/a", home.trim_end_matches('/'));
    assert_eq!(
        plan.args,
        vec![
            a.clone(),
            "/b".into(),
            format!("--all={a},/b"),
            "-n".into(),
            "5".into()
        ]
    );
    assert!(plan.paths.is_empty(), "a default grants nothing");

    // Configured: several values, each checked; stored as a JSON array.
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = (dir.path().join("x"), dir.path().join("y"));
    std::fs::create_dir_all(&x).unwrap();
    std::fs::create_dir_all(&y).unwrap();
    let given = serde_json::to_string(&[&x, &y]).unwrap();
    let stored = m.check_user_value("dirs", &given).unwrap();
    assert_eq!(
        stored_items(&stored),
        vec![x.display().to_string(), y.display().to_string()]
    );
    let missing = serde_json::to_string(&[x.clone(), dir.path().join("nope")]).unwrap();
    assert!(m
        .check_user_value("dirs", &missing)
        .unwrap_err()
        .contains("existing directory"));
    let values = BTreeMap::from([("dirs".to_string(), Secret::new(stored))]);
    let plan = stdio(m.plan(Path::new("/b"), &values).unwrap());
    assert_eq!(
        &plan.args[..2],
        &[x.display().to_string(), y.display().to_string()]
    );
    assert_eq!(
        plan.paths,
        vec![x.clone(), y.clone()],
        "configured paths are granted"
    );

    assert!(m
        .check_user_value("n", "0")
        .unwrap_err()
        .contains("at least 1"));
    assert!(m
        .check_user_value("n", "11")
        .unwrap_err()
        .contains("at most 10"));
    assert_eq!(m.check_user_value("n", "7").unwrap(), "7");
    assert!(m
        .check_user_value("n", "[\"1\",\"2\"]")
        .unwrap_err()
        .contains("takes one value"));
}

/// Issue 18, point 2: `${HOME}` is the home the bundle is given (its
/// sandbox data folder), also inside defaults.
#[test]
fn home_is_the_bundles_own_when_given() {
    let mut v = minimal();
    v["user_config"] = json!({
        "memory": {"type": "string", "title": "Memory file", "description": "Memory file", "default": "${HOME}/memory.jsonl"}
    });
    v["server"]["mcp_config"]["env"] =
        json!({"MEMORY_FILE_PATH": "${user_config.memory}", "DOCS": "${DOCUMENTS}"});
    let m = parse(&v.to_string()).unwrap();
    let home = Path::new("/state/sandboxes/ws/m/data");
    let plan = stdio(
        m.plan_with_home(Path::new("/b"), &BTreeMap::new(), Some(home))
            .unwrap(),
    );
    assert_eq!(
        plan.env["MEMORY_FILE_PATH"],
        "/state/sandboxes/ws/m/data/memory.jsonl"
    );
    assert_eq!(plan.env["DOCS"], "/state/sandboxes/ws/m/data/Documents");
}

/// Issue 18, point 5: a uv bundle may leave its launch to the host (MCPB
/// 0.4): `python ${__dirname}/ENTRY_POINT`, in the environment the daemon
/// builds. Other types still need `mcp_config`, and uv needs 0.4.
#[test]
fn a_uv_bundle_without_mcp_config_runs_its_entry_point_with_python() {
    let mut m = minimal();
    m["manifest_version"] = json!("0.4");
    m["server"] = json!({"type": "uv", "entry_point": "src/server.py"});
    let parsed = parse(&m.to_string()).unwrap();
    let plan = stdio(parsed.plan(Path::new("/b"), &BTreeMap::new()).unwrap());
    assert_eq!(plan.command, UV_PYTHON);
    assert_eq!(plan.args, vec!["/b/src/server.py".to_string()]);

    m["manifest_version"] = json!("0.3");
    let found = problems(m.clone());
    assert!(
        found
            .iter()
            .any(|p| p.path == "$.server.type" && p.message.contains("0.4")),
        "{found:?}"
    );

    m["manifest_version"] = json!("0.4");
    m["server"]["type"] = json!("python");
    let found = problems(m);
    assert!(
        found.iter().any(|p| p.path == "$.server.mcp_config"),
        "{found:?}"
    );
}
