//! `bundlevisor status --watch`: in a pseudo-terminal it redraws the table
//! in place and exits on Ctrl-C with the cursor restored; piped, it prints
//! plain tables with no terminal control codes.

mod common;

use std::io::Write;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{in_terminal, wait_exit, wait_for, Daemon, Seen, BIN};

const REDRAW: &str = "\x1b[H\x1b[2J";

#[test]
fn in_a_terminal_it_redraws_in_place_and_ctrl_c_ends_it() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let (mut child, mut input, seen) =
        in_terminal(Command::new(BIN).arg("--socket").arg(&d.socket).args([
            "status",
            "--watch",
            "--interval",
            "100ms",
        ]));

    // Calls between redraws show up as a rate.
    wait_for(
        Duration::from_secs(20),
        "three redraws of the table",
        || {
            let t = seen.text();
            (t.matches(REDRAW).count() >= 3).then_some(())
        },
    );
    // Frames drawn from the first call on: one of them may already show
    // the rate while the calls are still being made (a loaded machine).
    let after_calls = seen.text().len();
    for _ in 0..5 {
        d.ok(&["call", "demo", "echo", r#"{"text":"x"}"#]);
    }
    wait_for(Duration::from_secs(20), "a redraw with a call rate", || {
        let t = seen.text();
        let latest = t[after_calls..]
            .rsplit(REDRAW)
            .next()
            .unwrap_or("")
            .to_string();
        let row = latest.lines().find(|l| l.contains("demo"))?.to_string();
        // The CALLS/S cell of the demo row, by the header's column.
        let rates_seen = t[after_calls..].split(REDRAW).any(|frame| {
            let header = frame.lines().find(|l| l.contains("CALLS/S"));
            let row = frame.lines().find(|l| l.contains("demo"));
            let (Some(header), Some(row)) = (header, row) else {
                return false;
            };
            let at = header.find("CALLS/S").unwrap();
            row.get(at..)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|cell| cell.parse::<f64>().ok())
                .is_some_and(|rate| rate > 0.0)
        });
        (rates_seen && row.contains("ready") && row.contains("MiB")).then_some(())
    });
    let t = seen.text();
    assert!(
        t.contains("\x1b[?25l"),
        "the cursor is hidden while watching"
    );
    assert!(
        t.contains("CALLS/S") && t.contains("MEMORY") && t.contains("CPU"),
        "{t}"
    );

    input.write_all(b"\x03").unwrap();
    let status = wait_exit(
        &mut child,
        Duration::from_secs(10),
        "status --watch to end on Ctrl-C",
    );
    assert!(status.success(), "{status}");
    wait_for(
        Duration::from_secs(5),
        "the cursor to be shown again",
        || seen.text().trim_end().ends_with("\x1b[?25h").then_some(()),
    );
}

#[test]
fn piped_it_prints_plain_tables_until_interrupted() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["status", "--watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = std::fs::File::from(OwnedFd::from(child.stdout.take().unwrap()));
    let seen = Seen::collect(out);
    wait_for(Duration::from_secs(20), "two tables", || {
        (seen.text().matches("WORKSPACE").count() >= 2).then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let t = seen.text();
    assert!(!t.contains('\x1b'), "no terminal codes when piped: {t:?}");
    assert!(
        t.lines().any(|l| l.contains("demo") && l.contains("ready")),
        "{t}"
    );
}
