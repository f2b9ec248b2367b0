//! `bundlevisor events --json`, `bundlevisor logs -f` and log rotation,
//! through the real CLI against the real daemon.

mod common;

use std::time::Duration;

use common::{events, nth, Daemon, Stream};
use serde_json::Value;

#[test]
fn events_stream_the_lifecycle_of_a_crash_and_an_uninstall() {
    let d = Daemon::start();
    let s = events(&d, &["events", "--json"]);
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let _ = d.cli(&["call", "demo", "crash", r#"{"code":5}"#]);
    let seen = s.until(
        "the restart to be ready",
        nth(2, |l| {
            l.contains("\"name\":\"demo\"") && l.contains("\"kind\":\"ready\"")
        }),
    );
    let demo: Vec<Value> = seen
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["name"] == "demo")
        .collect();
    let kinds: Vec<&str> = demo.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "installed",
            "starting",
            "ready",
            "exited",
            "restarting",
            "starting",
            "ready"
        ]
    );
    let exited = &demo[3];
    assert_eq!(exited["exit"]["code"], 5);
    assert!(
        exited["stderr"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("crashing on request")),
        "{exited}"
    );
    let restarting = &demo[4];
    assert_eq!(restarting["attempt"], 1);
    assert!(
        restarting["delay_ms"].as_u64().unwrap() <= 100,
        "{restarting}"
    );
    assert!(restarting["time_ms"].as_u64().unwrap() >= exited["time_ms"].as_u64().unwrap());

    d.ok(&["uninstall", "demo"]);
    let seen = s.until("the uninstall", |l| {
        l.contains("\"uninstalled\"") && l.contains("\"demo\"")
    });
    assert!(seen
        .iter()
        .any(|l| l.contains("\"stopped\"") && l.contains("\"demo\"")));
}

#[test]
fn human_events_show_the_crash_stderr() {
    let d = Daemon::start();
    let s = events(&d, &["events"]);
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let _ = d.cli(&["call", "demo", "crash"]);
    s.until("the exited event", |l| {
        l.contains("default/demo exited: process") && l.contains("(exit code 3)")
    });
    s.until("its stderr", |l| {
        l.starts_with("    | ") && l.contains("demo: crashing on request")
    });
}

#[test]
fn logs_follow_prints_new_lines() {
    let d = Daemon::start();
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let s = Stream::start(&d, &["logs", "demo", "-f", "-n", "5"]);
    s.until("the existing tail", |l| l.contains("demo: starting"));
    let _ = d.cli(&["call", "demo", "crash", r#"{"code":7}"#]);
    s.until("the crash line", |l| {
        l.contains("crashing on request with exit code 7")
    });
    s.until("the restarted bundle's first line", |l| {
        l.contains("demo: starting")
    });
}

#[test]
fn bundle_logs_rotate_by_size() {
    let d = Daemon::start_with("[logs]\nmax_bytes = 1024\nkeep = 2\n");
    let noisy = common::shell_wrapped_demo(
        &d.root().join("bundles"),
        "noisy",
        "for i in $(seq 1 300); do echo \"noise line $i\" >&2; done;",
    );
    d.ok(&["install", noisy.to_str().unwrap()]);
    let log = d.state.join("logs/default/noisy.log");
    let rotated = |n: u32| d.state.join(format!("logs/default/noisy.log.{n}"));
    // The demo's own first line comes after the 300 noise lines: once `logs`
    // shows it, capture is complete.
    common::wait_for(Duration::from_secs(10), "capture to catch up", || {
        let tail = d.ok(&["logs", "noisy", "-n", "2"]);
        (tail.contains("noise line 300") && tail.contains("demo: starting")).then_some(())
    });
    assert!(rotated(1).exists() && rotated(2).exists());
    assert!(!rotated(3).exists(), "more rotated files than keep = 2");
    for p in [log.clone(), rotated(1), rotated(2)] {
        assert!(
            std::fs::metadata(&p).unwrap().len() <= 1024,
            "{}",
            p.display()
        );
    }
}
