//! Issue 19: every bundle in a cgroup of its own. Descendants that leave
//! the bundle's process group (`setsid`, double forks, daemonizing) die
//! with it on every kill path; a fork bomb is capped by `pids.max`; a
//! memory hog is stopped by `memory.max`, and the reason is shown.
//!
//! These run on the machine's real cgroups (v2, or a v1/v2 hybrid as on
//! CI); a host without a writable cgroup fails them, as it should.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{shell_wrapped_demo, wait_for, Daemon};
use nix::sys::signal::Signal;

/// Starts three escapees before the demo server: a `setsid` sleeper, a
/// double-forked one, and a daemonizing shell's sleeper (its parent exits).
const ESCAPE: &str = "( setsid sleep 3001 & ) ; ( setsid sh -c 'sleep 3002 & exit 0' & ) ; sh -c '( setsid sleep 3003 & ) ; exit 0' ;";

/// Processes whose command line is `sleep 300N`, with their working folder
/// under `root` (the escapees of this test's bundles only).
fn escapees(root: &Path) -> Vec<u32> {
    common::processes_with_cwd_under(root)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"sleep\x00300"))
        })
        .collect()
}

fn wait_escapees(root: &Path, n: usize, what: &str) {
    wait_for(Duration::from_secs(15), what, || {
        (escapees(root).len() == n).then_some(())
    });
}

#[test]
fn setsid_and_double_forked_descendants_die_on_restart_uninstall_and_daemon_sigterm() {
    let mut d = Daemon::start();
    let bundle = shell_wrapped_demo(&d.root().join("src"), "escaper", ESCAPE);
    d.ok(&["install", bundle.to_str().unwrap()]);
    let b = d.bundle("default", "escaper").unwrap();
    let containment = b["sandbox"]["containment"].as_str().unwrap().to_string();
    assert!(containment.starts_with("cgroup"), "{containment}");
    assert!(b["sandbox"]["cgroup"].as_str().is_some(), "{b:#}");
    wait_escapees(&d.root(), 3, "the three escapees");

    // Restart: the first generation's escapees go, the second's are there.
    let before = escapees(&d.root());
    d.ok(&["restart", "escaper"]);
    wait_for(Duration::from_secs(15), "a new generation", || {
        let now = escapees(&d.root());
        (now.len() == 3 && now.iter().all(|p| !before.contains(p))).then_some(())
    });

    // Uninstall: nothing left.
    d.ok(&["uninstall", "escaper"]);
    wait_escapees(&d.root(), 0, "no escapee after the uninstall");

    // Daemon SIGTERM: nothing left, and no cgroup of this daemon.
    d.ok(&["install", bundle.to_str().unwrap()]);
    wait_escapees(&d.root(), 3, "the escapees again");
    let cgroup = d.bundle("default", "escaper").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(d.signal(Signal::SIGTERM).success());
    wait_escapees(&d.root(), 0, "no escapee after the daemon stopped");
    let instance = Path::new(&cgroup).parent().unwrap().parent().unwrap();
    assert!(!instance.exists(), "{} is left", instance.display());
}

#[test]
fn a_sigkilled_daemons_bundles_die_by_the_reaper_and_its_cgroups_go_at_the_next_start() {
    let mut d = Daemon::start();
    let bundle = shell_wrapped_demo(&d.root().join("src"), "escaper", ESCAPE);
    d.ok(&["install", bundle.to_str().unwrap()]);
    wait_escapees(&d.root(), 3, "the three escapees");
    let cgroup = d.bundle("default", "escaper").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    d.signal(Signal::SIGKILL);
    // The reaper kills the group and the cgroup: the setsid ones too.
    wait_escapees(&d.root(), 0, "no escapee after the daemon was killed");
    assert!(
        Path::new(&cgroup).exists(),
        "the killed daemon could not remove it"
    );
    // The next start empties and removes what the killed one left, then
    // starts the bundle afresh.
    d.launch();
    d.wait_state("default", "escaper", "ready");
    assert!(
        d.log()
            .contains("removed a bundle cgroup an earlier daemon left behind"),
        "{}",
        d.log()
    );
    wait_escapees(&d.root(), 3, "the new generation's escapees");
}

#[test]
fn a_fork_bomb_is_capped_by_pids_max_and_the_daemon_is_unharmed() {
    let d = Daemon::start_with("[sandbox]\npids_max = 48\n");
    // From the background, as many sleepers as it can fork, forever.
    let bomb = "( while :; do sleep 3009 & done ) 2>/dev/null & sleep 0.2 ;";
    let bundle = shell_wrapped_demo(&d.root().join("src"), "bomb", bomb);
    d.ok(&["install", bundle.to_str().unwrap()]);
    let b = d.bundle("default", "bomb").unwrap();
    let limits = b["sandbox"]["limits"].as_array().unwrap();
    assert!(limits.iter().any(|l| l == "pids.max 48"), "{limits:?}");
    let cgroup = b["sandbox"]["cgroup"].as_str().unwrap().to_string();
    // It reaches the cap and stays there.
    let count = || common::processes_with_cwd_under(&d.root()).len();
    wait_for(Duration::from_secs(15), "the bomb at its cap", || {
        (count() >= 40).then_some(())
    });
    for _ in 0..20 {
        let n = count();
        assert!(n <= 48, "{n} processes in a bundle capped at 48");
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(d.ok(&["status"]).contains("bomb"));
    d.ok(&["uninstall", "bomb"]);
    wait_for(Duration::from_secs(15), "nothing left of the bomb", || {
        (count() == 0).then_some(())
    });
    assert!(!Path::new(&cgroup).exists());
}

#[test]
fn a_memory_hog_is_stopped_by_memory_max_and_the_reason_is_shown() {
    let d = Daemon::start_with(
        "[sandbox]\n[[sandbox.bundle]]\nbundle = \"hog\"\nmemory_max = 67108864\n\
         [[sandbox.bundle]]\nbundle = \"hungry\"\nmemory_max = 67108864\n\
         [supervision]\n[[supervision.override]]\nbundle = \"hog\"\nrestart = \"never\"\n\
         [[supervision.override]]\nbundle = \"hungry\"\nrestart = \"never\"\n",
    );
    let mut manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.demo_bundle("x").join("manifest.json")).unwrap(),
    )
    .unwrap();
    manifest["name"] = "hog".into();
    manifest["server"]["mcp_config"]["command"] = "/usr/bin/python3".into();
    manifest["server"]["mcp_config"]["args"] = serde_json::json!([
        "-c",
        "import time\nx = bytearray(512 * 1024 * 1024)\ntime.sleep(60)"
    ]);
    let bundle = common::write_bundle(&d.root().join("src"), "hog", &manifest);
    let events = common::events(&d, &["events", "--json"]);
    let out = d.cli(&["install", bundle.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("OOM killer"), "{said}");
    // Killed during its start: the `failed` event says why.
    let seen = events.until("the hog's end", |l| {
        l.contains("\"hog\"")
            && (l.contains("\"kind\":\"exited\"") || l.contains("\"kind\":\"failed\""))
    });
    let ended = seen.last().unwrap();
    assert!(ended.contains("OOM killer"), "{ended}");
    let b = d.wait_state("default", "hog", "failed");
    let why = b["last_error"].as_str().unwrap();
    assert!(
        why.contains("OOM killer") && why.contains("memory_max"),
        "{why}"
    );
    assert!(
        b["sandbox"]["limits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "memory.max 67108864"),
        "{b:#}"
    );
    let metrics = d.ok(&["metrics"]);
    assert!(
        metrics
            .contains("bundlevisor_bundle_oom_kills_total{workspace=\"default\",bundle=\"hog\"} 1"),
        "{metrics}"
    );

    // A ready bundle that outgrows its limit: its `exited` event says so.
    let hungry = d.demo_bundle("hungry");
    d.ok(&["install", hungry.to_str().unwrap()]);
    let _ = d.cli(&["call", "hungry", "hog", r#"{"mib": 256}"#]);
    let seen = events.until("the hungry bundle's exit", |l| {
        l.contains("\"hungry\"") && l.contains("\"kind\":\"exited\"")
    });
    let exited = seen.last().unwrap();
    assert!(
        exited.contains("\"oom_killed\":true") && exited.contains("OOM killer"),
        "{exited}"
    );
    let b = d.wait_state("default", "hungry", "failed");
    assert!(
        b["last_error"].as_str().unwrap().contains("OOM killer"),
        "{b:#}"
    );
    let metrics = d.ok(&["metrics"]);
    assert!(
        metrics.contains(
            "bundlevisor_bundle_oom_kills_total{workspace=\"default\",bundle=\"hungry\"} 1"
        ),
        "{metrics}"
    );
}

#[test]
fn status_shows_the_whole_trees_memory_and_cpu_from_the_cgroup() {
    let d = Daemon::start();
    // A child that holds 48 MiB and spins beside the server.
    let busy = "( /usr/bin/python3 -c 'x = bytearray(48 * 1024 * 1024)\nwhile True: x[0] = (x[0] + 1) % 256' & ) ;";
    let bundle = shell_wrapped_demo(&d.root().join("src"), "busy", busy);
    d.ok(&["install", bundle.to_str().unwrap()]);
    let mut raw = d.raw();
    raw.hello();
    let mut id = 1;
    let mut usage = || {
        id += 1;
        let answer = raw.request(id, "status", serde_json::json!({"usage": true}));
        answer["result"]["bundles"][0]["usage"].clone()
    };
    let first = wait_for(Duration::from_secs(20), "the tree's memory", || {
        let u = usage();
        (u["memory_bytes"].as_u64()? > 48 * 1024 * 1024).then_some(u)
    });
    // The server's own RSS does not count its child; the cgroup does.
    assert!(
        first["rss_bytes"].as_u64().unwrap() < 40 * 1024 * 1024,
        "{first}"
    );
    let cpu = first["cpu_usec"].as_u64().unwrap();
    wait_for(
        Duration::from_secs(20),
        "the tree's CPU time growing",
        || (usage()["cpu_usec"].as_u64()? > cpu + 100_000).then_some(()),
    );
    let metrics = d.ok(&["metrics"]);
    assert!(
        metrics.contains("bundlevisor_bundle_memory_bytes{workspace=\"default\",bundle=\"busy\"}"),
        "{metrics}"
    );
}
