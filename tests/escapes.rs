//! Terminal escape sequences from bundles (issue 15, finding 10): what a
//! bundle writes to stderr, returns as a tool error or leaves in its
//! `last_error` is shown escaped by every human output (`status`, `install`,
//! `logs`, `logs -f`, `events`, `call`) and in the daemon's log, and exactly
//! as it was by `--json`.

mod common;

use common::{events, shell_wrapped_demo, Daemon, Stream};
use serde_json::{json, Value};

/// What the hostile bundles say: a window title, a screen clear, a bell,
/// a carriage return that overwrites the line, a bidi override.
const STDERR_LINE: &str = "evil \x1b]0;pwned\x07 \x1b[2J\rfake \u{202e}txt";
const SHELL_STDERR: &str = r"printf 'evil \033]0;pwned\007 \033[2J\rfake \342\200\256txt\n' >&2;";
const TOOL_ERROR: &str = "tool \x1b]0;owned\x07\rfailed \x1b[31mred\u{9b}";

/// Fails if `text` holds a character a terminal would act on.
fn assert_inert(what: &str, text: &str) {
    for raw in ['\x1b', '\r', '\x07', '\u{9b}', '\u{202e}'] {
        assert!(!text.contains(raw), "{what} shows a raw {raw:?}:\n{text:?}");
    }
}

/// Whether a string somewhere in `v` contains `text`.
fn holds(v: &Value, text: &str) -> bool {
    match v {
        Value::String(s) => s.contains(text),
        Value::Array(a) => a.iter().any(|v| holds(v, text)),
        Value::Object(o) => o.values().any(|v| holds(v, text)),
        _ => false,
    }
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[test]
fn bundle_text_is_escaped_for_people_and_exact_in_json() {
    let d = Daemon::start();
    let human = events(&d, &["events"]);
    let machine = Stream::start(&d, &["events", "--json"]);

    // A bundle that works, but writes escape sequences to stderr.
    let loud = shell_wrapped_demo(&d.root().join("bundles"), "loud", SHELL_STDERR);
    let out = d.ok(&["install", loud.to_str().unwrap()]);
    assert_inert("install", &out);

    let logs = d.ok(&["logs", "loud"]);
    assert_inert("logs", &logs);
    assert!(
        logs.contains(r"evil \x1b]0;pwned\x07 \x1b[2J\rfake \u{202e}txt"),
        "{logs}"
    );
    let follow = Stream::start(&d, &["logs", "loud", "-f", "-n", "5"]);
    let seen = follow.until("the stderr line", |l| l.contains("evil"));
    assert_inert("logs -f", &seen.join("\n"));

    // A tool error.
    let args = json!({ "message": TOOL_ERROR }).to_string();
    let out = d.cli(&["call", "loud", "fail", &args]);
    assert_eq!(out.status.code(), Some(1));
    assert_inert("call (tool error)", &stderr(&out));
    assert!(
        stderr(&out).contains(r"tool \x1b]0;owned\x07\rfailed"),
        "{out:?}"
    );
    let out = d.cli(&["call", "loud", "fail", &args, "--json"]);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], TOOL_ERROR, "--json is exact");

    // A bundle that dies during its start, its stderr line in the error.
    let bad = shell_wrapped_demo(
        &d.root().join("bundles"),
        "bad",
        &format!("{SHELL_STDERR} exit 1;"),
    );
    let out = d.cli(&["install", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_inert("install error", &stderr(&out));
    assert!(stderr(&out).contains(r"\x1b]0;pwned\x07"), "{out:?}");

    let table = d.ok(&["status"]);
    assert_inert("status", &table);
    assert!(table.contains(r"\x1b]0;pwned\x07"), "{table}");
    let bad_status = d.bundle("default", "bad").unwrap();
    assert!(
        holds(&bad_status["last_error"], STDERR_LINE),
        "status --json is exact: {bad_status}"
    );

    // The lifecycle events of both, as people and programs see them.
    let seen = human.until("bad's error", |l| {
        l.contains("default/bad ") && l.contains(r"\x1b]0;pwned")
    });
    assert_inert("events", &seen.join("\n"));
    let seen = machine.until("bad's error", |l| {
        l.contains("\"bad\"") && l.contains("pwned")
    });
    let event: Value = serde_json::from_str(seen.last().unwrap()).unwrap();
    assert!(
        holds(&event, STDERR_LINE),
        "events --json carries the exact text: {event}"
    );

    // The daemon's own log.
    let log = d.log();
    assert!(log.contains("evil"), "{log}");
    assert_inert("the daemon log", &log);
}
