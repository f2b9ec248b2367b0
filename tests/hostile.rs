//! Hostile bundles: each tries something a third-party bundle must not get
//! away with. The daemon must stay responsive, a neighbour bundle must keep
//! answering, nothing may leak, and the attempt must be refused or
//! contained. (Bundles that ignore SIGTERM: tests/shutdown.rs; reading
//! other workspaces' ids: tests/host_resources.rs.)

mod common;

use std::time::Duration;

use common::{demo_bundle_at, shell_wrapped_demo, wait_for, Daemon};
use serde_json::Value;

/// A well-behaved neighbour, installed first.
fn neighbour(d: &Daemon) {
    let dir = d.root().join("bundles");
    d.ok(&[
        "install",
        demo_bundle_at(&dir, "neighbour").to_str().unwrap(),
    ]);
}

fn neighbour_answers(d: &Daemon) {
    assert_eq!(
        d.ok(&["call", "neighbour", "echo", r#"{"text":"still here"}"#])
            .trim(),
        "still here"
    );
}

fn landlock_available() -> bool {
    bundlevisor::bundle::sandbox::landlock_abi().is_ok()
}

fn daemon_peak_rss_kib(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn a_bundle_cannot_read_the_state_dir_etc_shadow_or_another_sandbox() {
    let d = Daemon::start();
    neighbour(&d);
    let bundles = d.root().join("bundles");
    // The neighbour keeps a secret in its own data dir.
    let secret = d.state.join("sandboxes/default/neighbour/data/secret");
    std::fs::write(&secret, "neighbour's secret").unwrap();
    let targets = [
        "/etc/shadow".to_string(),
        d.state.join("state.db").display().to_string(),
        d.state.join("credentials.key").display().to_string(),
        secret.display().to_string(),
        d.root().join("bundlevisor.toml").display().to_string(),
    ];
    let probe = targets
        .iter()
        .map(|t| format!("if cat '{t}' >/dev/null 2>&1; then echo \"READ {t}\" >&2; else echo \"DENIED {t}\" >&2; fi;"))
        .collect::<String>();
    let write_probe = format!(
        "if touch '{}/evil' 2>/dev/null; then echo WROTE-STATE >&2; else echo DENIED-WRITE >&2; fi; echo own > \"$BUNDLEVISOR_DATA_DIR/mine\" && echo WROTE-OWN >&2;",
        d.state.display()
    );
    let folder = shell_wrapped_demo(&bundles, "prober", &format!("{probe}{write_probe}"));
    d.ok(&["install", folder.to_str().unwrap()]);

    let status: Value = d.bundle("default", "prober").unwrap();
    let sandbox = &status["sandbox"];
    assert_eq!(sandbox["sandbox_id"], "default/prober", "{status}");
    assert!(sandbox["strategy"]
        .as_str()
        .unwrap()
        .contains("no_new_privs"));
    let logs = d.ok(&["logs", "prober", "-n", "50"]);
    assert!(
        logs.contains("WROTE-OWN"),
        "its own data dir is writable: {logs}"
    );
    if landlock_available() {
        assert!(
            sandbox["landlock"]
                .as_str()
                .unwrap()
                .starts_with("enforced"),
            "{status}"
        );
        for t in &targets {
            assert!(
                logs.contains(&format!("DENIED {t}")),
                "{t} was readable:\n{logs}"
            );
        }
        assert!(logs.contains("DENIED-WRITE"), "{logs}");
    } else {
        // No silent downgrade: status says so.
        assert!(
            sandbox["landlock"]
                .as_str()
                .unwrap()
                .starts_with("unavailable"),
            "{status}"
        );
    }
    neighbour_answers(&d);
}

#[test]
fn junk_on_stdout_after_start_restarts_the_bundle_with_the_reason() {
    let d = Daemon::start();
    neighbour(&d);
    // Ready first, then a log line on stdout, as a careless server does.
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "chatty",
        "( sleep 0.3; echo 'Server listening on port 8080' ) &",
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    let b = wait_for(
        Duration::from_secs(20),
        "the violation to be reported",
        || {
            d.bundle("default", "chatty").filter(|b| {
                b["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("not an MCP message"))
            })
        },
    );
    let reason = b["last_error"].as_str().unwrap();
    assert!(
        reason.contains("Server listening on port 8080") && reason.contains("stderr"),
        "{reason}"
    );
    assert!(
        b["restarts"].as_u64().unwrap() >= 1 || b["state"] == "restarting",
        "{b}"
    );
    neighbour_answers(&d);
}

#[test]
fn a_100_mb_line_is_cut_the_bundle_restarted_and_daemon_memory_stays_bounded() {
    let d = Daemon::start();
    neighbour(&d);
    let before = daemon_peak_rss_kib(&d);
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "spewer",
        "( sleep 0.3; printf '{'; head -c 104857600 /dev/zero | tr '\\0' x ) &",
    );
    d.ok(&["install", folder.to_str().unwrap()]);
    let b = wait_for(
        Duration::from_secs(30),
        "the overlong message to be reported",
        || {
            d.bundle("default", "spewer").filter(|b| {
                b["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("longer than 16777216 bytes"))
            })
        },
    );
    assert!(b["last_error"]
        .as_str()
        .unwrap()
        .contains("max_message_bytes"));
    let after = daemon_peak_rss_kib(&d);
    assert!(
        after < before + 64 * 1024,
        "the daemon buffered the line: peak RSS {before} KiB -> {after} KiB"
    );
    neighbour_answers(&d);
    d.ok(&["uninstall", "spewer"]);
    wait_for(
        Duration::from_secs(10),
        "the spewer's processes to be gone",
        || {
            common::processes_with_cwd_under(&d.root().join("bundles/spewer"))
                .is_empty()
                .then_some(())
        },
    );
}

/// Live processes of a uid (from /proc).
fn processes_of(uid: u32) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let real_uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        let zombie = status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if real_uid == Some(uid) && !zombie {
            n += 1;
        }
    }
    n
}

#[test]
fn a_fork_loop_run_as_an_unprivileged_user_is_capped_and_cleaned_up() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        // Switching users needs root (CI runs as root). A non-root daemon
        // ignores `user` and says so by not listing it in the strategy.
        let d = Daemon::start_with("[sandbox]\nuser = \"nobody\"\n");
        neighbour(&d);
        let b = d.bundle("default", "neighbour").unwrap();
        let strategy = b["sandbox"]["strategy"].as_str().unwrap();
        assert!(!strategy.contains("user"), "{strategy}");
        return;
    }
    assert_eq!(
        processes_of(NOBODY),
        0,
        "another test or service runs as nobody"
    );
    let d = Daemon::start_with("[sandbox]\nuser = \"nobody\"\nmax_processes = 40\n");
    // The bundle's user must reach its folder and binary.
    for p in [d.root(), d.root().join("bundles")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    neighbour(&d);
    // Forks until the kernel says no (the forking subshell then dies).
    let folder = shell_wrapped_demo(
        &d.root().join("bundles"),
        "forker",
        "( while :; do sleep 60 & done ) 2>/dev/null;",
    );
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.ok(&["install", "--no-wait", folder.to_str().unwrap()]);
    let peak = wait_for(
        Duration::from_secs(20),
        "the fork loop to reach the cap",
        || {
            let n = processes_of(NOBODY);
            (n >= 30).then_some(n)
        },
    );
    assert!(peak <= 40, "RLIMIT_NPROC did not hold: {peak} processes");
    // The sandbox record is in status while the bundle is still starting.
    let b = wait_for(
        Duration::from_secs(10),
        "the forker's sandbox record",
        || {
            d.bundle("default", "forker")
                .filter(|b| b["sandbox"].is_object())
        },
    );
    assert!(
        b["sandbox"]["strategy"]
            .as_str()
            .unwrap()
            .contains("user nobody"),
        "{b}"
    );
    for _ in 0..50 {
        let n = processes_of(NOBODY);
        assert!(n <= 40, "RLIMIT_NPROC did not hold: {n} processes");
    }
    neighbour_answers(&d);
    // The neighbour runs as nobody too: after both uninstalls, nothing of
    // that user may be left.
    d.ok(&["uninstall", "forker"]);
    d.ok(&["uninstall", "neighbour"]);
    wait_for(
        Duration::from_secs(10),
        "every process of the forker to be gone",
        || (processes_of(NOBODY) == 0).then_some(()),
    );
}

#[test]
fn a_host_resources_flood_is_rate_limited_and_a_neighbour_keeps_its_own_budget() {
    let d = Daemon::start_with("[host_resources]\nrate_per_sec = 20\nburst = 20\n");
    neighbour(&d);
    let dir = d.root().join("bundles");
    d.ok(&["install", demo_bundle_at(&dir, "flooder").to_str().unwrap()]);
    let id = d.put_file("note.txt", b"shared note");
    let uri = format!("files://{id}");
    std::thread::scope(|s| {
        let flood = s.spawn(|| {
            let args = serde_json::json!({ "uri": uri, "count": 8000 }).to_string();
            let out = d.ok(&["call", "flooder", "host_bench", &args]);
            serde_json::from_str::<Value>(out.trim()).unwrap()
        });
        // While the flood runs, the neighbour's reads come out of its own
        // bucket (10 reads, within its burst of 20).
        for _ in 0..10 {
            let args = serde_json::json!({ "uri": uri }).to_string();
            let read = d.ok(&["call", "neighbour", "host_read", &args]);
            assert!(
                read.contains("shared note"),
                "the neighbour was refused: {read}"
            );
        }
        assert!(
            !flood.is_finished(),
            "the flood should still be running (raise its count if this machine is very fast)"
        );
        let result = flood.join().unwrap();
        let errors = result["errors"].as_u64().unwrap();
        assert!(errors > 7500, "the flood was not rate limited: {result}");
    });
    d.ok(&["status"]);
}
