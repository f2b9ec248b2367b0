//! Issue 19: clients that try to exhaust the control plane. Each flood
//! keeps the daemon's memory under a stated bound, and `status` answers
//! throughout.

mod common;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::{rss, wait_for, Daemon};

/// The daemon's resident memory may grow by at most this much under a flood
/// (its answers queued for one client are capped at 4 MiB).
const FLOOD_GROWTH: u64 = 64 * 1024 * 1024;

/// A client that pipelines `status` requests and never reads the answers:
/// the daemon stops reading it once 64 requests are in flight, cuts it off
/// once 4 MiB of answers wait for it, says why in its log, and stays small.
#[test]
fn a_client_that_pipelines_without_reading_is_bounded_and_cut_off() {
    let d = Daemon::start();
    for name in ["a", "b", "c"] {
        d.ok(&["install", d.demo_bundle(name).to_str().unwrap()]);
    }
    let before = rss(d.pid());
    let mut client = d.raw();
    client.hello();
    let mut stream = client.stream();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let writer = std::thread::spawn(move || {
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\",\"params\":{}}\n";
        let mut sent = 0u64;
        // 200,000 requests, or until the daemon stops taking them.
        for _ in 0..200_000 {
            if stream.write_all(line).is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    let mut peak = before;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !writer.is_finished() && Instant::now() < deadline {
        peak = peak.max(rss(d.pid()));
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = writer.join().unwrap();
    peak = peak.max(rss(d.pid()));
    eprintln!(
        "pipelined flood: {sent} requests written; daemon RSS {} KiB before, peak {} KiB",
        before / 1024,
        peak / 1024
    );
    assert!(
        peak < before + FLOOD_GROWTH,
        "the daemon grew from {before} to {peak} bytes"
    );
    wait_for(Duration::from_secs(10), "the cut-off in the log", || {
        d.log().contains("control client cut off").then_some(())
    });
    // The connection is closed: what is left to read ends.
    let mut rest = Vec::new();
    let _ = client.reader.read_to_end(&mut rest);
    assert!(d.ok(&["status"]).contains("a"));
    // What the flood took is given back once the client is gone.
    wait_for(Duration::from_secs(10), "the memory back", || {
        (rss(d.pid()) < before + FLOOD_GROWTH / 2).then_some(())
    });
}

/// Clients that never say `daemon.hello` but keep sending something are
/// closed at the handshake deadline all the same: they cannot hold the
/// connection slots and lock the operator out.
#[test]
fn chatty_clients_that_never_say_hello_are_closed_at_the_deadline() {
    let d = Daemon::start_with("[control]\nmax_connections = 32\nhandshake_timeout = \"1s\"\n");
    let before = rss(d.pid());
    let mut chatty: Vec<_> = (0..16).map(|_| d.raw()).collect();
    let started = Instant::now();
    let talkers: Vec<_> = chatty
        .iter()
        .map(|c| {
            let mut s = c.stream();
            std::thread::spawn(move || {
                // "x" every 200 ms, well inside the deadline each time.
                for _ in 0..50 {
                    if s.write_all(b"x\n").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    for c in &mut chatty {
        // Closed: the end of the stream, or a reset (the daemon closed
        // with the client's last `x` unread).
        let mut rest = String::new();
        match c.reader.read_to_string(&mut rest) {
            Ok(_) => assert!(rest.contains("hello_required"), "{rest}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    let closed_after = started.elapsed();
    assert!(
        closed_after < Duration::from_secs(5),
        "closed only after {closed_after:?}"
    );
    assert!(
        d.cli(&["status"]).status.success(),
        "status must answer once they are gone"
    );
    let peak = rss(d.pid());
    eprintln!(
        "chatty pre-hello clients: closed after {closed_after:?}; daemon RSS {} KiB before, {} KiB after",
        before / 1024,
        peak / 1024
    );
    assert!(peak < before + FLOOD_GROWTH);
    for t in talkers {
        t.join().unwrap();
    }
}

/// Another allowed user that opens every connection it can never locks the
/// operator (the daemon's own uid) out: the last slot is the operator's.
#[test]
fn other_users_cannot_take_the_operators_last_connection_slot() {
    let d = Daemon::start_with("[control]\nallowed_uids = [4242]\nmax_connections = 4\n");
    let socket = d.root().join("run/bv.sock");
    let script = r#"
import json, socket, sys, time
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"daemon.hello","params":{"protocol":1}}\n')
    return s, "result" in json.loads(s.makefile().readline())
held, refused = [], 0
for _ in range(4):
    # A refusal is retried for a moment: a slot the test's own status
    # connection held may not be free yet.
    for attempt in range(20):
        s, ok = connect()
        if ok:
            held.append(s)
            break
        s.close()
        time.sleep(0.05)
    else:
        refused += 1
print(len(held), refused, flush=True)
sys.stdin.read()
"#;
    let mut other = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(&socket)
        .uid(4242)
        .gid(4242)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(other.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), "3 1", "uid 4242 held/refused");
    // All its connections are still open, and the operator gets in.
    assert!(d.cli(&["status"]).status.success());
    drop(other.stdin.take());
    other.wait().unwrap();
}

/// Issue 30, finding 7: an admitted user that puts its own FIFO hundreds
/// of times at once (no writer ever comes) gets "not a regular file" for
/// each, at once; the daemon's blocking pool is not held by opens that
/// never return, so the operator's `status` is answered meanwhile.
#[test]
fn fifo_puts_are_refused_at_once_and_the_operator_is_still_answered() {
    const USER: u32 = 4243;
    let d = Daemon::start_with(&format!("[control]\nallowed_uids = [{USER}]\n"));
    let own = d.root().join("user-files");
    std::fs::create_dir(&own).unwrap();
    nix::unistd::chown(&own, Some(USER.into()), Some(USER.into())).unwrap();
    let fifo = own.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    nix::unistd::chown(&fifo, Some(USER.into()), Some(USER.into())).unwrap();

    // 10 connections × 60 pipelined puts (each connection handles 64 at
    // once): more opens than the daemon's blocking pool has threads.
    let script = r#"
import json, socket, sys, time
path, conns, each = sys.argv[2], 10, 60
socks = []
for c in range(conns):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sys.argv[1])
    f = s.makefile("rb")
    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"daemon.hello","params":{"protocol":1}}\n')
    json.loads(f.readline())
    socks.append((s, f))
start = time.time()
for s, _ in socks:
    reqs = b"".join(json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "files.put",
                                "params": {"path": path}}).encode() + b"\n" for i in range(each))
    s.sendall(reqs)
print("sent", flush=True)
answered, regular = 0, 0
try:
    for s, f in socks:
        for _ in range(each):
            line = f.readline()
            if not line:
                break
            answered += 1
            if "not a regular file" in json.loads(line).get("error", {}).get("message", ""):
                regular += 1
except socket.timeout:
    pass
print(answered, regular, round(time.time() - start, 1), flush=True)
"#;
    let mut user = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(d.root().join("run/bv.sock"))
        .arg(&fifo)
        .uid(USER)
        .gid(USER)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = user.stdout.take().unwrap();
    let _user = KillOnDrop(user);
    let (tx, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let limit = Duration::from_secs(20);
    assert_eq!(said.recv_timeout(limit).unwrap(), "sent");

    // The operator is answered while the puts are in flight (or done).
    let mut status = KillOnDrop(
        std::process::Command::new(common::BIN)
            .arg("--socket")
            .arg(&d.socket)
            .arg("status")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let answered = wait_for(limit, "the operator's status to be answered", || {
        status.0.try_wait().unwrap()
    });
    assert!(answered.success());

    let done = said
        .recv_timeout(Duration::from_secs(40))
        .expect("the user's puts were not answered");
    let fields: Vec<&str> = done.split_whitespace().collect();
    assert_eq!(
        &fields[..2],
        ["600", "600"],
        "answered, refused as not regular: {done}"
    );
    d.ok(&["status"]);
}

/// Kills a child (unless already reaped) when dropped, so that a failed
/// assertion leaves nothing behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
