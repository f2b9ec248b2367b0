//! Installs survive the daemon: boot reload after SIGKILL, fail-closed on a
//! vanished bundle, stale and live sockets, the state-dir lock, the socket's
//! mode, and the watched folders scanned at start.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::{wait_for, Daemon, BIN};
use nix::sys::signal::Signal;

#[test]
fn boot_reload_after_sigkill_restores_every_bundle() {
    let mut d = Daemon::start();
    let one = d.demo_bundle("one");
    let two = d.demo_bundle("two");
    d.ok(&["install", one.to_str().unwrap()]);
    d.ok(&["install", two.to_str().unwrap()]);
    d.ok(&["install", one.to_str().unwrap(), "-w", "other"]);
    let before = d.bundle_processes();
    assert_eq!(before.len(), 3);

    d.signal(Signal::SIGKILL);
    // PR_SET_PDEATHSIG takes the bundles down with the daemon.
    wait_for(
        Duration::from_secs(10),
        "bundles to die with the daemon",
        || d.bundle_processes().is_empty().then_some(()),
    );
    assert!(d.socket.exists(), "SIGKILL leaves the socket behind");

    d.launch();
    for (ws, name) in [("default", "one"), ("default", "two"), ("other", "one")] {
        let b = d.wait_state(ws, name, "ready");
        assert!(!before.contains(&(b["pid"].as_u64().unwrap() as u32)));
    }
    assert_eq!(
        d.ok(&["call", "two", "echo", r#"{"text":"after reboot"}"#])
            .trim(),
        "after reboot"
    );
    assert!(d.log().contains("removing a stale socket"));
}

#[test]
fn a_vanished_bundle_is_failed_at_boot_while_the_others_come_up() {
    let mut d = Daemon::start();
    let keep = d.demo_bundle("keep");
    let gone = d.demo_bundle("gone");
    d.ok(&["install", keep.to_str().unwrap()]);
    d.ok(&["install", gone.to_str().unwrap()]);
    assert!(d.signal(Signal::SIGTERM).success());
    std::fs::remove_dir_all(&gone).unwrap();

    d.launch();
    d.wait_state("default", "keep", "ready");
    let failed = d.wait_state("default", "gone", "failed");
    let reason = failed["last_error"].as_str().unwrap();
    assert!(
        reason.contains("cannot read manifest") && reason.contains("gone/manifest.json"),
        "{reason}"
    );
    assert_eq!(d.bundle_processes().len(), 1);

    // Restoring the folder and restarting brings it back.
    d.demo_bundle("gone");
    d.ok(&["restart", "gone"]);
    assert_eq!(d.bundle("default", "gone").unwrap()["state"], "ready");
}

/// Issue 16, finding 8: a manifest changed while the daemon was down so
/// that it no longer passes (the gate here, a half-written file below) is
/// refused, and the last good version runs, as it would for a live edit.
#[test]
fn a_manifest_refused_at_boot_keeps_the_last_good_version_running() {
    let mut d = Daemon::start();
    let b = d.demo_bundle("gated");
    d.ok(&["install", b.to_str().unwrap()]);
    d.signal(Signal::SIGTERM);
    let path = b.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["_meta"]["ai.nimblebrain/host"]["host_capabilities"]["ai.nimblebrain/teleport"] =
        serde_json::json!({"required": true});
    std::fs::write(&path, m.to_string()).unwrap();
    d.launch();
    let ready = wait_for(Duration::from_secs(10), "the last good version", || {
        d.bundle("default", "gated")
            .filter(|b| b["state"] == "ready" && !b["last_error"].is_null())
    });
    let why = ready["last_error"].as_str().unwrap();
    assert!(
        why.contains("rejected") && why.contains("ai.nimblebrain/teleport"),
        "{why}"
    );
    assert_eq!(
        d.ok(&["call", "gated", "echo", r#"{"text":"old"}"#]).trim(),
        "old"
    );
}

/// Issue 16, finding 8: a half-written manifest plus an operator restart,
/// a crash, or a daemon restart runs the last good version.
#[test]
fn a_half_written_manifest_never_stops_a_restart() {
    let mut d = Daemon::start();
    let b = d.demo_bundle("half");
    d.ok(&["install", b.to_str().unwrap()]);
    std::fs::write(b.join("manifest.json"), "{ \"name\": \"half\", \"vers").unwrap();
    let back = |d: &Daemon, what: &str, old: Option<u64>| {
        wait_for(Duration::from_secs(10), what, || {
            d.bundle("default", "half")
                .filter(|b| b["state"] == "ready" && b["pid"].as_u64() != old)
        })
    };
    let pid = |d: &Daemon| d.bundle("default", "half").unwrap()["pid"].as_u64();

    let old = pid(&d);
    let out = d.cli(&["restart", "half"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b1 = back(&d, "the restart", old);
    assert!(
        b1["last_error"].as_str().unwrap().contains("rejected"),
        "{b1}"
    );

    let old = pid(&d);
    let _ = d.cli(&["call", "half", "crash", "{}"]);
    back(&d, "the crash restart", old);

    assert!(d.signal(Signal::SIGTERM).success());
    d.launch();
    back(&d, "the boot reload", None);
    assert_eq!(
        d.ok(&["call", "half", "echo", r#"{"text":"whole"}"#])
            .trim(),
        "whole"
    );
}

/// Issue 16, finding 9: installed bundles are listed (as `starting`) from
/// the first answer the socket gives after a start.
#[test]
fn the_first_status_after_a_start_lists_every_install() {
    let mut d = Daemon::start();
    let mut names = Vec::new();
    for i in 0..6 {
        let name = format!("b{i}");
        let b = d.demo_bundle(&name);
        let ws = if i % 2 == 0 { "default" } else { "other" };
        d.ok(&["install", b.to_str().unwrap(), "-w", ws, "--no-wait"]);
        names.push(name);
    }
    for round in 0..3 {
        assert!(d.signal(Signal::SIGTERM).success());
        let first = d.launch_first_status();
        let listed: Vec<&str> = first["bundles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap())
            .collect();
        assert_eq!(listed.len(), names.len(), "round {round}: {first}");
        // `tools NAME` at once: the bundle, as starting, not "no bundle".
        let mut raw = d.raw();
        raw.hello();
        let r = raw.request(1, "bundle.tools", serde_json::json!({"name": "b2"}));
        assert!(r.get("result").is_some(), "round {round}: {r}");
    }
}

#[test]
fn a_second_daemon_is_refused_and_the_socket_is_private() {
    let d = Daemon::start();
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Same state dir: the lock refuses it.
    let out = Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(&d.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another bundlevisor daemon is using the state dir"),
        "{stderr}"
    );

    // Another state dir, same socket: the live socket refuses it.
    let other = d.root().join("other.toml");
    std::fs::write(
        &other,
        format!(
            "state_dir = \"state2\"\nsocket = \"{}\"\n",
            d.socket.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is listening on"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first daemon is unharmed.
    d.ok(&["status"]);
}

#[test]
fn watched_folders_are_installed_at_start_and_bad_bundles_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let watched = dir.path().canonicalize().unwrap().join("watched");
    common::demo_bundle_at(&watched, "alpha");
    common::demo_bundle_at(&watched, "beta");
    std::fs::create_dir_all(watched.join("broken")).unwrap();
    std::fs::write(watched.join("broken/manifest.json"), "{}").unwrap();
    let d = Daemon::start_with(&format!(
        "\n[[watch]]\ndir = \"{}\"\nworkspace = \"team\"\n",
        watched.display()
    ));
    d.wait_state("team", "alpha", "ready");
    d.wait_state("team", "beta", "ready");
    assert_eq!(d.status()["bundles"].as_array().unwrap().len(), 2);
    assert!(d.log().contains("bundle not installed"), "{}", d.log());
}

/// Issue 30, finding 18: two root daemons never give bundles the same
/// uids. A second daemon with the default `[sandbox] uid_range` is refused
/// while the first lives, naming it and the fix; with a range of its own
/// it runs beside it; once the first is SIGKILLed, the range is free.
#[test]
fn two_root_daemons_never_share_a_uid_range() {
    if !nix::unistd::geteuid().is_root() {
        return; // only a root daemon gives bundles uids of their own
    }
    // The harness gives each daemon a range of its own: take it out.
    let default_range = |d: &Daemon| {
        let text = std::fs::read_to_string(&d.config).unwrap();
        let line = format!("uid_range = \"{}\"\n", d.uid_range);
        assert!(text.contains(&line), "{text}");
        std::fs::write(&d.config, text.replace(&line, "")).unwrap();
    };
    let mut first = Daemon::unlaunched("");
    default_range(&first);
    first.launch();
    first.ok(&["install", first.demo_bundle("demo").to_str().unwrap()]);

    let mut second = Daemon::unlaunched("");
    default_range(&second);
    let said = second.root().join("refused.log");
    let mut refused = Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(&second.config)
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    let exit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::wait_exit(
            &mut refused,
            Duration::from_secs(20),
            "the second daemon to be refused",
        )
    }));
    let _ = refused.kill();
    let _ = refused.wait();
    assert_eq!(
        exit.expect("the second daemon ran on the first one's uids")
            .code(),
        Some(1)
    );
    let stderr = std::fs::read_to_string(&said).unwrap();
    assert!(
        stderr.contains("uid_range 2000000000-2000065535 overlaps")
            && stderr.contains(&format!("pid {}", first.pid()))
            && stderr.contains(&first.state.display().to_string())
            && stderr.contains("uid_range = \"2000065536-2000131071\""),
        "{stderr}"
    );
    assert!(
        !second.socket.exists(),
        "the refused daemon left its socket"
    );

    // A range of its own: both run.
    let third = Daemon::start();
    third.ok(&["install", third.demo_bundle("demo").to_str().unwrap()]);
    first.ok(&["status"]);

    // A claim dies with its daemon, even by SIGKILL.
    first.signal(Signal::SIGKILL);
    second.launch();
    second.ok(&["install", second.demo_bundle("demo").to_str().unwrap()]);
    let uid = second.bundle("default", "demo").unwrap()["sandbox"]["uid"]
        .as_u64()
        .unwrap();
    assert!((2_000_000_000..=2_000_065_535).contains(&uid), "{uid}");
}
