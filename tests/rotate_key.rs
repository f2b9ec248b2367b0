//! `bundlevisor rotate-key`: every stored secret re-sealed under a new key
//! that replaces the key file; the old key no longer opens the state; a
//! rotation cut short is finished (or undone) at the next start; a key from
//! the environment is refused with what to do.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use common::{write_bundle, Daemon, BIN, DEMO_MANIFEST};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

const CANARY: &str = "sk-CANARY-rotate-9d1e";

/// A demo bundle with a required sensitive `api_key` in its environment.
fn keyed(d: &Daemon) {
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!("keyed");
    m["user_config"] = json!({
        "api_key": {"type": "string", "title": "API key", "description": "API key", "required": true, "sensitive": true}
    });
    m["server"]["mcp_config"]["env"] = json!({ "DEMO_API_KEY": "${user_config.api_key}" });
    let folder = write_bundle(&d.root().join("bundles"), "keyed", &m);
    d.ok(&["install", "--no-wait", folder.to_str().unwrap()]);
    d.wait_state("default", "keyed", "needs_config");
    d.ok(&["configure", "keyed", &format!("api_key={CANARY}")]);
}

fn api_key(d: &Daemon) -> String {
    d.wait_state("default", "keyed", "ready");
    d.ok(&["call", "keyed", "env", r#"{"name":"DEMO_API_KEY"}"#])
        .trim()
        .to_string()
}

fn key_file(d: &Daemon) -> PathBuf {
    d.state.join("credentials.key")
}

fn pending(d: &Daemon) -> PathBuf {
    d.state.join("credentials.key.new")
}

#[test]
fn the_secrets_are_resealed_under_a_new_key_and_the_old_one_no_longer_opens_them() {
    let mut d = Daemon::start();
    keyed(&d);
    assert_eq!(api_key(&d), CANARY);
    let old = std::fs::read(key_file(&d)).unwrap();

    let out: Value = serde_json::from_str(&d.ok(&["rotate-key", "--json"])).unwrap();
    assert_eq!(out["values"], 1, "{out}");
    assert_eq!(out["token_sets"], 0, "{out}");
    assert_eq!(out["key_file"], key_file(&d).display().to_string());
    let new = std::fs::read(key_file(&d)).unwrap();
    assert_ne!(old, new, "the key file holds a new key");
    let mode = std::fs::metadata(key_file(&d))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!pending(&d).exists());

    // The running daemon uses the new key: a respawn reads the value.
    d.ok(&["restart", "keyed"]);
    assert_eq!(api_key(&d), CANARY);

    // The old key is refused at start, and says so.
    d.signal(Signal::SIGTERM);
    std::fs::write(key_file(&d), &old).unwrap();
    let refused = Command::new(BIN)
        .args(["daemon", "--config"])
        .arg(&d.config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("does not match"), "{stderr}");
    assert!(!stderr.contains(CANARY));

    std::fs::write(key_file(&d), &new).unwrap();
    d.launch();
    assert_eq!(api_key(&d), CANARY);
}

/// Needs a daemon built with `fault-injection` (it aborts on cue).
#[test]
#[cfg(feature = "fault-injection")]
fn a_rotation_cut_short_after_the_commit_is_finished_at_the_next_start() {
    let mut d = Daemon::start();
    keyed(&d);
    assert_eq!(api_key(&d), CANARY);
    let old = std::fs::read(key_file(&d)).unwrap();
    d.signal(Signal::SIGTERM);

    // The daemon dies between the commit and the rename.
    d.env = vec![("BUNDLEVISOR_FAULT".into(), "rotate_after_commit".into())];
    d.launch();
    let out = d.cli(&["rotate-key"]);
    assert!(!out.status.success());
    d.signal(Signal::SIGKILL); // reaps the aborted daemon
    assert_eq!(std::fs::read(key_file(&d)).unwrap(), old, "not renamed yet");
    let new = std::fs::read(pending(&d)).unwrap();

    d.env.clear();
    d.launch();
    assert_eq!(api_key(&d), CANARY);
    assert_eq!(std::fs::read(key_file(&d)).unwrap(), new);
    assert!(!pending(&d).exists());
    assert!(d
        .log()
        .contains("finished a key rotation that was cut short"));
}

#[test]
fn a_new_key_left_before_the_commit_is_removed_at_the_next_start() {
    let mut d = Daemon::start();
    keyed(&d);
    let old = std::fs::read(key_file(&d)).unwrap();
    d.signal(Signal::SIGTERM);
    // What a daemon stopped before the commit leaves: a new key, unused.
    std::fs::write(
        pending(&d),
        "bm90IHVzZWQgYnkgdGhlIHN0YXRlIGF0IGFsbCEhISE=\n",
    )
    .unwrap();
    std::fs::set_permissions(pending(&d), std::fs::Permissions::from_mode(0o600)).unwrap();
    d.launch();
    assert_eq!(api_key(&d), CANARY);
    assert_eq!(std::fs::read(key_file(&d)).unwrap(), old);
    assert!(!pending(&d).exists(), "the leftover is removed at start");
}

#[test]
fn a_key_from_the_environment_is_not_rotated_and_the_error_says_what_to_do() {
    let key = "BUNDLEVISOR_TEST_ROTATE_KEY";
    let mut d = Daemon::unlaunched(&format!("[credentials]\nkey_env = \"{key}\"\n"));
    d.env = vec![(
        key.into(),
        "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=".into(),
    )];
    d.launch();
    let out = d.cli(&["rotate-key"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(key) && stderr.contains("key_file"),
        "{stderr}"
    );
}

/// Issue 16, finding 10: a rotation with a param the method does not take
/// is refused and rotates nothing.
#[test]
fn a_rotation_with_an_unknown_param_is_refused_and_changes_nothing() {
    let d = Daemon::start();
    keyed(&d);
    let old = std::fs::read(key_file(&d)).unwrap();
    let mut raw = d.raw();
    raw.hello();
    let r = raw.request(
        1,
        "credentials.rotate_key",
        serde_json::json!({"junk": true}),
    );
    assert_eq!(r["error"]["data"]["kind"], "invalid_params", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `junk`"),
        "{r}"
    );
    assert_eq!(
        std::fs::read(key_file(&d)).unwrap(),
        old,
        "the key was rotated"
    );
    assert!(!pending(&d).exists());
}

/// Issue 30, finding 9: rotations asked at once run one after the other;
/// the key file ends up holding the key the store is sealed with, so every
/// secret still opens, in this daemon and in the next.
#[test]
fn rotations_asked_at_once_leave_the_key_file_and_the_store_in_step() {
    let mut d = Daemon::start();
    keyed(&d);
    assert_eq!(api_key(&d), CANARY);

    let rotations: Vec<_> = (0..8)
        .map(|_| {
            Command::new(BIN)
                .arg("--socket")
                .arg(&d.socket)
                .args(["rotate-key", "--json"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for rotation in rotations {
        let out = rotation.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a rotation failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!pending(&d).exists(), "a new key was left behind");

    // The running daemon opens the value with the key it holds...
    d.ok(&["restart", "keyed"]);
    assert_eq!(api_key(&d), CANARY);
    // ...and the next one with the key file.
    d.signal(Signal::SIGTERM);
    d.launch();
    assert_eq!(api_key(&d), CANARY);
    assert!(!d.log().contains("does not match"), "{}", d.log());
}
