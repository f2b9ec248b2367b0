//! Malformed and hostile control requests get JSON-RPC errors with stable
//! kinds, and the daemon keeps serving.

mod common;

use common::Daemon;
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
