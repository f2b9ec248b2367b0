//! The command line as scripts and operators use it: a closed output pipe,
//! one workspace's status, an unknown workspace for the gateway, a call
//! that waits for a restarting bundle, plain-text logs.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_for, Daemon, BIN};

/// Runs the CLI with its stdout a pipe whose reader takes `keep` bytes and
/// then goes away (`| head -c KEEP`); returns the exit status and stderr.
fn into_closed_pipe(d: &Daemon, args: &[&str], keep: usize) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = vec![0u8; keep];
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (
        common::wait_exit(&mut child, Duration::from_secs(20), "the CLI"),
        stderr,
    )
}

/// Issue 16: `call … | head -c 5` panicked (exit 101); `files get ID | head
/// -c 10` exited 2 with a protocol error.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    // More than a pipe holds (64 KiB), so the writer meets the closed pipe;
    // less than one argument may be (128 KiB).
    let text = "x".repeat(120_000);
    let args = format!(r#"{{"text":"{text}"}}"#);
    let (status, stderr) = into_closed_pipe(&d, &["call", "demo", "echo", &args], 5);
    assert!(status.success(), "call: {status}: {stderr}");
    assert!(stderr.is_empty(), "call: {stderr}");

    let id = d.put_file("big.bin", &vec![7u8; 300_000]);
    let (status, stderr) = into_closed_pipe(&d, &["files", "get", &id], 10);
    assert!(status.success(), "files get: {status}: {stderr}");
    assert!(stderr.is_empty(), "files get: {stderr}");
}

#[test]
fn status_of_one_workspace_and_an_unknown_one() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("a").to_str().unwrap()]);
    d.ok(&[
        "install",
        d.demo_bundle("b").to_str().unwrap(),
        "-w",
        "other",
    ]);
    let one: serde_json::Value =
        serde_json::from_str(&d.ok(&["status", "-w", "other", "--json"])).unwrap();
    let names: Vec<&str> = one["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b"], "{one}");
    assert_eq!(one["workspaces"], serde_json::json!(["other"]));
    let table = d.ok(&["status", "-w", "default"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["default", "a"])),
        "{table}"
    );
    assert!(!table.contains("other"), "{table}");

    let out = d.cli(&["status", "-w", "nowhere"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no workspace \"nowhere\"") && err.contains("other"),
        "{err}"
    );
}

/// Issue 16: `bundlevisor mcp -w` with an unknown workspace served an
/// empty list; it says so and exits.
#[test]
fn the_gateway_refuses_an_unknown_workspace() {
    let d = Daemon::start();
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["mcp", "-w", "nowhere"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::wait_exit(&mut child, Duration::from_secs(20), "the gateway");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no workspace \"nowhere\""), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a piped stderr: {stderr:?}"
    );
}

/// Issue 16: `call --wait-ready` waits for a bundle that is restarting (as
/// the gateway does); without it, the call is refused as not ready.
#[test]
fn call_wait_ready_waits_for_a_restarting_bundle() {
    let d = Daemon::start();
    // Takes a second to come up, every time.
    let slow = common::shell_wrapped_demo(&d.root().join("bundles"), "slow", "sleep 1;");
    d.ok(&["install", slow.to_str().unwrap()]);
    let before = d.bundle("default", "slow").unwrap()["pid"].as_u64();
    let _ = d.cli(&["call", "slow", "crash", "{}"]);
    wait_for(Duration::from_secs(10), "the restart to begin", || {
        d.bundle("default", "slow")
            .filter(|b| b["pid"].as_u64() != before && b["state"] != "ready")
    });
    let out = d.cli(&["call", "slow", "echo", r#"{"text":"now"}"#]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not ready"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = d.cli(&[
        "call",
        "slow",
        "echo",
        r#"{"text":"waited"}"#,
        "--wait-ready",
        "10s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "waited");
}

#[test]
fn the_daemon_log_has_no_colour_codes_when_it_is_a_file() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let _ = d.cli(&["call", "demo", "crash", "{}"]);
    wait_for(Duration::from_secs(10), "the restart", || {
        d.log().contains("restarting").then_some(())
    });
    let log = d.log();
    assert!(log.contains("bundle ready"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "colour codes in the log file:\n{log:?}"
    );
}

/// Issue 16, finding 7: files errors keep their kind; a bad tag is the
/// caller's mistake (`invalid_params`), not a store failure (`file_error`).
#[test]
fn a_bad_tag_is_invalid_params_and_a_missing_file_is_file_not_found() {
    let d = Daemon::start();
    let path = d.root().join("note.txt");
    std::fs::write(&path, "hello").unwrap();
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(
        1,
        "files.put",
        serde_json::json!({"path": path, "tags": ["bad\u{1}tag"]}),
    );
    assert_eq!(r["error"]["data"]["kind"], "invalid_params", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid tag"),
        "{r}"
    );
    let r = raw.request(
        2,
        "files.get",
        serde_json::json!({"id": "fl_000000000000000000000000"}),
    );
    assert_eq!(r["error"]["data"]["kind"], "file_not_found", "{r}");
}
