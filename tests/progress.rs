//! Progress: `install` and `restart` show a spinner on a terminal and
//! nothing when piped; a daemon started on a terminal shows its boot
//! reload as a bar, with its log lines above it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{in_terminal, wait_exit, wait_for, Daemon, BIN};

#[test]
fn install_and_restart_spin_on_a_terminal_and_stay_quiet_when_piped() {
    let d = Daemon::start();
    let folder = d.demo_bundle("demo");
    let (mut child, _input, seen) = in_terminal(
        Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .arg("install")
            .arg(&folder),
    );
    let status = wait_exit(&mut child, Duration::from_secs(30), "install to finish");
    assert!(status.success(), "{}", seen.text());
    let shown = wait_for(Duration::from_secs(5), "the answer on the terminal", || {
        let t = seen.text();
        t.contains("is ready").then_some(t)
    });
    assert!(
        shown.contains("installing "),
        "the spinner names the work: {shown:?}"
    );
    // indicatif clears the spinner line before the answer is printed.
    let answer_at = shown.find("default/demo").unwrap();
    assert!(
        shown[..answer_at].contains("\x1b[2K"),
        "the spinner was cleared: {shown:?}"
    );

    let piped = d.cli(&["restart", "demo"]);
    assert!(piped.status.success());
    assert!(
        piped.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert!(String::from_utf8_lossy(&piped.stdout).contains("is ready"));

    let (mut child, _input, seen) = in_terminal(
        Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .args(["restart", "demo"]),
    );
    assert!(wait_exit(&mut child, Duration::from_secs(30), "restart to finish").success());
    wait_for(
        Duration::from_secs(5),
        "the restart's spinner and answer",
        || {
            let t = seen.text();
            (t.contains("restarting default/demo") && t.contains("is ready")).then_some(())
        },
    );
}

#[test]
fn a_daemon_on_a_terminal_shows_its_boot_reload_as_a_bar() {
    let mut d = Daemon::start();
    for name in ["a", "b", "c"] {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
    }
    d.signal(nix::sys::signal::Signal::SIGTERM);

    let (mut child, _input, seen) = in_terminal(
        Command::new(BIN)
            .args(["daemon", "--config"])
            .arg(&d.config)
            .env("RUST_LOG", "info,rmcp=warn"),
    );
    let shown = wait_for(Duration::from_secs(30), "the boot reload to finish", || {
        let t = seen.text();
        t.contains("boot reload done: 3 of 3 bundles ready")
            .then_some(t)
    });
    assert!(shown.contains("boot reload ["), "the bar: {shown:?}");
    assert!(
        shown.contains("/3 ("),
        "the bar counts the bundles: {shown:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut child, Duration::from_secs(30), "the daemon to stop").success());
}
