//! `bundlevisor status --watch`: in a pseudo-terminal it redraws the table
//! in place and exits on Ctrl-C with the cursor restored; piped, it prints
//! plain tables with no terminal control codes.

mod common;

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{wait_for, Daemon, BIN};

const REDRAW: &str = "\x1b[H\x1b[2J";

/// Everything read from `from`, collected by a thread.
fn collect(mut from: std::fs::File) -> Arc<Mutex<Vec<u8>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // EIO once the terminal's last user has gone.
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    seen
}

fn text(seen: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&seen.lock().unwrap()).into_owned()
}

#[test]
fn in_a_terminal_it_redraws_in_place_and_ctrl_c_ends_it() {
    let d = Daemon::start();
    d.ok(&["install", d.demo_bundle("demo").to_str().unwrap()]);
    let pty = nix::pty::openpty(None, None).unwrap();
    let (master, slave): (OwnedFd, OwnedFd) = (pty.master, pty.slave);
    let mut child = unsafe {
        Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .args(["status", "--watch", "--interval", "100ms"])
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            // Its own session with the terminal as the controlling one, so
            // that ^C reaches it as SIGINT the way a shell's job gets it.
            .pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY as _, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .unwrap()
    };
    let mut input = std::fs::File::from(master.try_clone().unwrap());
    let seen = collect(std::fs::File::from(master));

    // Calls between redraws show up as a rate.
    wait_for(
        Duration::from_secs(20),
        "three redraws of the table",
        || {
            let t = text(&seen);
            (t.matches(REDRAW).count() >= 3).then_some(())
        },
    );
    for _ in 0..5 {
        d.ok(&["call", "demo", "echo", r#"{"text":"x"}"#]);
    }
    let after_calls = text(&seen).len();
    wait_for(Duration::from_secs(20), "a redraw with a call rate", || {
        let t = text(&seen);
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
    let t = text(&seen);
    assert!(
        t.contains("\x1b[?25l"),
        "the cursor is hidden while watching"
    );
    assert!(t.contains("CALLS/S") && t.contains("RSS"), "{t}");

    input.write_all(b"\x03").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "status --watch did not end on Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    wait_for(
        Duration::from_secs(5),
        "the cursor to be shown again",
        || text(&seen).trim_end().ends_with("\x1b[?25h").then_some(()),
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
    let seen = collect(out);
    wait_for(Duration::from_secs(20), "two tables", || {
        (text(&seen).matches("WORKSPACE").count() >= 2).then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let t = text(&seen);
    assert!(!t.contains('\x1b'), "no terminal codes when piped: {t:?}");
    assert!(
        t.lines().any(|l| l.contains("demo") && l.contains("ready")),
        "{t}"
    );
}
