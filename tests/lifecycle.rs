//! Install → ready → tools → call → uninstall against the real daemon and
//! real demo bundle processes; concurrency; crash and manual restart; logs.

mod common;

use std::time::Duration;

use common::{wait_for, Daemon};
use serde_json::Value;

#[test]
fn install_status_tools_call_uninstall() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    let out = d.ok(&["install", bundle.to_str().unwrap(), "--json"]);
    let installed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(installed["bundle"]["state"], "ready");
    assert_eq!(installed["bundle"]["tools"], common::DEMO_TOOLS);
    let pid = installed["bundle"]["pid"].as_u64().unwrap() as u32;
    assert_eq!(d.bundle_processes(), vec![pid]);

    let status = d.bundle("default", "demo").unwrap();
    for key in [
        "workspace",
        "name",
        "state",
        "pid",
        "restarts",
        "tools",
        "last_error",
        "uptime_secs",
        "version",
        "source",
    ] {
        assert!(
            status.get(key).is_some(),
            "status --json lacks {key}: {status}"
        );
    }
    assert_eq!(status["state"], "ready");
    assert_eq!(status["version"], "0.1.0");
    assert!(d
        .ok(&["status"])
        .lines()
        .any(|l| l.starts_with("default") && l.contains("demo") && l.contains("ready")));

    let tools: Value = serde_json::from_str(&d.ok(&["tools", "demo", "--json"])).unwrap();
    let names: Vec<&str> = tools["bundles"][0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for tool in [
        "echo",
        "add",
        "sleep",
        "fail",
        "crash",
        "env",
        "host_read",
        "host_list",
    ] {
        assert!(names.contains(&tool), "{names:?}");
    }

    assert_eq!(
        d.ok(&["call", "demo", "echo", r#"{"text":"hi"}"#]).trim(),
        "hi"
    );
    let result: Value =
        serde_json::from_str(&d.ok(&["call", "demo", "add", r#"{"a":2,"b":40}"#, "--json"]))
            .unwrap();
    assert_eq!(result["content"][0]["text"], "42");
    // A tool error is shown and exits non-zero; the bundle keeps running.
    let failed = d.cli(&["call", "demo", "fail", r#"{"message":"nope"}"#]);
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("nope"));
    assert_eq!(d.bundle("default", "demo").unwrap()["state"], "ready");

    d.ok(&["uninstall", "demo"]);
    assert!(d.bundle("default", "demo").is_none());
    assert!(
        d.bundle_processes().is_empty(),
        "bundle process left after uninstall"
    );
    let again = d.cli(&["call", "demo", "echo", r#"{"text":"hi"}"#]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("no bundle \"demo\""));
}

#[test]
fn twenty_concurrent_calls_to_one_bundle_all_succeed() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    // Each call sleeps 300 ms in the bundle: run one after another they would
    // take 6 s; concurrently they overlap.
    let started = std::time::Instant::now();
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                let out = std::process::Command::new(common::BIN)
                    .arg("--socket")
                    .arg(&socket)
                    .args(["call", "demo", "sleep", r#"{"ms":300}"#])
                    .output()
                    .unwrap();
                (i, out)
            })
        })
        .collect();
    for h in handles {
        let (i, out) = h.join().unwrap();
        assert!(
            out.status.success(),
            "call {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "slept 300 ms");
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "calls were serialized: {:?}",
        started.elapsed()
    );
}

#[test]
fn crashed_bundle_under_restart_never_stays_failed_until_restarted() {
    let d =
        Daemon::start_with("[[supervision.override]]\nbundle = \"demo\"\nrestart = \"never\"\n");
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    let first_pid = d.bundle("default", "demo").unwrap()["pid"]
        .as_u64()
        .unwrap();

    let out = d.cli(&["call", "demo", "crash", r#"{"code":4}"#]);
    assert!(!out.status.success());
    let failed = d.wait_state("default", "demo", "failed");
    // The exit and the bundle's own last words (issue 18: a useful last_error).
    assert_eq!(
        failed["last_error"],
        "process exited (exit code 4): demo: crashing on request with exit code 4"
    );
    assert!(failed["pid"].is_null());
    assert!(d.bundle_processes().is_empty());

    let refused = d.cli(&["call", "demo", "echo", r#"{"text":"x"}"#]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("failed") && stderr.contains("bundlevisor restart demo"),
        "{stderr}"
    );

    let restarted: Value = serde_json::from_str(&d.ok(&["restart", "demo", "--json"])).unwrap();
    assert_eq!(restarted["bundle"]["state"], "ready");
    assert_eq!(restarted["bundle"]["restarts"], 1);
    assert_ne!(restarted["bundle"]["pid"].as_u64().unwrap(), first_pid);
    assert_eq!(
        d.ok(&["call", "demo", "echo", r#"{"text":"back"}"#]).trim(),
        "back"
    );

    // The crash and both starts are in the bundle's captured stderr.
    let logs = d.ok(&["logs", "demo", "-n", "10"]);
    assert!(
        logs.contains("crashing on request with exit code 4"),
        "{logs}"
    );
    assert_eq!(logs.matches("demo: starting").count(), 2, "{logs}");
    assert_eq!(d.ok(&["logs", "demo", "-n", "1"]).lines().count(), 1);
}

#[test]
fn restart_of_a_ready_bundle_replaces_its_process() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    let old = d.bundle("default", "demo").unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    d.ok(&["restart", "demo"]);
    let new = d.bundle("default", "demo").unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    assert_ne!(old, new);
    wait_for(
        Duration::from_secs(10),
        "the old process to be gone",
        || (d.bundle_processes() == vec![new]).then_some(()),
    );
}

#[test]
fn a_call_that_outlives_its_timeout_fails_without_restarting_the_bundle() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    let out = d.cli(&[
        "call",
        "demo",
        "sleep",
        r#"{"ms":5000}"#,
        "--timeout",
        "200ms",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not answer within 200ms"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = d.bundle("default", "demo").unwrap();
    assert_eq!(
        (b["state"].as_str(), b["restarts"].as_u64()),
        (Some("ready"), Some(0))
    );
    assert_eq!(
        d.ok(&["call", "demo", "echo", r#"{"text":"still here"}"#])
            .trim(),
        "still here"
    );
}

#[test]
fn bundles_in_two_workspaces_are_separate() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    d.ok(&["install", bundle.to_str().unwrap(), "-w", "team-b"]);
    let status = d.status();
    assert_eq!(
        status["workspaces"],
        serde_json::json!(["default", "team-b"])
    );
    assert_eq!(d.bundle_processes().len(), 2);
    d.ok(&["uninstall", "demo", "-w", "team-b"]);
    assert_eq!(d.bundle("default", "demo").unwrap()["state"], "ready");
    assert!(d.bundle("team-b", "demo").is_none());
    let dup = d.cli(&["install", bundle.to_str().unwrap()]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already installed"));
}

#[test]
fn an_overlong_stderr_line_is_dropped_without_blocking_the_bundle() {
    let d = Daemon::start();
    // 200 KB on one stderr line: more than a pipe holds, so an unread stderr would block the bundle.
    let folder = common::shell_wrapped_demo(
        &d.root().join("bundles"),
        "noisy",
        "head -c 200000 /dev/zero | tr '\\0' x >&2; echo >&2; echo 'after the long line' >&2;",
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    let logs = d.ok(&["logs", "noisy", "-n", "3"]);
    assert!(
        logs.contains("stderr line longer than") && logs.contains("after the long line"),
        "{logs}"
    );
    assert!(logs.len() < 1000, "the long line reached the log");
}

/// Issue 16, finding 10: a tool the bundle does not have is `tool_not_found`
/// (as docs/protocol.md says), not `tool_call_failed`.
#[test]
fn an_unknown_tool_is_tool_not_found() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(
        1,
        "bundle.call",
        serde_json::json!({"name": "demo", "tool": "no_such_tool"}),
    );
    assert_eq!(r["error"]["data"]["kind"], "tool_not_found", "{r}");
    // A tool it has still works on the same connection.
    let r = raw.request(
        2,
        "bundle.call",
        serde_json::json!({"name": "demo", "tool": "add", "arguments": {"a": 2, "b": 3}}),
    );
    assert!(r.get("result").is_some(), "{r}");
}
