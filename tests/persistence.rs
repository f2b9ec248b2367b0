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

#[test]
fn a_manifest_that_no_longer_passes_the_gate_is_failed_at_boot() {
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
    let failed = d.wait_state("default", "gated", "failed");
    assert!(failed["last_error"]
        .as_str()
        .unwrap()
        .contains("ai.nimblebrain/teleport"));
    assert!(d.bundle_processes().is_empty());
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
