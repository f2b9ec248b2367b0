//! Issue 20, point 6: the official MCP TypeScript SDK's client (npm
//! `@modelcontextprotocol/sdk`, pinned by tests/ts-sdk/package-lock.json,
//! installed by `make ts-sdk`, which `make test` runs) against the daemon's
//! HTTP gateway: it lists, calls, reads a workspace file, and is told when
//! the tools change.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{demo_bundle_at, free_port, Daemon};
use serde_json::Value;

fn client_script() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ts-sdk/client.mjs");
    assert!(
        path.exists(),
        "the TypeScript SDK client is not installed at {}; run `make ts-sdk` (make test does)",
        path.display()
    );
    path
}

/// Runs `node SCRIPT URL TOKEN` against the workspace endpoint on `port`:
/// the client, and its lines (JSON) as they come, read by a thread (a test
/// acts on what it said).
fn run(
    script: &std::path::Path,
    port: u16,
    token: &str,
) -> (std::process::Child, mpsc::Receiver<Value>) {
    let mut child = Command::new("node")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/mcp/default"))
        .arg(token)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node runs");
    let (tx, lines) = mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
            if tx.send(value).is_err() {
                return;
            }
        }
    });
    (child, lines)
}

#[test]
fn the_typescript_sdk_client_lists_calls_reads_and_hears_of_changes() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let id = d.put_file(
        "from-ts.txt",
        b"a workspace file, read by the TypeScript SDK",
    );
    let token = d.ok(&["token", "create"]).trim().to_string();
    let (mut child, lines) = run(&client_script(), port, &token);
    let next = |what: &str| -> Value {
        lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the client said nothing about {what}"))
    };

    let hello = next("its session");
    assert_eq!(hello["protocol"], "2025-11-25", "{hello}");
    assert_eq!(hello["session"], true, "{hello}");
    let tools = next("tools/list");
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "demo__echo"),
        "{tools}"
    );
    assert_eq!(next("tools/call")["call"], "from the TypeScript SDK");
    // A call asking for progress: the reports, in order, then its result.
    let stepped = next("the call with progress");
    assert_eq!(
        stepped["progress"],
        serde_json::json!([1, 2, 3]),
        "{stepped}"
    );
    assert_eq!(stepped["done"], "done after 3 steps", "{stepped}");
    // Issue 37: both calls on its session (it declared nothing a bundle
    // could ask) were answered below rmcp, the second on its own stream.
    assert_eq!(
        common::answered_by(&d).0,
        2,
        "the SDK's calls went through rmcp"
    );
    let resources = next("resources/list");
    assert!(
        resources["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| *r == format!("files://{id}")),
        "{resources}"
    );
    let read = next("resources/read");
    assert_eq!(read["read"], "a workspace file, read by the TypeScript SDK");
    assert_eq!(read["mime"], "text/plain");
    assert_eq!(next("ready")["ready"], true);

    // A second bundle: the client is told, and lists it.
    let dir = d.root().join("bundles");
    d.ok(&["install", demo_bundle_at(&dir, "second").to_str().unwrap()]);
    assert_eq!(next("list_changed")["tools_changed"], true);
    let after = next("the new list");
    assert!(
        after["tools_after"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "second__echo"),
        "{after}"
    );
    assert!(child.wait().unwrap().success());
}

/// Issue 34, point 10: after a daemon crash, the TypeScript SDK's call in
/// progress hung for its whole timeout: its stream was resumable, both
/// resumes got 404, and nothing answered the call. A resume of a session
/// that is gone now answers the call's request with an error at once.
#[test]
fn a_call_in_progress_when_the_daemon_dies_fails_at_once_not_at_its_timeout() {
    let port = free_port();
    let mut d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let token = d.ok(&["token", "create"]).trim().to_string();
    let (mut child, lines) = run(&client_script().with_file_name("crash.mjs"), port, &token);
    let running = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the call running");
    assert_eq!(running["progress"], 1, "{running}");
    // Issue 37: the call (it asks for progress) runs below rmcp, on a
    // stream of the daemon's own, whose ids say whose request it is too.
    assert_eq!(common::answered_by(&d).0, 1, "the call went through rmcp");
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.launch();
    // The SDK resumes after its stream's retry time; its timeout is 120 s.
    let ended = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the call still waiting after the daemon came back");
    let error = ended["error"].as_str().unwrap_or_default();
    assert!(error.contains("the daemon restarted"), "{ended}");
    assert!(ended["ms"].as_u64().unwrap() < 30_000, "{ended}");
    assert!(child.wait().unwrap().success());
}
