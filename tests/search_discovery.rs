//! Issue 35: `discovery = "search"` with real clients — the official
//! TypeScript SDK 1.32.2 (MCP 2025-11-25: find, call, pin, call the pinned
//! tool) and the TypeScript SDK 2.4.0 pinned to MCP 2026-07-28 (find and
//! call; no sessions, so nothing to pin), each over the HTTP gateway and
//! over the stdio gateway — and what the agent saves against the full list.

mod common;

use std::path::Path;
use std::process::Command;

use common::{free_port, installed, Daemon, BIN};
use serde_json::Value;

/// Runs `node SCRIPT ARGS`; what it saw (its last line, JSON).
fn saw(script: &Path, args: &[&str]) -> Value {
    saw_finding(script, args, "add two numbers")
}

/// [`saw`], the script finding `query`.
fn saw_finding(script: &Path, args: &[&str], query: &str) -> Value {
    let out = Command::new("node")
        .arg(script)
        .args(args)
        .env("QUERY", query)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn daemon() -> (Daemon, String, String) {
    daemon_with("")
}

/// [`daemon`], with `extra` in its configuration.
fn daemon_with(extra: &str) -> (Daemon, String, String) {
    let port = free_port();
    let d = Daemon::start_with(&format!(
        "{extra}[http]\nlisten = \"127.0.0.1:{port}\"\n[[profile]]\nname = \"finder\"\ndiscovery = \"search\"\n"
    ));
    for name in ["demo", "second"] {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
    }
    let token = d
        .ok(&["token", "create", "--profile", "finder"])
        .trim()
        .to_string();
    (
        d,
        format!("http://127.0.0.1:{port}/mcp/default/finder"),
        token,
    )
}

/// The script arguments of each transport: the HTTP endpoint with the
/// token, and `bundlevisor mcp --profile finder` over stdio.
fn transports<'a>(d: &'a Daemon, url: &'a str, token: &'a str) -> [Vec<&'a str>; 2] {
    [
        vec!["http", url, token],
        vec!["stdio", BIN, d.socket.to_str().unwrap(), "finder"],
    ]
}

/// What every run must have seen: the meta-tools listed instead of the
/// tools, an add tool found first with its schema, and its sum.
fn found_and_called(seen: &Value, listed: &[&str]) {
    assert_eq!(seen["listed"], serde_json::json!(listed), "{seen}");
    let best = seen["found"][0].as_str().unwrap_or_default();
    assert!(best.ends_with("__add"), "{seen}");
    assert!(seen["schema"]["properties"]["a"].is_object(), "{seen}");
    assert_eq!(seen["called"], "5", "{seen}");
}

#[test]
fn the_typescript_sdk_finds_calls_and_pins_over_http_and_stdio() {
    let (d, url, token) = daemon();
    let sdk = installed("target/ts-sdk/search.mjs", "ts-sdk");
    for args in transports(&d, &url, &token) {
        let seen = saw(&sdk, &args);
        found_and_called(&seen, &["find_tools", "call_tool", "pin_tools"]);
        let best = seen["found"][0].as_str().unwrap();
        let pinned = seen["pinned"].as_array().unwrap();
        assert_eq!(pinned.len(), 4, "{seen}");
        assert_eq!(pinned[3], best, "{seen}");
        assert_eq!(seen["direct"], "42", "{seen}");
    }
}

#[test]
fn the_typescript_sdk_2_on_2026_07_28_finds_and_calls_over_http_and_stdio() {
    let (d, url, token) = daemon();
    let sdk = installed("target/ts-sdk2/search.mjs", "ts-sdk2");
    for args in transports(&d, &url, &token) {
        let seen = saw(&sdk, &args);
        assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
        found_and_called(&seen, &["find_tools", "call_tool"]);
    }
}

/// The model `make model` fetches.
const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/models/all-minilm-l6-v2"
);

#[test]
fn with_a_model_agents_find_tools_by_what_they_mean_not_only_their_words() {
    // No word of this query is in the add tool's name or description (nor
    // in any other demo tool's): by words alone it finds nothing, by
    // meaning the add tool first.
    let query = "what is seven plus five?";
    let (d, url, token) = daemon_with(&format!("[search]\nmodel = \"{MODEL}\"\n"));
    assert!(
        d.log().contains("tool search ranks by meaning too"),
        "{}",
        d.log()
    );
    // Both revisions: SDK 1 on 2025-11-25 (with pin_tools), SDK 2 on
    // 2026-07-28.
    for (script, dir, listed) in [
        (
            "target/ts-sdk/search.mjs",
            "ts-sdk",
            &["find_tools", "call_tool", "pin_tools"][..],
        ),
        (
            "target/ts-sdk2/search.mjs",
            "ts-sdk2",
            &["find_tools", "call_tool"][..],
        ),
    ] {
        let sdk = installed(script, dir);
        for args in transports(&d, &url, &token) {
            let seen = saw_finding(&sdk, &args, query);
            found_and_called(&seen, listed);
        }
    }
}

#[test]
fn a_model_that_cannot_be_loaded_is_refused_at_start_with_the_fix() {
    let d = Daemon::unlaunched("[search]\nmodel = \"no-such-model\"\n");
    let out = Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(&d.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    let folder = d.root().join("no-such-model");
    assert!(
        said.contains(&format!(
            "cannot load the tool search model ([search] model = {})",
            folder.display()
        )) && said.contains("config.json")
            && said.contains("`make model`"),
        "{said}"
    );
}
