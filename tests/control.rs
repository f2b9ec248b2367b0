//! Malformed and hostile control requests get JSON-RPC errors with stable
//! kinds, and the daemon keeps serving.

mod common;

use std::time::Duration;

use common::{wait_for, Daemon, BIN};
use serde_json::{json, Value};

fn kind(response: &Value) -> &str {
    response["error"]["data"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("no error kind in {response}"))
}

#[test]
fn malformed_requests_get_errors_and_the_daemon_keeps_serving() {
    let d = Daemon::start();
    let mut raw = d.raw();

    // Before hello.
    let r = raw.request(1, "status", json!({}));
    assert_eq!(
        (r["error"]["code"].as_i64(), kind(&r)),
        (Some(-32600), "hello_required")
    );
    let r = raw.request(2, "daemon.hello", json!({"protocol": 99}));
    assert_eq!(kind(&r), "protocol_mismatch");
    assert!(r["error"]["message"].as_str().unwrap().contains("speaks 1"));
    raw.hello();

    raw.send_line("this is not json");
    let r = raw.read();
    assert_eq!(
        (r["error"]["code"].as_i64(), kind(&r), &r["id"]),
        (Some(-32700), "parse_error", &Value::Null)
    );

    for (line, want) in [
        (r#"[1,2]"#, "invalid_request"),
        (
            r#"{"jsonrpc":"1.0","id":3,"method":"status"}"#,
            "invalid_request",
        ),
        (r#"{"jsonrpc":"2.0","id":4}"#, "invalid_request"),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"status","params":7}"#,
            "invalid_request",
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"no.such.method"}"#,
            "method_not_found",
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"bundle.install","params":{"path":5}}"#,
            "invalid_params",
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"bundle.call","params":{"name":"x","tool":"t","bogus":1}}"#,
            "invalid_params",
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"bundle.call","params":{"name":"ghost","tool":"t"}}"#,
            "bundle_not_found",
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"bundle.install","params":{"path":"/x","workspace":"../etc"}}"#,
            "invalid_name",
        ),
    ] {
        raw.send_line(line);
        let r = raw.read();
        assert_eq!(kind(&r), want, "{line} -> {r}");
        if let Some(id) = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v.get("id").cloned())
        {
            assert_eq!(r["id"], id, "{line}");
        }
    }

    // A 2 MiB line is refused without the daemon reading it into a request.
    raw.send_line(&format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"status\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(2 << 20)
    ));
    let r = raw.read();
    assert_eq!(kind(&r), "invalid_request");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("longer than"));

    // The same connection and new ones still work.
    let r = raw.request(12, "status", json!({}));
    assert!(r["result"]["bundles"].is_array(), "{r}");
    d.ok(&["status"]);
}

#[test]
fn a_client_that_disconnects_mid_request_does_not_disturb_the_daemon() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    d.ok(&["install", bundle.to_str().unwrap()]);
    {
        let mut raw = d.raw();
        raw.hello();
        raw.send_line(r#"{"jsonrpc":"2.0","id":1,"method":"bundle.call","params":{"name":"demo","tool":"sleep","arguments":{"ms":300}}}"#);
        // Dropped here, before the answer.
    }
    assert_eq!(
        d.ok(&["call", "demo", "echo", r#"{"text":"fine"}"#]).trim(),
        "fine"
    );
}

#[test]
fn install_reports_progress_notifications_before_the_result() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    let mut raw = d.raw();
    raw.hello();
    raw.send_line(
        &json!({"jsonrpc":"2.0","id":1,"method":"bundle.install","params":{"path": bundle}})
            .to_string(),
    );
    let mut states = Vec::new();
    loop {
        let m = raw.read();
        if m.get("id").is_some() {
            assert_eq!(m["result"]["bundle"]["state"], "ready", "{m}");
            break;
        }
        assert_eq!(m["method"], "progress");
        states.push(m["params"]["kind"].as_str().unwrap().to_string());
    }
    assert_eq!(states, vec!["installed", "starting", "ready"]);
}

/// Issue 37: a list's `status` leaves each sandbox's read, write and
/// execute lists out (they were 2 KiB of a bundle's 2.2 and made `status`
/// of 2,000 bundles 4.3 MB); `{"paths": true}` and `status --json` have
/// them, and an install's answer (one bundle) keeps them.
#[test]
fn status_has_the_sandbox_paths_only_when_asked() {
    let d = Daemon::start();
    let bundle = d.demo_bundle("demo");
    let installed: Value =
        serde_json::from_str(&d.ok(&["install", bundle.to_str().unwrap(), "--json"])).unwrap();
    let listed = |s: &Value| -> usize {
        let sandbox = &s["sandbox"];
        assert!(sandbox["strategy"].is_string(), "{s}");
        ["read", "write", "execute"]
            .iter()
            .map(|k| sandbox[k].as_array().map_or(0, Vec::len))
            .sum()
    };
    let mut raw = d.raw();
    raw.hello();
    let lean = raw.request(1, "status", json!({}));
    let lean = &lean["result"]["bundles"][0];
    assert_eq!(listed(lean), 0, "{lean}");
    let whole = raw.request(2, "status", json!({"paths": true}));
    let whole = &whole["result"]["bundles"][0];
    assert!(listed(whole) > 0, "{whole}");
    assert!(listed(&d.bundle("default", "demo").unwrap()) > 0);
    let one = installed.get("bundle").unwrap_or(&installed);
    assert!(listed(one) > 0, "{installed}");
}

#[test]
fn a_silent_client_is_closed_after_the_handshake_timeout_and_connections_are_capped() {
    let d = Daemon::start_with("[control]\nmax_connections = 3\nhandshake_timeout = \"300ms\"\n");

    // Says nothing: answered hello_required, then closed.
    let mut silent = d.raw();
    let answer = silent.read();
    assert_eq!(kind(&answer), "hello_required", "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("within 300ms"));
    let mut rest = String::new();
    assert_eq!(
        std::io::BufRead::read_line(&mut silent.reader, &mut rest).unwrap(),
        0,
        "the connection is closed"
    );

    // Three held connections fill the cap; a fourth is refused clearly.
    let mut held: Vec<_> = (0..3)
        .map(|_| {
            let mut c = d.raw();
            c.hello();
            c
        })
        .collect();
    let mut extra = d.raw();
    let refused = extra.read();
    assert_eq!(kind(&refused), "too_many_connections", "{refused}");
    let out = d.cli(&["status"]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("max_connections"), "{msg}");

    // A slot frees when a client leaves.
    held.pop();
    wait_for(Duration::from_secs(5), "a free connection slot", || {
        d.cli(&["status"]).status.success().then_some(())
    });
    let status = held[0].request(9, "status", json!({}));
    assert!(status["result"]["bundles"].is_array(), "{status}");
}

#[test]
fn peer_credentials_are_checked_and_the_socket_is_private() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let d = Daemon::start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "not root: the other-uid half of this test needs to switch uid (CI runs as root)"
        );
        return;
    }
    let as_nobody = |d: &Daemon| {
        std::process::Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .arg("status")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    // Open the file modes, as a careless operator might: the peer check
    // still refuses the other uid, and says who was refused.
    for p in [d.root(), d.socket.parent().unwrap().to_path_buf()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&d);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("uid 65534") && msg.contains("not allowed"),
        "{msg}"
    );
    assert!(d.log().contains("control connection refused: uid 65534"));

    // allowed_gids: the socket is 0660 for that group, and its members get in.
    let d = Daemon::start_with("[control]\nallowed_gids = [65534]\n");
    assert_eq!(mode(&d.socket), 0o660);
    assert_eq!(std::fs::metadata(&d.socket).unwrap().gid(), 65534);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o710);
    std::fs::set_permissions(d.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody(&d);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn allowed_uids_alone_admits_that_uid_and_still_refuses_others() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let d = Daemon::start_with("[control]\nallowed_uids = [65534]\n");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // No ACLs: the socket is open to connect to, its folder can be entered
    // but not listed, and the peer check decides.
    assert_eq!(mode(&d.socket), 0o666);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o711);
    assert!(
        d.log()
            .contains("allowed_uids is set: the control socket is 0666"),
        "{}",
        d.log()
    );
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "not root: the other-uid half of this test needs to switch uid (CI runs as root)"
        );
        return;
    }
    // The test's own temp folder must be enterable (a real socket folder,
    // /run/bundlevisor, is).
    std::fs::set_permissions(d.root(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // A gid that is in no allow list: the uid alone admits.
    let as_uid = |uid: u32| {
        std::process::Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .args(["status", "--json"])
            .uid(uid)
            .gid(54321)
            .output()
            .unwrap()
    };
    let out = as_uid(65534);
    assert!(
        out.status.success(),
        "uid 65534 is in allowed_uids: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_uid(65533);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("uid 65533") && msg.contains("not allowed"),
        "{msg}"
    );
}

/// Issue 16, finding 10: every method refuses a param it does not take
/// (as docs/protocol.md says), including the ones that take none.
#[test]
fn every_method_refuses_unknown_params() {
    let d = Daemon::start();
    let mut raw = d.raw();
    raw.hello();
    let methods = bundlevisor::protocol::typed::TYPED;
    assert!(methods.contains(&"metrics") && methods.contains(&"events.subscribe"));
    for (i, method) in methods.iter().enumerate() {
        if *method == "daemon.hello" {
            continue; // answered once per connection, before anything else
        }
        if *method == "debug.panic_bundle_actor" && !cfg!(feature = "fault-injection") {
            continue; // served only by a daemon built with fault-injection
        }
        let r = raw.request(10 + i as u64, method, json!({"junk": 1}));
        assert_eq!(kind(&r), "invalid_params", "{method}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unknown field `junk`"),
            "{method}: {r}"
        );
    }
    // The connection still serves.
    let r = raw.request(99, "status", json!({}));
    assert!(r.get("result").is_some(), "{r}");
}
