//! The gateway with a real third-party MCP client: the MCP Inspector CLI
//! (npm, pinned in tests/inspector/package-lock.json, installed by
//! `make inspector`, which `make test` runs).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{demo_bundle_at, Daemon, BIN};
use serde_json::Value;

fn inspector() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/inspector/node_modules/.bin/mcp-inspector");
    assert!(
        path.exists(),
        "the MCP Inspector is not installed at {}; run `make inspector` (make test does)",
        path.display()
    );
    path
}

/// `mcp-inspector --cli bundlevisor mcp ... ARGS`, parsed as JSON.
fn inspect(d: &Daemon, args: &[&str]) -> Value {
    let socket = d.socket.to_str().unwrap();
    let mut all = vec![BIN, "--socket", socket, "mcp"];
    all.extend_from_slice(args);
    inspector_json(&all)
}

/// `mcp-inspector --cli ARGS`, parsed as JSON.
fn inspector_json(args: &[&str]) -> Value {
    let out = Command::new(inspector())
        .arg("--cli")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn the_mcp_inspector_lists_calls_and_reads_through_the_gateway() {
    let d = Daemon::start();
    let dir = d.root().join("bundles");
    for name in ["alpha", "beta"] {
        d.ok(&["install", demo_bundle_at(&dir, name).to_str().unwrap()]);
    }
    let id = d.put_file("note.txt", b"read by the inspector");

    let tools = inspect(&d, &["--method", "tools/list"]);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"alpha__echo") && names.contains(&"beta__add"),
        "{names:?}"
    );
    assert_eq!(names.len(), 2 * common::DEMO_TOOLS);

    let result = inspect(
        &d,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "beta__echo",
            "--tool-arg",
            "text=hello",
        ],
    );
    assert_eq!(result["content"][0]["text"], "hello", "{result}");
    assert_eq!(result["isError"], false);

    let resources = inspect(&d, &["--method", "resources/list"]);
    let file = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["uri"] == format!("files://{id}"))
        .unwrap_or_else(|| panic!("{resources}"))
        .clone();
    assert_eq!(file["mimeType"], "text/plain");
    assert_eq!(file["name"], "note.txt");

    let read = inspect(
        &d,
        &[
            "--method",
            "resources/read",
            "--uri",
            &format!("files://{id}"),
        ],
    );
    assert_eq!(
        read["contents"][0]["text"], "read by the inspector",
        "{read}"
    );
    assert_eq!(read["contents"][0]["mimeType"], file["mimeType"]);
    // The daemon served the official SDK's stdio itself (node's socket
    // pairs), not through a relay.
    assert!(
        d.log()
            .contains("a stdio gateway session runs on the agent's own stdin and stdout"),
        "{}",
        d.log()
    );
}

/// Issue 20, point 6 (first client): the Inspector CLI over streamable
/// HTTP, with a token, lists, calls and reads a workspace file through the
/// daemon's HTTP endpoint. (It runs one method and exits, so it cannot
/// wait for `list_changed`; the rmcp and TypeScript SDK clients do.)
#[test]
fn the_mcp_inspector_lists_calls_and_reads_over_http() {
    let port = common::free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let token = d.ok(&["token", "create"]).trim().to_string();
    let url = format!("http://127.0.0.1:{port}/mcp/default");
    let header = format!("Authorization: Bearer {token}");
    let run = |args: &[&str]| -> Value {
        let mut all = vec![
            "--transport",
            "http",
            "--server-url",
            &url,
            "--header",
            &header,
        ];
        all.extend_from_slice(args);
        inspector_json(&all)
    };
    let listed = run(&["--method", "tools/list"]);
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"demo__echo"), "{names:?}");
    let called = run(&[
        "--method",
        "tools/call",
        "--tool-name",
        "demo__echo",
        "--tool-arg",
        "text=through the inspector",
    ]);
    assert!(
        called.to_string().contains("through the inspector"),
        "{called}"
    );
    let id = d.put_file("over-http.md", b"# read over HTTP");
    let read = run(&[
        "--method",
        "resources/read",
        "--uri",
        &format!("files://{id}"),
    ]);
    assert_eq!(read["contents"][0]["text"], "# read over HTTP", "{read}");
    assert_eq!(read["contents"][0]["mimeType"], "text/markdown", "{read}");
}
