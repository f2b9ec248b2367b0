//! A panicking BundleActor is restarted by its WorkspaceActor; the daemon
//! and the other bundles are unaffected, and no process is leaked.
#![cfg(feature = "fault-injection")]

mod common;

use std::time::Duration;

use common::{wait_for, Daemon};
use serde_json::json;

#[test]
fn a_panicking_bundle_actor_is_restarted_and_its_old_process_killed() {
    let d = Daemon::start();
    let victim = d.demo_bundle("victim");
    let bystander = d.demo_bundle("bystander");
    d.ok(&["install", victim.to_str().unwrap()]);
    d.ok(&["install", bystander.to_str().unwrap()]);
    let old_pid = d.bundle("default", "victim").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let bystander_pid = d.bundle("default", "bystander").unwrap()["pid"]
        .as_u64()
        .unwrap();

    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "debug.panic_bundle_actor", json!({"name": "victim"}));
    assert!(r.get("result").is_some(), "{r}");

    let b = wait_for(Duration::from_secs(20), "the victim to come back", || {
        d.bundle("default", "victim")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(old_pid))
    });
    assert_eq!(b["restarts"], 1);
    let new_pid = b["pid"].as_u64().unwrap() as u32;
    wait_for(
        Duration::from_secs(10),
        "the old process to be killed",
        || {
            let mut procs = d.bundle_processes();
            procs.sort();
            let mut want = vec![new_pid, bystander_pid as u32];
            want.sort();
            (procs == want).then_some(())
        },
    );
    assert_eq!(
        d.ok(&["call", "victim", "echo", r#"{"text":"alive"}"#])
            .trim(),
        "alive"
    );
    assert_eq!(
        d.bundle("default", "bystander").unwrap()["pid"].as_u64(),
        Some(bystander_pid)
    );
    assert!(d.log().contains("bundle actor failed"));
}

/// Issue 16, finding 2: the actor that replaces a panicked one goes on
/// counting where it stopped (one restart for the crash, one for the panic).
#[test]
fn a_panicked_actor_keeps_the_bundles_restart_count() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("victim").to_str().unwrap()]);
    let first = d.bundle("default", "victim").unwrap()["pid"].as_u64();
    let _ = d.cli(&["call", "victim", "crash", "{}"]);
    let b = wait_for(Duration::from_secs(10), "the crash restart", || {
        d.bundle("default", "victim")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != first)
    });
    assert_eq!(b["restarts"], 1);
    let second = b["pid"].as_u64();
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(1, "debug.panic_bundle_actor", json!({"name": "victim"}));
    assert!(r.get("result").is_some(), "{r}");
    let b = wait_for(Duration::from_secs(20), "the victim to come back", || {
        d.bundle("default", "victim")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != second)
    });
    assert_eq!(b["restarts"], 2, "{b}");
    let metrics = d.ok(&["metrics"]);
    assert!(
        metrics.contains(
            "bundlevisor_bundle_restarts_total{workspace=\"default\",bundle=\"victim\"} 2"
        ),
        "{metrics}"
    );
}
