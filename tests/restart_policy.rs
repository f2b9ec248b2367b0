//! Restart policies, backoff, the crash-loop breaker and liveness checks,
//! with real crashing and hanging bundle processes.

mod common;

use std::time::{Duration, Instant};

use common::{wait_for, Daemon};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn pid_of(d: &Daemon, name: &str) -> u64 {
    d.bundle("default", name).unwrap()["pid"].as_u64().unwrap()
}

#[test]
fn a_crashed_bundle_is_restarted_quickly_and_serves_again() {
    let d = Daemon::start();
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let old = pid_of(&d, "demo");
    let crashed = Instant::now();
    let _ = d.cli(&["call", "demo", "crash"]);
    let back = wait_for(
        Duration::from_secs(10),
        "the bundle back with a new pid",
        || {
            d.bundle("default", "demo")
                .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(old))
        },
    );
    assert!(
        crashed.elapsed() < Duration::from_secs(3),
        "restart took {:?}",
        crashed.elapsed()
    );
    assert_eq!(back["restarts"], 1);
    assert_eq!(
        d.ok(&["call", "demo", "echo", r#"{"text":"again"}"#])
            .trim(),
        "again"
    );
    assert_eq!(d.bundle_processes().len(), 1);
}

#[test]
fn a_crash_loop_trips_the_breaker_while_a_neighbour_keeps_answering() {
    let d = Daemon::start_with(
        "[supervision]\nmax_restarts = 3\nrestart_window = \"30s\"\nbackoff_initial = \"20ms\"\n",
    );
    let neighbour = d.demo_bundle("neighbour");
    d.ok(&["install", neighbour.to_str().unwrap()]);
    // Starts, then dies 100 ms later, every time.
    let looping = common::shell_wrapped_demo(
        &d.root().join("bundles"),
        "looping",
        "(sleep 0.1; kill $$) &",
    );
    let out = d.cli(&["install", looping.to_str().unwrap(), "--no-wait"]);
    assert!(out.status.success());
    let neighbour_pid = pid_of(&d, "neighbour");
    // Every poll also proves the neighbour answers while the loop runs.
    let failed = wait_for(Duration::from_secs(20), "the breaker to trip", || {
        assert_eq!(
            d.ok(&["call", "neighbour", "add", r#"{"a":1,"b":1}"#])
                .trim(),
            "2"
        );
        d.bundle("default", "looping")
            .filter(|b| b["state"] == "failed")
    });
    let reason = failed["last_error"].as_str().unwrap();
    assert!(
        reason.contains("crash loop: 3 restarts within 30s"),
        "{reason}"
    );
    assert_eq!(failed["restarts"], 3);
    let neighbour = d.bundle("default", "neighbour").unwrap();
    assert_eq!(
        (neighbour["restarts"].as_u64(), neighbour["pid"].as_u64()),
        (Some(0), Some(neighbour_pid))
    );
    // Only the neighbour runs: nothing of the loop is left.
    wait_for(
        Duration::from_secs(5),
        "the loop's processes to be gone",
        || (d.bundle_processes().len() == 1).then_some(()),
    );
    // An operator restart clears the breaker.
    let out = d.cli(&["restart", "looping"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ready"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A daemon with a quick liveness check and a demo bundle that hangs (a
/// stopped process answers nothing); returns the hung process's pid.
fn hung_bundle() -> (Daemon, u64) {
    let d = Daemon::start_with(
        "[supervision]\nping_interval = \"100ms\"\nping_timeout = \"300ms\"\nping_failures = 2\n",
    );
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    let old = pid_of(&d, "demo");
    kill(Pid::from_raw(old as i32), Signal::SIGSTOP).unwrap();
    (d, old)
}

#[test]
fn a_hung_bundle_is_killed_and_restarted_by_the_liveness_check() {
    let (d, old) = hung_bundle();
    let back = wait_for(
        Duration::from_secs(20),
        "the hung bundle to be replaced",
        || {
            d.bundle("default", "demo")
                .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(old))
        },
    );
    assert_eq!(back["restarts"], 1);
    assert!(
        common::is_zombie(old as u32) || !std::path::Path::new(&format!("/proc/{old}")).exists()
    );
    assert!(
        d.log().contains("liveness check failed: 2 pings in a row"),
        "{}",
        d.log()
    );
}

#[test]
fn a_slow_tool_call_does_not_trip_the_liveness_check() {
    let d = Daemon::start_with(
        "[supervision]\nping_interval = \"100ms\"\nping_timeout = \"1s\"\nping_failures = 2\n",
    );
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    // The call times out; the bundle still answers pings, so it is not restarted.
    let out = d.cli(&[
        "call",
        "demo",
        "sleep",
        r#"{"ms":1500}"#,
        "--timeout",
        "300ms",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = d.ok(&["call", "demo", "sleep", r#"{"ms":800}"#]);
    assert_eq!(out.trim(), "slept 800 ms");
    assert_eq!(d.bundle("default", "demo").unwrap()["restarts"], 0);
}

#[test]
fn a_clean_exit_under_on_failure_is_stopped_and_under_always_restarts() {
    let d = Daemon::start_with(
        "[[supervision.override]]\nbundle = \"forever\"\nrestart = \"always\"\n",
    );
    let once = d.demo_bundle("once");
    let forever = d.demo_bundle("forever");
    d.ok(&["install", once.to_str().unwrap()]);
    d.ok(&["install", forever.to_str().unwrap()]);
    let old = pid_of(&d, "forever");
    let _ = d.cli(&["call", "once", "crash", r#"{"code":0}"#]);
    let _ = d.cli(&["call", "forever", "crash", r#"{"code":0}"#]);
    let stopped = d.wait_state("default", "once", "stopped");
    assert!(stopped["last_error"].is_null(), "{stopped}");
    wait_for(Duration::from_secs(10), "forever to come back", || {
        d.bundle("default", "forever")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(old))
    });
}

/// Issue 16, finding 1: why the daemon killed a session belongs to that
/// session. An operator restart during a hung bundle's grace period, then a
/// crash of the new process: the crash is reported as a crash.
#[test]
fn a_liveness_kill_never_explains_a_later_sessions_crash() {
    let (d, old) = hung_bundle();
    wait_for(
        Duration::from_secs(10),
        "the liveness check to give up",
        || d.log().contains("liveness check failed").then_some(()),
    );
    let out = d.cli(&["restart", "demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = pid_of(&d, "demo");
    assert_ne!(new, old);
    let _ = d.cli(&["call", "demo", "crash", "{}"]);
    wait_for(Duration::from_secs(10), "the crash restart", || {
        d.bundle("default", "demo")
            .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != Some(new))
    });
    let log = d.log();
    assert!(
        log.contains(
            "process exited (exit code 3): demo: crashing on request with exit code 3; restarting"
        ),
        "{log}"
    );
    assert!(
        !log.contains("; process exit code 3"),
        "the crash was blamed on the earlier liveness kill:\n{log}"
    );
}
