//! SIGTERM stops every bundle — grandchildren and bundles that ignore
//! SIGTERM included — removes the socket and exits 0.

mod common;

use std::time::{Duration, Instant};

use common::{wait_for, Daemon};
use nix::sys::signal::Signal;

fn wrapped_demo(d: &Daemon, name: &str, prefix: &str) -> std::path::PathBuf {
    common::shell_wrapped_demo(&d.root().join("bundles"), name, prefix)
}

#[test]
fn sigterm_leaves_no_process_behind() {
    let mut d = Daemon::start();
    let plain = d.demo_bundle("plain");
    // A bundle that started a grandchild (sharing no pipes with us).
    let forks = wrapped_demo(&d, "forks", "sleep 1000 </dev/null >/dev/null 2>&1 &");
    // A bundle that ignores SIGTERM and forks a grandchild that ignores it
    // too: only SIGKILL of the group after the grace period ends them.
    let stubborn = wrapped_demo(
        &d,
        "stubborn",
        "trap '' TERM; sleep 1000 </dev/null >/dev/null 2>&1 &",
    );
    for b in [&plain, &forks, &stubborn] {
        d.ok(&["install", b.to_str().unwrap()]);
    }
    // demo x3 plus two sleeping grandchildren (one ignores SIGTERM).
    wait_for(Duration::from_secs(10), "five processes", || {
        (d.bundle_processes().len() == 5).then_some(())
    });

    let started = Instant::now();
    let status = d.signal(Signal::SIGTERM);
    assert!(status.success(), "daemon exit status {status}");
    let took = started.elapsed();
    assert!(
        d.bundle_processes().is_empty(),
        "left behind: {:?}",
        d.bundle_processes()
    );
    assert!(!d.socket.exists(), "socket not removed");
    wait_for(Duration::from_secs(5), "the reaper helper to exit", || {
        helpers_of(&d).is_empty().then_some(())
    });
    // The stubborn bundle held shutdown for about the 2 s grace period, not longer.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "shutdown took {took:?}"
    );
    assert!(d.log().contains("ignored SIGTERM"), "{}", d.log());
}

#[test]
fn uninstall_kills_the_bundles_grandchildren() {
    let d = Daemon::start();
    let forks = wrapped_demo(&d, "forks", "sleep 1000 </dev/null >/dev/null 2>&1 &");
    d.ok(&["install", forks.to_str().unwrap()]);
    wait_for(Duration::from_secs(10), "bundle and grandchild", || {
        (d.bundle_processes().len() == 2).then_some(())
    });
    d.ok(&["uninstall", "forks"]);
    assert!(
        d.bundle_processes().is_empty(),
        "left behind: {:?}",
        d.bundle_processes()
    );
}

#[test]
fn a_crashed_bundles_grandchild_is_killed_with_its_group() {
    let d = Daemon::start_with("[supervision]\nrestart = \"never\"\n");
    let forks = wrapped_demo(&d, "forks", "sleep 1000 </dev/null >/dev/null 2>&1 &");
    d.ok(&["install", forks.to_str().unwrap()]);
    wait_for(Duration::from_secs(10), "bundle and grandchild", || {
        (d.bundle_processes().len() == 2).then_some(())
    });
    let _ = d.cli(&["call", "forks", "crash"]);
    d.wait_state("default", "forks", "failed");
    wait_for(Duration::from_secs(10), "the group to be gone", || {
        d.bundle_processes().is_empty().then_some(())
    });
}

/// Processes whose command line mentions this test's temp dir (the reaper
/// helper names the state dir it serves).
fn helpers_of(d: &Daemon) -> Vec<u32> {
    let root = d.root().display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains(&root) && !common::is_zombie(*pid)
        })
        .collect()
}

#[test]
fn sigkill_of_the_daemon_takes_bundles_and_their_grandchildren_down() {
    let mut d = Daemon::start();
    let forks = wrapped_demo(&d, "forks", "sleep 1000 </dev/null >/dev/null 2>&1 &");
    let plain = d.demo_bundle("plain");
    d.ok(&["install", forks.to_str().unwrap()]);
    d.ok(&["install", plain.to_str().unwrap()]);
    wait_for(Duration::from_secs(10), "three processes", || {
        (d.bundle_processes().len() == 3).then_some(())
    });
    d.signal(Signal::SIGKILL);
    wait_for(
        Duration::from_secs(10),
        "every bundle process, grandchild included, to die",
        || d.bundle_processes().is_empty().then_some(()),
    );
    wait_for(Duration::from_secs(10), "the reaper to exit", || {
        helpers_of(&d).is_empty().then_some(())
    });
}
