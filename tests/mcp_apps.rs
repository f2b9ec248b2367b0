//! Issue 33, MCP Apps (`io.modelcontextprotocol/ui`): a real MCP Apps
//! server run as a bundle works through the workspace gateway when a host
//! drives it with ext-apps' own host helper.
//!
//! The server is ext-apps' example `@modelcontextprotocol/server-basic-vanillajs`
//! 2.0.3: one tool, `get-time`, whose `_meta.ui.resourceUri` (and the older
//! `_meta["ui/resourceUri"]`) is `ui://get-time/mcp-app.html`, a resource of
//! MIME type `text/html;profile=mcp-app`. Through the gateway the tool is
//! `basic-vanillajs__get-time` and its UI `ui://basic-vanillajs/get-time/mcp-app.html`
//! (ext-apps refuses a UI resource that is not `ui://`).
//!
//! The host (tests/ext-apps/host.mjs) is the MCP TypeScript SDK 2 client
//! 2.4.0 with ext-apps 2.0.2's `getToolUiResourceUri`, declaring the UI
//! extension in its capabilities: it lists the resources and the tools, asks
//! ext-apps for the tool's UI URI, reads it, and calls the tool; once on
//! 2025-11-25 (the client's default) and once on 2026-07-28
//! (`versionNegotiation` "auto"). All of it pinned by
//! tests/ext-apps/package-lock.json and built by `make ext-apps` (which
//! `make test` runs) into target/ext-apps and target/basic-vanillajs-bundle.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, wait_exit, Daemon};
use serde_json::Value;

/// The URI the gateway gives the bundle's `ui://get-time/mcp-app.html`.
const UI_URI: &str = "ui://basic-vanillajs/get-time/mcp-app.html";

/// `path` under the crate, which `make ext-apps` builds.
fn built(path: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    assert!(
        path.exists(),
        "{} is not built; run `make ext-apps` (make test does)",
        path.display()
    );
    path
}

/// Runs the host in `mode` against `url`: the JSON lines it printed, once
/// it succeeded.
fn host(d: &Daemon, url: &str, token: &str, mode: &str) -> Vec<Value> {
    let script = built("target/ext-apps/host.mjs");
    let stdout = d.root().join(format!("host-{mode}.stdout"));
    let stderr = d.root().join(format!("host-{mode}.stderr"));
    let mut child = Command::new("node")
        .arg(script)
        .args([url, token, mode])
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run node (20 or later is needed): {e}"));
    let limit = Duration::from_secs(120);
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break wait_exit(&mut child, Duration::from_secs(10), "the host to die");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let said = read(&stdout);
    assert!(
        status.success(),
        "the host ({mode}) exited {status}\nstdout:\n{said}\nstderr:\n{}\ndaemon log:\n{}",
        read(&stderr),
        d.log()
    );
    said.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn an_mcp_apps_servers_ui_is_found_by_ext_apps_and_read_through_the_gateway() {
    let bundle = built("target/basic-vanillajs-bundle/.installed");
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", bundle.parent().unwrap().to_str().unwrap()]);
    d.wait_state("default", "basic-vanillajs", "ready");
    let token = d.ok(&["token", "create"]).trim().to_string();
    let url = format!("http://127.0.0.1:{port}/mcp/default");

    for (mode, protocol) in [("default", "2025-11-25"), ("auto", "2026-07-28")] {
        let said = host(&d, &url, &token, mode);
        let all = said
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(said.len(), 4, "{mode}: {all}");
        assert_eq!(said[0]["protocol"], protocol, "{mode}: {all}");

        // resources/list names the UI by its ui:// URI, not a bundle:// one.
        let resources = said[1]["resources"].as_array().expect("resources");
        assert!(
            resources
                .iter()
                .any(|r| r["uri"] == UI_URI && r["mimeType"] == "text/html;profile=mcp-app"),
            "{mode}: {all}"
        );
        assert!(
            !resources.iter().any(|r| r["uri"]
                .as_str()
                .is_some_and(|u| u.starts_with("bundle://basic-vanillajs/"))),
            "{mode}: {all}"
        );

        // ext-apps found the UI of the tool (both keys renamed), and the
        // host read it: the bundle's HTML, under the URI it asked for.
        let ui = &said[2];
        assert_eq!(ui["tool"], "basic-vanillajs__get-time", "{mode}: {all}");
        assert_eq!(ui["uiUri"], UI_URI, "{mode}: {all}");
        assert_eq!(ui["legacyUri"], UI_URI, "{mode}: {all}");
        assert_eq!(ui["contentUri"], UI_URI, "{mode}: {all}");
        assert_eq!(ui["mimeType"], "text/html;profile=mcp-app", "{mode}: {all}");
        assert!(
            ui["htmlBytes"].as_u64().unwrap_or(0) > 1000,
            "{mode}: {all}"
        );
        assert_eq!(ui["startsWithDoctype"], true, "{mode}: {all}");

        // The tool answers the time (ISO 8601), as text and structured.
        let call = &said[3];
        let time = call["call"].as_str().unwrap_or_default();
        assert!(
            time.len() >= 20 && time.as_bytes()[4] == b'-' && time.contains('T'),
            "{mode}: {all}"
        );
        assert_eq!(call["structured"]["time"], time, "{mode}: {all}");
    }
}
