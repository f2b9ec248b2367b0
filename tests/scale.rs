//! One node at scale: what the daemon raises and reports about its own
//! limits at start (docs/scaling.md).

mod common;

use common::{demo_bundle_at, wait_for, Daemon};
use std::time::Duration;

/// The soft open-files limit of a running process, from /proc.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn the_open_files_limit_is_raised_to_its_hard_limit_and_a_short_one_is_said() {
    let mut d = Daemon::unlaunched("");
    d.nofile = Some((512, 4096));
    d.launch();
    assert_eq!(soft_nofile(d.pid()), 4096);
    wait_for(Duration::from_secs(10), "the raise logged", || {
        d.log()
            .contains("open-files limit raised to its hard limit")
            .then_some(())
    });
    // One bundle installed; a restart under a hard limit that holds the
    // daemon and it says nothing, one that cannot says so at boot, with
    // what is needed.
    let dir = demo_bundle_at(&d.root().join("bundles"), "one");
    d.ok(&["install", dir.to_str().unwrap()]);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.launch();
    d.wait_state("default", "one", "ready");
    assert!(!d.log().contains("too low"), "{}", d.log());
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.nofile = Some((256, 256));
    d.launch();
    let log = wait_for(Duration::from_secs(10), "the warning", || {
        let log = d.log();
        log.contains("open-files limit is too low").then_some(log)
    });
    assert!(
        log.contains("needed=272") && log.contains("limit=256"),
        "{log}"
    );
}
