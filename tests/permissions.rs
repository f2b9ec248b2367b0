//! File modes of what the daemon keeps (issue 15, finding 11): the state
//! dir is the daemon's alone even when it was created open, and the audit
//! logs (which name bundles and file ids) are `0600` in a `0700` folder,
//! including ones an older version left open.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{wait_for, Daemon};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn an_open_state_dir_and_audit_log_are_tightened_and_new_audit_logs_are_private() {
    let mut d = Daemon::unlaunched("");
    // What an older version (or a careless mkdir) left: 0755 and 0644.
    let audit = d.state.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    let old = audit.join("default.jsonl");
    std::fs::write(&old, "{\"earlier\":true}\n").unwrap();
    set_mode(&d.state, 0o755);
    set_mode(&audit, 0o755);
    set_mode(&old, 0o644);
    d.launch();

    // A root daemon's bundles pass through it (uids of their own): 711.
    let private = if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    };
    assert_eq!(mode(&d.state), private);
    let log = d.log();
    assert!(
        log.contains(&format!(
            "the state dir was open to other users; tightened it to {private:o}"
        )),
        "{log}"
    );
    // The workspace opens its audit log when it starts.
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    wait_for(
        Duration::from_secs(10),
        "the audit log to be tightened",
        || (mode(&old) == 0o600 && mode(&audit) == 0o700).then_some(()),
    );
    assert!(std::fs::read_to_string(&old)
        .unwrap()
        .starts_with("{\"earlier\""));

    // A workspace seen for the first time: its audit log is created private.
    let other = common::demo_bundle_at(&d.root(), "other");
    d.ok(&["install", other.to_str().unwrap(), "-w", "fresh"]);
    let fresh = audit.join("fresh.jsonl");
    wait_for(Duration::from_secs(10), "fresh.jsonl", || {
        fresh.exists().then_some(())
    });
    assert_eq!(mode(&fresh), 0o600);

    // A private state dir is left alone, and said nothing about.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    std::fs::write(d.root().join("daemon.log"), "").unwrap();
    d.launch();
    assert!(!d.log().contains("tightened"), "{}", d.log());
}
