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

/// The escaper bundle (installed from `bundle`) with its three escapees:
/// a restart takes the first generation's (the second's are there), an
/// uninstall leaves none; then it is installed again, escapees and all.
fn restart_and_uninstall_take_every_escapee(d: &Daemon, bundle: &Path) {
    wait_escapees(&d.root(), 3, "the three escapees");
    let before = escapees(&d.root());
    d.ok(&["restart", "escaper"]);
    wait_for(Duration::from_secs(15), "a new generation", || {
        let now = escapees(&d.root());
        (now.len() == 3 && now.iter().all(|p| !before.contains(p))).then_some(())
    });
    d.ok(&["uninstall", "escaper"]);
    wait_escapees(&d.root(), 0, "no escapee after the uninstall");
    d.ok(&["install", bundle.to_str().unwrap()]);
    wait_escapees(&d.root(), 3, "the escapees again");
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
    restart_and_uninstall_take_every_escapee(&d, &bundle);

    // Daemon SIGTERM: nothing left, and no cgroup of this daemon.
    let cgroup = d.bundle("default", "escaper").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(d.signal(Signal::SIGTERM).success());
    wait_escapees(&d.root(), 0, "no escapee after the daemon stopped");
    let instance = Path::new(&cgroup).parent().unwrap().parent().unwrap();
    assert!(!instance.exists(), "{} is left", instance.display());
}

/// Without a cgroup (a container whose cgroup filesystem is read-only, as
/// deploy/base's pod), a bundle under a uid of its own is still stopped
/// whole: every process of its uid is killed with it. Before, the three
/// escapees outlived every restart and the uninstall.
#[test]
fn without_a_cgroup_escapees_of_an_own_uid_bundle_die_on_restart_uninstall_and_daemon_sigterm() {
    if !nix::unistd::geteuid().is_root() {
        return; // bundles share the daemon's uid: nothing tells theirs apart
    }
    let mut d = Daemon::start_with("[sandbox]\ncgroups = \"off\"\n");
    let bundle = shell_wrapped_demo(&d.root().join("src"), "escaper", ESCAPE);
    d.ok(&["install", bundle.to_str().unwrap()]);
    let b = d.bundle("default", "escaper").unwrap();
    let containment = b["sandbox"]["containment"].as_str().unwrap().to_string();
    assert!(
        containment.starts_with("process group and own uid"),
        "{containment}"
    );
    restart_and_uninstall_take_every_escapee(&d, &bundle);
    assert!(d.signal(Signal::SIGTERM).success());
    wait_escapees(&d.root(), 0, "no escapee after the daemon stopped");
}

/// Without a cgroup, a restart while the bundle is still starting: the
/// superseded start is dropped, and the kill of its uid (which lands a
/// moment later) must not take the next process, which runs under the same
/// uid, with it. The next start waits until that kill is done.
#[test]
fn without_a_cgroup_a_restart_during_the_start_leaves_the_new_process_alone() {
    if !nix::unistd::geteuid().is_root() {
        return; // bundles share the daemon's uid: nothing is killed by uid
    }
    let d = Daemon::start_with("[sandbox]\ncgroups = \"off\"\n");
    // A start that takes a moment: the process is there, not ready yet.
    let bundle = shell_wrapped_demo(&d.root().join("src"), "slow", "sleep 0.5 ;");
    // Its shell, sleeping before it becomes the demo server: a start that
    // has its process and is not ready yet.
    let starting = || {
        common::processes_with_cwd_under(&d.root())
            .into_iter()
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"sleep\x000.5"))
            })
    };
    d.ok(&["install", "--no-wait", bundle.to_str().unwrap()]);
    let mut sleeper = wait_for(Duration::from_secs(10), "the first start", starting);
    for round in 0..4 {
        // From the second round on, a restart in the background begins a
        // start, and this one supersedes it.
        let background = (round > 0).then(|| {
            let mut cli = std::process::Command::new(common::BIN);
            cli.arg("--socket").arg(&d.socket).args(["restart", "slow"]);
            std::thread::spawn(move || cli.output())
        });
        if round > 0 {
            sleeper = wait_for(Duration::from_secs(10), "a new start", || {
                starting().filter(|pid| *pid != sleeper)
            });
        }
        let out = d.cli(&["restart", "slow"]);
        assert!(
            out.status.success(),
            "round {round}: the start after a restart during the start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.log()
        );
        if let Some(b) = background {
            let _ = b.join();
        }
    }
    let b = d.wait_state("default", "slow", "ready");
    let pid = b["pid"].as_u64().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "{b:#}");
}

/// The daemon's reaper helper (`bundlevisor __reap STATE_DIR`).
fn reaper_of(d: &Daemon) -> u32 {
    let state = d.root().join("state");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("__reap") && c.contains(state.to_str().unwrap())
            })
        })
        .expect("the daemon's reaper")
}

#[test]
fn a_sigkilled_daemons_bundles_and_cgroups_are_removed_by_the_reaper() {
    let mut d = Daemon::start();
    let bundle = shell_wrapped_demo(&d.root().join("src"), "escaper", ESCAPE);
    d.ok(&["install", bundle.to_str().unwrap()]);
    wait_escapees(&d.root(), 3, "the three escapees");
    let cgroup = d.bundle("default", "escaper").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    d.signal(Signal::SIGKILL);
    // The reaper kills the group and the cgroup (the setsid ones too), and
    // removes the cgroup with its workspace and instance folders.
    wait_escapees(&d.root(), 0, "no escapee after the daemon was killed");
    let instance = Path::new(&cgroup)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    wait_for(Duration::from_secs(10), "the cgroups removed", || {
        (!instance.exists()).then_some(())
    });
}

/// Daemon and reaper both SIGKILLed (an OOM kill of the whole unit, say):
/// the setsid escapees survive in the bundle's cgroup, and the next start
/// kills them and removes it before it starts the bundle afresh.
#[test]
fn the_next_start_removes_what_a_killed_daemon_and_reaper_left() {
    let mut d = Daemon::start();
    let bundle = shell_wrapped_demo(&d.root().join("src"), "escaper", ESCAPE);
    d.ok(&["install", bundle.to_str().unwrap()]);
    wait_escapees(&d.root(), 3, "the three escapees");
    let reaper = reaper_of(&d);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(reaper as i32), Signal::SIGKILL).unwrap();
    let survivors = escapees(&d.root());
    d.signal(Signal::SIGKILL);
    assert_eq!(escapees(&d.root()), survivors, "nothing killed them");
    d.launch();
    d.wait_state("default", "escaper", "ready");
    assert!(
        d.log()
            .contains("removed a bundle cgroup an earlier daemon left behind"),
        "{}",
        d.log()
    );
    wait_for(Duration::from_secs(15), "only the new generation", || {
        let now = escapees(&d.root());
        (now.len() == 3 && now.iter().all(|p| !survivors.contains(p))).then_some(())
    });
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

/// Issue 30, finding 15: a daemon whose config caps nothing still caps
/// each bundle, at 256 processes and 1 GiB: a bundle that forks 400
/// sleepers once it is up gets no more than the cap.
#[test]
fn a_bundle_is_capped_by_default_without_any_configured_limit() {
    let d = Daemon::start();
    let forks = "( sleep 0.5 ; i=0 ; while [ $i -lt 400 ] ; do sleep 3010 & i=$((i+1)) ; done ) 2>/dev/null & ";
    let bundle = shell_wrapped_demo(&d.root().join("src"), "forker", forks);
    d.ok(&["install", bundle.to_str().unwrap()]);
    // It comes near the cap and never past it.
    let count = || common::processes_with_cwd_under(&d.root()).len();
    wait_for(Duration::from_secs(15), "the forker near its cap", || {
        (count() >= 200).then_some(())
    });
    for _ in 0..40 {
        let n = count();
        assert!(
            n <= 256,
            "{n} processes in a bundle capped at 256 by default"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let b = d.bundle("default", "forker").unwrap();
    let limits = b["sandbox"]["limits"].as_array().unwrap();
    assert!(limits.iter().any(|l| l == "pids.max 256"), "{limits:?}");
    assert!(
        limits.iter().any(|l| l == "memory.max 1073741824"),
        "{limits:?}"
    );
    d.ok(&["uninstall", "forker"]);
    wait_for(
        Duration::from_secs(15),
        "nothing left of the forker",
        || (count() == 0).then_some(()),
    );
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

/// The cgroup v2 mount of this host (`/sys/fs/cgroup` or, on a hybrid
/// host, `/sys/fs/cgroup/unified`).
fn v2_mount() -> std::path::PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = mounts
        .lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|r| r.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split(' ').nth(4))
        .expect("a cgroup v2 hierarchy is mounted");
    std::path::PathBuf::from(point)
}

/// Under systemd with `Delegate=yes` the daemon starts in a cgroup of its
/// own: it moves itself into `OWN/daemon` and puts bundles below
/// `OWN/bundlevisor`. `[sandbox] cgroup_root` puts them where it says.
#[test]
fn bundles_go_below_a_delegated_cgroup_or_the_configured_root() {
    let own = v2_mount().join(format!("bv-test-{}", std::process::id()));
    std::fs::create_dir_all(&own).unwrap();
    let mut d = Daemon::unlaunched("");
    d.cgroup = Some(own.clone());
    d.launch();
    let daemon_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", d.pid())).unwrap();
    let own_name = own.file_name().unwrap().to_str().unwrap();
    assert!(
        daemon_cgroup.contains(&format!("0::/{own_name}/daemon")),
        "{daemon_cgroup}"
    );
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let cgroup = d.bundle("default", "demo").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        cgroup.starts_with(own.join("bundlevisor").to_str().unwrap())
            && cgroup.contains("/w-default/b-demo/g"),
        "{cgroup}"
    );
    assert!(d.signal(Signal::SIGTERM).success());
    assert!(!Path::new(&cgroup).exists());
    for leftover in ["daemon", "bundlevisor"] {
        let _ = std::fs::remove_dir_all(own.join(leftover));
        let _ = std::fs::remove_dir(own.join(leftover));
    }
    std::fs::remove_dir(&own).unwrap();

    let root = v2_mount().join(format!("bv-root-{}", std::process::id()));
    let d = Daemon::start_with(&format!(
        "[sandbox]\ncgroup_root = \"{}\"\n",
        root.display()
    ));
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let cgroup = d.bundle("default", "demo").unwrap()["sandbox"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cgroup.starts_with(root.to_str().unwrap()), "{cgroup}");
    // Killed: its reaper kills the bundle and removes every folder of it.
    drop(d);
    let instance = Path::new(&cgroup).ancestors().nth(3).unwrap().to_path_buf();
    wait_for(
        Duration::from_secs(10),
        "the killed daemon's cgroups removed",
        || (!instance.exists()).then_some(()),
    );
    std::fs::remove_dir(&root).unwrap();
}

/// `[sandbox] cgroups = "off"`: process groups only, and `status` says
/// what that means and which limits are not in force.
#[test]
fn without_a_cgroup_status_says_so() {
    let d = Daemon::start_with("[sandbox]\ncgroups = \"off\"\npids_max = 10\n");
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let b = d.bundle("default", "demo").unwrap();
    let containment = b["sandbox"]["containment"].as_str().unwrap();
    // Under a uid of its own, the uid holds what left the group.
    let holds = if nix::unistd::geteuid().is_root() {
        "process group and own uid"
    } else {
        "process group only"
    };
    assert!(
        containment.starts_with(holds) && containment.contains("setsid"),
        "{containment}"
    );
    assert!(b["sandbox"]["cgroup"].is_null(), "{b:#}");
    // A bundle under a uid of its own (a root daemon) keeps pids_max as
    // that uid's RLIMIT_NPROC; under the daemon's uid nothing replaces it.
    let pids = if nix::unistd::geteuid().is_root() {
        "pids_max: 10 as RLIMIT_NPROC of the bundle's own uid (no cgroup)"
    } else {
        "pids_max: not in force (no cgroup)"
    };
    assert_eq!(
        b["sandbox"]["limits"],
        serde_json::json!(["memory_max: not in force (no cgroup)", pids])
    );
}

/// Without a cgroup (a container whose cgroup filesystem is read-only, as
/// deploy/base's pod), a fork bomb in a bundle under a uid of its own is
/// still capped at pids_max: by its uid's RLIMIT_NPROC. Before, nothing
/// capped it.
#[test]
fn without_a_cgroup_a_fork_bomb_is_capped_by_its_own_uid() {
    if !nix::unistd::geteuid().is_root() {
        return; // bundles share the daemon's uid: no per-bundle count
    }
    let d = Daemon::start_with("[sandbox]\ncgroups = \"off\"\npids_max = 24\n");
    // 100 sleepers from the background: the shell says "Cannot fork" and
    // gives up at the first fork refused, or "forks done" after all 100.
    let bomb = "( i=0 ; while [ $i -lt 100 ] ; do sleep 3011 & i=$((i+1)) ; done ; echo forks done >&2 ) & ";
    let bundle = shell_wrapped_demo(&d.root().join("src"), "bomb", bomb);
    d.ok(&["install", bundle.to_str().unwrap()]);
    let said = wait_for(Duration::from_secs(30), "the bomb's end", || {
        let logs = d.ok(&["logs", "bomb"]);
        (logs.contains("Cannot fork") || logs.contains("forks done")).then_some(logs)
    });
    assert!(said.contains("Cannot fork"), "{said}");
    let count = || common::processes_with_cwd_under(&d.root()).len();
    let n = count();
    assert!(n <= 24, "{n} processes in a bundle capped at 24");
    assert!(d.ok(&["status"]).contains("bomb"));
    d.ok(&["uninstall", "bomb"]);
    wait_for(Duration::from_secs(15), "nothing left of the bomb", || {
        (count() == 0).then_some(())
    });
}

/// A bundle under a uid of its own owns its stdin and stdout pipes, so it
/// can reopen them through /proc/self/fd and poll them (the demo bundle's
/// `stdio::stdio` does; a pipe the daemon made stayed the daemon's, and the
/// bundle fell back to tokio's stdio: two thread hand-offs a message,
/// ≈ 35 µs a call in `make bench`).
#[test]
fn a_bundle_owns_its_stdio_pipes_and_polls_them() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return; // bundles run under the daemon's own uid then
    }
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let b = d.bundle("default", "demo").unwrap();
    let (pid, uid) = (
        b["pid"].as_u64().unwrap(),
        b["sandbox"]["uid"].as_u64().unwrap(),
    );
    assert_ne!(uid, 0, "{b}");
    for fd in [0, 1] {
        let pipe = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(
            u64::from(pipe.uid()),
            uid,
            "fd {fd} of the bundle is not its own"
        );
    }
    // And the bundle reopened both: each pipe is open twice in it.
    let links: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .collect();
    for fd in [0, 1] {
        let pipe = std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
            .unwrap()
            .display()
            .to_string();
        assert_eq!(
            links.iter().filter(|l| **l == pipe).count(),
            2,
            "fd {fd} ({pipe}) not reopened: {links:?}"
        );
    }
}

/// A bundle's cgroup folder is made in its workspace's, which holds the
/// hierarchy's control files: a bundle named like one (`tasks` in every
/// cgroup v1 folder, `cgroup.procs` in every one) still starts.
#[test]
fn a_bundle_named_like_a_cgroup_control_file_starts() {
    let d = Daemon::start();
    for name in ["tasks", "cgroup.procs", "notify_on_release"] {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
        let b = d.wait_state("default", name, "ready");
        let cgroup = b["sandbox"]["cgroup"].as_str().unwrap_or_default();
        assert!(cgroup.contains(&format!("/b-{name}/g")), "{b}");
    }
}

/// A bundle starts with its stdio and nothing else of the daemon's: the
/// daemon's child takes a descriptor table of its own holding only the
/// reserved block's numbers (issue 37, point 4: it used to copy the
/// daemon's whole table, 12,000 descriptors at 2,000 bundles, and close
/// each one), and the block is back to placeholders once it has.
#[test]
fn a_bundle_starts_with_none_of_the_daemons_descriptors() {
    let d = Daemon::start();
    // The block is reserved (the path under test), a placeholder in each.
    let slot = std::fs::read_link(format!("/proc/{}/fd/64", d.pid())).unwrap();
    assert_eq!(slot, std::path::Path::new("/dev/null"));
    for name in ["one", "two"] {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
    }
    let daemon_fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count();
    assert!(daemon_fds > 20, "{daemon_fds}");
    let said = "ls -l /proc/$$/fd >&2;";
    let bundle = shell_wrapped_demo(&d.root().join("src"), "lister", said);
    d.ok(&["install", bundle.to_str().unwrap()]);
    d.wait_state("default", "lister", "ready");
    let logs = wait_for(Duration::from_secs(10), "the listing", || {
        let logs = d.ok(&["logs", "lister"]);
        logs.contains(" 2 -> ").then_some(logs)
    });
    // `ls -l` of the shell's: each `N -> what`. The shell keeps its own
    // stdout at 10 while its stderr is the listing's stdout.
    let open: Vec<(u32, &str)> = logs
        .lines()
        .filter_map(|l| {
            let (head, target) = l.split_once(" -> ")?;
            Some((head.rsplit(' ').next()?.parse().ok()?, target))
        })
        .collect();
    let fds: Vec<u32> = open.iter().map(|(fd, _)| *fd).collect();
    assert!(
        fds.iter().all(|fd| [0, 1, 2, 3, 10].contains(fd)),
        "{open:?}\n{logs}"
    );
    assert!(
        open.iter()
            .any(|(fd, target)| *fd == 3 && target.starts_with("socket:")),
        "the host channel: {open:?}"
    );
    let slots: Vec<_> = (64..80)
        .map(|fd| std::fs::read_link(format!("/proc/{}/fd/{fd}", d.pid())).unwrap())
        .collect();
    assert!(
        slots.iter().all(|s| s == std::path::Path::new("/dev/null")),
        "{slots:?}"
    );
}
