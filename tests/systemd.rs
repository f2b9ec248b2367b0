//! systemd notify protocol: READY=1 once the boot reload has settled,
//! WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on shutdown.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::Daemon;
use nix::sys::signal::Signal;

fn recv(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 1024];
    let n = socket
        .recv(&mut buf)
        .expect("a notification before the read timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_after_boot_reload_then_watchdog_then_stopping() {
    let mut d = Daemon::start();
    let b = d.demo_bundle("demo");
    d.ok(&["install", b.to_str().unwrap()]);
    d.signal(Signal::SIGTERM);

    let path = d.root().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    d.env = vec![
        ("NOTIFY_SOCKET".into(), path.display().to_string()),
        ("WATCHDOG_USEC".into(), "200000".into()),
    ];
    d.launch();

    let ready = recv(&socket);
    assert!(
        ready.starts_with("READY=1\nSTATUS=boot reload done: 1 of 1 bundles ready"),
        "{ready}"
    );
    // READY means the reloaded bundle is up, not merely spawned.
    assert_eq!(d.bundle("default", "demo").unwrap()["state"], "ready");

    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(recv(&socket), "WATCHDOG=1");
    }
    // Three pings at half of 200 ms each.
    assert!(
        started.elapsed() >= Duration::from_millis(150)
            && started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    d.signal(Signal::SIGTERM);
    let mut last = recv(&socket);
    while last == "WATCHDOG=1" {
        last = recv(&socket);
    }
    assert_eq!(last, "STOPPING=1");
}

#[test]
fn a_watchdog_for_another_pid_is_ignored() {
    let mut d = Daemon::start();
    d.signal(Signal::SIGTERM);
    let path = d.root().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(600)))
        .unwrap();
    d.env = vec![
        ("NOTIFY_SOCKET".into(), path.display().to_string()),
        ("WATCHDOG_USEC".into(), "100000".into()),
        ("WATCHDOG_PID".into(), "1".into()),
    ];
    d.launch();
    assert!(recv(&socket).starts_with("READY=1"));
    let mut buf = [0u8; 64];
    assert!(
        socket.recv(&mut buf).is_err(),
        "a watchdog ping was sent for another pid"
    );
}
